#include "xnn_mlp.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace xnnmlp {

namespace {

constexpr char kMagic[8] = {'W', 'C', 'X', 'M', 'O', 'D', 'E', 'L'};
constexpr std::uint32_t kVersion = 2;
constexpr std::size_t kAlign = 64, kSlack = 64;

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint16_t dtype;
  std::uint16_t attention;
  std::uint64_t layers, dim, hidden, seed;
  std::uint64_t digest;
  std::uint64_t total_size;
};
static_assert(sizeof(FileHeader) == 64);

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  std::string name;
  std::size_t offset, size;
  char fill;  // 'w' weights, 'b' bias, 's' scales
  std::size_t cols;
};

std::size_t weight_bytes_of(DType t, std::size_t rows, std::size_t cols) {
  switch (t) {
    case DType::f32: return rows * cols * 4;
    case DType::qc8w: return rows * cols;
    case DType::qc4w: return rows * cols / 2;
  }
  return 0;
}

std::vector<Layout> layout_of(DType t, const Shape& s, std::size_t* total) {
  std::vector<Layout> out;
  std::size_t at = sizeof(FileHeader);
  auto add = [&](std::string name, std::size_t size, char fill, std::size_t cols) {
    at = round_up(at);
    out.push_back({std::move(name), at, size, fill, cols});
    at += size + kSlack;
  };
  auto matrix = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    add(name + ".weight", weight_bytes_of(t, rows, cols), 'w', cols);
    add(name + ".bias", rows * 4, 'b', cols);
    if (t != DType::f32) add(name + ".scale", rows * 4, 's', cols);
  };
  for (std::size_t l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    if (s.attention)
      for (const char* n : {"attn.q", "attn.k", "attn.v", "attn.o"}) matrix(p + n, s.dim, s.dim);
    matrix(p + "mlp.up", s.hidden, s.dim);
    matrix(p + "mlp.down", s.dim, s.hidden);
  }
  *total = round_up(at);
  return out;
}

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fill_tensor(unsigned char* p, const Layout& t, DType dtype, std::uint64_t seed) {
  std::uint64_t state = mix(seed ^ std::hash<std::string>{}(t.name));
  auto next = [&state] { return mix(state += 0x9e3779b97f4a7c15ull); };
  const float spread = 1.0f / std::sqrt(static_cast<float>(t.cols));
  if (t.fill == 'w' && dtype != DType::f32) {  // int8 or int4 pairs: any bits
    for (std::size_t i = 0; i < t.size; i += 8) {
      const std::uint64_t v = next();
      std::memcpy(p + i, &v, std::min<std::size_t>(8, t.size - i));
    }
    return;
  }
  auto* f = reinterpret_cast<float*>(p);
  for (std::size_t i = 0; i < t.size / 4; i += 2) {
    const std::uint64_t v = next();
    for (std::size_t j = 0; j < 2 && i + j < t.size / 4; ++j) {
      const float u = static_cast<float>((v >> (32 * j)) & 0xffffff) / float(1 << 24) * 2.0f - 1.0f;
      switch (t.fill) {
        case 'w': f[i + j] = u * spread; break;
        case 'b': f[i + j] = u * 0.1f; break;
        default: f[i + j] = (dtype == DType::qc8w ? 1.0f / 127 : 1.0f / 8) * spread * (1.0f + 0.25f * u); break;
      }
    }
  }
}

std::uint64_t digest_of(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 0x6a09e667f3bcc909ull;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, p + i, 8);
    h = (h ^ mix(v + i)) * 0x100000001b3ull;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return mix(h);
}

bool fail(std::string* err, std::string what) {
  if (err) *err = std::move(what);
  return false;
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::qc8w: return "qc8w";
    case DType::qc4w: return "qc4w";
  }
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  for (DType t : {DType::f32, DType::qc8w, DType::qc4w})
    if (name == dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

bool ModelFile::ensure(const std::string& path, DType dtype, const Shape& shape, std::uint64_t seed,
                       std::string* err) {
  if (shape.layers == 0 || shape.dim == 0 || shape.hidden == 0 || shape.dim % 2 || shape.hidden % 2)
    return fail(err, "the model needs layers, dim and hidden above 0, dim and hidden even");
  std::size_t total = 0;
  const auto layout = layout_of(dtype, shape, &total);
  {  // A complete model of this dtype, shape and seed: keep it.
    FileHeader h{};
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0) {
      const bool ok = ::pread(fd, &h, sizeof h, 0) == sizeof h && ::fstat(fd, &st) == 0;
      ::close(fd);
      if (ok && std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion &&
          h.dtype == static_cast<std::uint16_t>(dtype) && h.attention == shape.attention &&
          h.layers == shape.layers && h.dim == shape.dim &&
          h.hidden == shape.hidden && h.seed == seed && h.total_size == total &&
          static_cast<std::uint64_t>(st.st_size) == total)
        return true;
    }
  }
  const std::string tmp = path + ".writing";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(err, "cannot create '" + tmp + "': " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return fail(err, "cannot size '" + tmp + "': " + std::strerror(e));
  }
  void* m = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return fail(err, "cannot map '" + tmp + "': " + std::strerror(e));
  }
  auto* base = static_cast<unsigned char*>(m);
  for (const auto& t : layout) fill_tensor(base + t.offset, t, dtype, seed);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.dtype = static_cast<std::uint16_t>(dtype);
  h.attention = shape.attention ? 1 : 0;
  h.layers = shape.layers;
  h.dim = shape.dim;
  h.hidden = shape.hidden;
  h.seed = seed;
  h.digest = digest_of(base + sizeof h, total - sizeof h);
  h.total_size = total;
  std::memcpy(base, &h, sizeof h);
  ::munmap(m, total);
  const bool synced = ::fdatasync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return fail(err, "cannot write '" + path + "': " + std::strerror(errno));
  }
  return true;
}

ModelFile::~ModelFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

bool ModelFile::open(const std::string& path, std::string* err) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(err, "cannot open the model '" + path + "': " + std::strerror(errno));
  FileHeader h{};
  struct stat st {};
  const bool read = ::pread(fd, &h, sizeof h, 0) == sizeof h && ::fstat(fd, &st) == 0;
  if (!read || std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion || h.dtype > 2 || h.attention > 1 ||
      static_cast<std::uint64_t>(st.st_size) != h.total_size) {
    ::close(fd);
    return fail(err, "'" + path + "' is not a complete model file");
  }
  dtype_ = static_cast<DType>(h.dtype);
  shape_ = {h.layers, h.dim, h.hidden, h.attention != 0};
  std::size_t total = 0;
  const auto layout = layout_of(dtype_, shape_, &total);
  if (total != h.total_size) {
    ::close(fd);
    return fail(err, "'" + path + "' has a size its header does not explain");
  }
  void* m = ::mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return fail(err, "cannot map the model '" + path + "': " + std::strerror(errno));
  map_ = m;
  map_size_ = total;
  path_ = path;
  char buf[40];
  std::snprintf(buf, sizeof buf, "xnnmlp-v1:%016llx", static_cast<unsigned long long>(h.digest));
  digest_ = buf;
  tensors_.clear();
  for (const auto& t : layout) tensors_.push_back({t.name, static_cast<const unsigned char*>(m) + t.offset, t.size});
  return true;
}

std::uint64_t ModelFile::weight_bytes() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors_) n += t.size;
  return n;
}

bool ModelFile::name_buffers(wc_xnn_adapter* adapter) const {
  for (const auto& t : tensors_)
    if (wc_xnn_adapter_name_buffer(adapter, t.data, t.name.c_str()) != WC_OK) return false;
  return true;
}

std::vector<unsigned char> compat_key(const ModelFile& model) {
  const void* id = xnn_experimental_get_build_identifier_data();
  const std::size_t id_size = xnn_experimental_get_build_identifier_size();
  // XNNPACK picks its micro-kernels, and so its packed layouts, by the CPU's features.
  std::string cpu(wc_cpu_features(nullptr, 0), '\0');
  (void)wc_cpu_features(cpu.data(), cpu.size() + 1);
  const std::string options = std::string("xnnmlp dtype=") + dtype_name(model.dtype()) + " xnn_flags=0 cpu=" + cpu;
  const std::string& digest = model.digest();
  std::vector<unsigned char> key(WC_XNN_COMPAT_KEY_MAX_SIZE);
  std::size_t size = 0;
  if (wc_xnn_compat_key(id, id_size, digest.data(), digest.size(), options.data(), options.size(), key.data(),
                        key.size(), &size) != WC_OK)
    return {};
  key.resize(size);
  return key;
}

// ---- the runtime --------------------------------------------------------------------------------

namespace {

#define XNNMLP_CHECK(expr, step)          \
  do {                                    \
    const xnn_status s_ = (expr);         \
    if (s_ != xnn_status_success) {       \
      if (where) *where = (step);         \
      return s_;                          \
    }                                     \
  } while (0)

constexpr std::uint32_t kInputId = 0, kOutputId = 1;

}  // namespace

Runtime::~Runtime() { destroy(); }

void Runtime::destroy() {
  if (runtime_ != nullptr) xnn_delete_runtime(runtime_);
  runtime_ = nullptr;
}

xnn_status Runtime::create(const ModelFile& model, xnn_weights_cache_t cache, pthreadpool_t threadpool,
                           std::size_t batch, std::string* where) {
  destroy();
  model_ = &model;
  batch_ = batch;
  const Shape& s = model.shape();
  const DType dtype = model.dtype();
  xnn_subgraph_t g = nullptr;
  XNNMLP_CHECK(xnn_create_subgraph(2, 0, &g), "create subgraph");
  struct SubgraphOwner {
    xnn_subgraph_t g;
    ~SubgraphOwner() { xnn_delete_subgraph(g); }
  } owner{g};
  auto value = [&](std::size_t cols, std::uint32_t external, std::uint32_t flags, std::uint32_t* id) {
    const std::size_t dims[2] = {batch, cols};
    return xnn_define_tensor_value(g, xnn_datatype_fp32, 2, dims, nullptr, external, flags, id);
  };
  std::uint32_t x = 0, out = 0;
  XNNMLP_CHECK(value(s.dim, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT, &x), "define input");
  XNNMLP_CHECK(value(s.dim, kOutputId, XNN_VALUE_FLAG_EXTERNAL_OUTPUT, &out), "define output");
  const auto& t = model.tensors();
  const std::size_t per_matrix = dtype == DType::f32 ? 2 : 3;  // weight, bias (, scale)
  std::size_t next_tensor = 0;
  // One fully-connected node: src [batch x cols] -> dst [batch x rows], weights from tensors i..
  auto fc = [&](std::size_t rows, std::size_t cols, std::uint32_t src, std::uint32_t dst) {
    const std::size_t i = next_tensor;
    next_tensor += per_matrix;
    const Tensor& w = t[i];
    const Tensor& b = t[i + 1];
    const std::size_t wdims[2] = {rows, cols}, bdims[1] = {rows};
    std::uint32_t filter = 0, bias = 0;
    xnn_status st = xnn_define_tensor_value(g, xnn_datatype_fp32, 1, bdims, b.data, XNN_INVALID_VALUE_ID, 0, &bias);
    if (st != xnn_status_success) return st;
    if (dtype == DType::f32) {
      st = xnn_define_tensor_value(g, xnn_datatype_fp32, 2, wdims, w.data, XNN_INVALID_VALUE_ID, 0, &filter);
    } else {
      const auto* scale = static_cast<const float*>(t[i + 2].data);
      st = dtype == DType::qc8w
               ? xnn_define_channelwise_quantized_tensor_value(g, xnn_datatype_qcint8, scale, 2, 0, wdims, w.data,
                                                               XNN_INVALID_VALUE_ID, 0, &filter)
               : xnn_define_channelwise_quantized_tensor_value_v2(g, xnn_datatype_qcint4, /*zero_point=*/8, scale, 2,
                                                                  0, wdims, w.data, XNN_INVALID_VALUE_ID, 0, &filter);
      if (st != xnn_status_success) return st;
      const std::size_t qdims[2] = {batch, cols};
      std::uint32_t q = 0;
      st = xnn_define_dynamically_quantized_tensor_value(g, xnn_datatype_qdint8, 2, 1, qdims, XNN_INVALID_VALUE_ID,
                                                         0, &q);
      if (st != xnn_status_success) return st;
      st = xnn_define_unary(g, xnn_unary_convert, nullptr, src, q, 0);
      src = q;
    }
    if (st != xnn_status_success) return st;
    return xnn_define_fully_connected(g, -INFINITY, INFINITY, src, filter, bias, dst, 0);
  };
  for (std::size_t l = 0; l < s.layers; ++l) {
    if (s.attention) {
      std::uint32_t h = x;
      for (int p = 0; p < 4; ++p) {
        std::uint32_t o = 0;
        XNNMLP_CHECK(value(s.dim, XNN_INVALID_VALUE_ID, 0, &o), "define value");
        XNNMLP_CHECK(fc(s.dim, s.dim, h, o), "define attention projection");
        h = o;
      }
      std::uint32_t sum = 0;
      XNNMLP_CHECK(value(s.dim, XNN_INVALID_VALUE_ID, 0, &sum), "define value");
      XNNMLP_CHECK(xnn_define_binary(g, xnn_binary_add, nullptr, x, h, sum, 0), "define residual add");
      x = sum;
    }
    std::uint32_t up = 0, act = 0, down = 0, next = 0;
    XNNMLP_CHECK(value(s.hidden, XNN_INVALID_VALUE_ID, 0, &up), "define hidden value");
    XNNMLP_CHECK(value(s.hidden, XNN_INVALID_VALUE_ID, 0, &act), "define hidden value");
    XNNMLP_CHECK(value(s.dim, XNN_INVALID_VALUE_ID, 0, &down), "define value");
    if (l + 1 == s.layers) next = out;
    else XNNMLP_CHECK(value(s.dim, XNN_INVALID_VALUE_ID, 0, &next), "define value");
    XNNMLP_CHECK(fc(s.hidden, s.dim, x, up), "define up projection");
    XNNMLP_CHECK(xnn_define_unary(g, xnn_unary_gelu, nullptr, up, act, 0), "define gelu");
    XNNMLP_CHECK(fc(s.dim, s.hidden, act, down), "define down projection");
    XNNMLP_CHECK(xnn_define_binary(g, xnn_binary_add, nullptr, x, down, next, 0), "define residual add");
    x = next;
  }
  XNNMLP_CHECK(xnn_create_runtime_v3(g, cache, threadpool, 0, &runtime_), "create runtime");
  return xnn_status_success;
}

xnn_status Runtime::run(std::uint64_t* digest, std::string* where) {
  const std::size_t dim = model_->shape().dim;
  input_.assign(batch_ * dim + 16, 0.0f);  // XNNPACK may read a little past an input
  for (std::size_t i = 0; i < batch_ * dim; ++i)
    input_[i] = static_cast<float>(mix(i + 1) >> 40) / float(1 << 24) * 2.0f - 1.0f;
  output_.assign(batch_ * dim, 0.0f);
  XNNMLP_CHECK(xnn_reshape_runtime(runtime_), "reshape runtime");
  const xnn_external_value ext[2] = {{kInputId, input_.data()}, {kOutputId, output_.data()}};
  XNNMLP_CHECK(xnn_setup_runtime_v2(runtime_, 2, ext), "setup runtime");
  XNNMLP_CHECK(xnn_invoke_runtime(runtime_), "invoke runtime");
  *digest = digest_of(reinterpret_cast<const unsigned char*>(output_.data()), output_.size() * sizeof(float));
  return xnn_status_success;
}

}  // namespace xnnmlp
