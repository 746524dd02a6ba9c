#include "log.hpp"

#include "fork_guard.hpp"
#include "utf8.hpp"
#include <weightcache/weight_cache.hpp>

#if !WEIGHTCACHE_LOG_OWN_FORMAT
#include <fmt/format.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <string_view>

// One logger of our own, where spdlog's was: the same levels, the same line on stderr
// ("[2026-11-27 10:56:47.123] [weightcache] [warning] text", local time), the same routing to a
// host callback under one mutex. spdlog's pattern engine, sinks and registry cost more code than
// everything else the library logs with (docs/BENCHMARKS.md, "Library size").
namespace weightcache::log {
namespace {

// spdlog's levels and names, which WEIGHTCACHE_LOG_LEVEL takes: "critical" lets no message of the
// library through but a critical one (it logs none), as before.
enum Level : int { kTrace, kDebug, kInfo, kWarn, kErr, kCritical, kOff };
constexpr std::string_view kNames[] = {"trace", "debug", "info", "warning", "error", "critical", "off"};

Level to_level(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return kTrace;
    case LogLevel::debug: return kDebug;
    case LogLevel::info: return kInfo;
    case LogLevel::warn: return kWarn;
    case LogLevel::error: return kErr;
    case LogLevel::off: return kOff;
  }
  return kWarn;
}

wc_log_level to_c(Level l) {
  switch (l) {
    case kTrace: return WC_LOG_TRACE;
    case kDebug: return WC_LOG_DEBUG;
    case kInfo: return WC_LOG_INFO;
    case kWarn: return WC_LOG_WARN;
    case kErr:
    case kCritical: return WC_LOG_ERROR;
    default: return WC_LOG_OFF;
  }
}

// spdlog::level::from_str: a name of kNames, or "warn" or "err"; anything else is off.
Level from_name(std::string_view name) {
  for (int i = 0; i < kOff + 1; ++i)
    if (name == kNames[i]) return static_cast<Level>(i);
  if (name == "warn") return kWarn;
  if (name == "err") return kErr;
  return kOff;
}

// An environment value as it may be quoted in a line: at most 64 bytes, cut at a character's
// start, with control characters (a newline would start a line of its own on stderr) escaped.
std::string quoted_env_value(std::string_view v) {
  std::size_t keep = v.size();
  if (keep > 64) {
    keep = 64;
    while (keep > 0 && (static_cast<unsigned char>(v[keep]) & 0xC0) == 0x80) --keep;
  }
  std::string out;
  for (std::size_t i = 0; i < keep; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7F) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (keep < v.size()) out += "...";
  return out;
}

struct State {
  std::atomic<int> level{kWarn};
  std::mutex mu;  // around every message written or handed to the callback, and a swap of it
  wc_log_callback cb = nullptr;
  void* user = nullptr;
  // WEIGHTCACHE_LOG_LEVEL's value when it is not a level: said once, with the first message the
  // library logs, so that it reaches the callback a host set before that (the host's first call
  // may be wc_set_log_callback, which is when this state is made).
  std::string env_complaint;
  std::atomic<bool> complaint_pending{false};

  // Called for a message that passed the level: the complaint goes out before it, if warnings
  // pass too; else it waits for a message logged while they do (a host that set error or off
  // does not see it, as it sees no other warning).
  void say_env_complaint() {
    if (kWarn < level.load(std::memory_order_relaxed)) return;
    std::string text;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!complaint_pending.load(std::memory_order_relaxed)) return;
      complaint_pending.store(false, std::memory_order_relaxed);
      text.swap(env_complaint);
    }
    write(kWarn, text);
  }

  void write(Level l, std::string_view text) {
    // Messages quote paths, which may be bytes that are not UTF-8: escaped, as in wc_last_error.
    if (utf8::valid_prefix(text) != text.size()) {
      std::string clean;
      utf8::for_each_piece(text, [&](const char* p, std::size_t n) {
        clean.append(p, n);
        return true;
      });
      write(l, clean);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (cb != nullptr) {
      cb(user, to_c(l), text.data(), text.size());
      return;
    }
    // "[%Y-%m-%d %H:%M:%S.%e] [weightcache] [%l] %v", in one write.
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm{};
#if defined(_WIN32)
    ::localtime_s(&tm, &t);
#else
    ::localtime_r(&t, &tm);
#endif
    char stamp[64];
    const int n = std::snprintf(stamp, sizeof stamp, "[%04d-%02d-%02d %02d:%02d:%02d.%03d] [weightcache] [",
                                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                                static_cast<int>(ms));
    std::string line(stamp, static_cast<std::size_t>(n > 0 ? n : 0));
    line.append(kNames[l]);
    line.append("] ");
    line.append(text);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stderr);
  }

  State() {
    if (const char* env = std::getenv("WEIGHTCACHE_LOG_LEVEL"); env != nullptr) {
      // spdlog read any word it did not know as "off": a typo ("warnings") would silence the very
      // warnings it meant to keep. Only the names above change the level; anything else keeps
      // warn and says so, once (this runs once per process). An empty value too: set by a script
      // that meant to set something, it is as much a mistake as a typo.
      const std::string name = env;
      const Level l = from_name(name);
      if (l != kOff || name == "off") {
        level.store(l, std::memory_order_relaxed);
      } else {
        env_complaint = "WEIGHTCACHE_LOG_LEVEL='" + quoted_env_value(name) +
                        "' is not a level (trace, debug, info, warn, error, critical or off); logging at warn";
        complaint_pending.store(true, std::memory_order_relaxed);
      }
    }
  }
};

State* make_state() {
  fork_guard::install();  // before the lock is first used
  return new State();
}

State& state() {
  static State* s = make_state();  // never destroyed: logging may happen during static teardown
  return *s;
}

}  // namespace

#if WEIGHTCACHE_LOG_OWN_FORMAT
void vlog(LogLevel level, std::string_view f, const text::Arg* args, std::size_t n) noexcept {
  try {
    State& s = state();
    const Level l = to_level(level);
    if (l < s.level.load(std::memory_order_relaxed) || l == kOff) return;  // nothing formatted below the level
    if (s.complaint_pending.load(std::memory_order_relaxed)) s.say_env_complaint();
    std::string text;
    text::format_to(text, f, args, n);
    s.write(l, text);
  } catch (...) {
  }
}
#else
void vlog(LogLevel level, fmt::string_view f, fmt::format_args args) noexcept {
  try {
    State& s = state();
    const Level l = to_level(level);
    if (l < s.level.load(std::memory_order_relaxed) || l == kOff) return;  // nothing formatted below the level
    if (s.complaint_pending.load(std::memory_order_relaxed)) s.say_env_complaint();
    fmt::basic_memory_buffer<char, 250> text;
    fmt::vformat_to(fmt::appender(text), f, args);
    s.write(l, std::string_view(text.data(), text.size()));
  } catch (...) {
  }
}
#endif

void message(LogLevel level, std::string_view text) noexcept {
  try {
    State& s = state();
    const Level l = to_level(level);
    if (l < s.level.load(std::memory_order_relaxed) || l == kOff) return;
    if (s.complaint_pending.load(std::memory_order_relaxed)) s.say_env_complaint();
    s.write(l, text);
  } catch (...) {
  }
}

void lock_for_fork() noexcept { state().mu.lock(); }
void unlock_after_fork() noexcept { state().mu.unlock(); }

}  // namespace weightcache::log

namespace weightcache {

void set_log_level(LogLevel level) noexcept {
  try {
    const int v = static_cast<int>(level);
    if (v < WC_LOG_TRACE || v > WC_LOG_OFF || v == WC_LOG_OFF - 1) {
      // Not one of the enum's values (5 is spdlog's "critical", which the enum does not have):
      // refused, as documented, so that a stray value neither silences warnings nor floods.
      log::warn("log level {} is not one of wc_log_level's values (0 to 4, or 6 for off); the level stays as it was", v);
      return;
    }
    log::state().level.store(log::to_level(level), std::memory_order_relaxed);
  } catch (...) {
  }
}

void log_message(LogLevel level, std::string_view message) noexcept {
  const int v = static_cast<int>(level);
  if (v < WC_LOG_TRACE || v > WC_LOG_ERROR) {
    log::warn("wc_log_message: level {} is not one of WC_LOG_TRACE (0) to WC_LOG_ERROR (4); the message is dropped", v);
    return;
  }
  log::message(level, message);
}

void set_log_callback(wc_log_callback callback, void* user) noexcept {
  try {
    log::State& s = log::state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.cb = callback;
    s.user = user;
  } catch (...) {
  }
}

}  // namespace weightcache
