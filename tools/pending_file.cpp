#include "pending_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::cli {
namespace {

Error os_error(int err, const std::string& what) {
  return Error{err == ENOSPC || err == EDQUOT ? Errc::no_space : Errc::io, err, what + ": " + std::strerror(err)};
}

}  // namespace

PendingFile::PendingFile(int fd, std::string dir, std::string temp, std::string final_path) noexcept
    : fd_(fd), dir_(std::move(dir)), temp_(std::move(temp)), final_(std::move(final_path)) {}

PendingFile::PendingFile(PendingFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)),
      dir_(std::move(other.dir_)),
      temp_(std::move(other.temp_)),
      final_(std::move(other.final_)) {}

PendingFile::~PendingFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

Result<PendingFile> PendingFile::create(const std::string& dir, const std::string& name) {
  static std::atomic<unsigned> counter{0};
  const std::string final_path = dir + "/" + name;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string temp =
        dir + "/" + name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return PendingFile(fd, dir, temp, final_path);
    if (errno != EEXIST) return os_error(errno, "cannot create '" + temp + "'");
  }
  return Error{Errc::io, EEXIST, "cannot find a free temporary name for '" + final_path + "'"};
}

Result<void> PendingFile::write(const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size != 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return os_error(n < 0 ? errno : EIO, "cannot write '" + temp_ + "'");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return {};
}

Result<void> PendingFile::sync() {
  if (::fsync(fd_) != 0) return os_error(errno, "cannot sync '" + temp_ + "'");
  return {};
}

Result<void> PendingFile::set_mode(unsigned mode) {
  if (::fchmod(fd_, static_cast<mode_t>(mode)) != 0) return os_error(errno, "cannot set the mode of '" + temp_ + "'");
  return {};
}

Result<void> PendingFile::commit() {
  if (auto r = sync(); !r) return r;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return os_error(errno, "cannot close '" + temp_ + "'");
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    return os_error(errno, "cannot rename '" + temp_ + "' to '" + final_ + "'");
  committed_ = true;
  return sync_directory(dir_);
}

Result<void> PendingFile::commit_as(const std::string& name) {
  final_ = dir_ + "/" + name;
  return commit();
}

Result<void> sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error(errno, "cannot open the directory '" + dir + "'");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return os_error(err, "cannot sync the directory '" + dir + "'");
  return {};
}

}  // namespace weightcache::cli
