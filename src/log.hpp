// The library's one logger, "weightcache". Hosts route or silence it through set_log_level /
// set_log_callback (or the C ABI equivalents). A call site only packs its arguments: the formatting
// lives once, in log.cpp, not once per argument list in every file that logs (docs/BENCHMARKS.md,
// "Library size"). Default builds format with fmt, whose format_string checks each call's format
// string against its arguments at compile time; WEIGHTCACHE_MOBILE builds format the same strings
// with the library's own few hundred bytes (text_format.hpp), without fmt's engine.
#pragma once

#include <weightcache/weight_cache.hpp>

#if defined(WEIGHTCACHE_MOBILE) && WEIGHTCACHE_MOBILE
#define WEIGHTCACHE_LOG_OWN_FORMAT 1
#include "text_format.hpp"
#else
#define WEIGHTCACHE_LOG_OWN_FORMAT 0
#include <fmt/core.h>
#endif

#include <string_view>
#include <utility>

namespace weightcache::log {

#if WEIGHTCACHE_LOG_OWN_FORMAT
/// Formats and logs the message at `level` if the logger lets that level through; never throws
/// (a message that cannot be formatted or written is dropped).
void vlog(LogLevel level, std::string_view f, const text::Arg* args, std::size_t n) noexcept;
#else
/// As above, with fmt.
void vlog(LogLevel level, fmt::string_view f, fmt::format_args args) noexcept;
#endif

/// Logs `text` as it is at `level` if the logger lets that level through (wc_log_message);
/// never throws.
void message(LogLevel level, std::string_view text) noexcept;

/// Around fork() (fork_guard.cpp): holds the lock every message is written under, so that no
/// thread is inside the callback (or a write to stderr) at the fork; then lets go of it on both
/// sides. fork() therefore waits for a callback in progress to return.
void lock_for_fork() noexcept;
void unlock_after_fork() noexcept;

/// Logs at `level`; never throws (a message that cannot be formatted or written is dropped).
#if WEIGHTCACHE_LOG_OWN_FORMAT
template <class... Args>
using format_string = std::string_view;
template <class... Args>
void at(LogLevel level, std::string_view f, Args&&... args) noexcept {
  if constexpr (sizeof...(Args) == 0) {
    vlog(level, f, nullptr, 0);
  } else {
    const text::Arg packed[] = {text::Arg(args)...};
    vlog(level, f, packed, sizeof...(Args));
  }
}
#else
template <class... Args>
using format_string = fmt::format_string<Args...>;
template <class... Args>
void at(LogLevel level, fmt::format_string<Args...> f, Args&&... args) noexcept {
  vlog(level, f, fmt::make_format_args(args...));
}
#endif
template <class... Args>
void warn(format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::warn, f, std::forward<Args>(args)...); }
template <class... Args>
void info(format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::info, f, std::forward<Args>(args)...); }
template <class... Args>
void debug(format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::debug, f, std::forward<Args>(args)...); }
template <class... Args>
void error(format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::error, f, std::forward<Args>(args)...); }

}  // namespace weightcache::log
