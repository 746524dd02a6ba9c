// A fresh directory under the system's temporary directory ($TMPDIR on POSIX, GetTempPath on
// Windows) that is removed, with everything in it, on destruction. The same interface as
// tests/support/temp_dir.hpp, without mkdtemp: the Windows build puts this directory first on
// the include path so that suites written for POSIX (tests/format/golden_test.cpp) build there.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace weightcache::test {

class TempDir {
 public:
  explicit TempDir(std::string prefix = "weightcache-test") {
    static std::atomic<unsigned> counter{0};
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) throw std::runtime_error("no temporary directory: " + ec.message());
    std::random_device rd;
    const auto ticks = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::string name = prefix + "-" + std::to_string(rd()) + "-" + std::to_string(ticks % 1000000) + "-" +
                               std::to_string(counter.fetch_add(1));
      // create_directory reports false (no error) when the name is taken: try another.
      if (std::filesystem::create_directory(base / name, ec)) {
        path_ = base / name;
        return;
      }
      if (ec) throw std::runtime_error("cannot create a directory in " + base.string() + ": " + ec.message());
    }
    throw std::runtime_error("cannot find a free temporary directory name in " + base.string());
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  /// Path of `name` (UTF-8) inside the directory (not created), as UTF-8.
  std::string file(const std::string& name) const {
    const auto u8 = (path_ / std::filesystem::u8path(name)).u8string();
    return std::string(u8.begin(), u8.end());
  }

 private:
  std::filesystem::path path_;
};

}  // namespace weightcache::test
