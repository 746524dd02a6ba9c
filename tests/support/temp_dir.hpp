// A fresh directory under the system's temporary directory ($TMPDIR or /tmp on POSIX,
// GetTempPathW on Windows) that is removed, with everything in it, on destruction. Tests create
// files only inside one of these.
#pragma once

#include <atomic>
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
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    std::error_code ec;
    const fs::path base = fs::temp_directory_path(ec);
    if (ec) throw std::runtime_error("no temporary directory: " + ec.message());
    // mkdtemp's contract without mkdtemp: a name nobody holds (create_directory reports false,
    // no error, when it exists), readable by the owner only where permission bits exist.
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      const fs::path candidate = base / (prefix + "-" + std::to_string(rd()) + "-" + std::to_string(counter++));
      if (fs::create_directory(candidate, ec)) {
        path_ = candidate;
#ifndef _WIN32
        fs::permissions(path_, fs::perms::owner_all, ec);
#endif
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
  /// Path of `name` (UTF-8) inside the directory (not created), as UTF-8: the library takes
  /// UTF-8 paths on every platform.
  std::string file(const std::string& name) const {
    const auto u8 = (path_ / std::filesystem::u8path(name)).u8string();
    return std::string(u8.begin(), u8.end());
  }

 private:
  std::filesystem::path path_;
};

}  // namespace weightcache::test
