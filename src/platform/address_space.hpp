// The owner of a range of reserved address space (Platform::reserve_address_space): released,
// with everything mapped or committed inside it, when the owner is destroyed, assigned over or
// released. A Core's file mirror and each chunk of its heap arena are one.
#pragma once

#include "platform/platform.hpp"

#include <cstddef>

namespace weightcache::platform {

class AddressReservation {
 public:
  AddressReservation() noexcept = default;
  /// Reserves `size` bytes aligned to `align` through `pf` (see Platform::reserve_address_space).
  static Result<AddressReservation> reserve(Platform& pf, std::size_t size, std::size_t align) {
    auto r = pf.reserve_address_space(size, align);
    if (!r) return r.error();
    return AddressReservation(pf, static_cast<std::byte*>(r.value()), size);
  }
  AddressReservation(AddressReservation&& o) noexcept : pf_(o.pf_), base_(o.base_), size_(o.size_) {
    o.base_ = nullptr;
    o.size_ = 0;
  }
  AddressReservation& operator=(AddressReservation&& o) noexcept {
    if (this != &o) {
      release();
      pf_ = o.pf_;
      base_ = o.base_;
      size_ = o.size_;
      o.base_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  AddressReservation(const AddressReservation&) = delete;
  AddressReservation& operator=(const AddressReservation&) = delete;
  ~AddressReservation() { release(); }

  /// The start of the range; nullptr when nothing is reserved.
  std::byte* base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  bool contains(const std::byte* p) const noexcept { return base_ != nullptr && p >= base_ && p < base_ + size_; }
  /// Gives the range back now (a no-op when nothing is reserved).
  void release() noexcept {
    if (base_ != nullptr) pf_->release_address_space(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

 private:
  AddressReservation(Platform& pf, std::byte* base, std::size_t size) noexcept : pf_(&pf), base_(base), size_(size) {}
  Platform* pf_ = nullptr;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace weightcache::platform
