// The library's one logger, "weightcache". Hosts route or silence it through set_log_level /
// set_log_callback (or the C ABI equivalents); messages are formatted with fmt. A call site only
// packs its arguments (fmt::make_format_args): the formatting lives once, in log.cpp, not once
// per argument list in every file that logs (docs/BENCHMARKS.md, "Library size").
#pragma once

#include <weightcache/weight_cache.hpp>

#include <fmt/core.h>

#include <utility>

namespace weightcache::log {

/// Formats and logs the message at `level` if the logger lets that level through; never throws
/// (a message that cannot be formatted or written is dropped).
void vlog(LogLevel level, fmt::string_view f, fmt::format_args args) noexcept;

/// Around fork() (fork_guard.cpp): holds the lock every message is written under, so that no
/// thread is inside the callback (or a write to stderr) at the fork; then lets go of it on both
/// sides. fork() therefore waits for a callback in progress to return.
void lock_for_fork() noexcept;
void unlock_after_fork() noexcept;

/// Logs at `level`; never throws (a message that cannot be formatted or written is dropped).
template <class... Args>
void at(LogLevel level, fmt::format_string<Args...> f, Args&&... args) noexcept {
  vlog(level, f, fmt::make_format_args(args...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::warn, f, std::forward<Args>(args)...); }
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::info, f, std::forward<Args>(args)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::debug, f, std::forward<Args>(args)...); }
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) noexcept { at(LogLevel::error, f, std::forward<Args>(args)...); }

}  // namespace weightcache::log
