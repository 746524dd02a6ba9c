// Sizes a caller passes to look_up_or_insert are checked where the cache can check them: a size
// over 2^48 (over 2^31 - 1, half the address space, in a 32-bit process), one larger than the reservation `ptr` starts, or one that runs past the end of the
// entry or reservation `ptr` points into is WC_ERR_INVALID_ARGUMENT, with wc_last_error saying
// which, and nothing is read (each of these used to read past the end of a mapping, or copy
// between overlapping ranges). Both backings: the file mirror and the heap arena.
#include "key_content.hpp"
#include "unit_test_util.hpp"

#include <cstdint>
#include <cstring>

namespace weightcache::test {
namespace {

// The largest entry: 2^48 bytes in a 64-bit process. A 32-bit size_t cannot carry 2^48 (2^48 + 1 is
// 1 there), and no more than half of a 32-bit address space can be one entry: the limit is
// SIZE_MAX / 2 there, and the message says which.
constexpr bool k64Bit = sizeof(std::size_t) >= 8;
constexpr std::size_t kJustOverTheLimit =
    k64Bit ? static_cast<std::size_t>((std::uint64_t{1} << 48) + 1) : SIZE_MAX / 2 + 1;
constexpr const char* kLimitText = k64Bit ? "over 2^48 bytes" : "over 2^31 - 1 bytes (half the address space)";

class CallerSizes : public ::testing::TestWithParam<Backing> {
 protected:
  void SetUp() override {
    Options o = file_options(dir_.file("sizes.wcache"));
    o.backing = GetParam();
    if (GetParam() == Backing::heap) o.path.clear();
    cache_ = open_or_fail(o);
    ASSERT_TRUE(cache_);
    ASSERT_EQ(cache_.stats().backing, GetParam());
  }

  // Insert must fail with invalid_argument and a message containing `needle`.
  void expect_refused(const std::string& key, void* ptr, std::size_t size, const std::string& needle) {
    EXPECT_EQ(cache_.look_up_or_insert(key, ptr, size), kNotFound) << key;
    EXPECT_EQ(last_error().code, Errc::invalid_argument) << key << ": " << last_error().message;
    EXPECT_NE(last_error().message.find(needle), std::string::npos) << key << ": " << last_error().message;
    EXPECT_EQ(cache_.look_up(key), kNotFound) << key;
  }

  TempDir dir_{"wc-sizes"};
  WeightCache cache_;
};

TEST_P(CallerSizes, ASizeOverTheLargestEntryIsRefusedUnread) {
  char buf[16] = "0123456789abcde";
  expect_refused("wild", buf, SIZE_MAX, kLimitText);
  expect_refused("wild", buf, kJustOverTheLimit, kLimitText);
  EXPECT_EQ(cache_.reserve(SIZE_MAX), nullptr);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_NE(last_error().message.find(kLimitText), std::string::npos) << last_error().message;
  EXPECT_EQ(cache_.reserve(kJustOverTheLimit), nullptr);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_NE(last_error().message.find(kLimitText), std::string::npos) << last_error().message;
  EXPECT_NE(cache_.look_up_or_insert("fine", buf, sizeof buf), kNotFound);
}

TEST_P(CallerSizes, ASizeLargerThanTheReservationIsRefused) {
  auto* p = static_cast<char*>(cache_.reserve(64));
  ASSERT_NE(p, nullptr) << last_error().message;
  std::memset(p, 'r', 64);
  expect_refused("big", p, std::size_t{64} << 20, "larger than the reservation");
  auto* q = static_cast<char*>(cache_.reserve(100));
  ASSERT_NE(q, nullptr);
  std::memset(q, 'q', 100);
  expect_refused("overlap", q, 5000, "(100 bytes reserved)");
  // Both reservations are still there, and commit in place at their real sizes.
  EXPECT_EQ(cache_.offset_to_addr(cache_.look_up_or_insert("big", p, 64)), p);
  EXPECT_EQ(cache_.offset_to_addr(cache_.look_up_or_insert("overlap", q, 100)), q);
  EXPECT_EQ(std::string(static_cast<const char*>(cache_.offset_to_addr(cache_.look_up("overlap"))), 100),
            std::string(100, 'q'));
}

TEST_P(CallerSizes, APointerIntoAnEntryOrReservationStaysInside) {
  const std::string bytes = bytes_for_key("whole", 1000);
  const std::size_t off = cache_.insert("whole", bytes);
  ASSERT_NE(off, kNotFound);
  auto* e = static_cast<char*>(cache_.offset_to_addr(off));
  // A slice of an entry, up to its last byte, is fine; one byte more is not.
  const std::size_t slice = cache_.look_up_or_insert("slice", e + 100, 900);
  ASSERT_NE(slice, kNotFound) << last_error().message;
  EXPECT_EQ(std::memcmp(cache_.offset_to_addr(slice), bytes.data() + 100, 900), 0);
  expect_refused("past-entry", e + 100, 901, "bytes into the entry at offset " + std::to_string(off));

  auto* r = static_cast<char*>(cache_.reserve(1000));
  ASSERT_NE(r, nullptr);
  std::memset(r, 'x', 1000);
  const std::size_t inner = cache_.look_up_or_insert("inner", r + 10, 990);
  ASSERT_NE(inner, kNotFound) << last_error().message;
  EXPECT_EQ(std::string(static_cast<const char*>(cache_.offset_to_addr(inner)), 990), std::string(990, 'x'));
  expect_refused("past-reservation", r + 10, 991, "10 bytes into a reservation of 1000 bytes");
  EXPECT_TRUE(cache_.release(r).ok());
}

// A reservation given back and handed out again: inserting from inside the old space copies
// bytes onto an overlapping range (memmove; a memcpy of overlapping ranges is undefined, and
// AddressSanitizer reports it).
TEST_P(CallerSizes, CopyingFromReleasedSpaceThatIsReusedIsAMove) {
  auto* p = static_cast<char*>(cache_.reserve(4096));
  ASSERT_NE(p, nullptr);
  const std::string bytes = bytes_for_key("moved", 4096);
  std::memcpy(p, bytes.data(), bytes.size());
  ASSERT_TRUE(cache_.release(p).ok());
  const std::size_t off = cache_.look_up_or_insert("moved", p + 64, 1000);  // lands at p: overlaps
  ASSERT_NE(off, kNotFound) << last_error().message;
  EXPECT_EQ(cache_.offset_to_addr(off), p) << "the released space was not reused (the test needs it to be)";
  EXPECT_EQ(std::memcmp(cache_.offset_to_addr(off), bytes.data() + 64, 1000), 0);
}

INSTANTIATE_TEST_SUITE_P(Backings, CallerSizes, ::testing::Values(Backing::file, Backing::heap),
                         [](const auto& info) { return info.param == Backing::file ? "File" : "Heap"; });

// Through the C ABI, as the reports had it.
TEST(CallerSizesC, WildSizesAreInvalidArguments) {
  wc_options o;
  wc_options_init(&o);
  o.backing = WC_BACKING_HEAP;
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  char buf[2] = {'a', 'b'};
  EXPECT_EQ(wc_look_up_or_insert(c, "k", 1, buf, SIZE_MAX), WC_NOT_FOUND);
  EXPECT_NE(std::string(wc_last_error()).find(kLimitText), std::string::npos) << wc_last_error();
  EXPECT_EQ(wc_look_up_or_insert(c, "k", 1, buf, kJustOverTheLimit), WC_NOT_FOUND);
  EXPECT_NE(std::string(wc_last_error()).find(kLimitText), std::string::npos) << wc_last_error();
  void* p = wc_reserve_space(c, 64);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(wc_look_up_or_insert(c, "k", 1, p, std::size_t{64} << 20), WC_NOT_FOUND);
  EXPECT_NE(std::string(wc_last_error()).find("larger than the reservation"), std::string::npos) << wc_last_error();
  void* q = wc_reserve_space(c, 100);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(wc_look_up_or_insert(c, "q", 1, q, 5000), WC_NOT_FOUND);
  EXPECT_NE(std::string(wc_last_error()).find("(100 bytes reserved)"), std::string::npos) << wc_last_error();
  EXPECT_EQ(wc_release_space(c, p), WC_OK);
  EXPECT_EQ(wc_release_space(c, q), WC_OK);
  wc_close(c);
}

}  // namespace
}  // namespace weightcache::test
