#include "registry.hpp"

#include "fork_guard.hpp"
#include "format/format.hpp"
#include "log.hpp"
#include "platform/errors.hpp"
#include "prebuilt.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <mutex>
#include <tuple>
#include <vector>

namespace weightcache::registry {
namespace {

using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, bool>;  // dev, inode, compat, ro

struct DescriptorCache {
  std::uint64_t device, inode, compat;
  std::weak_ptr<Core> core;
};

struct Registry {
  std::mutex mu;
  std::map<Key, std::weak_ptr<Core>> caches;
  // Caches on a caller's descriptor or handle: never shared (each open is a cache of its own),
  // kept only so that an open under another compatibility key is refused as by path.
  std::vector<DescriptorCache> descriptor_caches;
  std::map<std::string, std::shared_ptr<std::mutex>> opening;  // per-file gates for opens in progress
};

Registry& instance() {
  static Registry* r = new Registry();  // outlives static destructors of hosts
  return *r;
}

// A cache opened by the process this one was forked from is the parent's: its lease, lock
// descriptors and reservations are shared with the parent. A child that opens the file gets a
// cache of its own (weightcache.h, "fork()").
std::shared_ptr<Core> live(const std::weak_ptr<Core>& w) {
  auto core = w.lock();
  return core && !core->inherited_across_fork() ? core : nullptr;
}

std::shared_ptr<Core> find_locked(Registry& reg, const Options& options, std::uint64_t compat) {
  auto st = platform::os().stat_path(options.path, options.allow_symlink);
  if (!st) return nullptr;
  auto it = reg.caches.find(Key{st->device, st->inode, compat, options.read_only});
  if (it != reg.caches.end()) return live(it->second);
  // A symlink to a file this process already has open as a cache names that cache: share it.
  // Nothing is opened or created through the link, so the refusal of symlinks (which guards
  // against being steered into writing some other file) does not apply.
  if (options.allow_symlink || !st->symlink) return nullptr;
  auto target = platform::os().stat_path(options.path, true);
  if (!target) return nullptr;
  it = reg.caches.find(Key{target->device, target->inode, compat, options.read_only});
  return it == reg.caches.end() ? nullptr : live(it->second);
}

// Whether this file is open in this process under another compatibility key. Opening it would
// find it incompatible and rebuild it under the lease, which this process may hold already (a
// wait of lease_timeout against ourselves), or rename a new file over the live cache's.
bool other_key_live_locked(Registry& reg, std::uint64_t device, std::uint64_t inode, std::uint64_t compat) {
  for (const auto& [k, w] : reg.caches)
    if (std::get<0>(k) == device && std::get<1>(k) == inode && std::get<2>(k) != compat && live(w)) return true;
  for (const auto& d : reg.descriptor_caches)
    if (d.device == device && d.inode == inode && d.compat != compat && live(d.core)) return true;
  return false;
}

bool open_with_other_key_locked(Registry& reg, const Options& options, std::uint64_t compat) {
  auto st = platform::os().stat_path(options.path, options.allow_symlink);
  return st && other_key_live_locked(reg, st->device, st->inode, compat);
}

// This process cannot share its cache with an opener: with backing=file that is an error, with
// automatic backing the opener gets a private heap cache and one warning.
Result<std::shared_ptr<Core>> cannot_share(const Options& options, const std::string& why) {
  Error e{Errc::incompatible, 0, "'" + options.path + why};
  if (options.backing == Backing::file) return fail(e);
  log::warn("{}; using a private heap cache", e.message);
  Options heap = options;
  heap.private_cache = true;
  auto core = Core::open(heap, platform::os());
  if (core) core.value()->set_heap_reason(e);
  return core;
}

Result<std::shared_ptr<Core>> refuse_other_key(const Options& options) {
  return cannot_share(options,
                      "' is open in this process under another compatibility key; close that cache first, or "
                      "give each compatibility key its own path");
}

// A shared cache serves a second opener only if it honours that opener's alignment; the other
// options of the first opener stay in force (documented on Options).
Result<std::shared_ptr<Core>> share(std::shared_ptr<Core> core, const Options& options) {
  if (core->alignment() % options.alignment == 0) return core;
  return cannot_share(options, "' is already open in this process with alignment " +
                                   std::to_string(core->alignment()) + ", weaker than the " +
                                   std::to_string(options.alignment) + " asked for; open it with one alignment everywhere");
}

// Keys for "an open of this file is in progress", whatever its compatibility key and mode, so
// that two opens of one file under two keys take turns and the second is refused as
// incompatible instead of racing the first to a rebuild. A path open holds the gate of its path
// (its existing directories resolved), then the gate of the file's identity where it exists; a
// descriptor open holds only the latter (its file cannot change under it). The path's gate is
// the one that serialises path opens: a rebuild gives the path a new identity meanwhile.
std::string path_gate_key(const Options& options) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(options.path, ec);
  return "path:" + (ec ? options.path : p.string());
}

std::string identity_gate_key(std::uint64_t device, std::uint64_t inode) {
  return "id:" + std::to_string(device) + ':' + std::to_string(inode);
}

std::shared_ptr<std::mutex> gate_locked(Registry& reg, const std::string& key) {
  auto& g = reg.opening[key];
  if (!g) g = std::make_shared<std::mutex>();
  return g;
}

void prune_gates_locked(Registry& reg, const std::shared_ptr<std::mutex>& ours) {
  for (auto it = reg.opening.begin(); it != reg.opening.end();)
    it = it->second.use_count() == 1 && it->second != ours ? reg.opening.erase(it) : std::next(it);
}

// A cache on the caller's descriptor or handle: a cache of its own, but refused (as by path)
// when this process has the same file open under another compatibility key, which would find
// the file incompatible and wait for a rebuild that its own other cache keeps from happening.
Result<std::shared_ptr<Core>> open_descriptor(const Options& options) {
  Registry& reg = instance();
  const std::uint64_t compat = format::hash_bytes(options.compat_key);
  auto& pf = platform::os();
  auto f = options.handle != nullptr ? pf.reopen_os_handle(options.handle, false) : pf.reopen(options.fd, false);
  auto st = f ? pf.stat_file(f.value()) : Result<platform::FileInfo>(f.error());
  // Writable opens of one file take turns (see opening_key), by path or descriptor alike. Not a
  // read-only one: it never rebuilds, and may wait for a writer of this process to set an empty
  // file up.
  std::shared_ptr<std::mutex> gate;
  if (st && !options.read_only) {
    std::lock_guard<std::mutex> lock(reg.mu);
    gate = gate_locked(reg, identity_gate_key(st->device, st->inode));
  }
  std::unique_lock<std::mutex> opening;
  if (gate) opening = std::unique_lock<std::mutex>(*gate);
  if (st) {
    std::lock_guard<std::mutex> lock(reg.mu);
    if (other_key_live_locked(reg, st->device, st->inode, compat)) {
      Options named = options;
      if (named.path.empty())
        named.path = options.handle != nullptr ? "the file of the handle given" : "fd " + std::to_string(options.fd);
      return refuse_other_key(named);
    }
  }
  auto core = Core::open(options, platform::os());
  if (!core || !core.value()->file_backed()) return core;
  const auto id = core.value()->identity();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase_if(reg.descriptor_caches, [](const DescriptorCache& d) { return d.core.expired(); });
  reg.descriptor_caches.push_back({id.device, id.inode, compat, core.value()});
  prune_gates_locked(reg, gate);
  return core;
}

// Options::prebuilt_dir: the first prebuilt file that suits this open, opened read-only (and
// shared like any other open of it); null when none suits or none can be opened, and the open
// goes on with the path.
std::shared_ptr<Core> open_prebuilt(const Options& options) {
  // The open's own cache is never taken for a prebuilt one (a host may keep it inside the set).
  std::optional<platform::FileInfo> own;
  if (!options.path.empty()) {
    if (auto st = platform::os().stat_path(options.path, options.allow_symlink)) own = st.value();
  }
  const auto found = prebuilt::scan(platform::os(), options.prebuilt_dir, format::hash_bytes(options.compat_key),
                                    options.alignment, own ? &own.value() : nullptr);
  const std::string local = options.path.empty() ? std::string("a heap cache") : "'" + options.path + "'";
  for (const std::string& why : found.skipped) log::info("prebuilt caches: cannot read {}; skipping it", why);
  if (!found.unreadable.empty()) {
    log::info("prebuilt caches: cannot read '{}' ({}); using {}", options.prebuilt_dir, found.unreadable, local);
    return nullptr;
  }
  Options o = options;
  o.prebuilt_dir.clear();
  o.read_only = true;  // never written: it is somebody else's build, usually on a read-only mount
  o.backing = Backing::file;
  o.allow_symlink = false;
  o.compact_dead_percent = 0;
  for (const auto& path : found.suitable) {
    o.path = path;
    auto core = open(o);
    // A file whose newest commit is damaged serves the one before it, maybe none at all: a
    // prebuilt file without entries is no better than the process's own cache.
    if (core && core.value()->stats().entries == 0) {
      log::warn("the prebuilt cache '{}' was written for this process's compatibility key but holds no entries (a "
                "damaged commit?); trying the next",
                path);
      continue;
    }
    if (core) {
      core.value()->mark_prebuilt();
      log::info("serving the prebuilt cache '{}' instead of {}: its compatibility key is this process's", path, local);
      return std::move(core).value();
    }
    log::warn("the prebuilt cache '{}' was written for this process's compatibility key but cannot be used ({}); "
              "trying the next",
              path, core.error().message);
  }
  log::info("no prebuilt cache in '{}' was written for this process's compatibility key ({} cache files looked at); "
            "using {}, where what is missing is packed once",
            options.prebuilt_dir, found.looked_at, local);
  return nullptr;
}

}  // namespace

Result<std::shared_ptr<Core>> open(const Options& options) {
  fork_guard::install();
  if (!options.prebuilt_dir.empty() && options.fd < 0 && options.handle == nullptr &&
      options.backing != Backing::heap && !options.private_cache && options.path != kMemoryPath) {
    try {
      if (auto core = open_prebuilt(options)) return core;
    } catch (const std::bad_alloc&) {
      return fail(platform::no_memory_error("out of memory while looking for a prebuilt cache", options.prebuilt_dir));
    }
  }
  // A descriptor or ":memory:" cache has no path to share by: each open is a cache of its own.
  const bool own_backing = options.backing != Backing::heap && !options.private_cache;
  const bool file_candidate = !options.path.empty() && options.fd < 0 && options.handle == nullptr &&
                              options.path != kMemoryPath && own_backing;
  if (!file_candidate) {
    if (own_backing && (options.fd >= 0 || options.handle != nullptr)) {
      try {
        return open_descriptor(options);
      } catch (const std::bad_alloc&) {
        return fail(platform::no_memory_error("out of memory while opening the cache", options.path));
      }
    }
    return Core::open(options, platform::os());
  }
  try {
    Registry& reg = instance();
    const std::uint64_t compat = format::hash_bytes(options.compat_key);
    std::shared_ptr<std::mutex> gate, id_gate;
    {
      std::lock_guard<std::mutex> lock(reg.mu);
      if (auto core = find_locked(reg, options, compat)) return share(std::move(core), options);
      gate = gate_locked(reg, path_gate_key(options));
    }
    // Opening may wait for another process's lease (while it builds the file): hold only this
    // file's gates, never the registry's mutex, so opens of other files go on meanwhile.
    std::lock_guard<std::mutex> opening(*gate);
    std::unique_lock<std::mutex> opening_id;
    if (auto st = platform::os().stat_path(options.path, options.allow_symlink)) {
      {
        std::lock_guard<std::mutex> lock(reg.mu);
        id_gate = gate_locked(reg, identity_gate_key(st->device, st->inode));
      }
      opening_id = std::unique_lock<std::mutex>(*id_gate);
    }
    {
      std::lock_guard<std::mutex> lock(reg.mu);
      if (auto core = find_locked(reg, options, compat)) return share(std::move(core), options);
      if (open_with_other_key_locked(reg, options, compat)) return refuse_other_key(options);
    }
    auto core = Core::open(options, platform::os());
    if (!core) return core;
    std::lock_guard<std::mutex> lock(reg.mu);
    if (core.value()->file_backed()) {
      const auto id = core.value()->identity();
      auto& slot = reg.caches[Key{id.device, id.inode, compat, options.read_only}];
      // Another spelling of the same file (a hard link) may have won the race: use its cache.
      if (auto existing = live(slot)) return share(std::move(existing), options);
      slot = core.value();
    }
    for (auto it = reg.caches.begin(); it != reg.caches.end();) {
      it = it->second.expired() ? reg.caches.erase(it) : std::next(it);
    }
    prune_gates_locked(reg, gate);
    return core;
  } catch (const std::bad_alloc&) {
    return fail(platform::no_memory_error("out of memory while opening the cache", options.path));
  } catch (...) {
    return fail({Errc::io, 0, "unexpected failure while opening the cache"});
  }
}

std::size_t live_count() noexcept {
  Registry& reg = instance();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::size_t n = 0;
  for (const auto& [k, w] : reg.caches) n += w.expired() ? 0 : 1;
  return n;
}

void lock_for_fork() noexcept { instance().mu.lock(); }

void unlock_after_fork(bool in_child) noexcept {
  Registry& reg = instance();
  // A gate held at the fork was held by a thread of the parent, which the child does not have:
  // it would stay locked forever there, and the child's open of that file would wait for it. The
  // child's opens are all its own: it starts with no gates. Clearing frees only gates nobody
  // refers to; one a parent thread held stays alive (its reference is on that thread's stack),
  // unused. Erasing from the map frees memory and allocates none.
  if (in_child) reg.opening.clear();
  reg.mu.unlock();
}

}  // namespace weightcache::registry
