// look_up_or_insert's contract, case by case, on a file-backed and a heap-only cache alike.
#include "unit_test_util.hpp"

#include <memory>

namespace weightcache::test {
namespace {

enum class Kind { file, heap };

class InsertSemantics : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    Options o = GetParam() == Kind::file ? file_options(dir_.file("cache.wcache")) : Options{};
    cache_ = open_or_fail(o);
    ASSERT_TRUE(cache_);
    ASSERT_EQ(cache_.stats().backing, GetParam() == Kind::file ? Backing::file : Backing::heap);
  }
  TempDir dir_;
  WeightCache cache_;
};

TEST_P(InsertSemantics, NullPointerBehavesAsLookUp) {
  EXPECT_EQ(cache_.look_up_or_insert("k", nullptr, 100), kNotFound);
  EXPECT_EQ(cache_.stats().entries, 0u) << "a NULL insert must not create an entry";
  EXPECT_EQ(cache_.stats().misses, 1u);
  EXPECT_TRUE(cache_.is_finalized());
  const std::size_t off = cache_.insert("k", "value");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(cache_.look_up_or_insert("k", nullptr, 0), off);
  EXPECT_EQ(cache_.stats().hits, 1u);
}

TEST_P(InsertSemantics, ForeignPointersAreCopied) {
  char stack_buf[333];
  Rng(1).fill(stack_buf, sizeof stack_buf);
  auto heap_buf = std::make_unique<char[]>(70000);
  Rng(2).fill(heap_buf.get(), 70000);

  const std::size_t off1 = cache_.look_up_or_insert("stack", stack_buf, sizeof stack_buf);
  ASSERT_NE(off1, kNotFound) << last_error().message;
  const void* p1 = cache_.offset_to_addr(off1);
  EXPECT_NE(p1, static_cast<const void*>(stack_buf));
  EXPECT_EQ(std::memcmp(p1, stack_buf, sizeof stack_buf), 0);

  const std::size_t off2 = cache_.look_up_or_insert("heap", heap_buf.get(), 70000);
  ASSERT_NE(off2, kNotFound);
  const void* p2 = cache_.offset_to_addr(off2);
  EXPECT_NE(p2, static_cast<const void*>(heap_buf.get()));
  EXPECT_EQ(std::memcmp(p2, heap_buf.get(), 70000), 0);

  // The source is not kept: scribbling on it afterwards changes nothing in the cache.
  std::memset(stack_buf, 0, sizeof stack_buf);
  EXPECT_NE(std::memcmp(p1, stack_buf, sizeof stack_buf), 0);

  // A pointer into the middle of a reservation is not a reservation either.
  auto* r = static_cast<char*>(cache_.reserve(4096));
  ASSERT_NE(r, nullptr);
  Rng(3).fill(r, 4096);
  const std::size_t off3 = cache_.look_up_or_insert("middle", r + 64, 1000);
  ASSERT_NE(off3, kNotFound);
  EXPECT_NE(cache_.offset_to_addr(off3), r + 64);
  EXPECT_EQ(std::memcmp(cache_.offset_to_addr(off3), r + 64, 1000), 0);

  // More bytes than were reserved: refused (the bytes past the reservation are not the caller's
  // to insert), never committed in place over the next region, and nothing is read.
  auto* small = static_cast<char*>(cache_.reserve(16));
  ASSERT_NE(small, nullptr);
  auto* next = static_cast<char*>(cache_.reserve(20000));
  ASSERT_NE(next, nullptr);
  ASSERT_GT(next, small);
  Rng(4).fill(small, 16);
  Rng(5).fill(next, 20000);
  const std::string next_before(next, 20000);
  const std::size_t span = static_cast<std::size_t>(next - small) + 1000;  // runs into `next`
  EXPECT_EQ(cache_.look_up_or_insert("too-big", small, span), kNotFound);
  EXPECT_EQ(last_error().code, Errc::invalid_argument) << last_error().message;
  EXPECT_EQ(cache_.look_up("too-big"), kNotFound);
  EXPECT_EQ(std::string(next, 20000), next_before);
  // The over-long commit did not consume the reservation: it can still be committed in place.
  const std::size_t off5 = cache_.look_up_or_insert("small", small, 16);
  ASSERT_NE(off5, kNotFound);
  EXPECT_EQ(cache_.offset_to_addr(off5), small);
}

TEST_P(InsertSemantics, ReservationIsCommittedInPlace) {
  auto* p = static_cast<char*>(cache_.reserve(5000));
  ASSERT_NE(p, nullptr);
  Rng(5).fill(p, 5000);
  const std::size_t off = cache_.look_up_or_insert("in-place", p, 4000);  // smaller than reserved
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(cache_.offset_to_addr(off), p);
}

TEST_P(InsertSemantics, SameKeySameBytesReturnsExistingOffset) {
  const std::string bytes = random_bytes(6, 3000);
  const std::size_t off = cache_.insert("same", bytes);
  ASSERT_NE(off, kNotFound);
  const Stats before = cache_.stats();
  EXPECT_EQ(cache_.insert("same", bytes), off);
  std::string copy = bytes;  // another buffer, same bytes
  EXPECT_EQ(cache_.look_up_or_insert("same", copy.data(), copy.size()), off);
  void* p = cache_.reserve(bytes.size());
  ASSERT_NE(p, nullptr);
  std::memcpy(p, bytes.data(), bytes.size());
  EXPECT_EQ(cache_.look_up_or_insert("same", p, bytes.size()), off);
  EXPECT_EQ(cache_.stats().entries, before.entries);
  EXPECT_EQ(cache_.stats().mapped_bytes + cache_.stats().heap_bytes, before.mapped_bytes + before.heap_bytes);
  // Inserts are not look-ups: only look_up (and look_up_or_insert with ptr == NULL) count.
  EXPECT_EQ(cache_.stats().hits, before.hits);
  EXPECT_EQ(cache_.stats().misses, before.misses);
  ASSERT_NE(cache_.insert("same", random_bytes(60, 3000)), kNotFound);  // other bytes: a replacement
  EXPECT_EQ(cache_.stats().hits, before.hits);
  EXPECT_EQ(cache_.stats().misses, before.misses);
}

TEST_P(InsertSemantics, AReplacedEntrysOffsetNoLongerResolves) {
  const std::string stale = random_bytes(61, 5000), fresh = random_bytes(62, 5000);
  const std::size_t old_off = cache_.insert("w", stale);
  ASSERT_NE(old_off, kNotFound);
  const auto* old_addr = static_cast<const char*>(cache_.offset_to_addr(old_off));
  ASSERT_NE(old_addr, nullptr);
  const std::size_t new_off = cache_.insert("w", fresh);
  ASSERT_NE(new_off, kNotFound);
  ASSERT_NE(new_off, old_off);
  EXPECT_EQ(cache_.look_up("w"), new_off);
  EXPECT_EQ(cache_.offset_to_addr(old_off), nullptr) << "the stale entry is reachable through its old offset";
  const auto* new_addr = static_cast<const char*>(cache_.offset_to_addr(new_off));
  ASSERT_NE(new_addr, nullptr);
  EXPECT_EQ(std::string(new_addr, fresh.size()), fresh);
  // The old pointer itself stays readable until close (no pointer is ever invalidated early).
  EXPECT_EQ(std::string(old_addr, stale.size()), stale);
  // Replacing back with the first bytes makes a third entry; neither earlier offset revives.
  const std::size_t third = cache_.insert("w", stale);
  ASSERT_NE(third, kNotFound);
  EXPECT_EQ(cache_.offset_to_addr(old_off), nullptr);
  EXPECT_EQ(cache_.offset_to_addr(new_off), nullptr);
  EXPECT_NE(cache_.offset_to_addr(third), nullptr);
}

TEST_P(InsertSemantics, IsFinalizedTracksInserts) {
  EXPECT_TRUE(cache_.is_finalized()) << "a fresh cache has nothing to finalize";
  const std::string bytes = random_bytes(7, 1234);
  ASSERT_NE(cache_.insert("f", bytes), kNotFound);
  EXPECT_FALSE(cache_.is_finalized());
  ASSERT_TRUE(cache_.finalize().ok()) << last_error().message;
  EXPECT_TRUE(cache_.is_finalized());
  ASSERT_NE(cache_.insert("f", bytes), kNotFound);  // identical bytes: nothing new
  EXPECT_TRUE(cache_.is_finalized());
  void* p = cache_.reserve(bytes.size());
  ASSERT_NE(p, nullptr);
  std::memcpy(p, bytes.data(), bytes.size());
  ASSERT_NE(cache_.look_up_or_insert("f", p, bytes.size()), kNotFound);
  EXPECT_TRUE(cache_.is_finalized());
  EXPECT_EQ(cache_.look_up_or_insert("f", nullptr, 0), cache_.look_up("f"));
  EXPECT_TRUE(cache_.is_finalized());
  ASSERT_NE(cache_.insert("f", random_bytes(8, 1234)), kNotFound);  // other bytes: new
  EXPECT_FALSE(cache_.is_finalized());
}

TEST_P(InsertSemantics, OffsetToAddrOfNonEntriesIsNull) {
  EXPECT_EQ(cache_.offset_to_addr(kNotFound), nullptr);
  EXPECT_EQ(cache_.offset_to_addr(0), nullptr);
  const std::size_t off = cache_.insert("entry", random_bytes(9, 8192));
  ASSERT_NE(off, kNotFound);
  EXPECT_NE(cache_.offset_to_addr(off), nullptr);
  // Far past the heap arena: 2^40, or 2^30 where size_t has 32 bits.
  const std::size_t far_away = static_cast<std::size_t>(std::uint64_t{1} << (sizeof(std::size_t) >= 8 ? 40 : 30));
  for (std::size_t bad : {off + 1, off - 1, off + 64, off + 4096, std::size_t{4096}, std::size_t{12345}, far_away,
                          kNotFound - 1}) {
    EXPECT_EQ(cache_.offset_to_addr(bad), nullptr) << "offset " << bad;
  }
  // A reservation not yet inserted is not an entry.
  void* p = cache_.reserve(100);
  ASSERT_NE(p, nullptr);
  const std::size_t entry_addr_delta =
      static_cast<std::size_t>(static_cast<char*>(p) - static_cast<char*>(cache_.offset_to_addr(off)));
  EXPECT_EQ(cache_.offset_to_addr(off + entry_addr_delta), nullptr);
}

TEST_P(InsertSemantics, KeysAreArbitraryBytes) {
  using namespace std::string_literals;
  const std::string k1 = "a\0b"s, k2 = "a\0c"s, k3 = "a"s, k4 = "\0"s, k5 = "\0\0"s;
  std::size_t offs[5];
  const std::string keys[5] = {k1, k2, k3, k4, k5};
  for (int i = 0; i < 5; ++i) {
    offs[i] = cache_.insert(keys[i], "value" + std::to_string(i));
    ASSERT_NE(offs[i], kNotFound) << i;
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(cache_.look_up(keys[i]), offs[i]) << i;
    EXPECT_EQ(verify_entry(cache_, keys[i], "value" + std::to_string(i), "key " + std::to_string(i)), "");
  }
  EXPECT_EQ(cache_.stats().entries, 5u);

  std::string longest = random_bytes(10, kMaxKeySize);
  const std::size_t off = cache_.insert(longest, "long key");
  ASSERT_NE(off, kNotFound) << last_error().message;
  EXPECT_EQ(cache_.look_up(longest), off);

  const std::string too_long = random_bytes(11, kMaxKeySize + 1);
  EXPECT_EQ(cache_.insert(too_long, "x"), kNotFound);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(cache_.look_up(too_long), kNotFound);

  EXPECT_EQ(cache_.insert("", "x"), kNotFound);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  char buf[4] = {1, 2, 3, 4};
  void* p = cache_.reserve(4);
  ASSERT_NE(p, nullptr);
  std::memcpy(p, buf, 4);
  EXPECT_EQ(cache_.look_up_or_insert("", p, 4), kNotFound);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(cache_.look_up(""), kNotFound);
  EXPECT_EQ(cache_.stats().entries, 6u);
}

INSTANTIATE_TEST_SUITE_P(Backings, InsertSemantics, ::testing::Values(Kind::file, Kind::heap),
                         [](const auto& info) { return info.param == Kind::file ? "file" : "heap"; });

TEST(Keys, ArbitraryBytesSurviveReopen) {
  using namespace std::string_literals;
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string keys[] = {"a\0b"s, "a\0c"s, "\0"s, random_bytes(12, kMaxKeySize)};
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (const auto& k : keys) ASSERT_NE(cache.insert(k, k + "!"), kNotFound);
    ASSERT_TRUE(cache.finalize().ok());
  }
  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  for (const auto& k : keys) EXPECT_EQ(verify_entry(cache, k, k + "!", "key of size " + std::to_string(k.size())), "");
  EXPECT_EQ(cache.stats().entries, std::size(keys));
}

}  // namespace
}  // namespace weightcache::test
