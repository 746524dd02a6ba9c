// The owner of what the platform seam opens: an open file, with the path it was opened as, so
// that every error about it names it. Move-only, and the destructor closes it: no caller closes
// by hand.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <string>

namespace weightcache::platform {

using Handle = std::intptr_t;
inline constexpr Handle kInvalidHandle = -1;

class Platform;

/// An open file: the OS handle, what it was opened as (its path, or a label such as "fd 7" or
/// ":memory:") for messages, and the platform that opened it, which closes it when the File is
/// destroyed, assigned over or closed. Move-only. Not thread-safe: one owner at a time.
class File {
 public:
  File() noexcept = default;
  /// Takes `h`, opened through `owner`. Only a Platform makes these (open_file, reopen,
  /// create_anonymous), or a platform that wraps another (handed_to).
  File(Platform& owner, Handle h, std::string path) noexcept : owner_(&owner), h_(h), path_(std::move(path)) {}
  File(File&& o) noexcept : owner_(o.owner_), h_(o.h_), path_(std::move(o.path_)) { o.h_ = kInvalidHandle; }
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { close(); }

  Handle handle() const noexcept { return h_; }
  /// What the file was opened as; stays after close(), for messages about what it was.
  const std::string& path() const noexcept { return path_; }
  /// Names the file otherwise in messages (a caller's label for a descriptor it handed over).
  void set_path(std::string path) noexcept { path_ = std::move(path); }
  bool is_open() const noexcept { return h_ != kInvalidHandle; }
  /// Closes the handle now (Platform::close_file of its owner), and with it every lock taken
  /// through it. A no-op when closed already.
  void close() noexcept;
  /// The same file, owned by `owner` from now on: a platform that wraps another gives its callers
  /// what the inner one opened this way, so that their closes come back through it.
  File handed_to(Platform& owner) && noexcept;

 private:
  Platform* owner_ = nullptr;
  Handle h_ = kInvalidHandle;
  std::string path_;
};

}  // namespace weightcache::platform
