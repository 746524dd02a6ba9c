#include "text_format.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace weightcache::text {
namespace {

void append_unsigned(std::string& out, unsigned long long v, bool hex, bool upper) {
  char digits[24];
  char* p = digits + sizeof digits;
  const char* alphabet = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  const unsigned base = hex ? 16 : 10;
  do {
    *--p = alphabet[v % base];
    v /= base;
  } while (v != 0);
  out.append(p, static_cast<std::size_t>(digits + sizeof digits - p));
}

// fmt's "{}" for a double: the shortest digits that read back as the same value, fixed notation
// for decimal exponents from -4 to 15 and scientific (at least two exponent digits) outside.
void append_real(std::string& out, double v) {
  if (std::isnan(v)) {
    out += std::signbit(v) ? "-nan" : "nan";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  int precision = 1;
  for (; precision < 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", precision - 1, v);
  const char* e = buf;
  while (*e != 'e') ++e;
  const int exponent = std::atoi(e + 1);
  if (exponent >= -4 && exponent < 16) {
    const int decimals = precision - 1 - exponent;
    std::snprintf(buf, sizeof buf, "%.*f", decimals > 0 ? decimals : 0, v);
  } else {
    // "%e" already wrote the mantissa's shortest digits and an exponent of two digits or more.
  }
  out += buf;
}

}  // namespace

void Arg::append_to(std::string& out, std::string_view spec) const {
  bool alternate = false, hex = false, upper = false;
  for (const char c : spec) {
    if (c == '#') alternate = true;
    if (c == 'x') hex = true;
    if (c == 'X') hex = upper = true;
  }
  switch (kind_) {
    case Kind::sint: {
      const bool negative = v_.s < 0;
      if (negative) out += '-';
      if (alternate && hex) out += upper ? "0X" : "0x";
      append_unsigned(out, negative ? 0ULL - static_cast<unsigned long long>(v_.s) : static_cast<unsigned long long>(v_.s),
                      hex, upper);
      return;
    }
    case Kind::uint:
      if (alternate && hex) out += upper ? "0X" : "0x";
      append_unsigned(out, v_.u, hex, upper);
      return;
    case Kind::real: append_real(out, v_.d); return;
    case Kind::boolean: out += v_.u != 0 ? "true" : "false"; return;
    case Kind::character: out += static_cast<char>(v_.u); return;
    case Kind::string: out.append(v_.str.p, v_.str.n); return;
    case Kind::pointer:
      out += "0x";
      append_unsigned(out, v_.u, true, false);
      return;
  }
}

void format_to(std::string& out, std::string_view f, const Arg* args, std::size_t n) {
  std::size_t next = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const std::size_t close = f.find('}', i + 1);
    if (close == std::string_view::npos) {
      out.append(f.substr(i));
      return;
    }
    if (next >= n) {
      out.append(f.substr(i, close - i + 1));
      i = close;
      continue;
    }
    std::string_view field = f.substr(i + 1, close - i - 1);
    const std::size_t colon = field.find(':');
    args[next++].append_to(out, colon == std::string_view::npos ? std::string_view() : field.substr(colon + 1));
    i = close;
  }
}

}  // namespace weightcache::text
