// GoogleTest-side helpers for the unit suite.
#pragma once

#include "cache_test_util.hpp"
#include "file_time.hpp"
#include "log_capture.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace weightcache::test {

#ifndef WEIGHTCACHE_UNIT_CHILD
#error "WEIGHTCACHE_UNIT_CHILD must name the helper executable (see tests/unit/CMakeLists.txt)"
#endif
inline const std::string kChildExe = helper_exe(WEIGHTCACHE_UNIT_CHILD);

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

/// Everything a no-op must leave alone: size and modification time at the file system's
/// resolution.
struct FileState {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileState&) const = default;
};

inline FileState file_state(const std::string& path) {
  FileTimes t;
  EXPECT_TRUE(read_file_times(path, &t)) << path;
  return {t.size, t.mtime_ns};
}

inline std::ostream& operator<<(std::ostream& os, const FileState& s) {
  return os << "{size " << s.size << ", mtime " << s.mtime_ns / 1000000000 << "." << s.mtime_ns % 1000000000 << "}";
}

/// Sets the file's mtime to a fixed instant in the past, so any later write shows up as a
/// changed mtime even within one tick of the file system's clock.
inline void set_past_mtime(const std::string& path) {
  ASSERT_TRUE(set_file_mtime(path, 978307200123456700)) << path;  // 2001-01-01, a multiple of 100 ns
}

inline std::uint64_t file_size(const std::string& path) { return file_state(path).size; }

/// True where a read-write open may grow a finalized file: the Win32 backend's legacy mapping
/// mode (Wine 8, Windows before 10 1803) grows a file whose size is not a multiple of 64 KiB to
/// the granule's end (docs/PLATFORMS.md), and the last close does not cut it back when the
/// cache wrote nothing. Tests that a no-op leaves the file alone cannot hold there.
inline bool open_may_grow_file() {
#ifdef _WIN32
  return legacy_mapping();
#else
  return false;
#endif
}

}  // namespace weightcache::test
