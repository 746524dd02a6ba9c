// The part of fmt's "{}" syntax that the library's log lines use, for the WEIGHTCACHE_MOBILE build:
// there fmt's formatting engine was the largest single part of the library after the core itself
// (docs/BENCHMARKS.md, "Library size"). Default builds format with fmt, which checks every log
// call's format string against its arguments at compile time; the mobile build formats the same
// strings with format_to below, and tests/unit/text_format_test.cpp holds the two to the same text.
//
// Understood: "{}" (the next argument), "{{" and "}}", and after a colon the fill-free specs the
// library writes: '#' and a type of 'x', 'X' or 'd'. Any other spec prints the argument as "{}"
// would; a "{" without its "}" is copied as it is (fmt would have refused it at compile time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace weightcache::text {

/// One argument of a log line, by value or by view (a view must outlive the format_to call, as a
/// log call's arguments do). Implicit, so that a call site passes its arguments as they are.
class Arg {
 public:
  enum class Kind : unsigned char { sint, uint, real, boolean, character, string, pointer };

  Arg(bool v) noexcept : kind_(Kind::boolean) { v_.u = v ? 1 : 0; }
  Arg(char v) noexcept : kind_(Kind::character) { v_.u = static_cast<unsigned char>(v); }
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_signed_v<T> && !std::is_same_v<T, char>, int> = 0>
  Arg(T v) noexcept : kind_(Kind::sint) {
    v_.s = v;
  }
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool> &&
                                          !std::is_same_v<T, char>,
                                      int> = 0>
  Arg(T v) noexcept : kind_(Kind::uint) {
    v_.u = v;
  }
  template <class T, std::enable_if_t<std::is_enum_v<T>, int> = 0>
  Arg(T v) noexcept : Arg(static_cast<std::underlying_type_t<T>>(v)) {}
  Arg(double v) noexcept : kind_(Kind::real) { v_.d = v; }
  Arg(const char* v) noexcept : Arg(std::string_view(v != nullptr ? v : "")) {}
  Arg(char* v) noexcept : Arg(static_cast<const char*>(v)) {}
  Arg(const void* v) noexcept : kind_(Kind::pointer) { v_.u = reinterpret_cast<std::uintptr_t>(v); }
  /// Any other pointer would print as a bool: refused, as fmt's "{}" refuses it.
  template <class T>
  Arg(T*) = delete;
  Arg(const std::string& v) noexcept : Arg(std::string_view(v)) {}
  Arg(std::string_view v) noexcept : kind_(Kind::string) {
    v_.str.p = v.data();
    v_.str.n = v.size();
  }

  /// Appends this argument as fmt would with `spec`: the text after the colon ("" for "{}").
  void append_to(std::string& out, std::string_view spec) const;

 private:
  Kind kind_;
  union {
    long long s;
    unsigned long long u;
    double d;
    struct {
      const char* p;
      std::size_t n;
    } str;
  } v_;
};

/// Appends `f` with its replacement fields filled from args[0..n), in order; a field past the last
/// argument is copied as it is. Throws only std::bad_alloc.
void format_to(std::string& out, std::string_view f, const Arg* args, std::size_t n);

}  // namespace weightcache::text
