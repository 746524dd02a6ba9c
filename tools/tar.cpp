#include "tar.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace weightcache::cli::tar {
namespace {

// Field offsets and widths of the ustar header (POSIX.1-1988 as extended by POSIX.1-2001).
struct Field {
  std::size_t offset, width;
};
constexpr Field kName{0, 100}, kMode{100, 8}, kUid{108, 8}, kGid{116, 8}, kSize{124, 12}, kMtime{136, 12},
    kChksum{148, 8}, kTypeflag{156, 1}, kMagic{257, 6}, kVersion{263, 2}, kUname{265, 32}, kGname{297, 32},
    kDevmajor{329, 8}, kDevminor{337, 8}, kPrefix{345, 155};

void put(Block& b, Field f, std::string_view s) {
  std::memcpy(b.data() + f.offset, s.data(), std::min(s.size(), f.width));
}

// `width - 1` octal digits and a NUL, as GNU tar and Go's archive/tar write them.
void put_octal(Block& b, Field f, std::uint64_t v) {
  for (std::size_t i = f.width - 1; i-- > 0; v >>= 3) b[f.offset + i] = static_cast<unsigned char>('0' + (v & 7));
  b[f.offset + f.width - 1] = 0;
}

std::uint64_t checksum_of(const Block& b) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < kBlockSize; ++i)
    sum += (i >= kChksum.offset && i < kChksum.offset + kChksum.width) ? ' ' : b[i];
  return sum;
}

bool field_is(const Block& b, Field f, std::string_view s) {
  return s.size() == f.width && std::memcmp(b.data() + f.offset, s.data(), f.width) == 0;
}

std::string_view c_string(const Block& b, Field f) {
  const auto* p = reinterpret_cast<const char*>(b.data() + f.offset);
  return {p, static_cast<std::size_t>(std::find(p, p + f.width, '\0') - p)};
}

}  // namespace

std::array<unsigned char, 12> encode_size(std::uint64_t size) {
  std::array<unsigned char, 12> out{};
  if (size <= kMaxOctalSize) {
    Block b{};
    put_octal(b, kSize, size);
    std::copy_n(b.begin() + kSize.offset, kSize.width, out.begin());
    return out;
  }
  out[0] = 0x80;
  for (std::size_t i = 11; i >= 1 && size != 0; --i, size >>= 8) out[i] = static_cast<unsigned char>(size & 0xff);
  return out;
}

std::optional<std::uint64_t> decode_number(const unsigned char* field, std::size_t width) {
  if (width == 0) return std::nullopt;
  if (field[0] & 0x80) {
    // Base-256: 0x80 marks a positive value; 0xff would be negative. The value must fit 63 bits.
    if (field[0] != 0x80) return std::nullopt;
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < width; ++i) {
      if (v >> 55) return std::nullopt;
      v = (v << 8) | field[i];
    }
    if (v >> 63) return std::nullopt;
    return v;
  }
  std::size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  std::uint64_t v = 0;
  std::size_t digits = 0;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, ++digits) {
    if (v >> 60) return std::nullopt;
    v = (v << 3) | static_cast<std::uint64_t>(field[i] - '0');
  }
  if (digits == 0) return std::nullopt;
  // After the digits: only terminators (NUL or space) to the end of the field.
  for (; i < width; ++i)
    if (field[i] != 0 && field[i] != ' ') return std::nullopt;
  return v;
}

Block file_header(std::string_view name, std::uint64_t size) {
  Block b{};
  put(b, kName, name);
  put_octal(b, kMode, 0444);
  put_octal(b, kUid, 0);
  put_octal(b, kGid, 0);
  const auto sz = encode_size(size);
  std::copy(sz.begin(), sz.end(), b.begin() + kSize.offset);
  put_octal(b, kMtime, 0);
  b[kTypeflag.offset] = '0';
  if (size <= kMaxOctalSize) {
    put(b, kMagic, std::string_view("ustar\0", 6));
    put(b, kVersion, "00");
  } else {
    put(b, kMagic, "ustar ");
    put(b, kVersion, std::string_view(" \0", 2));
  }
  put(b, kUname, "root");
  put(b, kGname, "root");
  put_octal(b, kDevmajor, 0);
  put_octal(b, kDevminor, 0);
  // Six octal digits, a NUL and a space: the form every tar writes and reads.
  char chk[8];
  std::snprintf(chk, sizeof chk, "%06o", static_cast<unsigned>(checksum_of(b)));
  std::memcpy(b.data() + kChksum.offset, chk, 6);
  b[kChksum.offset + 6] = 0;
  b[kChksum.offset + 7] = ' ';
  return b;
}

std::uint64_t padding(std::uint64_t size) { return (kBlockSize - size % kBlockSize) % kBlockSize; }

bool is_zero(const Block& block) {
  return std::all_of(block.begin(), block.end(), [](unsigned char c) { return c == 0; });
}

std::optional<Member> parse_header(const Block& b, std::string* why) {
  const auto stored = decode_number(b.data() + kChksum.offset, kChksum.width);
  if (!stored || *stored != checksum_of(b)) {
    *why = "its header checksum does not match the header (a damaged or altered tar header)";
    return std::nullopt;
  }
  const bool posix = field_is(b, kMagic, std::string_view("ustar\0", 6)) && field_is(b, kVersion, "00");
  const bool gnu = field_is(b, kMagic, "ustar ") && field_is(b, kVersion, std::string_view(" \0", 2));
  if (!posix && !gnu) {
    *why = "its header is neither POSIX ustar nor GNU tar (pre-POSIX tar headers are not read)";
    return std::nullopt;
  }
  Member m;
  m.name = std::string(c_string(b, kName));
  // In a ustar header a prefix is the directory part of the path: a member with one is not a plain
  // file name. GNU headers keep other fields (times) in that area.
  if (posix && !c_string(b, kPrefix).empty()) {
    *why = "its member's path has a directory prefix ('" + std::string(c_string(b, kPrefix)) + "/" + m.name + "')";
    return std::nullopt;
  }
  m.type = b[kTypeflag.offset] == 0 ? '0' : static_cast<char>(b[kTypeflag.offset]);
  const auto size = decode_number(b.data() + kSize.offset, kSize.width);
  if (!size) {
    *why = "its header's size field is not a number";
    return std::nullopt;
  }
  m.size = *size;
  return m;
}

}  // namespace weightcache::cli::tar
