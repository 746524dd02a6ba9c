// Entries whose size alone would stall the host. A hostile (or damaged) file may name a 100 GiB
// entry that is a hole in a sparse file: it must be a miss found without reading it. And a big
// entry that is really there is hashed in pieces, so that closing the cache stops the
// verify-ahead thread within one piece instead of waiting for the whole entry.
//
// What the library reads is observed through the POSIX call table: each piece is mapped with
// one MADV_POPULATE_READ before it is hashed, and the hole check is lseek(SEEK_HOLE), with the
// extent map (FS_IOC_FIEMAP) asked whether a hole is really unallocated. (On
// Windows the same code runs; these observers are POSIX-only, so the tests are too.)
#include "unit_test_util.hpp"

#ifndef _WIN32
#include "format/format.hpp"
#include "platform/posix_calls.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace weightcache::test {
namespace {

constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14), as the platform layer uses it
constexpr std::uint64_t kPiece = 8ull << 20;  // the library's hashing piece (kHashChunk in core.cpp)

// What the library asked of the OS while one of these is alive. Install only while no cache is
// open (the call table is process-wide). The calls go on to what was installed before (the OS, or
// the page-size shim of the 16 and 64 KiB runs, tests/support/page_size_shim.cpp).
struct Observer {
  static inline platform::PosixCalls before;
  static inline std::atomic<std::uint64_t> populates{0}, populated_bytes{0}, largest_populate{0}, hole_seeks{0};
  static inline std::atomic<int> populate_delay_us{0};
  static inline std::atomic<int> extent_map_errno{0};  // fail FS_IOC_FIEMAP with it when set
  static inline std::atomic<std::uint64_t> extent_queries{0};

  Observer() {
    populates = 0;
    populated_bytes = 0;
    largest_populate = 0;
    hole_seeks = 0;
    populate_delay_us = 0;
    extent_map_errno = 0;
    extent_queries = 0;
    auto& t = platform::posix_calls();
    before = t;
    t.ioctl = [](int fd, unsigned long request, void* arg) -> int {
      extent_queries.fetch_add(1);
      if (const int err = extent_map_errno.load(); err != 0) return (errno = err, -1);
      return before.ioctl(fd, request, arg);
    };
    t.madvise = [](void* a, size_t n, int advice) -> int {
      if (advice == kPopulateRead) {
        populates.fetch_add(1);
        populated_bytes.fetch_add(n);
        for (std::uint64_t m = largest_populate.load(); n > m && !largest_populate.compare_exchange_weak(m, n);) {
        }
        // Slows the verify-ahead thread down so the test sees it between pieces.
        if (const int us = populate_delay_us.load(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
      return before.madvise(a, n, advice);
    };
    t.lseek = [](int fd, off_t o, int whence) -> off_t {
      if (whence == SEEK_HOLE) hole_seeks.fetch_add(1);
      return before.lseek(fd, o, whence);
    };
  }
  ~Observer() {
    platform::posix_calls().madvise = before.madvise;
    platform::posix_calls().lseek = before.lseek;
    platform::posix_calls().ioctl = before.ioctl;
  }
};

// The hole: 100 GiB in a 64-bit process. A 32-bit one cannot map a file that large at all (its
// open says so: AFileTooLargeToMapIsRefusedUnread), nor can qemu-user's 16 GiB guest in
// scripts/test-arch, so there it is 512 MiB, still far more than a look-up may read and past the
// 16 MiB from which entries are checked for holes.
constexpr bool k64Bit = sizeof(void*) >= 8;
#ifdef WEIGHTCACHE_TEST_EMULATOR
constexpr bool kRoomFor100GiB = false;
#else
constexpr bool kRoomFor100GiB = k64Bit;
#endif
constexpr std::uint64_t kHole = kRoomFor100GiB ? 100ull << 30 : 512ull << 20;
constexpr std::uint64_t kHoleMaxFileBytes = kRoomFor100GiB ? 128ull << 30 : 1ull << 30;

Options sparse_options(const std::string& path) {
  Options o = file_options(path);
  o.read_only = true;  // nothing to rebuild: the test is about reading the file as it is
  o.verify = Verify::first_use;
  o.verify_ahead = true;
  return o;
}

// sparse_options for the file of kHole: its size is over the default max_file_bytes.
Options hole_options(const std::string& path) {
  Options o = sparse_options(path);
  o.max_file_bytes = kHoleMaxFileBytes;
  return o;
}

// Writes a cache file whose only entry, `size` bytes at offset 4096, was never written: a valid
// header and index (the library's own encoders) around a hole. Returns false where the file
// system cannot hold such a sparse file.
bool write_sparse_cache(const std::string& path, const std::string& key, std::uint64_t size) {
  format::HeaderFixed fixed;
  fixed.alignment = 64;
  fixed.size_alignment = 1;
  fixed.compat_hash = format::hash_bytes(file_options(path).compat_key);
  const format::IndexRecord rec{key, format::kHeaderSize, size, 0x5eedf00dcafe1234ull};
  format::CommitSlot slot;
  slot.sequence = 1;
  const std::uint64_t index_offset = format::kHeaderSize + size;
  const auto trailer = format::encode_trailer(std::span<const format::IndexRecord>(&rec, 1), index_offset, &slot);
  const auto header = format::encode_header(fixed, slot, {});
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  const bool ok = ::pwrite(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()) &&
                  ::pwrite(fd, trailer.data(), trailer.size(), static_cast<off_t>(index_offset)) ==
                      static_cast<ssize_t>(trailer.size());
  struct stat st {};
  const bool sparse = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_blocks) * 512 < (64ull << 20);
  ::close(fd);
  return ok && sparse;
}

TEST(SparseEntry, AHoleIsAMissFoundWithoutReadingIt) {
  TempDir dir("wc-sparse");
  const std::string path = dir.file("hostile.wcache");
  // (64-bit: 100 GiB in a 101 GiB file of a few KiB on disk.)
  if (!write_sparse_cache(path, "big", kHole)) GTEST_SKIP() << "the file system here cannot hold such a sparse file";
  Options o = hole_options(path);
  LogCapture log;
  Observer seen;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    EXPECT_EQ(cache.look_up("big"), kNotFound);
    EXPECT_EQ(cache.look_up("big"), kNotFound);  // the verdict stands, and is logged once
    const Stats s = cache.stats();
    EXPECT_EQ(s.verify_failures, 1u);
    EXPECT_EQ(s.misses, 2u);
  }  // close: the verify-ahead thread (the file is over 16 MiB) must be done or stop at once
  EXPECT_EQ(Observer::populated_bytes.load(), 0u) << "bytes of the hole were mapped to be hashed";
  EXPECT_GE(Observer::hole_seeks.load(), 1u);
  EXPECT_EQ(log.count("has a hole"), 1u) << log.all();
  EXPECT_EQ(log.count(path), log.at_least(WC_LOG_WARN).size()) << log.all();
}

// Where the extent map cannot be read, SEEK_HOLE's answer stands: still a miss, still unread.
TEST(SparseEntry, WithoutTheExtentMapAHoleIsStillAHole) {
  TempDir dir("wc-sparse");
  const std::string path = dir.file("hostile.wcache");
  if (!write_sparse_cache(path, "big", kHole)) GTEST_SKIP() << "no sparse files here";
  Options o = hole_options(path);
  o.verify_ahead = false;
  Observer seen;
  Observer::extent_map_errno = EOPNOTSUPP;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    EXPECT_EQ(cache.look_up("big"), kNotFound);
    EXPECT_EQ(cache.stats().verify_failures, 1u);
  }
  EXPECT_EQ(Observer::populated_bytes.load(), 0u);
  EXPECT_GE(Observer::hole_seeks.load(), 1u);
}

// A file whose commit spans more than the cache may map (in a 32-bit process or a 16 GiB guest,
// the 100 GiB hole with any max_file_bytes: the reservation is cut to what the address space has)
// is refused at open, saying what to raise, with nothing of it read.
TEST(SparseEntry, AFileTooLargeToMapIsRefusedUnread) {
  TempDir dir("wc-sparse");
  const std::string path = dir.file("hostile.wcache");
  if (!write_sparse_cache(path, "big", 100ull << 30)) GTEST_SKIP() << "no 100 GiB sparse files here";
  Options o = sparse_options(path);
  o.max_file_bytes = k64Bit ? 64ull << 30 : 128ull << 30;
  Observer seen;
  auto c = WeightCache::open(o);
  ASSERT_FALSE(c.ok()) << "a 101 GiB file opened with max_file_bytes " << o.max_file_bytes;
  EXPECT_EQ(c.error().code, Errc::no_space) << c.error().message;
  EXPECT_NE(c.error().message.find("the newest commit of '" + path + "' spans "), std::string::npos)
      << c.error().message;
  EXPECT_NE(c.error().message.find("raise max_file_bytes"), std::string::npos) << c.error().message;
  EXPECT_EQ(Observer::populated_bytes.load(), 0u);
}

// ext4, XFS and btrfs report space that was allocated (posix_fallocate) but never written as a
// hole to SEEK_HOLE once its pages left the page cache. A caller that filled only part of a
// reservation leaves such a range inside a sound entry: it must be served, not called a hole.
TEST(SparseEntry, AReservationLeftPartlyUnwrittenIsNotAHole) {
  TempDir dir("wc-sparse");
  const std::string path = dir.file("partial.wcache");
  const std::size_t size = 32u << 20;  // over the 16 MiB from which entries are checked for holes
  Options o = file_options(path);
  o.verify_ahead = false;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    auto* p = static_cast<char*>(cache.reserve(size));
    ASSERT_NE(p, nullptr);
    std::memset(p, 7, size / 2);  // the second half stays as the fresh file space was: zeros
    ASSERT_NE(cache.look_up_or_insert("half-written", p, size), kNotFound);
    ASSERT_TRUE(cache.finalize().ok());
  }
  {  // Out of the page cache, as after a reboot.
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const off_t hole = ::lseek(fd, format::kHeaderSize, SEEK_HOLE);
    ::close(fd);
    if (hole >= static_cast<off_t>(size))
      std::printf("note: this file system does not report unwritten space as a hole; the test checks less\n");
  }
  Observer seen;
  WeightCache cache = open_or_fail(o);
  ASSERT_TRUE(cache);
  const std::size_t off = cache.look_up("half-written");
  ASSERT_NE(off, kNotFound) << "a sound entry was called a hole";
  const auto* q = static_cast<const char*>(cache.offset_to_addr(off));
  EXPECT_EQ(q[0], 7);
  EXPECT_EQ(q[size - 1], 0);
  EXPECT_EQ(cache.stats().verify_failures, 0u);
  EXPECT_GE(Observer::hole_seeks.load(), 1u);
}

// The same through the C ABI, with the thread left alone: it finds the hole before any look-up.
TEST(SparseEntry, TheVerifyAheadThreadFindsTheHoleAndCloseIsNotKept) {
  TempDir dir("wc-sparse");
  const std::string path = dir.file("hostile.wcache");
  if (!write_sparse_cache(path, "big", kHole)) GTEST_SKIP() << "no sparse files here";
  LogCapture log;
  Observer seen;
  wc_options o;
  wc_options_init(&o);
  const std::string compat = file_options(path).compat_key;
  o.path = path.c_str();
  o.compat_key = compat.data();
  o.compat_key_size = compat.size();
  o.backing = WC_BACKING_FILE;
  o.read_only = 1;
  o.max_file_bytes = kHoleMaxFileBytes;
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  wc_stats s;
  wc_stats_init(&s);
  // Waits for the thread's verdict (the bound is the harness's, not a claim about speed).
  for (int i = 0; i < 60000 && s.verify_failures == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  }
  EXPECT_EQ(s.verify_failures, 1u);
  EXPECT_EQ(wc_look_up(c, "big", 3), WC_NOT_FOUND);
  wc_close(c);
  EXPECT_EQ(Observer::populated_bytes.load(), 0u);
  EXPECT_EQ(log.count("has a hole"), 1u) << log.all();
}

// A real 128 MiB entry (16 pieces): close while the verify-ahead thread is in the middle of it.
TEST(SparseEntry, CloseStopsTheVerifyAheadThreadWithinOnePiece) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "verify-ahead runs only with two or more CPUs";
  TempDir dir("wc-sparse");
  const std::string path = dir.file("big.wcache");
  const std::uint64_t size = 128ull << 20;
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    auto* p = static_cast<unsigned char*>(cache.reserve(size));
    ASSERT_NE(p, nullptr) << last_error().message;
    for (std::uint64_t i = 0; i < size; i += 4096) p[i] = static_cast<unsigned char>(i >> 12);
    ASSERT_NE(cache.look_up_or_insert("big", p, size), kNotFound);
    ASSERT_TRUE(cache.finalize().ok());
  }
  Observer seen;
  Observer::populate_delay_us = 5000;
  Options o = sparse_options(path);
  std::uint64_t before = 0;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    // Until the thread is past its first piece (or, unchunked, done with the whole entry).
    for (int i = 0; i < 60000 && Observer::populates.load() < 2 && cache.stats().verified_ahead == 0; ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    before = Observer::populates.load();
  }  // close
  const std::uint64_t after = Observer::populates.load();
  // (The platform rounds each piece's start down to its page: the one the library sees.)
  const auto page = static_cast<std::uint64_t>(platform::posix_calls().sysconf(_SC_PAGESIZE));
  EXPECT_LE(Observer::largest_populate.load(), kPiece + page)
      << "an entry was hashed in one piece";
  EXPECT_GE(before, 2u);
  // It may have begun one more piece between the count above and close's stop; not two more.
  EXPECT_LE(after - before, 2u) << "the thread went on hashing after close asked it to stop";
  EXPECT_LT(after, size / kPiece) << "close waited for the whole entry";
  // Nothing was decided about the entry: the next open hashes it and serves it.
  Observer::populate_delay_us = 0;
  o.verify_ahead = false;
  WeightCache again = open_or_fail(o);
  EXPECT_NE(again.look_up("big"), kNotFound);
  EXPECT_EQ(again.stats().verify_failures, 0u);
}

}  // namespace
}  // namespace weightcache::test
#endif  // !_WIN32
