// The one-member tar archive an OCI artifact's layer is (docs/CLI.md, "artifact pack"): written
// and read here, without a tar library, because the layer's digest must be a pure function of
// the cache file and the reader must refuse everything but one plain regular file.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weightcache::cli::tar {

inline constexpr std::size_t kBlockSize = 512;
using Block = std::array<unsigned char, kBlockSize>;

/// Largest size the 12-byte octal field holds (11 digits): 8 GiB - 1. Larger sizes are written
/// in GNU's base-256 form.
inline constexpr std::uint64_t kMaxOctalSize = (std::uint64_t{1} << 33) - 1;

/// The header of a regular-file member `name` (1 to 100 bytes, no NUL) of `size` bytes: mode
/// 0444, uid and gid 0, user and group "root", mtime 0, checksum filled in. POSIX ustar magic;
/// a size over kMaxOctalSize is written base-256 (first byte 0x80, then big-endian) under GNU's
/// magic ("ustar  "), as GNU tar writes it.
Block file_header(std::string_view name, std::uint64_t size);

/// Zero bytes that follow `size` bytes of member data to end its last block.
std::uint64_t padding(std::uint64_t size);

/// The 12-byte size field for `size`: 11 octal digits and a NUL, or base-256 as above.
std::array<unsigned char, 12> encode_size(std::uint64_t size);
/// A numeric field as readers take it: octal digits (leading spaces, ended by NUL, space or the
/// field's end) or base-256 (first byte 0x80, value below 2^63). nullopt for anything else.
std::optional<std::uint64_t> decode_number(const unsigned char* field, std::size_t width);

/// A header as the reader understood it.
struct Member {
  std::string name;  // the name field (the POSIX prefix is refused, never joined)
  char type = '0';   // typeflag; '\0' is read as '0'
  std::uint64_t size = 0;
};

/// Decodes a header block: checksum, ustar or GNU magic, name, type and size. Only the format
/// is judged here (the caller decides which names and types it takes). On failure returns
/// nullopt and says why in *why.
std::optional<Member> parse_header(const Block& block, std::string* why);

/// True for an all-zero block (the end-of-archive marker is two of them).
bool is_zero(const Block& block);

}  // namespace weightcache::cli::tar
