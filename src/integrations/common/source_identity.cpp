#include "source_identity.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>

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

// File systems on which every change of a file's bytes moves its ctime, stores through a shared
// writable mapping included once their pages have been written back (the page is write-protected
// again, and the next store faults into page_mkwrite, which updates the times): ext4 (and ext2/3
// through it), xfs, btrfs, f2fs. Not tmpfs (stores through a mapping never touch its times),
// network or FUSE file systems (another host's writes), nor anything unknown: their external data
// is hashed at every session.
}  // namespace

bool times_track_every_store(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53UL:      // ext2, ext3, ext4
    case 0x58465342UL:  // xfs
    case 0x9123683EUL:  // btrfs
    case 0xF2F52010UL:  // f2fs
      return true;
    default:
      return false;
  }
}

namespace {

std::int64_t ns_of(const struct timespec& ts) {
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

std::string hex_digest(const void* data, std::size_t size) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(data, size)));
  return buf;
}

FileIdentity file_part_of(const struct stat& st, bool times_track, std::int64_t window_ns) {
  FileIdentity f;
  struct timespec now {};
  if (!S_ISREG(st.st_mode) || !times_track) return f;
  if (::clock_gettime(CLOCK_REALTIME, &now) != 0 || ns_of(now) - ns_of(st.st_ctim) < window_ns) return f;
  f.file = "file|" + std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
           std::to_string(static_cast<unsigned long long>(st.st_ino)) + "|s" + std::to_string(st.st_size) + "|m" +
           std::to_string(ns_of(st.st_mtim)) + "|c" + std::to_string(ns_of(st.st_ctim));
  f.size = static_cast<std::int64_t>(st.st_size);
  return f;
}

FileIdentity file_part(const std::string& path, std::int64_t window_ns) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {};
  return file_part_of(st, times_track_every_store(path), window_ns);
}

std::string file_identity_in(const FileIdentity& f, const WeightSource& w) {
  if (f.file.empty() || w.external_offset < 0 ||
      static_cast<std::uint64_t>(w.external_offset) + w.bytes > static_cast<std::uint64_t>(f.size))
    return {};
  return f.file + "|o" + std::to_string(w.external_offset) + shape_suffix(w);
}

std::string file_identity(const WeightSource& w, std::int64_t window_ns) {
  if (w.external_path.empty()) return {};
  return file_identity_in(file_part(w.external_path, window_ns), w);
}

bool write_back(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fdatasync(fd) == 0;
  ::close(fd);
  return ok;
}

std::string content_identity(const WeightSource& w) {
  const XXH128_hash_t h = XXH3_128bits(w.data, w.bytes);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("xxh3|") + buf + shape_suffix(w);
}

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
#if defined(__x86_64__) || defined(__i386__)
  std::string s =
#if defined(__x86_64__)
      "x86_64:";
#else
      "i386:";
#endif
  __builtin_cpu_init();
  struct Feature {
    const char* name;
    int on;
  };
  const Feature features[] = {
      {"sse4.1", __builtin_cpu_supports("sse4.1")},   {"avx", __builtin_cpu_supports("avx")},
      {"avx2", __builtin_cpu_supports("avx2")},       {"fma", __builtin_cpu_supports("fma")},
#if defined(__clang__) && __clang_major__ < 16
      {"f16c", 0},  // older clang does not know the name (the provider is built with GCC; only this key's text differs)
#else
      {"f16c", __builtin_cpu_supports("f16c")},
#endif
      {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")}, {"avx512vl", __builtin_cpu_supports("avx512vl")},
      {"avx512dq", __builtin_cpu_supports("avx512dq")}, {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
  };
  bool first = true;
  for (const Feature& f : features) {
    if (!f.on) continue;
    s += (first ? "" : ",");
    s += f.name;
    first = false;
  }
  return s;
#elif defined(__aarch64__) && defined(__linux__)
  char buf[64];
  std::snprintf(buf, sizeof buf, "aarch64:hwcap=%lx,%lx", ::getauxval(AT_HWCAP), ::getauxval(AT_HWCAP2));
  return buf;
#else
  return "other";
#endif
}

}  // namespace weightcache::source
