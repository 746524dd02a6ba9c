// The C++ handle: a thin, non-throwing shell over Core.
#include "boundary.hpp"
#include "registry.hpp"

namespace weightcache {

const char* to_string(Errc code) noexcept { return errc_text(code); }

WeightCache::WeightCache() noexcept = default;
WeightCache::WeightCache(std::shared_ptr<Core> core) noexcept : core_(std::move(core)) {}
WeightCache::~WeightCache() {
  guard_void("WeightCache::~WeightCache", [&] { core_.reset(); });
}
WeightCache::WeightCache(WeightCache&&) noexcept = default;
WeightCache& WeightCache::operator=(WeightCache&& other) noexcept {
  if (this != &other) {
    guard_void("WeightCache::operator=", [&] { core_.reset(); });  // may close a cache
    core_ = std::move(other.core_);
  }
  return *this;
}

Result<WeightCache> WeightCache::open(const Options& options) noexcept {
  return guard_result("WeightCache::open", [&]() -> Result<WeightCache> {
    auto core = registry::open(options);
    if (!core) return core.error();
    return WeightCache(std::move(core.value()));
  });
}

namespace {
Error no_cache() {
  Error e{Errc::invalid_argument, 0, "operation on an empty WeightCache handle"};
  set_last_error(e);
  return e;
}
}  // namespace

std::size_t WeightCache::look_up(std::string_view key) noexcept {
  return guard("WeightCache::look_up", kNotFound, [&] { return core_ ? core_->look_up(key) : (no_cache(), kNotFound); });
}
void* WeightCache::reserve(std::size_t size) noexcept {
  return guard("WeightCache::reserve", static_cast<void*>(nullptr),
               [&] { return core_ ? core_->reserve(size) : (no_cache(), nullptr); });
}
Result<void> WeightCache::release(void* ptr) noexcept {
  return guard_result("WeightCache::release", [&]() -> Result<void> {
    if (!core_) return no_cache();
    return core_->release(ptr);
  });
}
std::size_t WeightCache::look_up_or_insert(std::string_view key, void* ptr, std::size_t size) noexcept {
  return guard("WeightCache::look_up_or_insert", kNotFound,
               [&] { return core_ ? core_->look_up_or_insert(key, ptr, size) : (no_cache(), kNotFound); });
}
std::size_t WeightCache::look_up_or_insert(std::string_view key, void* ptr, std::size_t size,
                                           std::uint64_t* finalize_ticket) noexcept {
  if (finalize_ticket != nullptr) *finalize_ticket = 0;
  return guard("WeightCache::look_up_or_insert", kNotFound, [&] {
    return core_ ? core_->look_up_or_insert(key, ptr, size, finalize_ticket) : (no_cache(), kNotFound);
  });
}
std::size_t WeightCache::insert(std::string_view key, std::string_view bytes) noexcept {
  static char empty = 0;
  void* p = bytes.empty() ? &empty : const_cast<char*>(bytes.data());
  return look_up_or_insert(key, p, bytes.size());
}
void* WeightCache::offset_to_addr(std::size_t offset) const noexcept {
  if (!core_) return nullptr;
  return guard("WeightCache::offset_to_addr", static_cast<void*>(nullptr), [&] { return core_->offset_to_addr(offset); });
}
void* WeightCache::offset_to_addr_kept(std::size_t offset) const noexcept {
  if (!core_) return nullptr;
  return guard("WeightCache::offset_to_addr_kept", static_cast<void*>(nullptr),
               [&] { return core_->offset_to_addr(offset, /*replaced_too=*/true); });
}
Result<void> WeightCache::finalize() noexcept {
  return guard_result("WeightCache::finalize", [&]() -> Result<void> {
    if (!core_) return no_cache();
    return core_->finalize();
  });
}
bool WeightCache::is_finalized() const noexcept { return core_ ? core_->is_finalized() : false; }
bool WeightCache::is_finalized_through(std::uint64_t ticket) const noexcept {
  return core_ && (ticket == 0 || core_->finalizes_started() >= ticket);
}
Result<void> WeightCache::refresh() noexcept {
  return guard_result("WeightCache::refresh", [&]() -> Result<void> {
    if (!core_) return no_cache();
    return core_->refresh();
  });
}
Stats WeightCache::stats() const noexcept {
  if (!core_) return Stats{};
  return guard("WeightCache::stats", Stats{}, [&] { return core_->stats(); });
}
std::string WeightCache::path() const { return core_ ? core_->path() : std::string(); }
std::size_t WeightCache::alignment() const noexcept { return core_ ? core_->alignment() : 0; }

int WeightCache::descriptor() const noexcept { return core_ ? core_->descriptor() : -1; }
void* WeightCache::file_handle() const noexcept { return core_ ? core_->os_handle() : nullptr; }

}  // namespace weightcache
