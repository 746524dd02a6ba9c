// The owners of what the platform seam opens: an open file (with the path it was opened as, so
// that every error about it names it) and the writer lease held through one. Move-only, and the
// destructor gives the resource back: no caller closes or unlocks by hand. (The address-space
// reservation's owner is in address_space.hpp.)
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
  friend class Lease;  // locks through the file's owner
  Platform* owner_ = nullptr;
  Handle h_ = kInvalidHandle;
  std::string path_;
};

/// The writer lease on an open lock file (Platform::try_lock), held while this object lives:
/// the destructor unlocks and closes the file. What the library's one-shot writers take (wc_compact,
/// the CLI's convert) on "<cache>.lock", the same lock every cache writer takes; a Core, which
/// takes and gives back its lease many times over one open lock file, keeps its own state (and
/// a forked child must close that file without unlocking the parent's lease).
class Lease {
 public:
  Lease() noexcept = default;
  /// Tries for the lease on `lock_file` without waiting. The Lease keeps the file either way;
  /// held() says whether it got the lease (false: another handle holds it). Errors: the OS's.
  static Result<Lease> try_take(File lock_file);
  Lease(Lease&& o) noexcept : file_(std::move(o.file_)), held_(o.held_) { o.held_ = false; }
  Lease& operator=(Lease&& o) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { release(); }

  bool held() const noexcept { return held_; }
  const File& file() const noexcept { return file_; }
  /// Gives the lease back (when held) and closes the lock file.
  void release() noexcept;

 private:
  Lease(File f, bool held) noexcept : file_(std::move(f)), held_(held) {}
  File file_;
  bool held_ = false;
};

}  // namespace weightcache::platform
