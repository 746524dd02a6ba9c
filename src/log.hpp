// The library's one logger, "weightcache" (spdlog). Hosts route or silence it through
// set_log_level / set_log_callback (or the C ABI equivalents); messages are formatted with fmt.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace weightcache::log {

/// The "weightcache" logger. Never null; safe from any thread.
spdlog::logger& get() noexcept;

template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) noexcept {
  try { get().warn(f, std::forward<Args>(args)...); } catch (...) {}
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) noexcept {
  try { get().info(f, std::forward<Args>(args)...); } catch (...) {}
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) noexcept {
  try { get().debug(f, std::forward<Args>(args)...); } catch (...) {}
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) noexcept {
  try { get().error(f, std::forward<Args>(args)...); } catch (...) {}
}

}  // namespace weightcache::log
