// The library's one logger, "weightcache" (spdlog). Hosts route or silence it through
// set_log_level / set_log_callback (or the C ABI equivalents); messages are formatted with fmt.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace weightcache::log {

/// The "weightcache" logger. Never null; safe from any thread.
spdlog::logger& get();  // built on first use: may throw std::bad_alloc

/// Logs at `level`; never throws (a message that cannot be formatted or written is dropped).
template <class... Args>
void at(spdlog::level::level_enum level, fmt::format_string<Args...> f, Args&&... args) noexcept {
  try {
    get().log(level, f, std::forward<Args>(args)...);
  } catch (...) {
  }
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) noexcept { at(spdlog::level::warn, f, std::forward<Args>(args)...); }
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) noexcept { at(spdlog::level::info, f, std::forward<Args>(args)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) noexcept { at(spdlog::level::debug, f, std::forward<Args>(args)...); }
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) noexcept { at(spdlog::level::err, f, std::forward<Args>(args)...); }

}  // namespace weightcache::log
