// The mobile build's formatter (src/text_format.hpp) against fmt, which formats every other
// build's log lines: the same format string and arguments give the same text, for every kind of
// argument the library logs and the values at their edges. A difference here is a log line that
// reads differently in an app's mobile build.
#include "text_format.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace weightcache::test {
namespace {

// Format strings reach fmt at run time here (fmt::runtime): the library's calls are checked at
// compile time, and these strings are the library's kinds of field.
template <class... Args>
void expect_same(std::string_view f, const Args&... args) {
  const std::string want = fmt::format(fmt::runtime(f), args...);
  std::string got;
  if constexpr (sizeof...(Args) == 0) {
    text::format_to(got, f, nullptr, 0);
  } else {
    const text::Arg packed[] = {text::Arg(args)...};
    text::format_to(got, f, packed, sizeof...(Args));
  }
  EXPECT_EQ(got, want) << "format string: " << f;
}

TEST(TextFormat, IntegersOfEveryWidthAsFmtPrintsThem) {
  expect_same("{}", 0);
  expect_same("{} {}", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  expect_same("{} {}", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
  expect_same("{}", std::numeric_limits<std::uint64_t>::max());
  expect_same("{} {}", std::int8_t{-128}, std::uint8_t{255});
  expect_same("{} {}", std::int16_t{-32768}, std::uint16_t{65535});
  expect_same("{}", std::size_t{4096});
  expect_same("{}", static_cast<long long>(-1));
}

TEST(TextFormat, HexWithAndWithoutThePrefix) {
  expect_same("{:#x}", 0u);
  expect_same("{:#x}", 0xdeadbeefu);
  expect_same("{:#x}", std::numeric_limits<std::uint64_t>::max());
  expect_same("{:#x}", -31);
  expect_same("{:x} {:X} {:#X}", 255, 255u, std::uint64_t{0xabcdef});
  expect_same("{:d}", 42);
}

TEST(TextFormat, BooleansCharactersAndStrings) {
  expect_same("{} {}", true, false);
  expect_same("[{}]", 'c');
  const std::string s = "a path/with spaces";
  expect_same("'{}' and '{}' and '{}'", s, std::string_view("view"), "literal");
  expect_same("[{}]", std::string());
  expect_same("{}", std::string("braces {} inside an argument stay"));
  const char* p = "pointer to chars";
  expect_same("{}", p);
  int object = 0;
  expect_same("{} {}", static_cast<const void*>(&object), static_cast<const void*>(nullptr));
}

TEST(TextFormat, EscapedBracesAndTextAroundFields) {
  expect_same("no fields at all");
  expect_same("{{literal}} {} {{", 7);
  expect_same("}}{}{{", std::string("x"));
  expect_same("");
  expect_same("{}{}{}", 1, std::string("two"), 3u);
}

TEST(TextFormat, DoublesAsTheShortestTextThatReadsBack) {
  for (double v : {0.0, -0.0, 1.0, 1.5, 0.1, 1.0 / 3, 2.0 / 3, 100.0, 123456789.125, 1e-4, 1e-5, 1.25e-7, 1e15,
                   9.999e15, 1e16, 1.5e16, 1e20, 1e100, 1e-300, 5e-324, std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::min(), -2.5, 6.02214076e23, 0.3, 4.35}) {
    expect_same("{}", v);
  }
  expect_same("{} {} {}", std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
              std::numeric_limits<double>::quiet_NaN());
  expect_same("{}", 1.5f);
}

// Fields without an argument: fmt refuses such a string at compile time, so no log call has one;
// the formatter copies the field rather than reading past the arguments.
TEST(TextFormat, AFieldPastTheLastArgumentIsCopiedNotRead) {
  std::string got;
  const text::Arg one[] = {text::Arg(1)};
  text::format_to(got, "{} {} {:#x} }} {", one, 1);
  EXPECT_EQ(got, "1 {} {:#x} } {");
}

}  // namespace
}  // namespace weightcache::test
