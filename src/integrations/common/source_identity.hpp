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
// - a file whose ctime is within its file system's change window of the clock read before its
//   stat (10 ms where change times are kept to the nanosecond, 2 s where whole seconds: the cache
//   file's own rule, docs/DESIGN.md "How a change is known"), or within the host's floor
//   (identity_window_ms, default 0), gets no such entry and none is trusted for it: a second
//   write within one timestamp tick of the first would leave ctime unchanged. Its bytes are
//   hashed instead, until the window has passed;
// - a write(2) sets ctime when it starts, not when its last byte lands, and a store through a
//   shared writable mapping moves it only when it faults. So before hashing bytes it may record,
//   the provider asks whether any process has the file open for writing (open_writers: a read lease,
//   which the kernel refuses while one does, and which it takes and gives back at once). Every
//   write in progress, direct I/O included, and every writable mapping holds such an opening: with
//   none, every later change comes through a new one and moves ctime past the window. With one,
//   the bytes are hashed and nothing is recorded; the question never waits for a writer;
// - where the lease cannot be asked for (a file owned by another user, without CAP_LEASE), the
//   rule before issue 32 holds: a file changed within the last 60 s is not recorded, and the file
//   is written back (fdatasync) before hashing, so a store through a mapping faults again;
// - a mapping is recorded only when the file identity is the same after hashing as before, asked
//   of one descriptor throughout (and of the path at the end);
// - the identity holds the boot id: a crash may lose a file's last bytes while its new change time
//   survives, or its new change time while its bytes survive, so nothing recorded in one boot is
//   used in another (the first load after a boot hashes once);
// - only file systems whose times follow every store (ext4, xfs, btrfs, f2fs) qualify; on any
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

/// The clock the kernel stamps change times from (CLOCK_REALTIME_COARSE). Read before the stat
/// whose change time it judges: a change after the reading gets a change time at or past it.
std::int64_t change_clock_ns();

/// The change window of a file on a file system whose times follow every store: 10 ms where its
/// change time has a sub-second part (the file system keeps nanoseconds for it), else 2 s (whole
/// seconds, as ext4 with 128-byte inodes keeps them). The cache file's rule
/// (Platform::change_window_ns), for the file systems file identities are used on.
std::int64_t change_window_ns(const struct stat& st);

/// The file identity of an external weight ("" when it has none that can be trusted: embedded,
/// the file cannot be examined, or it changed within its change window, or within floor_ns).
/// floor_ns: the host's least age for a file's ctime (identity_window_ms; 0: the window alone).
std::string file_identity(const WeightSource& w, std::int64_t floor_ns);

/// The part of a file identity that names the file (device, inode, size, times), taken once for
/// the weights of one file read together (a model load); "" (file) as file_identity would be.
struct FileIdentity {
  std::string file;
  std::int64_t size = 0;
};
FileIdentity file_part(const std::string& path, std::int64_t floor_ns);
/// file_part from a stat of the file already taken, the change clock read before that stat
/// (change_clock_ns), and whether its file system's times follow every store
/// (times_track_every_store of it).
FileIdentity file_part_of(const struct stat& st, bool times_track, std::int64_t clock_ns, std::int64_t floor_ns);
/// Whether every change of a file's bytes on this path's file system moves its ctime (ext4, xfs,
/// btrfs, f2fs; see file_identity): a statfs.
bool times_track_every_store(const std::string& path);
/// file_identity of `w` in the file `f` names, as file_identity gives while the file is still `f`.
std::string file_identity_in(const FileIdentity& f, const WeightSource& w);
/// The default of the provider's identity_window_ms (0: the file system's change window alone),
/// and its largest value.
constexpr std::int64_t kDefaultIdentityWindowMs = 0;
constexpr std::int64_t kMaxIdentityWindowMs = 86'400'000;

/// Whether any process has the file open for writing, as a read lease on `fd` (open read-only)
/// answers it (fcntl F_SETLEASE, F_RDLCK, given back at once): `none` (no writer: no write is in
/// progress and none can happen without a new opening), `writer` (one has: a write may be in
/// progress or a store through a writable mapping may come without moving ctime), `unknown` (the
/// lease cannot be asked for: the file is another user's and the process lacks CAP_LEASE, or the
/// file system or a sandbox refuses leases). Never waits. A writer opening the file in the
/// microseconds the lease is held gets its open through once it is given back, and the process
/// gets a SIGURG (ignored unless handled), never the SIGIO whose default ends it.
enum class Writers { none, writer, unknown };
Writers open_writers(int fd);
Writers open_writers(const std::string& path);  // opens it read-only for the question

/// The file a mapping is being recorded for, open once: every question asked of it (its identity,
/// writers, its bytes) goes to this one descriptor, so a path swapped meanwhile (a rename over it,
/// two directories exchanged) cannot send one question to another file (a hostile review's
/// finding). Closes it.
class Recording {
 public:
  Recording() = default;
  explicit Recording(int fd) : fd_(fd) {}
  Recording(Recording&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Recording& operator=(Recording&&) = delete;
  Recording(const Recording&) = delete;
  ~Recording();
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

/// Before the bytes behind `fid` (file_identity(w, floor_ns)) are hashed: opens the file, and the
/// Recording is ok() when what is hashed next may be recorded under `fid` (if `still` says so
/// afterwards): the descriptor's file is the one `fid` names, and open_writers says none; where it
/// cannot tell, only if the file's last change is 60 s old (kUnknownWritersFloorNs) and the file
/// is written back (fdatasync) first.
Recording may_record(const WeightSource& w, const std::string& fid, std::int64_t floor_ns);
constexpr std::int64_t kUnknownWritersFloorNs = 60'000'000'000;

/// After hashing: the recording's file and the file at the path are both still `fid`.
bool still(const Recording& r, const WeightSource& w, const std::string& fid, std::int64_t floor_ns);

/// The content key (content_identity) of the bytes the recording's file holds now at
/// `w.external_offset`, read with pread (never mapped: a file cut short meanwhile is a short read,
/// not a SIGBUS); "" when they cannot all be read. The bytes a runtime hands over may be a copy it
/// read before the file last changed: a mapping is recorded only when both agree.
std::string file_content_identity(const Recording& r, const WeightSource& w);

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
