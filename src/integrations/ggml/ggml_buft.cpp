// A ggml buffer type whose repacked weights live in a weightcache file (include/weightcache/ggml.h).
//
// ggml-cpu decides that a weight is repacked, and how to multiply it, by comparing its buffer's
// type with CPU_REPACK's buffer type *pointer*. So the buffers this type allocates report
// CPU_REPACK's type as theirs and borrow its init_tensor (which picks the layout and sets
// tensor->extra) and set_tensor (which repacks). What they change is where the repacked bytes go:
// - the buffer's own memory is an anonymous reservation (MAP_NORESERVE) that costs nothing unless a
//   tensor falls back to it;
// - set_tensor finds the tensor's key; on a hit it points tensor->data at the cache entry (the
//   source bytes are not read); on a miss it reserves space in the cache, points tensor->data at
//   it, lets CPU_REPACK repack straight into it, and commits it under the key (no copy);
// - when the last tensor given to a buffer is set, the cache is finalized (durable).
#include <weightcache/ggml.h>

#include "../common/source_identity.hpp"
#include "ggml_detail.hpp"

#include <ggml-backend-impl.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <condition_variable>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

// Exported by ggml-base (ggml-impl.h, which is not meant for C++ users outside ggml, declares it):
// messages go wherever the application pointed ggml's log (ggml_log_set, llama_log_set).
extern "C" void ggml_log_internal(enum ggml_log_level level, const char* format, ...);

#if !defined(WEIGHTCACHE_GGML_VERSION) || !defined(WEIGHTCACHE_GGML_REPACK_ID)
#error "WEIGHTCACHE_GGML_VERSION and WEIGHTCACHE_GGML_REPACK_ID (the ggml tree's) must be defined by the build"
#endif

using weightcache::source::content_identity;
using weightcache::source::file_identity;
using weightcache::source::WeightSource;
using weightcache::source::write_back;

namespace {
thread_local std::string t_error;
}  // namespace

// Also the llama.cpp front's (src/integrations/llama), which shares wc_ggml_last_error.
wc_status weightcache::ggml_detail::fail(wc_status st, std::string why) {
  t_error = std::move(why);
  return st;
}

namespace {

using weightcache::ggml_detail::fail;

constexpr std::int64_t kDefaultWindowMs = 60'000;
constexpr std::int64_t kMinWindowMs = 2'000;

// ---- CPU_REPACK, found through ggml's public registry -------------------------------------------

using init_tensor_fn = enum ggml_status (*)(ggml_backend_buffer_t, struct ggml_tensor*);
using set_tensor_fn = void (*)(ggml_backend_buffer_t, struct ggml_tensor*, const void*, size_t, size_t);

struct Repack {
  ggml_backend_buffer_type_t buft = nullptr;
  init_tensor_fn init = nullptr;
  set_tensor_fn set = nullptr;
  std::string features;  // the CPU features ggml-cpu reports ("AVX2=1;...")
  std::string why;       // why there is none
};

const Repack& repack() {
  static const Repack r = [] {
    Repack x;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
      x.why = "this process's ggml has no CPU backend";
      return x;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (extra != nullptr) {
      for (ggml_backend_buffer_type_t* b = extra(cpu); b != nullptr && *b != nullptr; ++b)
        if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) x.buft = *b;
    }
    if (x.buft == nullptr) {
      x.why = "this process's ggml CPU backend has no CPU_REPACK buffer type (built without GGML_CPU_REPACK?)";
      return x;
    }
    // Its buffers' functions: allocate a small one and keep its init_tensor and set_tensor.
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(x.buft, 256);
    if (probe == nullptr) {
      x.why = "could not allocate a CPU_REPACK buffer";
      x.buft = nullptr;
      return x;
    }
    x.init = probe->iface.init_tensor;
    x.set = probe->iface.set_tensor;
    ggml_backend_buffer_free(probe);
    if (x.init == nullptr || x.set == nullptr) {
      x.why = "CPU_REPACK's buffers have no init_tensor or set_tensor";
      x.buft = nullptr;
      return x;
    }
    auto features = reinterpret_cast<ggml_backend_get_features_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    if (features != nullptr)
      for (ggml_backend_feature* f = features(reg); f != nullptr && f->name != nullptr; ++f)
        x.features += std::string(f->name) + "=" + (f->value ? f->value : "") + ";";
    return x;
  }();
  return r;
}

// Whether CPU_REPACK gives the tensor a layout (the call only reads type and ne, and sets extra).
const void* repack_traits(const struct ggml_tensor* t) {
  const Repack& r = repack();
  if (r.buft == nullptr || t == nullptr) return nullptr;
  const int dims = ggml_n_dims(t);
  if (dims != 2 && dims != 3) return nullptr;  // ggml-cpu uses repacked weights in MUL_MAT (2-D) and MUL_MAT_ID (3-D)
  struct ggml_tensor copy = *t;
  copy.extra = nullptr;
  if (r.init(nullptr, &copy) != GGML_STATUS_SUCCESS) return nullptr;
  return copy.extra;
}

// ---- where the bytes handed to set_tensor come from ---------------------------------------------

// One line of /proc/self/maps that maps a file.
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::uint64_t offset = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool shared = false, writable = false;
  std::string path;
};

std::vector<Mapping> read_maps() {
  std::vector<Mapping> v;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return v;
  char line[4096 + 256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset, &major, &minor, &inode,
                    &path_at) < 7 ||
        inode == 0 || path_at <= 0)
      continue;
    Mapping m;
    m.start = static_cast<std::uintptr_t>(start);
    m.end = static_cast<std::uintptr_t>(end);
    m.offset = offset;
    m.dev = makedev(major, minor);
    m.ino = static_cast<ino_t>(inode);
    m.shared = perms[3] == 's';
    m.writable = perms[1] == 'w';
    m.path = line + path_at;
    while (!m.path.empty() && (m.path.back() == '\n' || m.path.back() == ' ')) m.path.pop_back();
    if (m.path.empty() || m.path[0] != '/' || m.path.find(" (deleted)") != std::string::npos) continue;
    v.push_back(std::move(m));
  }
  std::fclose(f);
  return v;
}

}  // namespace

// ---- the buffer type ------------------------------------------------------------------------------

struct wc_ggml {
  wc_cache* cache = nullptr;
  wc_ggml_options options{};
  struct ggml_backend_buffer_type buft {};
  std::string build_id;  // everything the repacked layout depends on besides the tensor
  // Which tensors the runtime may put here besides the repack check (the llama.cpp front: only
  // those llama.cpp computes from repacked weights); nullptr: any.
  std::atomic<bool (*)(const struct ggml_tensor*)> filter{nullptr};

  std::mutex mu;  // the one warning
  bool warned = false;
  std::atomic<int> buffers{0};
  std::atomic<bool> unfinalized{false};  // inserted since the last finalize

  std::atomic<std::uint64_t> tensors{0}, repacked{0}, served{0}, heap{0}, repacked_bytes{0}, hashed{0},
      dropped{0}, finalizes_failed{0};

  std::mutex fin_mu;  // one finalize at a time (wc_ggml_finish waits for a background one)
  // The background finalizer (finalize_when_loaded == 2): one thread, started on first use.
  std::mutex bg_mu;
  std::condition_variable bg_cv;
  bool bg_pending = false, bg_stop = false;
  std::thread bg;

  void warn_once(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (warned) return;
      warned = true;
    }
    ggml_log_internal(GGML_LOG_LEVEL_WARN, "weightcache: %s\n", what.c_str());
  }

  wc_status finalize() {
    std::lock_guard<std::mutex> lock(fin_mu);
    if (!unfinalized.exchange(false)) return WC_OK;
    const wc_status st = wc_finalize(cache);
    if (st != WC_OK) {
      unfinalized.store(true);  // every later finalize tries again
      // Said once at warning level: a later attempt (wc_ggml_finish after the background one)
      // usually fails for the same reason.
      const bool first = finalizes_failed.fetch_add(1, std::memory_order_relaxed) == 0;
      ggml_log_internal(first ? GGML_LOG_LEVEL_WARN : GGML_LOG_LEVEL_DEBUG,
                        "weightcache: could not make the repacked weights durable (%s); this process uses them from "
                        "memory and the next one repacks them again\n",
                        wc_last_error());
      t_error = wc_last_error();
    }
    return st;
  }

  // Loading ended: finalize now, or have the background thread do it (the load returns while the
  // repacked bytes are written back; every entry is served from the mapping meanwhile).
  void loaded() {
    if (options.finalize_when_loaded == 1) {
      (void)finalize();
      return;
    }
    if (options.finalize_when_loaded != 2) return;
    bool started = true;
    {
      std::lock_guard<std::mutex> lock(bg_mu);
      bg_pending = true;
      if (!bg.joinable()) {
        try {
          bg = std::thread([this] { background(); });
        } catch (...) {
          started = false;
          bg_pending = false;
        }
      }
    }
    if (started) {
      bg_cv.notify_one();
    } else {
      (void)finalize();  // no thread to be had: now
    }
  }

  void background() {
    std::unique_lock<std::mutex> lock(bg_mu);
    for (;;) {
      bg_cv.wait(lock, [this] { return bg_pending || bg_stop; });
      if (bg_pending) {
        bg_pending = false;
        lock.unlock();
        (void)finalize();
        lock.lock();
        continue;
      }
      return;  // stopped, nothing pending
    }
  }

  void stop_background() {
    {
      std::lock_guard<std::mutex> lock(bg_mu);
      bg_stop = true;
    }
    bg_cv.notify_one();
    if (bg.joinable()) bg.join();
  }
};

namespace {

// One buffer: its anonymous memory, and how many of its tensors are still to be set.
struct Buffer {
  wc_ggml* g = nullptr;
  void* base = nullptr;
  std::size_t mapped = 0;
  std::mutex mu;
  std::size_t pending = 0;  // initialized, not yet set
  struct Partial {
    std::vector<std::uint8_t> bytes;
    std::size_t covered = 0;  // bytes set so far (ggml loaders never overlap pieces)
  };
  std::map<const struct ggml_tensor*, Partial> partial;  // tensors being set piecewise
  // This buffer's snapshot of the process's file mappings (one load: read at its first tensor,
  // and again when an address is in none of it or its mapping no longer is that file).
  std::mutex maps_mu;
  std::vector<Mapping> maps;
  bool maps_read = false;
  // Source bytes of served tensors whose pages to give back (drop_source_pages), given back
  // together when the buffer's last tensor is set: tensors next to each other in the file in one
  // madvise (each call costs the process a TLB shootdown; one per tensor cost more than the
  // zapping itself), the pages of any other tensor left alone.
  struct Drop {
    Mapping m;
    std::uintptr_t start = 0, end = 0;  // the tensor's bytes
  };
  std::vector<Drop> drops;  // under maps_mu

  // The shared file mapping that holds [p, p + n), if one does. Only a MAP_SHARED mapping's pages
  // are the file's bytes: a private one may hold copies the process changed (even if it is
  // read-only now). Each answer is checked against /proc/self/map_files (the file mapped at that
  // very range now), so a mapping replaced since the snapshot is never taken for the old one.
  bool mapping_of(const void* p, std::size_t n, Mapping* out) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(maps_mu);
    bool fresh = false;
    if (!maps_read) {
      maps = read_maps();
      maps_read = fresh = true;
    }
    for (;;) {
      for (const Mapping& m : maps) {
        if (!(a >= m.start && a + n <= m.end && a + n >= a)) continue;
        char link[96];
        std::snprintf(link, sizeof link, "/proc/self/map_files/%lx-%lx", static_cast<unsigned long>(m.start),
                      static_cast<unsigned long>(m.end));
        struct stat st {};
        if (::stat(link, &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino) {
          if (!m.shared) return false;
          *out = m;
          return true;
        }
        break;  // the snapshot is stale here
      }
      if (fresh) return false;
      maps = read_maps();
      fresh = true;
    }
  }
};

Buffer* buffer_of(ggml_backend_buffer_t b) { return static_cast<Buffer*>(b->context); }

bool in_anonymous(const Buffer* buf, const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), s = reinterpret_cast<std::uintptr_t>(buf->base);
  return a >= s && a < s + buf->mapped;
}

void give_back_pages(Buffer* buf);

void b_free(ggml_backend_buffer_t b) {
  Buffer* buf = buffer_of(b);
  wc_ggml* g = buf->g;
  give_back_pages(buf);  // a load that stopped part-way
  if (buf->base != nullptr) ::munmap(buf->base, buf->mapped);
  delete buf;
  g->loaded();  // a load that stopped part-way still keeps what it repacked
  g->buffers.fetch_sub(1, std::memory_order_relaxed);
}

void* b_base(ggml_backend_buffer_t b) { return buffer_of(b)->base; }

enum ggml_status b_init_tensor(ggml_backend_buffer_t b, struct ggml_tensor* t) {
  if (t->view_src != nullptr) return GGML_STATUS_SUCCESS;  // a view shares its source's bytes
  Buffer* buf = buffer_of(b);
  const void* traits = repack_traits(t);
  if (traits == nullptr) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR,
                      "weightcache: tensor '%s' (%s, %" PRId64 " x %" PRId64 " x %" PRId64
                      ") is not one ggml's CPU backend repacks on this CPU; keep it out of the weightcache buffer "
                      "type (wc_ggml_would_repack)\n",
                      t->name, ggml_type_name(t->type), t->ne[0], t->ne[1], t->ne[2]);
    return GGML_STATUS_FAILED;
  }
  if (auto filter = buf->g->filter.load(); filter != nullptr && !filter(t)) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR,
                      "weightcache: tensor '%s' (%s, %d dimensions) is not one llama.cpp computes from repacked "
                      "weights, but a pattern routed it here: was the model file replaced after "
                      "wc_llama_model_params, or the params used for another model?\n",
                      t->name, ggml_type_name(t->type), ggml_n_dims(t));
    return GGML_STATUS_FAILED;
  }
  t->extra = const_cast<void*>(traits);
  std::lock_guard<std::mutex> lock(buf->mu);
  ++buf->pending;
  return GGML_STATUS_SUCCESS;
}

// Repacks into the buffer's own memory, as CPU_REPACK does (the cache could not take it).
void repack_here(ggml_backend_buffer_t b, struct ggml_tensor* t, void* own, const void* data, std::size_t size,
                 const std::string& why) {
  wc_ggml* g = buffer_of(b)->g;
  t->data = own;
  repack().set(b, t, data, 0, size);
  g->heap.fetch_add(1, std::memory_order_relaxed);
  g->repacked.fetch_add(1, std::memory_order_relaxed);
  g->repacked_bytes.fetch_add(size, std::memory_order_relaxed);
  g->warn_once("the cache could not take repacked weights (" + why +
               "); they are repacked into this process's memory (outputs are unaffected). Free disk space or fix "
               "the cache path, and the next load keeps them");
}

// Gives back this process's mapping of the whole pages inside [p, p + n) of a shared file mapping:
// they read back from the file.
std::uintptr_t page_size() { return static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)); }

// Notes [p, p + n), a served tensor's bytes in a shared file mapping, to give back its whole pages
// (give_back_pages); returns how many bytes of whole pages that is.
std::size_t drop_pages(Buffer* buf, const Mapping& m, const void* p, std::size_t n) {
  if (!m.shared) return 0;  // a private mapping's page may be the only copy of what the process wrote
  const std::uintptr_t page = page_size(), a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = (a + page - 1) & ~(page - 1), last = (a + n) & ~(page - 1);
  if (last <= first) return 0;
  try {
    std::lock_guard<std::mutex> lock(buf->maps_mu);
    buf->drops.push_back({m, a, a + n});
  } catch (...) {
    return 0;  // no memory to note it: the pages stay mapped (they are clean file pages)
  }
  return last - first;
}

// Gives back this process's mapping of the noted tensors' whole pages, where a fresh look at
// /proc/self/maps still finds that very shared mapping of that file. Tensors next to each other in
// the file (nothing but the GGUF's alignment padding between them) go in one call, with the page
// they share; a page holding any byte of a tensor not noted is never given back.
void give_back_pages(Buffer* buf) {
  std::vector<Buffer::Drop> drops;
  {
    std::lock_guard<std::mutex> lock(buf->maps_mu);
    drops.swap(buf->drops);
  }
  if (drops.empty()) return;
  constexpr std::uintptr_t kPadding = 64;  // more than GGUF's alignment padding (32 by default)
  const std::uintptr_t page = page_size();
  std::vector<Mapping> now;
  try {
    now = read_maps();
    std::sort(drops.begin(), drops.end(), [](const Buffer::Drop& x, const Buffer::Drop& y) {
      return x.m.start != y.m.start ? x.m.start < y.m.start : x.start < y.start;
    });
  } catch (...) {
    return;  // no memory: the pages stay mapped
  }
  auto give_back = [&](const Buffer::Drop& d) {
    bool same = false;
    for (const Mapping& m : now)
      same = same || (m.shared && m.start == d.m.start && m.end == d.m.end && m.dev == d.m.dev && m.ino == d.m.ino);
    const std::uintptr_t first = (d.start + page - 1) & ~(page - 1), last = d.end & ~(page - 1);
    if (same && first < last) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  };
  Buffer::Drop run = drops.front();
  for (std::size_t i = 1; i < drops.size(); ++i) {
    const Buffer::Drop& d = drops[i];
    const bool same_mapping = d.m.start == run.m.start && d.m.end == run.m.end && d.m.dev == run.m.dev &&
                              d.m.ino == run.m.ino;
    if (same_mapping && d.start >= run.end && d.start - run.end < kPadding) {
      run.end = d.end;  // the next tensor in the file
      continue;
    }
    give_back(run);
    run = d;
  }
  give_back(run);
}

// Points the tensor at a cache entry (a hit) and gives back its source pages.
void serve(Buffer* buf, struct ggml_tensor* t, void* at, const Mapping* m, const void* data, std::size_t size) {
  wc_ggml* g = buf->g;
  t->data = at;
  g->served.fetch_add(1, std::memory_order_relaxed);
  if (m != nullptr && g->options.drop_source_pages)
    g->dropped.fetch_add(drop_pages(buf, *m, data, size), std::memory_order_relaxed);
}

// Commits a reservation the tensor was repacked into under `key`, or, when the cache refuses
// it, repacks into the buffer's own memory.
void commit(ggml_backend_buffer_t b, struct ggml_tensor* t, void* own, const void* data, std::size_t size, void* p,
            const std::string& key) {
  wc_ggml* g = buffer_of(b)->g;
  const std::size_t off = wc_look_up_or_insert(g->cache, key.data(), key.size(), p, size);
  void* at = off != SIZE_MAX ? wc_offset_to_addr(g->cache, off) : nullptr;
  if (at == nullptr) {
    const std::string why = wc_last_error();
    if (off == SIZE_MAX) (void)wc_release_space(g->cache, p);
    return repack_here(b, t, own, data, size, why);
  }
  t->data = at;
  g->repacked.fetch_add(1, std::memory_order_relaxed);
  g->repacked_bytes.fetch_add(size, std::memory_order_relaxed);
  g->unfinalized.store(true);
}

// The tensor repacked into this process's memory, not cached: its source changed while it was
// read (what was read may be torn, as it would be for stock ggml; it is never stored).
void repack_uncached(ggml_backend_buffer_t b, struct ggml_tensor* t, void* own, const void* data, std::size_t size) {
  wc_ggml* g = buffer_of(b)->g;
  ggml_log_internal(GGML_LOG_LEVEL_WARN, "weightcache: '%s' changed in its GGUF while it was loaded: repacked without "
                    "caching it\n", t->name);
  t->data = own;
  repack().set(b, t, data, 0, size);
  g->repacked.fetch_add(1, std::memory_order_relaxed);
  g->repacked_bytes.fetch_add(size, std::memory_order_relaxed);
}

bool insert_small(wc_ggml* g, const std::string& key, const std::string& value) {
  if (wc_look_up_or_insert(g->cache, key.data(), key.size(), const_cast<char*>(value.c_str()), value.size() + 1) ==
      SIZE_MAX)
    return false;
  g->unfinalized.store(true);
  return true;
}

// The whole tensor's source bytes are at `data`: find its key, then serve or repack it.
//
// Entries are keyed by content (docs/DESIGN.md, "ggml keys"): a GGUF changed in place repacks only
// the tensors that changed. A warm load finds the content key through the file identity, reading
// no source byte; a load without that record hashes the tensor first.
void set_whole(ggml_backend_buffer_t b, struct ggml_tensor* t, const void* data, std::size_t size) {
  Buffer* buf = buffer_of(b);
  wc_ggml* g = buf->g;
  void* own = t->data;  // the tensor's place in the buffer's own memory
  g->tensors.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t window_ns = g->options.identity_window_ms * 1'000'000;

  WeightSource src;
  src.data = data;
  src.bytes = size;
  src.element_type = static_cast<int>(t->type);
  for (int i = 0; i < GGML_MAX_DIMS; ++i) src.dims.push_back(t->ne[i]);
  Mapping m;
  const bool from_file = buf->mapping_of(data, size, &m);
  std::string fid;
  if (from_file) {
    struct stat st {};
    // The path must still name the mapped file (not a replacement renamed over it).
    if (::stat(m.path.c_str(), &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino) {
      src.external_path = m.path;
      src.external_offset = static_cast<std::int64_t>(m.offset + (reinterpret_cast<std::uintptr_t>(data) - m.start));
      fid = file_identity(src, window_ns);
    }
  }
  const Mapping* pages = from_file ? &m : nullptr;
  const auto found = [&](const std::string& key) -> void* {
    const std::size_t off = wc_look_up(g->cache, key.data(), key.size());
    return off != SIZE_MAX ? wc_offset_to_addr(g->cache, off) : nullptr;
  };
  const std::string prefix = "ggml-repack/1|" + g->build_id + "|";
  std::string map_key;
  if (!fid.empty()) {
    map_key = "ggml-file-identity/1|" + fid + "|name|" + t->name;
    if (const char* c = static_cast<const char*>(found(map_key)); c != nullptr && std::strncmp(c, "xxh3|", 5) == 0) {
      const std::size_t n = strnlen(c, 4096);
      if (void* at = n < 4096 ? found(prefix + std::string(c, n)) : nullptr) return serve(buf, t, at, pages, data, size);
    }
  }
  // Hashing. Stores through a shared mapping move the identity only when they fault: write the
  // file back first, so any store from now on moves it; record identity -> content only if it
  // has not moved by the end.
  const bool settled = !fid.empty() && write_back(src.external_path) && file_identity(src, window_ns) == fid;
  // A shared file mapping that is not settled (the file is younger than the window, or on a file
  // system whose times do not follow stores) can change under us with no trace: hash and repack
  // a private copy, so the bytes repacked are exactly the bytes hashed. (Memory the process owns,
  // heap or private mapping, is the caller's to keep still while it sets the tensor.)
  std::unique_ptr<std::uint8_t[]> copy;
  const void* bytes = data;
  if (from_file && !settled) {
    copy.reset(new (std::nothrow) std::uint8_t[size]);
    if (!copy) return repack_here(b, t, own, data, size, "no memory for a private copy of the source");
    std::memcpy(copy.get(), data, size);
    bytes = copy.get();
  }
  WeightSource hashed = src;
  hashed.data = bytes;
  const std::string content = content_identity(hashed);
  g->hashed.fetch_add(size, std::memory_order_relaxed);
  const std::string key = prefix + content;
  if (void* at = found(key)) {
    serve(buf, t, at, pages, data, size);
  } else {
    void* p = wc_reserve_space(g->cache, size);
    if (p == nullptr) return repack_here(b, t, own, bytes, size, wc_last_error());
    t->data = p;
    repack().set(b, t, bytes, 0, size);  // straight into the reservation
    // A settled file's bytes were read in place: its identity must not have moved meanwhile.
    if (settled && file_identity(src, window_ns) != fid) {
      (void)wc_release_space(g->cache, p);
      return repack_uncached(b, t, own, data, size);
    }
    commit(b, t, own, bytes, size, p, key);
  }
  if (settled && file_identity(src, window_ns) == fid) (void)insert_small(g, map_key, content);
}

void b_set_tensor(ggml_backend_buffer_t b, struct ggml_tensor* t, const void* data, size_t offset, size_t size) {
  Buffer* buf = buffer_of(b);
  const std::size_t whole = ggml_nbytes(t);
  if (t->extra == nullptr || offset > whole || size > whole - offset) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: set_tensor of '%s' outside the tensor or of a tensor not "
                      "initialized by this buffer; ignored\n", t->name);
    return;
  }
  bool done = false;
  if (offset == 0 && size == whole) {
    set_whole(b, t, data, size);
    done = true;
  } else {
    // Set piecewise: gather the pieces, then handle the whole (CPU_REPACK repacks whole tensors).
    std::vector<std::uint8_t> all;
    {
      std::lock_guard<std::mutex> lock(buf->mu);
      Buffer::Partial& piece = buf->partial[t];
      if (piece.bytes.size() != whole) piece.bytes.assign(whole, 0);
      std::memcpy(piece.bytes.data() + offset, data, size);
      piece.covered += size;
      if (piece.covered >= whole) {
        all.swap(piece.bytes);
        buf->partial.erase(t);
      }
    }
    if (!all.empty()) {
      set_whole(b, t, all.data(), whole);
      done = true;
    }
  }
  if (!done) return;
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(buf->mu);
    if (buf->pending > 0) last = --buf->pending == 0;
  }
  if (last) {
    give_back_pages(buf);
    buf->g->loaded();
  }
}

void b_memset_tensor(ggml_backend_buffer_t b, struct ggml_tensor* t, uint8_t value, size_t offset, size_t size) {
  // Only a tensor still in the buffer's own memory may be written; the cache's bytes are read-only.
  if (!in_anonymous(buffer_of(b), t->data) || offset > ggml_nbytes(t) || size > ggml_nbytes(t) - offset) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: memset of '%s', a weight served from the cache; ignored\n",
                      t->name);
    return;
  }
  std::memset(static_cast<char*>(t->data) + offset, value, size);
}

void b_clear(ggml_backend_buffer_t b, uint8_t value) {
  Buffer* buf = buffer_of(b);
  if (buf->base == nullptr) return;
  if (value == 0) {
    (void)::madvise(buf->base, buf->mapped, MADV_DONTNEED);  // anonymous: reads back as zeros, frees the pages
  } else {
    std::memset(buf->base, value, buf->mapped);
  }
}

const char* bt_name(ggml_backend_buffer_type_t) { return "WEIGHTCACHE_REPACK"; }

std::size_t bt_alignment(ggml_backend_buffer_type_t) { return ggml_backend_buft_get_alignment(repack().buft); }

ggml_backend_buffer_t bt_alloc(ggml_backend_buffer_type_t bt, size_t size) {
  wc_ggml* g = static_cast<wc_ggml*>(bt->context);
  auto* buf = new (std::nothrow) Buffer;
  if (buf == nullptr) return nullptr;
  buf->g = g;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  buf->mapped = std::max<std::size_t>((size + page - 1) / page * page, page);
  void* p = ::mmap(nullptr, buf->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: could not reserve %zu bytes of address space (%s)\n", size,
                      std::strerror(errno));
    delete buf;
    return nullptr;
  }
  buf->base = p;
  struct ggml_backend_buffer_i iface {};
  iface.free_buffer = b_free;
  iface.get_base = b_base;
  iface.init_tensor = b_init_tensor;
  iface.memset_tensor = b_memset_tensor;
  iface.set_tensor = b_set_tensor;
  iface.get_tensor = nullptr;  // as CPU_REPACK: repacked bytes are not the tensor's values
  iface.cpy_tensor = nullptr;
  iface.clear = b_clear;
  iface.reset = nullptr;
  // CPU_REPACK's type, not ours: ggml-cpu finds repacked weights by that pointer.
  ggml_backend_buffer_t b = ggml_backend_buffer_init(repack().buft, iface, buf, size);
  if (b == nullptr) {
    ::munmap(p, buf->mapped);
    delete buf;
    return nullptr;
  }
  g->buffers.fetch_add(1, std::memory_order_relaxed);
  return b;
}

}  // namespace

// ---- the C API ------------------------------------------------------------------------------------

ggml_backend_buffer_type_t weightcache::ggml_detail::repack_buffer_type() { return repack().buft; }

void weightcache::ggml_detail::set_tensor_filter(wc_ggml* g, bool (*filter)(const struct ggml_tensor*)) {
  g->filter.store(filter);
}

extern "C" {

void wc_ggml_options_init(wc_ggml_options* o) {
  if (o == nullptr) return;
  *o = wc_ggml_options{};
  o->struct_size = sizeof *o;
  o->identity_window_ms = kDefaultWindowMs;
  o->drop_source_pages = 1;
  o->finalize_when_loaded = 2;
}

const char* wc_ggml_last_error(void) { return t_error.c_str(); }

wc_status wc_ggml_check_abi(void) {
  const char* running = ggml_version();
  if (running == nullptr || std::strcmp(running, WEIGHTCACHE_GGML_VERSION) != 0)
    return fail(WC_ERR_INCOMPATIBLE, std::string("this process runs ggml ") + (running ? running : "(unknown)") +
                                         ", but libweightcache_ggml was built against ggml " WEIGHTCACHE_GGML_VERSION
                                         ": rebuild it against the ggml tree the application uses "
                                         "(WEIGHTCACHE_GGML_SOURCE_DIR)");
  return WC_OK;
}

wc_status wc_ggml_create(wc_cache* cache, const wc_ggml_options* options, wc_ggml** out) {
  try {
    if (out != nullptr) *out = nullptr;
    if (cache == nullptr || out == nullptr) return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: NULL cache or out");
    wc_ggml_options o;
    wc_ggml_options_init(&o);
    if (options != nullptr) {
      if (options->struct_size < offsetof(wc_ggml_options, finalize_when_loaded) + sizeof(int) ||
          options->struct_size > sizeof(wc_ggml_options))
        return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: options not set up by wc_ggml_options_init");
      o = *options;
      o.struct_size = sizeof o;
    }
    if (o.finalize_when_loaded < 0 || o.finalize_when_loaded > 2)
      return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: finalize_when_loaded must be 0, 1 or 2");
    if (o.identity_window_ms < kMinWindowMs)
      return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: identity_window_ms must be at least 2000 (the coarsest "
                                           "file timestamp, FAT's, is 2 s)");
    if (wc_status st = wc_ggml_check_abi(); st != WC_OK) return st;
    const Repack& r = repack();
    if (r.buft == nullptr) return fail(WC_ERR_INCOMPATIBLE, "wc_ggml_create: " + r.why);
    auto g = std::unique_ptr<wc_ggml>(new (std::nothrow) wc_ggml);
    if (!g) return fail(WC_ERR_NO_MEMORY, "wc_ggml_create: out of memory");
    g->cache = cache;
    g->options = o;
    // The layout depends on ggml's repacking code (its fingerprint, taken by the build from the
    // tree this library is compiled against, which wc_ggml_check_abi ties to the running ggml)
    // and on the CPU features the build enabled; not on ggml's build commit, which is "unknown"
    // outside git and the enclosing repository's inside another one.
    g->build_id = std::string("ggml ") + WEIGHTCACHE_GGML_VERSION + " repack " + WEIGHTCACHE_GGML_REPACK_ID + " api" +
                  std::to_string(GGML_BACKEND_API_VERSION) + "|cpu " + r.features;
    g->buft.iface.get_name = bt_name;
    g->buft.iface.alloc_buffer = bt_alloc;
    g->buft.iface.get_alignment = bt_alignment;
    g->buft.iface.get_max_size = nullptr;
    g->buft.iface.get_alloc_size = nullptr;  // ggml_nbytes: a repacked tensor is as large as its source
    g->buft.iface.is_host = nullptr;
    g->buft.device = r.buft->device;
    g->buft.context = g.get();
    *out = g.release();
    return WC_OK;
  } catch (const std::bad_alloc&) {
    return fail(WC_ERR_NO_MEMORY, "wc_ggml_create: out of memory");
  } catch (...) {
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: unexpected failure");
  }
}

void wc_ggml_destroy(wc_ggml* g) {
  if (g == nullptr) return;
  if (g->buffers.load() != 0)
    ggml_log_internal(GGML_LOG_LEVEL_ERROR,
                      "weightcache: wc_ggml_destroy with %d buffers still allocated (free the model first); "
                      "the buffer type is kept alive\n",
                      g->buffers.load());
  else {
    g->stop_background();
    (void)g->finalize();
    delete g;
  }
}

ggml_backend_buffer_type_t wc_ggml_buffer_type(wc_ggml* g) { return g != nullptr ? &g->buft : nullptr; }

int wc_ggml_would_repack(const struct ggml_tensor* tensor) { return repack_traits(tensor) != nullptr ? 1 : 0; }

wc_status wc_ggml_finish(wc_ggml* g) {
  if (g == nullptr) return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_finish: NULL");
  return g->finalize();
}

void wc_ggml_stats_init(wc_ggml_stats* s) {
  if (s == nullptr) return;
  *s = wc_ggml_stats{};
  s->struct_size = sizeof *s;
}

wc_status wc_ggml_get_stats(const wc_ggml* g, wc_ggml_stats* out) {
  if (g == nullptr || out == nullptr || out->struct_size != sizeof(wc_ggml_stats))
    return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_get_stats: NULL, or stats not set up by wc_ggml_stats_init");
  out->tensors = g->tensors.load();
  out->repacked = g->repacked.load();
  out->served_from_cache = g->served.load();
  out->heap_fallbacks = g->heap.load();
  out->repacked_bytes = g->repacked_bytes.load();
  out->source_bytes_hashed = g->hashed.load();
  out->source_bytes_dropped = g->dropped.load();
  out->finalizes_failed = g->finalizes_failed.load();
  return WC_OK;
}

}  // extern "C"
