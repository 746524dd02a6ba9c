// Byte-level helpers for the format suites: whole-file read/write, a hex parser for hand-written
// images, and field surgery on a cache file image that can re-seal the checksums so a crafted
// file reaches exactly the check it is aimed at.
#pragma once

#include "format/format.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::test {

using Bytes = std::vector<std::byte>;

inline Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<std::byte>(raw[i]);
  return out;
}

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  const bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("short write to " + path);
}

/// Parses hex digits; whitespace is ignored, so images can be laid out like a hex dump.
inline Bytes parse_hex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes out;
  int high = -1;
  for (char c : hex) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
    const int v = nibble(c);
    if (v < 0) throw std::invalid_argument(std::string("bad hex digit '") + c + "'");
    if (high < 0) {
      high = v;
    } else {
      out.push_back(static_cast<std::byte>(high << 4 | v));
      high = -1;
    }
  }
  if (high >= 0) throw std::invalid_argument("odd number of hex digits");
  return out;
}

inline std::string as_string(const std::byte* p, std::size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

/// Where things are in a cache file image, from its header and both slots' indexes.
struct Layout {
  format::DecodedHeader header;
  int newest = -1;  // slot index of the highest valid sequence
  int older = -1;
  struct Record {
    format::IndexRecord rec;
    std::uint64_t at = 0;  // file offset of the record's first byte
  };
  std::vector<Record> records[2];  // per slot
};

/// Decodes a valid image (throws if it is not one: the suites only map healthy files).
inline Layout map_layout(const Bytes& b) {
  Layout l;
  if (format::decode_header(b, &l.header) != format::Problem::none) throw std::runtime_error("bad header");
  for (int i = 0; i < 2; ++i) {
    if (!l.header.slot_valid[i]) continue;
    const auto& s = l.header.slot[i];
    if (!format::slot_in_bounds(s, b.size())) throw std::runtime_error("slot out of bounds");
    std::span<const std::byte> t(b.data() + s.index_offset, s.index_size + format::kFooterSize);
    std::vector<format::IndexRecord> recs;
    if (format::decode_trailer(t, s, l.header.fixed.alignment, &recs, nullptr) != format::Problem::none)
      throw std::runtime_error("bad index");
    std::uint64_t at = s.index_offset + format::kIndexHeaderSize;
    for (auto& r : recs) {
      const std::uint64_t len = format::kRecordFixedSize + r.key.size();
      l.records[i].push_back({std::move(r), at});
      at += len;
    }
  }
  const auto& h = l.header;
  if (h.slot_valid[0] && h.slot_valid[1]) {
    l.newest = h.slot[1].sequence > h.slot[0].sequence ? 1 : 0;
    l.older = 1 - l.newest;
  } else if (h.slot_valid[0] || h.slot_valid[1]) {
    l.newest = h.slot_valid[0] ? 0 : 1;
  }
  return l;
}

/// Recomputes the checksums a slot depends on, from whatever its fields and index bytes now
/// say: the body checksum in the index header (when the index lies inside the image), the
/// slot's index checksum, and the slot checksum. `slot` is 0 or 1.
inline void reseal_slot(Bytes& b, int slot) {
  std::byte* s = b.data() + format::kSlotOffset[slot];
  const std::uint64_t index_offset = format::get_u64(s + 8);
  const std::uint64_t index_size = format::get_u64(s + 16);
  if (index_size >= format::kIndexHeaderSize && index_offset <= b.size() &&
      index_size <= b.size() - index_offset) {
    std::byte* idx = b.data() + index_offset;
    const std::uint64_t body = index_size - format::kIndexHeaderSize;
    format::put_u64(idx + 24, format::hash_bytes(idx + format::kIndexHeaderSize, body));
    format::put_u64(s + 40, format::hash_bytes(idx, index_size));
  }
  format::put_u64(s + 56, format::hash_bytes(s, 56));
}

/// Recomputes the fixed-part checksum after a header field was changed on purpose.
inline void reseal_fixed(Bytes& b) {
  format::put_u64(b.data() + format::kFixedChecksumOffset,
                  format::hash_bytes(b.data(), format::kFixedChecksumOffset));
}

}  // namespace weightcache::test
