// A new file written under a temporary name beside its final one, and renamed into place only
// when committed: "if commit() is not called, the file is deleted in the destructor" (LLVM's
// FileOutputBuffer). Every file the artifact commands write goes through it, so a crash or a
// failed check never leaves a file whose name claims content it does not have (a blob named by
// a digest its bytes do not hash to, a cache under its final name that failed its checks).
#pragma once

#include <weightcache/weight_cache.hpp>

#include <cstddef>
#include <string>

namespace weightcache::cli {

class PendingFile {
 public:
  /// Creates `<dir>/<name>.tmp.<pid>.<n>` (mode 0644 under the umask), exclusively: a name
  /// nobody holds. The library's own temporaries are named so: `gc` never takes one for a cache. Errors: io with the
  /// OS's errno and a message naming the path; no_space. Like every call here, it may throw std::bad_alloc (messages
  /// are built as strings).
  static Result<PendingFile> create(const std::string& dir, const std::string& name);
  PendingFile(PendingFile&& other) noexcept;
  PendingFile& operator=(PendingFile&&) = delete;
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  /// Closes the file and removes it unless commit() succeeded.
  ~PendingFile();

  /// Appends `size` bytes. Errors: io, no_space.
  Result<void> write(const void* data, std::size_t size);
  /// Flushes the bytes to the device (fsync). Errors: io, no_space.
  Result<void> sync();
  /// Sets the permission bits. Errors: io.
  Result<void> set_mode(unsigned mode);
  /// sync(), close, rename to `<dir>/<name>` (replacing what is there), then sync the directory so
  /// the rename is durable. After an error the temporary is still removed by the destructor.
  Result<void> commit();
  /// commit() under another final name in the same directory: for a file named by its content's
  /// digest, known only once it is written.
  Result<void> commit_as(const std::string& name);

  /// The temporary's path (for reading it back before commit).
  const std::string& temp_path() const noexcept { return temp_; }
  const std::string& final_path() const noexcept { return final_; }

 private:
  PendingFile(int fd, std::string dir, std::string temp, std::string final_path) noexcept;
  int fd_ = -1;
  bool committed_ = false;
  std::string dir_, temp_, final_;
};

/// fsync of a directory, so that renames and new names in it are durable. Errors: io.
Result<void> sync_directory(const std::string& dir);

}  // namespace weightcache::cli
