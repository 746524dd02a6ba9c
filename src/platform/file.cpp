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

}  // namespace weightcache::platform
