// The path each open file handle was opened with, so that an error about a handle names its
// file ("cannot allocate disk space for '/var/cache/app/model.wcache'", not for "<cache>").
// Shared by the OS implementations: open_file adds, close_file removes. Best effort: without
// memory for an entry, its messages name "(unknown file)".
#pragma once

#include "platform/platform.hpp"

#include <mutex>
#include <string>
#include <unordered_map>

namespace weightcache::platform {

class HandlePaths {
 public:
  void add(Handle h, const std::string& path) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      paths_[h] = path;
    } catch (...) {
    }
  }
  void remove(Handle h) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.erase(h);
  }
  /// The path `h` was opened with. Allocates: for building an error message.
  std::string of(Handle h) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = paths_.find(h);
    return it == paths_.end() ? std::string("(unknown file)") : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<Handle, std::string> paths_;
};

/// The process's table (descriptors and handles are process-wide too).
inline HandlePaths& handle_paths() noexcept {
  static HandlePaths* paths = new HandlePaths;  // never destroyed: caches may close after exit starts
  return *paths;
}

}  // namespace weightcache::platform
