// A really full disk: the test mounts an 8 MiB tmpfs (root only; skipped otherwise) and packs
// into a cache on it until nothing fits. Every reserved byte is written, so a reservation that
// was not backed by allocated blocks would kill the test with SIGBUS: surviving is part of the
// test. Then: heap fallback or a no_space error, WC_ERR_NO_SPACE in the log, committed entries
// intact, and a finalize that cannot fit fails cleanly and leaves the last commit loadable.
#include "env_common.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <fstream>
#include <cstring>
#include <string>
#include <vector>

#include <sys/mount.h>
#include <unistd.h>

namespace {

using namespace weightcache;
using namespace weightcache::env;

/// A tmpfs mounted on `dir` for the lifetime of the object.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, const std::string& size) : dir_(dir) {
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, ("size=" + size).c_str()) == 0)
      mounted_ = true;
    else
      errno_ = errno;
  }
  ~TmpfsMount() {
    if (mounted_) (void)::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const noexcept { return mounted_; }
  std::string why_not() const { return std::strerror(errno_); }

 private:
  std::string dir_;
  bool mounted_ = false;
  int errno_ = 0;
};

#define MOUNT_TMPFS_OR_SKIP(mnt, dir)                                                                      \
  TmpfsMount mnt((dir).path().string(), "8m");                                                               \
  if (!mnt.mounted())                                                                                        \
  GTEST_SKIP() << "cannot mount a tmpfs (" << mnt.why_not() << "): the full-disk tests need root or "      \
               << "CAP_SYS_ADMIN"

constexpr std::size_t kCommitted = 8;
constexpr std::size_t kCommittedSize = 64 * 1024;

/// Opens, commits kCommitted entries of 64 KiB, and returns them.
std::vector<Packed> commit_first(WeightCache& cache) {
  std::vector<Packed> out;
  for (std::uint64_t i = 0; i < kCommitted; ++i) {
    Packed e;
    EXPECT_TRUE(pack(cache, i, kCommittedSize, &e)) << last_error().message;
    EXPECT_FALSE(e.heap);
    out.push_back(e);
  }
  auto r = cache.finalize();
  EXPECT_TRUE(r.ok()) << r.error().message;
  return out;
}

/// Reopens `path` in this process (the caller closed its handles) and checks what must be there
/// and what may be there.
void reopen_and_verify(const std::string& path, const std::vector<Packed>& must, const std::vector<Packed>& may) {
  Options o = cache_options(path, Backing::file);
  o.read_only = true;
  auto reopened = WeightCache::open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.error().message;
  for (const auto& e : must) EXPECT_EQ(check(reopened.value(), e), "");
  for (const auto& e : may) EXPECT_EQ(check_absent_or_right(reopened.value(), e), "");
}

TEST(FullDisk, AutomaticBackingFallsBackToHeap) {
  test::TempDir dir("wc-full-disk");
  MOUNT_TMPFS_OR_SKIP(mnt, dir);
  const std::string path = dir.file("cache.wc");
  LogCapture log;
  std::vector<Packed> committed, later;
  bool finalized = false;
  {
    auto opened = WeightCache::open(cache_options(path, Backing::automatic));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();
    ASSERT_EQ(cache.stats().backing, Backing::file);
    committed = commit_first(cache);
    // 200 x 256 KiB is six times the disk: the file must run out of room on the way.
    std::size_t after_fallback = 0;
    for (std::uint64_t i = 100; i < 300 && after_fallback < 4; ++i) {
      Packed e;
      ASSERT_TRUE(pack(cache, i, 256 * 1024, &e)) << "backing=auto must never fail a reservation: "
                                                   << last_error().message;
      later.push_back(e);
      if (e.heap) ++after_fallback;
    }
    const Stats s = cache.stats();
    EXPECT_GT(s.heap_fallbacks, 0u);
    EXPECT_GT(s.heap_bytes, 0u);
    EXPECT_TRUE(log.contains("WC_ERR_NO_SPACE")) << log.all();
    for (const auto* set : {&committed, &later})
      for (const auto& e : *set) EXPECT_EQ(check(cache, e), "");
    auto r = cache.finalize();
    finalized = r.ok();
    // Entries live in heap memory and the disk cannot take them: never "durable".
    EXPECT_FALSE(r.ok()) << "finalize returned OK with entries only in heap memory";
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, Errc::no_space) << r.error().message;
      EXPECT_NE(r.error().message.find("not durable"), std::string::npos) << r.error().message;
    }
    EXPECT_GT(cache.stats().unpersisted_entries, 0u);
    for (const auto& e : later) EXPECT_EQ(check(cache, e), "") << "after finalize";
    std::printf("full disk, backing=auto: %llu reservations in the file, %llu on the heap; finalize %s\n",
                (unsigned long long)(later.size() - s.heap_fallbacks), (unsigned long long)s.heap_fallbacks,
                finalized ? "fit" : ("failed: " + r.error().message).c_str());
  }
  std::vector<Packed> must = committed;
  if (finalized)
    for (const auto& e : later)
      if (!e.heap) must.push_back(e);
  reopen_and_verify(path, must, later);
}

// The disk fills up (another program's file), entries fall back to the heap and finalize says
// they are not durable; once the other file is gone, the next finalize writes every one of them
// into the file and returns OK, and a fresh open finds them all.
TEST(FullDisk, HeapEntriesArePersistedOnceTheDiskHasRoomAgain) {
  test::TempDir dir("wc-full-disk");
  MOUNT_TMPFS_OR_SKIP(mnt, dir);
  const std::string path = dir.file("cache.wc");
  const std::string filler = dir.file("filler");
  LogCapture log;
  std::vector<Packed> all;
  {
    auto opened = WeightCache::open(cache_options(path, Backing::automatic));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();
    all = commit_first(cache);
    {
      // Another program takes most of what is left.
      std::ofstream f(filler, std::ios::binary);
      const std::string mib(1 << 20, 'x');
      for (int i = 0; i < 5; ++i) f.write(mib.data(), mib.size());
    }
    std::size_t heap = 0;
    for (std::uint64_t i = 100; i < 300 && heap < 4; ++i) {
      Packed e;
      ASSERT_TRUE(pack(cache, i, 256 * 1024, &e)) << last_error().message;
      all.push_back(e);
      if (e.heap) ++heap;
    }
    ASSERT_EQ(heap, 4u) << "the disk never filled up";
    auto r = cache.finalize();
    ASSERT_FALSE(r.ok()) << "finalize returned OK with entries only in heap memory";
    EXPECT_EQ(r.error().code, Errc::no_space) << r.error().message;
    const Stats before = cache.stats();
    EXPECT_GT(before.unpersisted_entries, 0u);
    EXPECT_GT(before.unpersisted_bytes, 0u);
    // Again, still full: still not OK, nothing lost from memory.
    EXPECT_FALSE(cache.finalize().ok());
    for (const auto& e : all) EXPECT_EQ(check(cache, e), "");

    ASSERT_EQ(::unlink(filler.c_str()), 0);
    r = cache.finalize();
    ASSERT_TRUE(r.ok()) << r.error().message;
    const Stats after = cache.stats();
    EXPECT_EQ(after.unpersisted_entries, 0u);
    EXPECT_EQ(after.unpersisted_bytes, 0u);
    EXPECT_EQ(after.heap_bytes, 0u) << "entries still counted in heap memory";
    // The offsets handed out before the move still name the same bytes.
    for (const auto& e : all) {
      EXPECT_EQ(check(cache, e), "") << "after the move into the file";
      const void* p = cache.offset_to_addr(e.offset);
      ASSERT_NE(p, nullptr) << "entry " << e.index << ": its old offset no longer resolves";
      EXPECT_EQ(std::memcmp(p, bytes_of(e.index, e.size).data(), e.size), 0) << "entry " << e.index;
    }
  }
  reopen_and_verify(path, all, {});
}

TEST(FullDisk, FileBackingSaysNoSpaceAndFailedFinalizeKeepsLastCommit) {
  test::TempDir dir("wc-full-disk");
  MOUNT_TMPFS_OR_SKIP(mnt, dir);
  const std::string path = dir.file("cache.wc");
  LogCapture log;
  std::vector<Packed> committed, later;
  {
    auto opened = WeightCache::open(cache_options(path, Backing::file));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();
    committed = commit_first(cache);
    // Fill the disk with ever smaller reservations down to 64 bytes: afterwards not one more page
    // can be allocated and the file has less room left than any index needs.
    std::uint64_t index = 100, refusals = 0;
    for (std::size_t size = 256 * 1024; size >= 64; size /= 2) {
      for (;;) {
        Packed e;
        if (!pack(cache, index++, size, &e)) {
          EXPECT_EQ(last_error().code, Errc::no_space) << last_error().message;
          ++refusals;
          break;
        }
        ASSERT_FALSE(e.heap);
        later.push_back(e);
        ASSERT_LT(later.size(), 100000u) << "the disk never filled up";
      }
    }
    EXPECT_GT(refusals, 0u);
    const Stats s = cache.stats();
    EXPECT_EQ(s.heap_fallbacks, 0u);
    EXPECT_EQ(s.heap_bytes, 0u);
    EXPECT_TRUE(log.contains("WC_ERR_NO_SPACE")) << log.all();
    for (const auto* set : {&committed, &later})
      for (const auto& e : *set) EXPECT_EQ(check(cache, e), "");

    auto r = cache.finalize();
    ASSERT_FALSE(r.ok()) << "an index for " << later.size() << " new entries cannot fit on a full disk";
    EXPECT_EQ(r.error().code, Errc::no_space) << r.error().message;
    EXPECT_TRUE(cache.is_finalized());  // the packing phase ends even when persisting fails
    for (const auto* set : {&committed, &later})
      for (const auto& e : *set) EXPECT_EQ(check(cache, e), "") << "after the failed finalize";
  }
  reopen_and_verify(path, committed, later);

  // With the tail of the failed attempt given back, the same file takes new entries again.
  auto opened = WeightCache::open(cache_options(path, Backing::file));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Packed extra;
  ASSERT_TRUE(pack(opened.value(), 99, 1000, &extra)) << last_error().message;
  auto r = opened.value().finalize();
  ASSERT_TRUE(r.ok()) << r.error().message;
  opened = Error{};
  std::vector<Packed> must = committed;
  must.push_back(extra);
  reopen_and_verify(path, must, later);
}

// Disk space runs out between packing and finalize (another program filled the disk): the data
// is safe in blocks allocated at reserve time, and the finalize either fits into space the
// cache already holds or fails with no_space; both leave a loadable file.
TEST(FullDisk, DiskFilledByAnotherProgramBeforeFinalize) {
  test::TempDir dir("wc-full-disk");
  MOUNT_TMPFS_OR_SKIP(mnt, dir);
  const std::string path = dir.file("cache.wc");
  std::vector<Packed> committed, later;
  bool finalized = false;
  {
    auto opened = WeightCache::open(cache_options(path, Backing::file));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();
    committed = commit_first(cache);
    for (std::uint64_t i = 100; i < 104; ++i) {
      Packed e;
      ASSERT_TRUE(pack(cache, i, 100000, &e)) << last_error().message;
      later.push_back(e);
    }
    {
      // The other program: write until the disk is full.
      FILE* f = std::fopen(dir.file("filler").c_str(), "wb");
      ASSERT_NE(f, nullptr);
      const std::string block(64 * 1024, 'x');
      std::size_t written = 0;
      while (std::fwrite(block.data(), 1, block.size(), f) == block.size() && written < (64u << 20))
        written += block.size();
      std::fclose(f);
    }
    auto r = cache.finalize();
    finalized = r.ok();
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, Errc::no_space) << r.error().message;
    }
    for (const auto* set : {&committed, &later})
      for (const auto& e : *set) EXPECT_EQ(check(cache, e), "");
    std::printf("disk filled before finalize: finalize %s\n",
                finalized ? "fit into space already allocated" : ("failed: " + r.error().message).c_str());
  }
  std::vector<Packed> must = committed;
  if (finalized) must.insert(must.end(), later.begin(), later.end());
  reopen_and_verify(path, must, later);
}

}  // namespace
