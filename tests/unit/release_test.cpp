// wc_release_space / WeightCache::release: a reservation that will not be inserted is given back
// and does not become dead space; and stats report the cache's alignment.
#include "unit_test_util.hpp"

namespace weightcache::test {
namespace {

TEST(Release, GivenBackReservationLeavesNoDeadBytes) {
  TempDir dir;
  // The file as it is when nothing but "kept" was ever written. (Measured on a twin, not on
  // this file after its first finalize: Windows cannot shrink a mapped file, so there the
  // preallocated tail is cut only at the last close.)
  std::uint64_t expected_size = 0;
  {
    Options twin;
    twin.path = dir.file("twin.wc");
    auto t = open_or_fail(twin);
    ASSERT_NE(t.insert("kept", std::string(1000, 'k')), kNotFound);
    ASSERT_TRUE(t.finalize());
    t = WeightCache{};
    expected_size = file_size(twin.path);
  }
  Options o;
  o.path = dir.file("c.wc");
  auto c = open_or_fail(o);
  ASSERT_NE(c.insert("kept", std::string(1000, 'k')), kNotFound);
  ASSERT_TRUE(c.finalize());
#ifndef _WIN32
  EXPECT_EQ(file_size(o.path), expected_size);
#endif
  const std::uint64_t dead_before = c.stats().dead_bytes;  // the fresh file's empty trailer
  for (int i = 0; i < 5; ++i) {
    void* p = c.reserve(1 << 20);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5a, 1 << 20);  // packing "failed" after writing
    ASSERT_TRUE(c.release(p));
  }
  ASSERT_TRUE(c.finalize());
  EXPECT_EQ(c.stats().dead_bytes, dead_before);
  EXPECT_EQ(c.stats().commits, 1u);  // nothing new: the second finalize wrote nothing
  c = WeightCache{};
  EXPECT_EQ(file_size(o.path), expected_size);
}

TEST(Release, RejectsWhatIsNotAnOutstandingReservation) {
  TempDir dir;
  Options o;
  o.path = dir.file("c.wc");
  auto c = open_or_fail(o);
  char local[16] = {};
  EXPECT_FALSE(c.release(local));
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  auto* p = static_cast<char*>(c.reserve(64));
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(c.release(p + 8));  // not the start
  std::memset(p, 1, 64);
  const std::size_t off = c.look_up_or_insert("k", p, 64);
  ASSERT_NE(off, kNotFound);
  EXPECT_FALSE(c.release(p));  // already inserted
  EXPECT_EQ(std::memcmp(c.offset_to_addr(off), std::string(64, '\1').data(), 64), 0);

  wc_options co;
  wc_options_init(&co);
  wc_cache* h = nullptr;
  ASSERT_EQ(wc_open(&co, &h), WC_OK);
  void* q = wc_reserve_space(h, 10);
  EXPECT_EQ(wc_release_space(h, q), WC_OK);
  EXPECT_EQ(wc_release_space(h, q), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_release_space(nullptr, q), WC_ERR_INVALID_ARGUMENT);
  wc_close(h);
}

TEST(Release, StatsReportAlignment) {
  for (std::size_t a : {std::size_t{1}, std::size_t{64}, std::size_t{4096}, std::size_t{65536}}) {
    wc_options co;
    wc_options_init(&co);
    co.alignment = a;
    wc_cache* h = nullptr;
    ASSERT_EQ(wc_open(&co, &h), WC_OK);
    wc_stats s;
    wc_stats_init(&s);
    ASSERT_EQ(wc_get_stats(h, &s), WC_OK);
    EXPECT_EQ(s.alignment, a);
    wc_close(h);
  }
}

}  // namespace
}  // namespace weightcache::test
