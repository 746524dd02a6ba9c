// The C++ handle: a thin, non-throwing shell over Core.
#include "registry.hpp"

namespace weightcache {

const char* to_string(Errc code) noexcept { return wc_status_string(static_cast<wc_status>(code)); }

WeightCache::WeightCache() noexcept = default;
WeightCache::WeightCache(std::shared_ptr<Core> core) noexcept : core_(std::move(core)) {}
WeightCache::~WeightCache() = default;
WeightCache::WeightCache(WeightCache&&) noexcept = default;
WeightCache& WeightCache::operator=(WeightCache&&) noexcept = default;

Result<WeightCache> WeightCache::open(const Options& options) noexcept {
  auto core = registry::open(options);
  if (!core) return core.error();
  return WeightCache(std::move(core.value()));
}

namespace {
const Error& no_cache() {
  static const Error e{Errc::invalid_argument, 0, "operation on an empty WeightCache handle"};
  set_last_error(e);
  return e;
}
}  // namespace

std::size_t WeightCache::look_up(std::string_view key) noexcept {
  if (!core_) return (no_cache(), kNotFound);
  return core_->look_up(key);
}
void* WeightCache::reserve(std::size_t size) noexcept {
  if (!core_) return (no_cache(), nullptr);
  return core_->reserve(size);
}
Result<void> WeightCache::release(void* ptr) noexcept {
  if (!core_) return no_cache();
  return core_->release(ptr);
}
std::size_t WeightCache::look_up_or_insert(std::string_view key, void* ptr, std::size_t size) noexcept {
  if (!core_) return (no_cache(), kNotFound);
  return core_->look_up_or_insert(key, ptr, size);
}
std::size_t WeightCache::insert(std::string_view key, std::string_view bytes) noexcept {
  static char empty = 0;
  void* p = bytes.empty() ? &empty : const_cast<char*>(bytes.data());
  return look_up_or_insert(key, p, bytes.size());
}
void* WeightCache::offset_to_addr(std::size_t offset) const noexcept {
  return core_ ? core_->offset_to_addr(offset) : nullptr;
}
Result<void> WeightCache::finalize() noexcept {
  if (!core_) return no_cache();
  return core_->finalize();
}
bool WeightCache::is_finalized() const noexcept { return core_ ? core_->is_finalized() : false; }
Result<void> WeightCache::refresh() noexcept {
  if (!core_) return no_cache();
  return core_->refresh();
}
Stats WeightCache::stats() const noexcept { return core_ ? core_->stats() : Stats{}; }
std::size_t WeightCache::alignment() const noexcept { return core_ ? core_->alignment() : 0; }

int WeightCache::descriptor() const noexcept { return core_ ? core_->descriptor() : -1; }

}  // namespace weightcache
