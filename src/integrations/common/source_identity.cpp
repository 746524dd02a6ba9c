#include "source_identity.hpp"

#include <weightcache/weightcache.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <new>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace weightcache::source {

namespace {

std::string shape_suffix(const WeightSource& w) {
  std::string s = "|t" + std::to_string(w.element_type) + "|";
  for (std::size_t i = 0; i < w.dims.size(); ++i) s += (i ? "x" : "") + std::to_string(w.dims[i]);
  s += "|b" + std::to_string(w.bytes);
  return s;
}

std::string content_key(XXH128_hash_t h, const WeightSource& w) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("xxh3|") + buf + shape_suffix(w);
}

}  // namespace

// File systems on which every change of a file's bytes moves its ctime, stores through a shared
// writable mapping included once their pages have been written back (the page is write-protected
// again, and the next store faults into page_mkwrite, which updates the times), and that grant
// leases (open_writers): ext4 (and ext2/3 through it), xfs, btrfs, f2fs. Not
// tmpfs (stores through a mapping never touch its times), overlayfs (the pages are the lower
// file's), network or FUSE file systems (another host's writes), nor anything unknown: their
// external data is hashed at every session.

namespace {

bool tracks_every_store(unsigned long type) {
  switch (type) {
    case 0xEF53UL:      // ext2, ext3, ext4
    case 0x58465342UL:  // xfs
    case 0x9123683EUL:  // btrfs
    case 0xF2F52010UL:  // f2fs
      return true;
    default:
      return false;
  }
}

}  // namespace

bool times_track_every_store(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && tracks_every_store(static_cast<unsigned long>(fs.f_type));
}

namespace {

std::int64_t ns_of(const struct timespec& ts) {
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The boot id (/proc/sys/kernel/random/boot_id) as 32 hex digits, read once per process (constant
// atomics: nothing to construct, nothing a fork can leave half made); "" where it cannot be read.
std::string boot_id() {
  static std::atomic<int> state{0};  // 0 not read yet, 1 read, 2 unreadable
  static std::atomic<std::uint64_t> hi{0}, lo{0};
  if (state.load(std::memory_order_acquire) == 0) {
    std::uint64_t h = 0, l = 0;
    int digits = 0;
    if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
      for (int c = std::fgetc(f); c != EOF && digits < 32; c = std::fgetc(f)) {
        if (c == '-' || c == '\n') continue;
        if (!std::isxdigit(c)) break;
        const std::uint64_t v = static_cast<std::uint64_t>(std::isdigit(c) ? c - '0' : std::tolower(c) - 'a' + 10);
        if (digits < 16) h = h << 4 | v;
        else l = l << 4 | v;
        ++digits;
      }
      std::fclose(f);
    }
    hi.store(h, std::memory_order_relaxed);
    lo.store(l, std::memory_order_relaxed);
    state.store(digits == 32 ? 1 : 2, std::memory_order_release);
  }
  if (state.load(std::memory_order_acquire) != 1) return {};
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi.load(std::memory_order_relaxed)),
                static_cast<unsigned long long>(lo.load(std::memory_order_relaxed)));
  return buf;
}

bool times_track_every_store_fd(int fd) {
  struct statfs fs {};
  return ::fstatfs(fd, &fs) == 0 && tracks_every_store(static_cast<unsigned long>(fs.f_type));
}

}  // namespace

std::string hex_digest(const void* data, std::size_t size) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(data, size)));
  return buf;
}

std::int64_t change_clock_ns() {
  struct timespec now {};
  if (::clock_gettime(CLOCK_REALTIME_COARSE, &now) != 0) return 0;
  return ns_of(now);
}

std::int64_t change_window_ns(const struct stat& st) {
  constexpr std::int64_t kFine = 10'000'000, kCoarse = 2'000'000'000;  // platform.hpp's two windows
  return st.st_ctim.tv_nsec != 0 ? kFine : kCoarse;
}

FileIdentity file_part_of(const struct stat& st, bool times_track, std::int64_t clock_ns, std::int64_t floor_ns) {
  FileIdentity f;
  if (!S_ISREG(st.st_mode) || !times_track || clock_ns <= 0) return f;
  // A change after the clock's reading gets a change time at or past it: one older than the
  // reading by more than the window can never be given again (docs/DESIGN.md, "ONNX Runtime keys").
  const std::int64_t ctime = ns_of(st.st_ctim);
  if (ctime <= 0 || ctime >= clock_ns - std::max(change_window_ns(st), floor_ns)) return f;
  const std::string boot = boot_id();
  if (boot.empty()) return f;  // a record could outlive a crash that undid the change it saw
  f.file = "file|" + std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
           std::to_string(static_cast<unsigned long long>(st.st_ino)) + "|s" + std::to_string(st.st_size) + "|m" +
           std::to_string(ns_of(st.st_mtim)) + "|c" + std::to_string(ctime) + "|boot" + boot;
  f.size = static_cast<std::int64_t>(st.st_size);
  return f;
}

FileIdentity file_part(const std::string& path, std::int64_t floor_ns) {
  if (path.empty()) return {};
  const std::int64_t clock = change_clock_ns();  // before the stat
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return file_part_of(st, times_track_every_store(path), clock, floor_ns);
}

std::string file_identity_in(const FileIdentity& f, const WeightSource& w) {
  if (f.file.empty() || w.external_offset < 0 ||
      static_cast<std::uint64_t>(w.external_offset) + w.bytes > static_cast<std::uint64_t>(f.size))
    return {};
  return f.file + "|o" + std::to_string(w.external_offset) + shape_suffix(w);
}

std::string file_identity(const WeightSource& w, std::int64_t floor_ns) {
  if (w.external_path.empty()) return {};
  return file_identity_in(file_part(w.external_path, floor_ns), w);
}

Writers open_writers(int fd) {
  // A lease break signals the lease holder: SIGURG, ignored by default, not SIGIO, which ends
  // the process. Without that, no lease.
  if (::fcntl(fd, F_SETSIG, SIGURG) != 0) return Writers::unknown;
  if (::fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
    (void)::fcntl(fd, F_SETLEASE, F_UNLCK);
    return Writers::none;
  }
  // The kernel refuses a read lease while anyone has the file open for writing.
  return errno == EAGAIN ? Writers::writer : Writers::unknown;
}

Writers open_writers(const std::string& path) {
  // O_NONBLOCK: where another process holds a lease on the file, the open fails rather than wait
  // for that lease to be broken.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Writers::unknown;
  const Writers w = open_writers(fd);
  ::close(fd);
  return w;
}

Recording::~Recording() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// The identity of the file open at `fd` as file_identity gives it for `w`.
std::string identity_of(int fd, const WeightSource& w, std::int64_t floor_ns) {
  const std::int64_t clock = change_clock_ns();  // before the fstat
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  return file_identity_in(file_part_of(st, times_track_every_store_fd(fd), clock, floor_ns), w);
}

}  // namespace

Recording may_record(const WeightSource& w, const std::string& fid, std::int64_t floor_ns) {
  if (fid.empty() || w.external_path.empty()) return {};
  Recording r(::open(w.external_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!r.ok() || identity_of(r.fd(), w, floor_ns) != fid) return {};  // another file by now
  switch (open_writers(r.fd())) {
    case Writers::none:
      return r;
    case Writers::writer:
      return {};
    case Writers::unknown:
      break;
  }
  if (identity_of(r.fd(), w, std::max(floor_ns, kUnknownWritersFloorNs)) != fid || ::fdatasync(r.fd()) != 0) return {};
  return r;
}

bool still(const Recording& r, const WeightSource& w, const std::string& fid, std::int64_t floor_ns) {
  return r.ok() && !fid.empty() && identity_of(r.fd(), w, floor_ns) == fid && file_identity(w, floor_ns) == fid;
}

std::string file_content_identity(const Recording& r, const WeightSource& w) {
  if (!r.ok() || w.external_offset < 0) return {};
  const int fd = r.fd();
  XXH3_state_t* state = XXH3_createState();
  constexpr std::size_t kChunk = 1u << 20;
  std::unique_ptr<unsigned char[]> buf(new (std::nothrow) unsigned char[kChunk]);
  bool ok = state != nullptr && buf != nullptr && XXH3_128bits_reset(state) == XXH_OK;
  for (std::size_t done = 0; ok && done < w.bytes;) {
    const std::size_t want = std::min(kChunk, w.bytes - done);
    const ssize_t n = ::pread(fd, buf.get(), want, static_cast<off_t>(w.external_offset) + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0 && XXH3_128bits_update(state, buf.get(), static_cast<std::size_t>(n)) == XXH_OK;
    done += n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  std::string key;
  if (ok) key = content_key(XXH3_128bits_digest(state), w);
  XXH3_freeState(state);
  return key;
}

std::string content_identity(const WeightSource& w) { return content_key(XXH3_128bits(w.data, w.bytes), w); }


std::string default_cache_path(const std::string& model_path, const char* kind) {
  std::string dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    dir = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    dir = std::string(home) + "/.cache";
  } else {
    return {};
  }
  dir += std::string("/weightcache/") + kind;
  std::string name = "unnamed-model";
  if (!model_path.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(model_path, ec);
    const std::string full = ec ? model_path : abs.lexically_normal().string();
    std::string stem = std::filesystem::path(full).stem().string();
    if (stem.size() > 64) stem.resize(64);
    for (char& c : stem)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
    name = (stem.empty() ? std::string("model") : stem) + "-" + hex_digest(full.data(), full.size());
  }
  return dir + "/" + name + ".wcache";
}

std::string cpu_features() {
  std::string s(wc_cpu_features(nullptr, 0), '\0');
  (void)wc_cpu_features(s.data(), s.size() + 1);
  return s;
}

}  // namespace weightcache::source
