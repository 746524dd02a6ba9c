// What a packed weight is keyed by, and where a model's cache lives by default.
//
// A weight's identity must change whenever its bytes may have changed, and must be found without
// reading the bytes on a warm session (docs/DESIGN.md, "ONNX Runtime keys"):
// - external data: the data file's identity (device, inode, size, mtime and ctime to the
//   nanosecond) plus the offset and length inside it. Any write to the file moves its ctime, which
//   no program can set back; a file replaced by rename has another inode. A file whose ctime is
//   within kRecentChangeWindow of now is hashed instead, since a second write within one
//   timestamp tick of the first would leave ctime unchanged;
// - embedded data (or external data whose file cannot be examined): XXH3-128 of the bytes ONNX
//   Runtime already parsed.
// Both carry the element type and shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::ort {

/// How a weight's identity was made.
enum class IdentityKind { file, content };

struct WeightSource {
  const void* data = nullptr;      // the bytes ORT has (valid during GetCapability/Compile only)
  std::size_t bytes = 0;
  int element_type = 0;            // ONNXTensorElementDataType
  std::vector<std::int64_t> dims;
  // External data: the data file as resolved against the model's directory ("" when embedded).
  std::string external_path;
  std::int64_t external_offset = 0;
};

/// The identity of one weight (deterministic across processes for the same bytes or file state).
std::string weight_identity(const WeightSource& w, IdentityKind* kind = nullptr);

/// The default cache file for a model: <cache dir>/weightcache/ort/<stem>-<digest>.wcache, where
/// the cache dir is $XDG_CACHE_HOME or $HOME/.cache; the digest is of the model's absolute path
/// ("unnamed-model" for a model loaded from bytes). "" when no cache directory is known.
std::string default_cache_path(const std::string& model_path);

/// The CPU features the packed layouts depend on (XNNPACK dispatches on them), e.g.
/// "x86_64:avx2,fma,avx512f". Part of the compatibility key.
std::string cpu_features();

/// A 16-hex-digit digest of bytes (XXH3-64).
std::string hex_digest(const void* data, std::size_t size);

}  // namespace weightcache::ort
