// ggml buffer types whose repacked weights live in a weightcache file (include/weightcache/ggml.h).
//
// ggml-cpu decides that a weight is repacked, and how to multiply it, by comparing its buffer's
// type with the repacking buffer type's *pointer* (CPU_REPACK's, AMX's). So there is one
// weightcache buffer type per such layout, and the buffers each allocates report that layout's
// ggml type as theirs and borrow its init_tensor (which picks the layout and sets tensor->extra),
// set_tensor (which repacks) and alloc size. What they change is where the repacked bytes go:
// - the buffer's own memory is an anonymous reservation (MAP_NORESERVE) that costs nothing unless a
//   tensor falls back to it;
// - set_tensor finds the tensor's key; on a hit it points tensor->data at the cache entry (the
//   source bytes are not read); on a miss it reserves space in the cache, points tensor->data at
//   it, lets CPU_REPACK repack straight into it, and commits it under the key (no copy);
// - when the last tensor given to a buffer is set, the cache is finalized (durable).
#include <weightcache/ggml.h>

#include "../common/file_mappings.hpp"
#include "../common/source_identity.hpp"
#include "ggml_detail.hpp"

#include <ggml-backend-impl.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
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

#if !defined(WEIGHTCACHE_GGML_VERSION) || !defined(WEIGHTCACHE_GGML_REPACK_ID) || !defined(WEIGHTCACHE_GGML_AMX_ID) || \
    !defined(WEIGHTCACHE_GGML_KLEIDIAI_ID)
#error "WEIGHTCACHE_GGML_VERSION and the layouts' fingerprints WEIGHTCACHE_GGML_REPACK_ID, WEIGHTCACHE_GGML_AMX_ID and WEIGHTCACHE_GGML_KLEIDIAI_ID (the ggml tree's) must be defined by the build"
#endif

using weightcache::source::content_identity;
using weightcache::source::file_identity;
using weightcache::source::may_record;
using weightcache::source::Recording;
using weightcache::source::still;
using weightcache::source::WeightSource;

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

constexpr std::int64_t kMaxWindowMs = 86'400'000;

// ---- the CPU backend's repacking buffer types, found through ggml's public registry -------------

using init_tensor_fn = enum ggml_status (*)(ggml_backend_buffer_t, struct ggml_tensor*);
using set_tensor_fn = void (*)(ggml_backend_buffer_t, struct ggml_tensor*, const void*, size_t, size_t);
using alloc_size_fn = size_t (*)(ggml_backend_buffer_type_t, const struct ggml_tensor*);

// The layouts this library stores, by the name of the ggml buffer type that writes them, with the
// word that names them in keys and the fingerprint of the code that writes them (taken by the
// build from the tree this library is compiled against). CPU_REPACK's key words are those of every
// earlier release, so caches written before AMX was served keep serving.
struct KnownLayout {
  const char* buft_name;
  const char* key_word;
  const char* fingerprint;
};
constexpr KnownLayout kKnown[] = {
    {"AMX", "amx", WEIGHTCACHE_GGML_AMX_ID},
    {"CPU_KLEIDIAI", "kleidiai", WEIGHTCACHE_GGML_KLEIDIAI_ID},
    {"CPU_REPACK", "repack", WEIGHTCACHE_GGML_REPACK_ID},
};

// What decides a layout's bytes besides its code and the CPU features. KleidiAI's packing reads
// two settings from the environment, once per process (ggml-cpu/kleidiai/kleidiai.cpp,
// init_kleidiai_context): GGML_KLEIDIAI_SME picks SME kernels or not, and GGML_TOTAL_THREADS
// decides whether the packings of its fallback kernels are stored beside the first (a packed
// weight holds one slot per kernel). Both go into its keys, verbatim (with their lengths, so that
// no value can read as another's).
std::string layout_settings(const KnownLayout& k) {
  if (std::strcmp(k.buft_name, "CPU_KLEIDIAI") != 0) return "";
  std::string s = "|env";
  for (const char* name : {"GGML_KLEIDIAI_SME", "GGML_TOTAL_THREADS"}) {
    const char* v = std::getenv(name);
    s += std::string(" ") + name + (v == nullptr ? "" : "=" + std::to_string(std::strlen(v)) + ":" + v);
  }
  return s;
}

// "ggml-repack/1|ggml V <word> <fingerprint> apiN|cpu FEATURES[|env ...]|": the start of every key
// of one layout on this CPU.
std::string key_prefix_for(const KnownLayout& k, const std::string& features) {
  return std::string("ggml-repack/1|ggml ") + WEIGHTCACHE_GGML_VERSION + " " + k.key_word + " " + k.fingerprint +
         " api" + std::to_string(GGML_BACKEND_API_VERSION) + "|cpu " + features + layout_settings(k) + "|";
}

}  // namespace

namespace weightcache::ggml_detail {
// One repacking buffer type of ggml's CPU backend that this library serves: its buffers' own
// init_tensor (picks the layout, sets tensor->extra) and set_tensor (repacks), and its alloc size.
struct Layout {
  ggml_backend_buffer_type_t buft = nullptr;  // ggml's
  const KnownLayout* known = nullptr;
  init_tensor_fn init = nullptr;
  set_tensor_fn set = nullptr;
  alloc_size_fn alloc_size = nullptr;  // nullptr: ggml_nbytes
  std::string key_prefix;              // "ggml-repack/1|ggml V <word> <fingerprint> apiN|cpu FEATURES|"
};
}  // namespace weightcache::ggml_detail

namespace {

using weightcache::ggml_detail::Layout;

// The CPU backend as this process's ggml has it: its device, its extra buffer types in its order
// (the order llama.cpp tries them in), and the layouts among them this library serves.
struct Cpu {
  ggml_backend_dev_t dev = nullptr;
  std::vector<ggml_backend_buffer_type_t> extras;
  std::vector<Layout> layouts;  // in ggml's order
  std::string features;         // the CPU features ggml-cpu reports ("AVX2=1;...")
  std::string why;              // why no layout is served
};

const Cpu& cpu() {
  static const Cpu* c = [] {
    auto* x = new Cpu;  // never destroyed: buffer types of it may outlive static destructors
    x->dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (x->dev == nullptr) {
      x->why = "this process's ggml has no CPU backend";
      return x;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(x->dev);
    auto features = reinterpret_cast<ggml_backend_get_features_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    if (features != nullptr)
      for (ggml_backend_feature* f = features(reg); f != nullptr && f->name != nullptr; ++f)
        x->features += std::string(f->name) + "=" + (f->value ? f->value : "") + ";";
    auto extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    for (ggml_backend_buffer_type_t* b = extra != nullptr ? extra(x->dev) : nullptr; b != nullptr && *b != nullptr; ++b)
      x->extras.push_back(*b);
    std::string unusable;
    for (ggml_backend_buffer_type_t b : x->extras) {
      const char* name = ggml_backend_buft_name(b);
      const KnownLayout* known = nullptr;
      for (const KnownLayout& k : kKnown)
        if (std::strcmp(name, k.buft_name) == 0) known = &k;
      if (known == nullptr) continue;  // others: llama.cpp repacks those itself
      // Its buffers' functions: allocate a small one and keep its init_tensor and set_tensor.
      ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(b, 256);
      if (probe == nullptr) {
        unusable += std::string(unusable.empty() ? "" : "; ") + "could not allocate a " + name + " buffer";
        continue;
      }
      Layout l;
      l.buft = b;
      l.known = known;
      l.init = probe->iface.init_tensor;
      l.set = probe->iface.set_tensor;
      l.alloc_size = b->iface.get_alloc_size;
      ggml_backend_buffer_free(probe);
      if (l.init == nullptr || l.set == nullptr) {
        unusable += std::string(unusable.empty() ? "" : "; ") + name + "'s buffers have no init_tensor or set_tensor";
        continue;
      }
      l.key_prefix = key_prefix_for(*known, x->features);
      x->layouts.push_back(std::move(l));
    }
    if (x->layouts.empty())
      x->why = !unusable.empty() ? unusable
                                 : "this process's ggml CPU backend has no repacking buffer type the cache serves (AMX "
                                   "or CPU_REPACK; built without GGML_CPU_REPACK?)";
    return x;
  }();
  return *c;
}

const Layout* layout_of(ggml_backend_buffer_type_t b) {
  for (const Layout& l : cpu().layouts)
    if (l.buft == b) return &l;
  return nullptr;
}

// Whether the device would compute `op` of weight `w` from a weight held in `buft`: what llama.cpp
// asks (llama-model.cpp, weight_buft_supported), with the same stand-in operands.
bool supports(const struct ggml_tensor* w0, enum ggml_op op, int n_expert_used, ggml_backend_dev_t dev,
              ggml_backend_buffer_type_t buft) {
  if (!weightcache::ggml_detail::plausible_weight(w0) || dev == nullptr || buft == nullptr) return false;
  ggml_init_params p{};
  p.mem_size = ggml_tensor_overhead() * 8;
  p.no_alloc = true;
  ggml_context* ctx = ggml_init(p);
  if (ctx == nullptr) return false;
  struct ggml_tensor* w = ggml_new_tensor(ctx, w0->type, GGML_MAX_DIMS, w0->ne);
  struct ggml_tensor* opt = nullptr;
  if (op == GGML_OP_MUL_MAT) {
    opt = ggml_mul_mat(ctx, w, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, w->ne[0], 512, w->ne[2], w->ne[3]));
  } else if (op == GGML_OP_MUL_MAT_ID) {
    const int used = std::max(1, n_expert_used);
    opt = ggml_mul_mat_id(ctx, w, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->ne[0], used, 512),
                          ggml_new_tensor_2d(ctx, GGML_TYPE_I32, used, 512));
  }
  bool ok = false;
  if (opt != nullptr) {
    w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);  // a dummy: supports_op looks at its type
    if (w->buffer != nullptr) {
      ok = ggml_backend_dev_supports_op(dev, opt);
      ggml_backend_buffer_free(w->buffer);
      w->buffer = nullptr;
    }
  }
  ggml_free(ctx);
  return ok;
}

}  // namespace

// A weight ggml's own checks accept (its stand-in operations assert on anything else): a known
// type, every dimension at least 1, rows a whole number of the type's blocks. Type and ne only
// (the stand-in is a new tensor of that type and shape; nb may be unset).
bool weightcache::ggml_detail::plausible_weight(const struct ggml_tensor* t) {
  if (t == nullptr || static_cast<int>(t->type) < 0 || t->type >= GGML_TYPE_COUNT) return false;
  const std::int64_t block = ggml_blck_size(t->type);
  if (block <= 0 || ggml_type_size(t->type) == 0) return false;
  for (int i = 0; i < GGML_MAX_DIMS; ++i)
    if (t->ne[i] <= 0 || t->ne[i] > (std::int64_t{1} << 40)) return false;
  return t->ne[0] % block == 0;
}

// The first of `candidates` (device and buffer type, in the order the runtime tries them) that
// computes `op` of `w`; nullptr when none does.
ggml_backend_buffer_type_t weightcache::ggml_detail::first_supporting(
    const struct ggml_tensor* w, enum ggml_op op, int n_expert_used,
    const std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>>& candidates) {
  for (const auto& [dev, buft] : candidates)
    if (supports(w, op, n_expert_used, dev, buft)) return buft;
  return nullptr;
}

std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>> weightcache::ggml_detail::cpu_extras() {
  std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>> v;
  for (ggml_backend_buffer_type_t b : cpu().extras) v.emplace_back(cpu().dev, b);
  return v;
}

namespace {

// ggml's CPU backend's own choice for a weight: the first of its extra buffer types, in its order,
// that computes the weight's product (MUL_MAT of a 2-D weight, MUL_MAT_ID of a 3-D one).
// The answer depends on type and shape only (ggml-cpu's list of extra buffer types is fixed once
// read), so it is asked once per shape: a model has a handful (a 12-layer llama, five).
ggml_backend_buffer_type_t stock_choice(const struct ggml_tensor* t) {
  if (!weightcache::ggml_detail::plausible_weight(t)) return nullptr;
  const int dims = ggml_n_dims(t);
  if (dims != 2 && dims != 3) return nullptr;
  using Shape = std::array<std::int64_t, GGML_MAX_DIMS + 1>;
  Shape shape{};
  shape[0] = static_cast<std::int64_t>(t->type);
  for (int i = 0; i < GGML_MAX_DIMS; ++i) shape[i + 1] = t->ne[i];
  static std::mutex mu;
  static std::map<Shape, ggml_backend_buffer_type_t>* known = new std::map<Shape, ggml_backend_buffer_type_t>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known->find(shape); it != known->end()) return it->second;
  }
  ggml_backend_buffer_type_t b = weightcache::ggml_detail::first_supporting(
      t, dims == 2 ? GGML_OP_MUL_MAT : GGML_OP_MUL_MAT_ID, 1, weightcache::ggml_detail::cpu_extras());
  std::lock_guard<std::mutex> lock(mu);
  if (known->size() < 4096) known->emplace(shape, b);  // bounded: a hostile model's shapes do not grow it without end
  return b;
}

// ---- where the bytes handed to set_tensor come from ---------------------------------------------

using weightcache::source::Mapping;
using weightcache::source::MappingProbe;
using weightcache::source::read_maps;

}  // namespace

// ---- the buffer type ------------------------------------------------------------------------------

namespace {
// One layout's weightcache buffer type: buffers of it hold tensors of that layout only.
struct Served {
  wc_ggml* g = nullptr;
  const Layout* layout = nullptr;
  std::string name;  // "WEIGHTCACHE_AMX", "WEIGHTCACHE_REPACK"
  struct ggml_backend_buffer_type buft {};
};
}  // namespace

struct wc_ggml {
  wc_cache* cache = nullptr;
  wc_ggml_options options{};
  std::vector<std::unique_ptr<Served>> served_types;  // one per layout, in ggml's order
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
    if (!unfinalized.load()) return;  // a warm load: nothing to make durable, no thread to start
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
  const Layout* layout = nullptr;  // what its tensors are repacked into (its buffer type's)
  void* base = nullptr;
  std::size_t mapped = 0;
  std::mutex mu;
  std::size_t pending = 0;  // initialized, not yet set
  struct Partial {
    std::vector<std::uint8_t> bytes;
    std::size_t covered = 0;  // bytes set so far (ggml loaders never overlap pieces)
  };
  std::map<const struct ggml_tensor*, Partial> partial;  // tensors being set piecewise
  // Where each tensor's source bytes are (file_mappings.hpp); under maps_mu.
  std::mutex maps_mu;
  MappingProbe probe;
  // Source bytes of served tensors whose pages to give back (drop_source_pages), given back
  // together when the buffer's last tensor is set: tensors next to each other in the file in one
  // madvise (each call costs the process a TLB shootdown; one per tensor cost more than the
  // zapping itself), the pages of any other tensor left alone.
  struct Drop {
    Mapping m;
    std::uintptr_t start = 0, end = 0;  // the tensor's bytes
  };
  std::vector<Drop> drops;  // under maps_mu
  // Whether each file system of this load's GGUFs has times that follow every store (a statfs per
  // file system per load, not per tensor; file_identity's rule).
  std::vector<std::pair<dev_t, bool>> tracks;  // under maps_mu

  // The shared file mapping that holds [p, p + n), if one does, checked now (MappingProbe: so a
  // mapping replaced since an earlier look is never taken for the old one). Only a MAP_SHARED
  // mapping's pages are the file's bytes: a private one may hold copies the process changed (even
  // if it is read-only now). *may_change says the bytes are not the process's own and might change
  // under the load all the same (a private or unnamed file mapping, a range the check cannot
  // vouch for): the caller then works from a private copy.
  bool mapping_of(const void* p, std::size_t n, Mapping* out, bool* may_change) {
    std::lock_guard<std::mutex> lock(maps_mu);
    const MappingProbe::Kind kind = probe.find(p, n, out);
    *may_change = kind == MappingProbe::Kind::changeable;
    return kind == MappingProbe::Kind::file;
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
  // Only a tensor whose layout on this CPU is this buffer's: ggml-cpu computes a weight from the
  // layout its buffer type names, so any other would reach a kernel that cannot read it.
  if (const ggml_backend_buffer_type_t stock = stock_choice(t); stock != buf->layout->buft) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR,
                      "weightcache: tensor '%s' (%s, %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                      ") is not one ggml's CPU backend puts in %s on this CPU (it would use %s); put it in the buffer "
                      "type wc_ggml_buffer_type_for gives, or keep it out\n",
                      t->name, ggml_type_name(t->type), t->ne[0], t->ne[1], t->ne[2], t->ne[3],
                      ggml_backend_buft_name(buf->layout->buft),
                      stock != nullptr ? ggml_backend_buft_name(stock) : "plain CPU memory");
    return GGML_STATUS_FAILED;
  }
  struct ggml_tensor probe = *t;
  probe.extra = nullptr;
  if (buf->layout->init(b, &probe) != GGML_STATUS_SUCCESS || probe.extra == nullptr) {
    ggml_log_internal(GGML_LOG_LEVEL_ERROR, "weightcache: %s gives tensor '%s' no layout\n",
                      ggml_backend_buft_name(buf->layout->buft), t->name);
    return GGML_STATUS_FAILED;
  }
  const void* traits = probe.extra;
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
  buffer_of(b)->layout->set(b, t, data, 0, size);
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
            std::size_t packed, const std::string& key) {
  wc_ggml* g = buffer_of(b)->g;
  const std::size_t off = wc_look_up_or_insert(g->cache, key.data(), key.size(), p, packed);
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
  buffer_of(b)->layout->set(b, t, data, 0, size);
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
  const std::int64_t floor_ns = g->options.identity_window_ms * 1'000'000;

  WeightSource src;
  src.data = data;
  src.bytes = size;
  src.element_type = static_cast<int>(t->type);
  for (int i = 0; i < GGML_MAX_DIMS; ++i) src.dims.push_back(t->ne[i]);
  Mapping m;
  bool may_change = false;
  const bool from_file = buf->mapping_of(data, size, &m, &may_change);
  std::string fid;
  if (from_file) {
    // The file's identity as of this tensor: one stat of the path, which must still name the
    // mapped inode (not a replacement renamed over it); the file system's rule once per load.
    const std::int64_t clock = weightcache::source::change_clock_ns();  // before the stat
    struct stat st {};
    if (::stat(m.path.c_str(), &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino) {
      src.external_path = m.path;
      src.external_offset = static_cast<std::int64_t>(m.offset + (reinterpret_cast<std::uintptr_t>(data) - m.start));
      int tracks = -1;
      {
        std::lock_guard<std::mutex> lock(buf->maps_mu);
        for (const auto& [dev, yes] : buf->tracks)
          if (dev == st.st_dev) tracks = yes ? 1 : 0;
      }
      if (tracks < 0) {
        tracks = weightcache::source::times_track_every_store(m.path) ? 1 : 0;
        std::lock_guard<std::mutex> lock(buf->maps_mu);
        buf->tracks.emplace_back(st.st_dev, tracks == 1);
      }
      fid = weightcache::source::file_identity_in(weightcache::source::file_part_of(st, tracks == 1, clock, floor_ns), src);
    }
  }
  const Mapping* pages = from_file ? &m : nullptr;
  const auto found = [&](const std::string& key) -> void* {
    const std::size_t off = wc_look_up(g->cache, key.data(), key.size());
    return off != SIZE_MAX ? wc_offset_to_addr(g->cache, off) : nullptr;
  };
  const std::string& prefix = buf->layout->key_prefix;
  std::string map_key;
  if (!fid.empty()) {
    map_key = "ggml-file-identity/1|" + fid + "|name|" + t->name;
    if (const char* c = static_cast<const char*>(found(map_key)); c != nullptr && std::strncmp(c, "xxh3|", 5) == 0) {
      const std::size_t n = strnlen(c, 4096);
      if (void* at = n < 4096 ? found(prefix + std::string(c, n)) : nullptr) return serve(buf, t, at, pages, data, size);
    }
  }
  // Hashing. A write(2) in progress moves the identity only when it starts, and stores through a
  // shared mapping only when they fault: record identity -> content only for bytes hashed while
  // nobody has the file open for writing (may_record: every later change then comes through a
  // new opening and moves the identity), and only if it has not moved by the end.
  const Recording rec = fid.empty() ? Recording() : may_record(src, fid, floor_ns);
  const bool settled = rec.ok();
  // A shared file mapping that is not settled (the file is younger than the window, or on a file
  // system whose times do not follow stores) can change under us with no trace: hash and repack
  // a private copy, so the bytes repacked are exactly the bytes hashed. (Memory the process owns,
  // heap or private mapping, is the caller's to keep still while it sets the tensor.)
  std::unique_ptr<std::uint8_t[]> copy;
  const void* bytes = data;
  if ((from_file && !settled) || may_change) {
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
    // The layout's size (AMX's tiles are larger than the GGUF's blocks; CPU_REPACK's are not).
    const std::size_t packed = buf->layout->alloc_size != nullptr ? buf->layout->alloc_size(buf->layout->buft, t) : size;
    void* p = wc_reserve_space(g->cache, packed);
    if (p == nullptr) return repack_here(b, t, own, bytes, size, wc_last_error());
    t->data = p;
    buf->layout->set(b, t, bytes, 0, size);  // straight into the reservation
    // A settled file's bytes were read in place: its identity must not have moved meanwhile.
    if (settled && !still(rec, src, fid, floor_ns)) {
      (void)wc_release_space(g->cache, p);
      return repack_uncached(b, t, own, data, size);
    }
    commit(b, t, own, bytes, size, p, packed, key);
  }
  if (settled && still(rec, src, fid, floor_ns)) (void)insert_small(g, map_key, content);
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
  const Layout* l = buffer_of(b)->layout;
  const std::size_t whole = l->alloc_size != nullptr ? l->alloc_size(l->buft, t) : ggml_nbytes(t);  // AMX's are larger
  if (!in_anonymous(buffer_of(b), t->data) || offset > whole || size > whole - offset) {
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

Served* served_of(ggml_backend_buffer_type_t bt) { return static_cast<Served*>(bt->context); }

const char* bt_name(ggml_backend_buffer_type_t bt) { return served_of(bt)->name.c_str(); }

std::size_t bt_alignment(ggml_backend_buffer_type_t bt) {
  return ggml_backend_buft_get_alignment(served_of(bt)->layout->buft);
}

std::size_t bt_alloc_size(ggml_backend_buffer_type_t bt, const struct ggml_tensor* t) {
  const Layout* l = served_of(bt)->layout;
  return l->alloc_size != nullptr ? l->alloc_size(l->buft, t) : ggml_nbytes(t);
}

ggml_backend_buffer_t bt_alloc(ggml_backend_buffer_type_t bt, size_t size) {
  wc_ggml* g = served_of(bt)->g;
  auto* buf = new (std::nothrow) Buffer;
  if (buf == nullptr) return nullptr;
  buf->g = g;
  buf->layout = served_of(bt)->layout;
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
  // The layout's own type (CPU_REPACK's, AMX's), not ours: ggml-cpu finds repacked weights, and
  // picks the kernels that read them, by that pointer.
  ggml_backend_buffer_t b = ggml_backend_buffer_init(buf->layout->buft, iface, buf, size);
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

void weightcache::ggml_detail::set_tensor_filter(wc_ggml* g, bool (*filter)(const struct ggml_tensor*)) {
  g->filter.store(filter);
}

ggml_backend_buffer_type_t weightcache::ggml_detail::served_for(wc_ggml* g, ggml_backend_buffer_type_t stock) {
  if (g == nullptr || stock == nullptr) return nullptr;
  for (const auto& s : g->served_types)
    if (s->layout->buft == stock) return &s->buft;
  return nullptr;
}

bool weightcache::ggml_detail::is_served_layout(ggml_backend_buffer_type_t stock) {
  return stock != nullptr && layout_of(stock) != nullptr;
}

std::string weightcache::ggml_detail::key_prefix_of(const char* buft_name) {
  for (const KnownLayout& k : kKnown)
    if (std::strcmp(k.buft_name, buft_name) == 0) return key_prefix_for(k, cpu().features);
  return "";
}

extern "C" {

void wc_ggml_options_init(wc_ggml_options* o) {
  if (o == nullptr) return;
  *o = wc_ggml_options{};
  o->struct_size = sizeof *o;
  o->identity_window_ms = 0;  // the file system's change window alone
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
    if (o.identity_window_ms < 0 || o.identity_window_ms > kMaxWindowMs)
      return fail(WC_ERR_INVALID_ARGUMENT, "wc_ggml_create: identity_window_ms must be 0 (the file system's own change "
                                           "window) to 86400000");
    if (wc_status st = wc_ggml_check_abi(); st != WC_OK) return st;
    const Cpu& c = cpu();
    if (c.layouts.empty()) return fail(WC_ERR_INCOMPATIBLE, "wc_ggml_create: " + c.why);
    auto g = std::unique_ptr<wc_ggml>(new (std::nothrow) wc_ggml);
    if (!g) return fail(WC_ERR_NO_MEMORY, "wc_ggml_create: out of memory");
    g->cache = cache;
    g->options = o;
    // A buffer type per layout this CPU's ggml writes. The keys of each name its layout, ggml's
    // version, the fingerprint of its packing code (taken by the build from the tree this library
    // is compiled against, which wc_ggml_check_abi ties to the running ggml) and the CPU features
    // the build enabled; not ggml's build commit, which is "unknown" outside git and the enclosing
    // repository's inside another one.
    for (const Layout& l : c.layouts) {
      auto sv = std::make_unique<Served>();
      sv->g = g.get();
      sv->layout = &l;
      sv->name = std::strcmp(l.known->buft_name, "CPU_REPACK") == 0     ? std::string("WEIGHTCACHE_REPACK")
                 : std::strcmp(l.known->buft_name, "CPU_KLEIDIAI") == 0 ? std::string("WEIGHTCACHE_KLEIDIAI")
                                                                        : std::string("WEIGHTCACHE_") + l.known->buft_name;
      sv->buft.iface.get_name = bt_name;
      sv->buft.iface.alloc_buffer = bt_alloc;
      sv->buft.iface.get_alignment = bt_alignment;
      sv->buft.iface.get_max_size = nullptr;
      sv->buft.iface.get_alloc_size = bt_alloc_size;
      sv->buft.iface.is_host = nullptr;
      sv->buft.device = l.buft->device;
      sv->buft.context = sv.get();
      g->served_types.push_back(std::move(sv));
    }
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

ggml_backend_buffer_type_t wc_ggml_buffer_type(wc_ggml* g) {
  for (const Layout& l : cpu().layouts)
    if (std::strcmp(l.known->buft_name, "CPU_REPACK") == 0) return weightcache::ggml_detail::served_for(g, l.buft);
  return nullptr;
}

ggml_backend_buffer_type_t wc_ggml_buffer_type_for(wc_ggml* g, const struct ggml_tensor* tensor) {
  try {
    return weightcache::ggml_detail::served_for(g, stock_choice(tensor));
  } catch (...) {
    return nullptr;
  }
}

ggml_backend_buffer_type_t wc_ggml_stock_buffer_type(const struct ggml_tensor* tensor) {
  try {
    return stock_choice(tensor);
  } catch (...) {
    return nullptr;
  }
}

int wc_ggml_would_repack(const struct ggml_tensor* tensor) {
  try {
    return layout_of(stock_choice(tensor)) != nullptr ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

const char* wc_ggml_layouts(void) {
  static const std::string names = [] {
    std::string n;
    for (const Layout& l : cpu().layouts) n += (n.empty() ? "" : ",") + std::string(l.known->buft_name);
    return n;
  }();
  return names.c_str();
}

const char* wc_ggml_compat_key(void) {
  static const std::string key = [] {
    std::string k;
    for (const Layout& l : cpu().layouts) k += l.key_prefix;
    return k;
  }();
  return key.c_str();
}

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
