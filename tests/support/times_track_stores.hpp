// Whether a file's times follow every store to it (ext4, xfs, btrfs, f2fs): where the integrations
// let a data file's identity stand for its content (src/integrations/common/source_identity.cpp).
// Elsewhere every load hashes, so tests expect hashing there. Linux only.
#pragma once

#include <string>

#include <sys/vfs.h>

namespace weightcache::test {

inline bool times_track_stores(const std::string& path) {
  struct statfs s {};
  if (::statfs(path.c_str(), &s) != 0) return false;
  const auto t = static_cast<unsigned long>(s.f_type);
  return t == 0xEF53UL || t == 0x58465342UL || t == 0x9123683EUL || t == 0xF2F52010UL;
}

}  // namespace weightcache::test
