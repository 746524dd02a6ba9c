// weight_cache.hpp: "calling value() (or * and ->) on an error, or error() on a value, is a
// precondition violation, which stops at an assert in a debug build (NDEBUG not defined)". This
// file is compiled without NDEBUG whatever the build type (tests/unit/CMakeLists.txt), so the
// asserts are checked in every build. It instantiates Result only with a type of its own: the
// other files of the binary, compiled with NDEBUG, never see Result<Probe>, so no definition of
// it without the asserts can be picked instead.
#ifdef NDEBUG
#error "result_assert_test.cpp must be compiled without NDEBUG"
#endif

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <utility>

namespace weightcache::test {
namespace {

struct Probe {
  int v = 7;
};

Result<Probe> an_error() { return Error{Errc::io, 5, "the disk said no"}; }

TEST(ResultAsserts, ValueOfAnErrorStopsADebugBuild) {
#ifdef WEIGHTCACHE_TEST_EMULATOR
  // Under an emulator without binfmt_misc the "threadsafe" style's re-exec of this binary fails
  // (the kernel cannot start it); a plain fork works, and no other thread runs here yet.
  GTEST_FLAG_SET(death_test_style, "fast");
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#endif
  EXPECT_DEATH(
      {
        Result<Probe> r = an_error();
        (void)r.value();
      },
      "Result::value\\(\\) called on an error");
  EXPECT_DEATH(
      {
        const Result<Probe> r = an_error();
        (void)r.value();
      },
      "Result::value\\(\\) called on an error");
  EXPECT_DEATH((void)an_error().value(), "Result::value\\(\\) called on an error");
  EXPECT_DEATH(
      {
        Result<Probe> r = an_error();
        (void)*r;
      },
      "Result::value\\(\\) called on an error");
  EXPECT_DEATH(
      {
        Result<Probe> r = an_error();
        (void)r->v;
      },
      "Result::value\\(\\) called on an error");
  EXPECT_DEATH(
      {
        Result<Probe> r = Probe{};
        (void)r.error();
      },
      "Result::error\\(\\) called on a value");
}

TEST(ResultAsserts, CheckedAccessStillWorks) {
  Result<Probe> ok = Probe{};
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value().v, 7);
  EXPECT_EQ((*ok).v, 7);
  EXPECT_EQ(ok->v, 7);
  EXPECT_EQ(std::move(ok).value().v, 7);
  const Result<Probe> bad = an_error();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::io);
  EXPECT_EQ(bad.error().sys_errno, 5);
}

}  // namespace
}  // namespace weightcache::test
