// Text the library produces (wc_last_error, Error::message, log lines) is UTF-8, but much of it
// quotes paths, which on POSIX are bytes: a byte that is not part of well-formed UTF-8 is written
// as "\xHH" (two lowercase hex digits) instead, so that a host that passes the text on (to JSON,
// a UI, a logger that checks its input) gets what was promised. Allocation-free: the last-error
// buffer is filled where memory has run out.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weightcache::utf8 {

/// Bytes in the well-formed UTF-8 sequence at the start of `s` (Unicode's table 3-7: no overlong
/// forms, no surrogates, nothing past U+10FFFF), or 0 if it does not start with one.
inline std::size_t sequence_size(std::string_view s) noexcept {
  if (s.empty()) return 0;
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if ((b(i) & 0xC0) != 0x80) return 0;
  return n;
}

/// Bytes of the longest prefix of `s` that is well-formed UTF-8.
inline std::size_t valid_prefix(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t n = sequence_size(s.substr(i));
    if (n == 0) break;
    i += n;
  }
  return i;
}

/// Calls `put(const char* p, std::size_t n)` for each piece of `s` as it is to be written: a run
/// of well-formed UTF-8, or the four characters "\xHH" for one byte outside it. A piece never
/// splits a character or an escape, so a writer that must cut the text cuts between pieces. Stops
/// early when `put` returns false.
template <class Put>
bool for_each_piece(std::string_view s, Put&& put) noexcept(noexcept(put("", 0))) {
  while (!s.empty()) {
    const std::size_t n = sequence_size(s);
    if (n > 0) {
      if (!put(s.data(), n)) return false;
      s.remove_prefix(n);
      continue;
    }
    constexpr char kHex[] = "0123456789abcdef";
    const auto c = static_cast<unsigned char>(s[0]);
    const char esc[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    if (!put(esc, sizeof esc)) return false;
    s.remove_prefix(1);
  }
  return true;
}

/// `s` with the bytes outside well-formed UTF-8 escaped; `s` itself (no copy) when there are none.
inline std::string escaped(std::string s) {
  if (valid_prefix(s) == s.size()) return s;
  std::string out;
  out.reserve(s.size() + 16);
  for_each_piece(s, [&](const char* p, std::size_t n) {
    out.append(p, n);
    return true;
  });
  return out;
}

}  // namespace weightcache::utf8
