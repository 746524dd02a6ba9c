// ExecuTorch XNNPACK weight-cache files ("XPWC"), written byte by byte as ExecuTorch lays them
// out: entries' data page-aligned from offset 0, then any garbage (an old trailer), the index and
// the 20-byte footer. For the suites that read them through the inspection library or the CLI.
// Standard C++ only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::test {

struct XpwcEntry {
  std::string name;
  std::string bytes;
  std::uint32_t seed = 0;
};

struct XpwcFile {
  std::string image;
  std::vector<std::uint64_t> offsets;  // where each entry's bytes are
  std::uint64_t index_start = 0;
};

/// Appends the `n` low bytes of `v`, in the byte order of a host of that order.
inline void put(std::string* s, std::uint64_t v, int n, bool big_endian) {
  for (int i = 0; i < n; ++i) {
    const int shift = big_endian ? 8 * (n - 1 - i) : 8 * i;
    s->push_back(static_cast<char>((v >> shift) & 0xFF));
  }
}

/// An XPWC file of `version` (1, or 2 with seeds) holding `entries`: data regions page-aligned
/// from offset 0, then `garbage` bytes (an old trailer), then the index and the footer.
inline XpwcFile make_xpwc(std::uint32_t version, const std::vector<XpwcEntry>& entries, bool big_endian = false,
                          std::size_t garbage = 0) {
  XpwcFile f;
  for (const auto& e : entries) {
    f.image.resize((f.image.size() + 4095) / 4096 * 4096, '\0');
    f.offsets.push_back(f.image.size());
    f.image += e.bytes;
  }
  f.image += std::string(garbage, '\x77');
  f.index_start = f.image.size();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    put(&f.image, entries[i].name.size(), 4, big_endian);
    f.image += entries[i].name;
    put(&f.image, f.offsets[i], 8, big_endian);
    put(&f.image, entries[i].bytes.size(), 8, big_endian);
    if (version >= 2) put(&f.image, entries[i].seed, 4, big_endian);
  }
  put(&f.image, f.index_start, 8, big_endian);
  put(&f.image, entries.size(), 4, big_endian);
  put(&f.image, 0x58505743, 4, big_endian);
  put(&f.image, version, 4, big_endian);
  return f;
}

}  // namespace weightcache::test
