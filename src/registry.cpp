#include "registry.hpp"

#include <map>
#include <mutex>
#include <tuple>

namespace weightcache::registry {
namespace {

using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, bool>;  // dev, inode, compat, ro

struct Registry {
  std::mutex mu;
  std::map<Key, std::weak_ptr<Core>> caches;
};

Registry& instance() {
  static Registry* r = new Registry();  // outlives static destructors of hosts
  return *r;
}

}  // namespace

Result<std::shared_ptr<Core>> open(const Options& options) noexcept {
  const bool file_candidate = !options.path.empty() && options.backing != Backing::heap && !options.private_cache;
  if (!file_candidate) return Core::open(options, platform::os());
  try {
    Registry& reg = instance();
    // Held across the open so two threads opening one path end with one Core. Opening may wait
    // for another process's lease only while creating a file, which is short.
    std::lock_guard<std::mutex> lock(reg.mu);
    const std::uint64_t compat = format::hash_bytes(options.compat_key);
    if (auto st = platform::os().stat_path(options.path, options.allow_symlink); st) {
      auto it = reg.caches.find(Key{st->device, st->inode, compat, options.read_only});
      if (it != reg.caches.end()) {
        if (auto core = it->second.lock()) return core;
      }
    }
    auto core = Core::open(options, platform::os());
    if (!core) return core;
    if (core.value()->file_backed()) {
      const auto id = core.value()->identity();
      reg.caches[Key{id.device, id.inode, compat, options.read_only}] = core.value();
    }
    for (auto it = reg.caches.begin(); it != reg.caches.end();) {
      it = it->second.expired() ? reg.caches.erase(it) : std::next(it);
    }
    return core;
  } catch (...) {
    return fail({Errc::no_memory, 0, "out of memory while opening the cache"});
  }
}

std::size_t live_count() noexcept {
  Registry& reg = instance();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::size_t n = 0;
  for (const auto& [k, w] : reg.caches) n += w.expired() ? 0 : 1;
  return n;
}

}  // namespace weightcache::registry
