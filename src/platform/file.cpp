#include "platform/file.hpp"

#include "platform/platform.hpp"

namespace weightcache::platform {

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    close();
    owner_ = o.owner_;
    h_ = o.h_;
    path_ = std::move(o.path_);
    o.h_ = kInvalidHandle;
  }
  return *this;
}

void File::close() noexcept {
  if (h_ == kInvalidHandle) return;
  owner_->close_file(h_);
  h_ = kInvalidHandle;
}

File File::handed_to(Platform& owner) && noexcept {
  File out(owner, h_, std::move(path_));
  h_ = kInvalidHandle;
  return out;
}

Result<Lease> Lease::try_take(File lock_file) {
  if (!lock_file.is_open()) return Error{Errc::invalid_argument, 0, "no open lock file to take a lease on"};
  auto got = lock_file.owner_->try_lock(lock_file);
  if (!got) return got.error();
  return Lease(std::move(lock_file), got.value());
}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    file_ = std::move(o.file_);
    held_ = o.held_;
    o.held_ = false;
  }
  return *this;
}

void Lease::release() noexcept {
  if (held_ && file_.is_open()) file_.owner_->unlock(file_);
  held_ = false;
  file_.close();
}

}  // namespace weightcache::platform
