// Heap memory in chunks: a chunk whose rest cannot be committed does not fail the entries after it.
// On Windows without placeholder support (older Windows, Wine) that happens for good when another
// allocation takes part of a chunk's address range while a mapping releases and reserves it
// again; under Wine, four threads inserting into heap caches met it in CI.
#include "core.hpp"
#include "forwarding_platform.hpp"
#include "key_content.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <string>

namespace weightcache::test {
namespace {

// Commits only at the start of a reserved range, as if the rest of every range had been taken.
class LosingPlatform final : public ForwardingPlatform {
 public:
  Result<void*> reserve_address_space(std::size_t n, std::size_t a) noexcept override {
    auto r = ForwardingPlatform::reserve_address_space(n, a);
    if (r && count_ < bases_.size()) bases_[count_++] = r.value();
    return r;
  }
  Result<void> commit_memory(void* at, std::size_t n) noexcept override {
    for (std::size_t i = 0; i < count_; ++i)
      if (bases_[i] == at) return ForwardingPlatform::commit_memory(at, n);
    ++refused;
    return Error{Errc::no_memory, ENOMEM, "part of the range was taken by another allocation"};
  }
  std::atomic<int> refused{0};

 private:
  std::array<void*, 64> bases_{};
  std::size_t count_ = 0;
};

TEST(HeapArena, AChunkWhoseRestCannotBeCommittedLeavesTheNextEntriesToANewChunk) {
  LosingPlatform pf;
  Options o;
  o.backing = Backing::heap;
  auto opened = Core::open(o, pf);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& core = *opened.value();
  // 200 KiB entries: the first chunks (1 MiB) are committed whole at once; the third (2 MiB) is
  // committed 1 MiB first, so its next entry needs a commit past its start.
  constexpr std::size_t kSize = 200 << 10;
  constexpr int kEntries = 24;
  std::string bytes(kSize, '\0');
  for (int i = 0; i < kEntries; ++i) {
    const std::string key = "entry/" + std::to_string(i);
    fill_for_key(key, bytes.data(), bytes.size());
    ASSERT_NE(core.look_up_or_insert(key, bytes.data(), bytes.size()), kNotFound)
        << key << ": " << last_error().message;
  }
  EXPECT_GT(pf.refused.load(), 0) << "no commit past a chunk's start was asked for: the test did not test";
  for (int i = 0; i < kEntries; ++i) {
    const std::string key = "entry/" + std::to_string(i);
    const std::size_t off = core.look_up(key);
    ASSERT_NE(off, kNotFound) << key;
    fill_for_key(key, bytes.data(), bytes.size());
    EXPECT_EQ(std::string(static_cast<const char*>(core.offset_to_addr(off)), kSize), bytes) << key;
  }
}

}  // namespace
}  // namespace weightcache::test
