// Whether a file's times follow every store to it (ext4, xfs, btrfs, f2fs): where the integrations
// let a data file's identity stand for its content (src/integrations/common/source_identity.cpp).
// Elsewhere every load hashes, so tests expect hashing there. Linux only.
#pragma once

#include "integrations/common/file_mappings.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace weightcache::test {

inline bool times_track_stores(const std::string& path) {
  struct statfs s {};
  if (::statfs(path.c_str(), &s) != 0) return false;
  const auto t = static_cast<unsigned long>(s.f_type);
  return t == 0xEF53UL || t == 0x58465342UL || t == 0x9123683EUL || t == 0xF2F52010UL;
}

// Whether this process can verify its own file mappings (src/integrations/common/file_mappings.hpp),
// which the ggml and llama.cpp integrations require before a mapped GGUF's identity may stand for
// its bytes: by the kernel's PROCMAP_QUERY (Linux 6.11+) or a fresh read of /proc/self/maps (also
// under qemu-user, which emulates it). Not in a sandbox that
// hides /proc: there every load hashes.
inline bool mappings_verifiable() {
  char path[] = "/tmp/wc-map-files-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return false;
  bool ok = false;
  if (::ftruncate(fd, 4096) == 0) {
    void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      weightcache::source::MappingProbe probe;
      weightcache::source::Mapping m;
      struct stat file {};
      ok = probe.find(p, 4096, &m) == weightcache::source::MappingProbe::Kind::file && ::fstat(fd, &file) == 0 &&
           m.ino == file.st_ino && m.dev == file.st_dev;
      ::munmap(p, 4096);
    }
  }
  ::close(fd);
  ::unlink(path);  // after the question: an unlinked file's mapping is never taken for a file
  return ok;
}

// Whether a load of a GGUF at `path` can find it by its identity: its file system's times follow
// every store, and this process can verify its mappings.
inline bool gguf_identity_usable(const std::string& path) { return times_track_stores(path) && mappings_verifiable(); }

// Why a load of a GGUF at `path` cannot find it by its identity (a test's reason to skip), or ""
// when it can.
inline std::string gguf_identity_unusable_because(const std::string& path) {
  if (!times_track_stores(path))
    return "the file system there is not one whose times follow every store (ext4, xfs, btrfs, f2fs): every load "
           "hashes there";
  if (!mappings_verifiable())
    return "this process cannot verify its file mappings (no PROCMAP_QUERY and no /proc/self/maps): every load "
           "hashes here";
  return "";
}

}  // namespace weightcache::test
