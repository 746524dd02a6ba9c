// What a packed weight is keyed by, and where a model's cache lives by default; shared by the
// ONNX Runtime provider and the ggml buffer type (each compiles it in).
//
// A weight is keyed by its content: XXH3-128 of its bytes, with its element type and shape. A
// warm session must not read every source byte to find that key again (docs/DESIGN.md, "ONNX
// Runtime keys"), so for external data the cache also keeps a small entry from the data file's
// identity to the content key:
// - the file identity is the data file's device, inode, size, mtime and ctime to the nanosecond,
//   plus the offset and length inside it. Any write to the file moves its ctime, which no program
//   can set back; a file replaced by rename has another inode;
// - a file whose ctime is within the identity window of now (identity_window_ms, default 60 s,
//   at least 2 s) gets no such entry (and none is trusted for it): a second write within one
//   timestamp tick of the first would leave ctime unchanged (2 s covers every file system), and a
//   write(2) sets ctime when it starts, so a single write still copying bytes when the window
//   ends would be recorded half done (60 s covers a write held up by dirty-page throttling). Its
//   bytes are hashed instead, until the window has passed;
// - a store through a shared writable mapping moves ctime only when it faults, that is on the
//   first store to a page after the page was written back. So before hashing the bytes it
//   records a mapping for, the provider writes the file back (write_back), and it records the
//   mapping only when the file identity is the same after hashing as before the write-back;
// - only file systems whose times follow every store qualify (ext4, xfs, btrfs, f2fs); on any
//   other the bytes are hashed at every session.
// Keys never depend on which way they were found, so a file that ages past the window keeps
// hitting the same packed entries.
#pragma once

#include <cstddef>
#include <sys/stat.h>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::source {

struct WeightSource {
  const void* data = nullptr;      // the bytes the runtime has (ORT: valid during GetCapability/Compile only)
  std::size_t bytes = 0;
  int element_type = 0;            // ONNXTensorElementDataType, or ggml_type
  std::vector<std::int64_t> dims;
  // External data: the data file as resolved against the model's directory ("" when embedded).
  std::string external_path;
  std::int64_t external_offset = 0;
};

/// The content key of one weight (reads all of its bytes).
std::string content_identity(const WeightSource& w);

/// The file identity of an external weight ("" when it has none that can be trusted: embedded,
/// the file cannot be examined, or it changed within the last kRecentChangeWindow).
/// window_ns: how long ago the file's ctime must be (identity_window_ms).
std::string file_identity(const WeightSource& w, std::int64_t window_ns);

/// The part of a file identity that names the file (device, inode, size, times), taken once for
/// the weights of one file read together (a model load); "" (file) as file_identity would be.
struct FileIdentity {
  std::string file;
  std::int64_t size = 0;
};
FileIdentity file_part(const std::string& path, std::int64_t window_ns);
/// file_part from a stat of the file already taken, and whether its file system's times follow
/// every store (times_track_every_store of it).
FileIdentity file_part_of(const struct stat& st, bool times_track, std::int64_t window_ns);
/// Whether every change of a file's bytes on this path's file system moves its ctime (ext4, xfs,
/// btrfs, f2fs; see file_identity): a statfs.
bool times_track_every_store(const std::string& path);
/// file_identity of `w` in the file `f` names, as file_identity gives while the file is still `f`.
std::string file_identity_in(const FileIdentity& f, const WeightSource& w);
/// The default of the provider's identity_window_ms, and its least value.
constexpr std::int64_t kDefaultIdentityWindowMs = 60'000;
constexpr std::int64_t kMinIdentityWindowMs = 2'000;

/// Writes the file's dirty pages back (fdatasync), so a store through any shared mapping of it
/// faults again and moves its ctime. Done before the bytes behind a recorded file identity are
/// hashed. False when the file cannot be opened or flushed.
bool write_back(const std::string& path);

/// The default cache file for a model: <cache dir>/weightcache/<kind>/<stem>-<digest>.wcache, where
/// the cache dir is $XDG_CACHE_HOME or $HOME/.cache; the digest is of the model's absolute path
/// ("unnamed-model" for a model loaded from bytes). "" when no cache directory is known.
std::string default_cache_path(const std::string& model_path, const char* kind);

/// The CPU features the packed layouts depend on (XNNPACK dispatches on them), e.g.
/// "x86_64:avx2,fma,avx512f". Part of the compatibility key.
std::string cpu_features();

/// A 16-hex-digit digest of bytes (XXH3-64).
std::string hex_digest(const void* data, std::size_t size);

}  // namespace weightcache::source
