// GoogleTest-side helpers for the unit suite.
#pragma once

#include "cache_test_util.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>

namespace weightcache::test {

#ifndef WEIGHTCACHE_UNIT_CHILD
#error "WEIGHTCACHE_UNIT_CHILD must name the helper executable (see tests/unit/CMakeLists.txt)"
#endif
inline const std::string kChildExe = WEIGHTCACHE_UNIT_CHILD;

/// Runs the helper process and asserts it exited 0.
inline ::testing::AssertionResult child_succeeds(const std::vector<std::string>& args) {
  const ExitStatus st = run_process(kChildExe, args);
  if (st.ok()) return ::testing::AssertionSuccess();
  std::string cmd;
  for (const auto& a : args) cmd += " " + a;
  return ::testing::AssertionFailure() << "cache_child" << cmd << ": " << st.describe();
}

/// Opens a cache, failing the test (with the library's message) when it cannot.
inline WeightCache open_or_fail(const Options& o) {
  auto r = WeightCache::open(o);
  EXPECT_TRUE(r.ok()) << "open('" << o.path << "'): " << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r.value()) : WeightCache{};
}

/// Everything a no-op must leave alone: size and modification time to the nanosecond.
struct FileState {
  std::uint64_t size = 0;
  std::int64_t mtime_sec = 0;
  std::int64_t mtime_nsec = 0;
  bool operator==(const FileState&) const = default;
};

inline FileState file_state(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {static_cast<std::uint64_t>(st.st_size), st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
}

inline std::ostream& operator<<(std::ostream& os, const FileState& s) {
  return os << "{size " << s.size << ", mtime " << s.mtime_sec << "." << s.mtime_nsec << "}";
}

/// Sets the file's mtime to a fixed instant in the past, so any later write shows up as a
/// changed mtime even within one tick of the file system's clock.
inline void set_past_mtime(const std::string& path) {
  const struct timespec times[2] = {{978307200, 123456789}, {978307200, 123456789}};  // 2001-01-01
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

inline std::uint64_t file_size(const std::string& path) { return file_state(path).size; }

/// Captures the library's log while alive (level warn and up), then restores the stderr sink.
class LogCapture {
 public:
  struct Message {
    wc_log_level level;
    std::string text;
  };

  LogCapture() {
    set_log_level(LogLevel::warn);
    set_log_callback(&LogCapture::on_message, this);
  }
  ~LogCapture() { set_log_callback(nullptr, nullptr); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<Message> at_least(wc_log_level level) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Message> out;
    for (const auto& m : messages_)
      if (m.level >= level && m.level != WC_LOG_OFF) out.push_back(m);
    return out;
  }

 private:
  static void on_message(void* user, wc_log_level level, const char* message, size_t size) {
    auto* self = static_cast<LogCapture*>(user);
    std::lock_guard<std::mutex> lock(self->mu_);
    self->messages_.push_back({level, std::string(message, size)});
  }
  mutable std::mutex mu_;
  std::vector<Message> messages_;
};

}  // namespace weightcache::test
