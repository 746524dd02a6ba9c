// The xnnpack backend of the reference execution provider: the whole forward pass runs in a real
// XNNPACK through its operator API, one fully-connected operator per layer
// (xnn_create_fully_connected_nc_f32, bias included) plus elementwise and reduce operators for
// the rest of each block (RMS norm, GELU, the residual add), on a 2-thread pthreadpool.
// XNNPACK packs the weights itself: into the cache file through the adapter's provider (adapter
// mode), or, with no weights cache (direct mode), into private memory of its own.
// Built only when the build has XNNPACK (WEIGHTCACHE_REF_EP_XNNPACK).
#pragma once

#include "ep.hpp"
#include "model.hpp"

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>
#include <pthreadpool.h>
#include <xnnpack.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace refep {

/// XNNPACK's allocator for this process (xnn_initialize takes one, once per process). Aligned
/// blocks of 64 KiB and more (packed weights, in direct mode) get an anonymous mapping of their
/// own between guard pages, as PrivateBuffer does (and as malloc would for blocks this large), so
/// /proc/self/smaps accounts for exactly their pages; the allocator remembers every aligned
/// block's size, so the backend can find its packed weights afterwards.
class XnnAllocator {
 public:
  static XnnAllocator& instance() {
    static XnnAllocator a;
    return a;
  }
  const xnn_allocator* get() const { return &allocator_; }

  /// The live aligned blocks of exactly `size` bytes allocated since `mark` (a value of next_id()).
  std::vector<void*> blocks_since(std::uint64_t mark, std::size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*> out;
    for (const auto& [p, b] : blocks_)
      if (b.id >= mark && b.size == size) out.push_back(p);
    return out;
  }
  std::uint64_t next_id() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_id_;
  }

 private:
  static constexpr std::size_t kOwnMapping = 64 << 10;
  struct Block {
    std::size_t size = 0, map_size = 0;
    std::uint64_t id = 0;
  };

  XnnAllocator() {
    allocator_.context = this;
    allocator_.allocate = [](void*, size_t n) { return std::malloc(n); };
    allocator_.reallocate = [](void*, void* p, size_t n) { return std::realloc(p, n); };
    allocator_.deallocate = [](void*, void* p) { std::free(p); };
    allocator_.aligned_allocate = [](void* c, size_t alignment, size_t n) {
      return static_cast<XnnAllocator*>(c)->aligned_allocate(alignment, n);
    };
    allocator_.aligned_deallocate = [](void* c, void* p) { static_cast<XnnAllocator*>(c)->aligned_deallocate(p); };
  }

  void* aligned_allocate(std::size_t alignment, std::size_t n) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* data = nullptr;
    std::size_t map_size = 0;
    if (n < kOwnMapping || alignment > page) {
      if (::posix_memalign(&data, alignment < sizeof(void*) ? sizeof(void*) : alignment, n) != 0) return nullptr;
    } else {
      const std::size_t size = (n + page - 1) / page * page;
      map_size = size + 2 * page;
      void* base = ::mmap(nullptr, map_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) return nullptr;
      data = static_cast<std::byte*>(base) + page;
      if (::mprotect(data, size, PROT_READ | PROT_WRITE) != 0) {
        ::munmap(base, map_size);
        return nullptr;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[data] = Block{n, map_size, next_id_++};
    return data;
  }

  void aligned_deallocate(void* p) {
    if (p == nullptr) return;
    std::size_t map_size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = blocks_.find(p);
      if (it != blocks_.end()) {
        map_size = it->second.map_size;
        blocks_.erase(it);
      }
    }
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (map_size != 0) ::munmap(static_cast<std::byte*>(p) - page, map_size);
    else std::free(p);
  }

  xnn_allocator allocator_{};
  std::mutex mu_;
  std::map<void*, Block> blocks_;  // guarded by mu_
  std::uint64_t next_id_ = 0;      // guarded by mu_
};

class XnnpackProvider final : public ExecutionProvider {
 public:
  static constexpr std::size_t kThreads = 2;

  /// `cache` (NULL in direct mode) and `source` are borrowed and must outlive the provider.
  /// Mode::c_abi is not a mode of this backend (XNNPACK talks to a provider, not to the C ABI).
  XnnpackProvider(Mode mode, wc_cache* cache, SourceModel* source, const Config& config)
      : mode_(mode), cache_(cache), source_(source), config_(config), layers_(model_layers(config)) {}
  ~XnnpackProvider() override {
    // Every operator goes before the provider it was created with, then the adapter.
    for (xnn_operator_t op : fc_) xnn_delete_operator(op);
    for (xnn_operator_t op : {square_mean_, add_eps_, rsqrt_, scale_, gelu_, residual_})
      if (op != nullptr) xnn_delete_operator(op);
    if (threadpool_ != nullptr) pthreadpool_destroy(threadpool_);
    wc_xnn_adapter_destroy(adapter_);
  }
  XnnpackProvider(const XnnpackProvider&) = delete;
  XnnpackProvider& operator=(const XnnpackProvider&) = delete;

  /// What the packed weights depend on besides the model: this XNNPACK build (its packers and
  /// micro-kernels), from its build identifier. Part of the cache's compatibility key.
  static std::string packer_id() {
    if (xnn_initialize(XnnAllocator::instance().get()) != xnn_status_success) return "xnnpack-uninitialized";
    const auto* id = static_cast<const unsigned char*>(xnn_experimental_get_build_identifier_data());
    std::string out = "xnnpack-";
    char hex[3];
    for (std::size_t i = 0; i < xnn_experimental_get_build_identifier_size(); ++i) {
      std::snprintf(hex, sizeof hex, "%02x", id[i]);
      out += hex;
    }
    return out;
  }

  std::string init() override {
    if (mode_ == Mode::c_abi) return "the xnnpack backend packs through a weights-cache provider, not the C ABI";
    if (const xnn_status s = xnn_initialize(XnnAllocator::instance().get()); s != xnn_status_success)
      return "xnn_initialize: status " + std::to_string(s);
    threadpool_ = pthreadpool_create(kThreads);
    if (threadpool_ == nullptr) return "cannot create a thread pool of " + std::to_string(kThreads);
    if (mode_ == Mode::adapter) {
      std::string err = open_adapter(cache_, *source_, &adapter_);
      if (!err.empty()) return err;
      hook_.install(static_cast<xnn_weights_cache_provider*>(wc_xnn_adapter_provider(adapter_)), this);
    }
    return {};
  }

  std::string create_operators(LoadCounts* counts) override {
    fc_.assign(layers_.size(), nullptr);
    packed_.assign(layers_.size(), Packed{});
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Linear& l = layers_[i];
      std::string err = probe_packed_size(i);
      if (!err.empty()) return err;
      const auto* w = static_cast<const float*>(source_->weight(i).data);
      const auto* b = static_cast<const float*>(source_->bias(i).data);
      const std::uint64_t mark = XnnAllocator::instance().next_id();
      current_ = i;
      current_packed_ = false;
      // Direct mode: XNNPACK packs, every time, from the unpacked weights, so they must be there.
      // Adapter mode: only on a miss, when it asks for space (the hook generates them then).
      if (mode_ == Mode::direct) materialize(i);
      const xnn_status s = xnn_create_fully_connected_nc_f32(
          l.cols, l.rows, l.cols, l.rows, w, b, -INFINITY, INFINITY, /*flags=*/0,
          mode_ == Mode::adapter ? hook_.get() : nullptr, &fc_[i]);
      release(i);
      if (s != xnn_status_success) {
        return "xnn_create_fully_connected_nc_f32 (" + l.weight_name + "): status " + std::to_string(s) +
               (mode_ == Mode::adapter ? std::string("; weightcache: ") + wc_last_error() : std::string());
      }
      if (mode_ == Mode::direct) {
        // XNNPACK allocated the packed weights with our allocator, in a block of the size it
        // reserves with a cache: that block is where they live.
        const auto blocks = XnnAllocator::instance().blocks_since(mark, packed_[i].size);
        if (blocks.size() == 1) packed_[i].addr = blocks[0];
        else
          std::fprintf(stderr, "weightcache-ref-ep: %s: %zu blocks of %zu bytes allocated by XNNPACK; its memory "
                               "is not measured\n",
                       l.weight_name.c_str(), blocks.size(), packed_[i].size);
        current_packed_ = true;
      }
      ++(current_packed_ ? counts->packed : counts->hits);
    }
    // The rest of a block: elementwise and reduce operators, shared by every block.
    xnn_status s = xnn_create_reduce_nd(xnn_reduce_mean_squared, xnn_datatype_fp32, nullptr, nullptr, 0, &square_mean_);
    if (s == xnn_status_success)
      s = xnn_create_binary_elementwise_nd(xnn_binary_add, xnn_datatype_fp32, nullptr, nullptr, nullptr, 0, &add_eps_);
    if (s == xnn_status_success)
      s = xnn_create_unary_elementwise_nc(xnn_unary_reciprocal_square_root, xnn_datatype_fp32, xnn_datatype_fp32,
                                          nullptr, nullptr, nullptr, nullptr, 0, &rsqrt_);
    if (s == xnn_status_success)
      s = xnn_create_binary_elementwise_nd(xnn_binary_multiply, xnn_datatype_fp32, nullptr, nullptr, nullptr, 0,
                                           &scale_);
    // The tanh form of GELU, as the gemm backend computes it.
    if (s == xnn_status_success)
      s = xnn_create_unary_elementwise_nc(xnn_unary_approxgelu, xnn_datatype_fp32, xnn_datatype_fp32, nullptr,
                                          nullptr, nullptr, nullptr, 0, &gelu_);
    if (s == xnn_status_success)
      s = xnn_create_binary_elementwise_nd(xnn_binary_add, xnn_datatype_fp32, nullptr, nullptr, nullptr, 0,
                                           &residual_);
    if (s != xnn_status_success) return "creating the elementwise operators: status " + std::to_string(s);
    return {};
  }

  std::string finalize() override {
    if (mode_ == Mode::direct) return {};
    if (hook_.inner()->is_finalized(hook_.inner()->context)) return {};
    if (wc_finalize(cache_) != WC_OK) return std::string("wc_finalize: ") + wc_last_error();
    return {};
  }

  std::string reshape() override {
    const std::size_t m = config_.tokens, d = config_.dim, h = config_.hidden;
    for (std::size_t i = 0; i < fc_.size(); ++i) {
      if (const xnn_status s = xnn_reshape_fully_connected_nc_f32(fc_[i], m, threadpool_); s != xnn_status_success)
        return "reshaping " + layers_[i].weight_name + ": status " + std::to_string(s);
      if (mode_ == Mode::adapter) {
        packed_[i].addr = hook_.inner()->offset_to_addr(hook_.inner()->context, packed_[i].offset);
        if (packed_[i].addr == nullptr) return "offset_to_addr failed for " + layers_[i].weight_name;
      }
    }
    const int64_t row_axis[1] = {1};
    const std::size_t md[2] = {m, d}, m1[2] = {m, 1}, one[1] = {1}, rows[1] = {m};
    xnn_status s = xnn_reshape_reduce_nd(square_mean_, 1, row_axis, 2, md, nullptr, threadpool_);
    if (s == xnn_status_success) s = xnn_reshape_binary_elementwise_nd(add_eps_, 1, rows, 1, one, threadpool_);
    if (s == xnn_status_success) s = xnn_reshape_unary_elementwise_nc(rsqrt_, m, 1, 1, 1, threadpool_);
    if (s == xnn_status_success) s = xnn_reshape_binary_elementwise_nd(scale_, 2, md, 2, m1, threadpool_);
    if (s == xnn_status_success) s = xnn_reshape_unary_elementwise_nc(gelu_, m, h, h, h, threadpool_);
    if (s == xnn_status_success) s = xnn_reshape_binary_elementwise_nd(residual_, 2, md, 2, md, threadpool_);
    if (s != xnn_status_success) return "reshaping the elementwise operators: status " + std::to_string(s);
    // XNNPACK may read a few bytes past the end of an input (XNN_EXTRA_BYTES): pad every buffer.
    for (auto* v : {&x_, &next_, &normed_, &down_}) v->assign(m * d + kPad, 0.0f);
    for (auto* v : {&up_, &act_}) v->assign(m * h + kPad, 0.0f);
    for (auto* v : {&mean_square_, &inv_rms_}) v->assign(m + kPad, 0.0f);
    return {};
  }

  std::string run(const std::vector<float>& input, std::vector<float>* output) override {
    const float eps = 1e-5f;
    std::copy(input.begin(), input.end(), x_.begin());
    for (std::size_t b = 0; b < config_.layers; ++b) {
      // normed = x * rsqrt(mean(x^2) + eps); up = gelu(W_up normed + b_up); x += W_down up + b_down.
      // An f32 reduction accumulates in its output: it takes no workspace (XNNPACK's subgraph
      // passes none either).
      xnn_status s = xnn_setup_reduce_nd(square_mean_, nullptr, x_.data(), mean_square_.data());
      if (s == xnn_status_success) s = xnn_run_operator(square_mean_, threadpool_);
      if (s == xnn_status_success) s = xnn_setup_binary_elementwise_nd(add_eps_, mean_square_.data(), &eps, mean_square_.data());
      if (s == xnn_status_success) s = xnn_run_operator(add_eps_, threadpool_);
      if (s == xnn_status_success) s = xnn_setup_unary_elementwise_nc(rsqrt_, mean_square_.data(), inv_rms_.data());
      if (s == xnn_status_success) s = xnn_run_operator(rsqrt_, threadpool_);
      if (s == xnn_status_success) s = xnn_setup_binary_elementwise_nd(scale_, x_.data(), inv_rms_.data(), normed_.data());
      if (s == xnn_status_success) s = xnn_run_operator(scale_, threadpool_);
      if (s == xnn_status_success) s = xnn_setup_fully_connected_nc_f32(fc_[2 * b], normed_.data(), up_.data());
      if (s == xnn_status_success) s = xnn_run_operator(fc_[2 * b], threadpool_);
      if (s == xnn_status_success) s = xnn_setup_unary_elementwise_nc(gelu_, up_.data(), act_.data());
      if (s == xnn_status_success) s = xnn_run_operator(gelu_, threadpool_);
      if (s == xnn_status_success) s = xnn_setup_fully_connected_nc_f32(fc_[2 * b + 1], act_.data(), down_.data());
      if (s == xnn_status_success) s = xnn_run_operator(fc_[2 * b + 1], threadpool_);
      if (s == xnn_status_success) s = xnn_setup_binary_elementwise_nd(residual_, x_.data(), down_.data(), next_.data());
      if (s == xnn_status_success) s = xnn_run_operator(residual_, threadpool_);
      if (s != xnn_status_success) return "block " + std::to_string(b) + ": status " + std::to_string(s);
      std::swap(x_, next_);
    }
    output->assign(x_.begin(), x_.begin() + static_cast<std::ptrdiff_t>(config_.tokens * config_.dim));
    return {};
  }

  std::vector<std::pair<const void*, std::size_t>> packed_ranges() const override {
    std::vector<std::pair<const void*, std::size_t>> out;
    for (const Packed& p : packed_) out.emplace_back(p.addr, p.addr != nullptr ? p.size : 0);
    return out;
  }
  std::size_t packed_total() const override {
    std::size_t n = 0;
    for (const Packed& p : packed_) n += p.size;
    return n;
  }
  wc_xnn_adapter* adapter() const override { return adapter_; }
  std::size_t operators() const override { return layers_.size(); }
  Backend backend() const override { return Backend::xnnpack; }

 private:
  static constexpr std::size_t kPad = 64 / sizeof(float);

  struct Packed {
    std::size_t offset = SIZE_MAX;  // adapter mode: where the cache keeps them
    const void* addr = nullptr;
    std::size_t size = 0;  // bytes XNNPACK packs this layer into
  };

  /// XNNPACK's provider with one addition: the adapter's provider, every call forwarded
  /// unchanged, except that when XNNPACK asks for space to pack a layer, the layer's unpacked
  /// weights are generated first (this runtime generates them on first use; one whose model file
  /// is memory-mapped needs no such hook, and would pass the adapter's provider itself). It
  /// also notes the offset each layer's packed weights get, to measure where they live.
  class Hook {
   public:
    void install(xnn_weights_cache_provider* inner, XnnpackProvider* owner) {
      inner_ = inner;
      owner_ = owner;
      p_.context = this;
      p_.look_up = [](void* c, const xnn_weights_cache_look_up_key* k) -> size_t {
        Hook* h = self(c);
        const size_t offset = h->inner_->look_up(h->inner_->context, k);
        if (offset != SIZE_MAX) h->owner_->packed_[h->owner_->current_].offset = offset;
        return offset;
      };
      p_.reserve_space = [](void* c, size_t n) -> void* {
        Hook* h = self(c);
        h->owner_->materialize(h->owner_->current_);
        h->owner_->current_packed_ = true;
        return h->inner_->reserve_space(h->inner_->context, n);
      };
      p_.look_up_or_insert = [](void* c, const xnn_weights_cache_look_up_key* k, void* ptr, size_t n) -> size_t {
        Hook* h = self(c);
        const size_t offset = h->inner_->look_up_or_insert(h->inner_->context, k, ptr, n);
        h->owner_->packed_[h->owner_->current_].offset = offset;
        return offset;
      };
      p_.is_finalized = [](void* c) { return self(c)->inner_->is_finalized(self(c)->inner_->context); };
      p_.offset_to_addr = [](void* c, size_t o) { return self(c)->inner_->offset_to_addr(self(c)->inner_->context, o); };
      p_.delete_cache = [](void* c) { return self(c)->inner_->delete_cache(self(c)->inner_->context); };
      p_.alias_data = [](void* c, void* a, void* o) { return self(c)->inner_->alias_data(self(c)->inner_->context, a, o); };
    }
    xnn_weights_cache_t get() { return &p_; }
    xnn_weights_cache_provider* inner() const { return inner_; }

   private:
    static Hook* self(void* c) { return static_cast<Hook*>(c); }
    xnn_weights_cache_provider p_{};
    xnn_weights_cache_provider* inner_ = nullptr;
    XnnpackProvider* owner_ = nullptr;
  };

  /// How many bytes XNNPACK packs layer i into: it reserves exactly that before packing
  /// anything, so a provider that misses and refuses the space learns it without a byte packed
  /// or read (XNNPACK then fails the creation cleanly). Once per layer shape.
  std::string probe_packed_size(std::size_t i) {
    const Linear& l = layers_[i];
    const auto known = sizes_.find({l.rows, l.cols});
    if (known != sizes_.end()) {
      packed_[i].size = known->second;
      return {};
    }
    struct Probe {
      xnn_weights_cache_provider p{};
      std::size_t asked = 0;
    } probe;
    probe.p.context = &probe;
    probe.p.look_up = [](void*, const xnn_weights_cache_look_up_key*) -> size_t { return SIZE_MAX; };
    probe.p.reserve_space = [](void* c, size_t n) -> void* {
      static_cast<Probe*>(c)->asked = n;
      return nullptr;
    };
    probe.p.look_up_or_insert = [](void*, const xnn_weights_cache_look_up_key*, void*, size_t) -> size_t {
      return SIZE_MAX;
    };
    probe.p.is_finalized = [](void*) { return false; };
    probe.p.offset_to_addr = [](void*, size_t) -> void* { return nullptr; };
    probe.p.delete_cache = [](void*) { return xnn_status_success; };
    probe.p.alias_data = [](void*, void*, void*) { return xnn_status_success; };
    xnn_operator_t op = nullptr;
    const xnn_status s = xnn_create_fully_connected_nc_f32(
        l.cols, l.rows, l.cols, l.rows, static_cast<const float*>(source_->weight(i).data),
        static_cast<const float*>(source_->bias(i).data), -INFINITY, INFINITY, 0, &probe.p, &op);
    if (op != nullptr) xnn_delete_operator(op);
    if (s != xnn_status_out_of_memory || probe.asked == 0)
      return "XNNPACK did not ask for the packed size of " + l.weight_name + " (status " + std::to_string(s) + ")";
    sizes_[{l.rows, l.cols}] = probe.asked;
    packed_[i].size = probe.asked;
    return {};
  }

  void materialize(std::size_t i) {
    source_->materialize(2 * i);
    source_->materialize(2 * i + 1);
  }
  void release(std::size_t i) {
    source_->release(2 * i);
    source_->release(2 * i + 1);
  }

  Mode mode_;
  wc_cache* cache_;
  SourceModel* source_;
  Config config_;
  std::vector<Linear> layers_;
  wc_xnn_adapter* adapter_ = nullptr;
  Hook hook_;
  pthreadpool_t threadpool_ = nullptr;
  std::vector<xnn_operator_t> fc_;
  std::vector<Packed> packed_;
  std::map<std::pair<std::size_t, std::size_t>, std::size_t> sizes_;
  std::size_t current_ = 0;      // the layer being created
  bool current_packed_ = false;  // whether XNNPACK packed it (asked for space)
  xnn_operator_t square_mean_ = nullptr, add_eps_ = nullptr, rsqrt_ = nullptr, scale_ = nullptr, gelu_ = nullptr,
                 residual_ = nullptr;
  std::vector<float> x_, next_, normed_, up_, act_, down_, mean_square_, inv_rms_;
};

}  // namespace refep
