#include "log.hpp"

#include <weightcache/weight_cache.hpp>

#include <spdlog/sinks/base_sink.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace weightcache::log {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

wc_log_level to_c(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return WC_LOG_TRACE;
    case spdlog::level::debug: return WC_LOG_DEBUG;
    case spdlog::level::info: return WC_LOG_INFO;
    case spdlog::level::warn: return WC_LOG_WARN;
    case spdlog::level::err:
    case spdlog::level::critical: return WC_LOG_ERROR;
    default: return WC_LOG_OFF;
  }
}

// One sink that writes to stderr or, when the host installed one, to its callback.
class RoutingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set_callback(wc_log_callback cb, void* user) {
    std::lock_guard<std::mutex> lock(mutex_);
    cb_ = cb;
    user_ = user;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (cb_ != nullptr) {
      cb_(user_, to_c(msg.level), msg.payload.data(), msg.payload.size());
      return;
    }
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::fwrite(buf.data(), 1, buf.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  wc_log_callback cb_ = nullptr;
  void* user_ = nullptr;
};

struct State {
  std::shared_ptr<RoutingSink> sink = std::make_shared<RoutingSink>();
  std::shared_ptr<spdlog::logger> logger;
  State() {
    logger = std::make_shared<spdlog::logger>("weightcache", sink);
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [weightcache] [%l] %v");
    logger->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("WEIGHTCACHE_LOG_LEVEL"); env != nullptr && *env != '\0') {
      // spdlog reads any word it does not know as "off": a typo ("warnings") would silence the
      // very warnings it meant to keep. Only the names below change the level; anything else
      // keeps warn and says so, once (this runs once per process).
      const std::string name = env;
      const auto level = spdlog::level::from_str(name);
      if (level != spdlog::level::off || name == "off") {
        logger->set_level(level);
      } else {
        logger->warn("WEIGHTCACHE_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical or off); "
                     "logging at warn",
                     name.size() > 64 ? name.substr(0, 64) + "..." : name);
      }
    }
  }
};

State& state() {
  static State* s = new State();  // never destroyed: logging may happen during static teardown
  return *s;
}

}  // namespace

spdlog::logger& get() { return *state().logger; }

}  // namespace weightcache::log

namespace weightcache {

void set_log_level(LogLevel level) noexcept {
  try { log::state().logger->set_level(log::to_spdlog(level)); } catch (...) {}
}

void set_log_callback(wc_log_callback callback, void* user) noexcept {
  try { log::state().sink->set_callback(callback, user); } catch (...) {}
}

}  // namespace weightcache
