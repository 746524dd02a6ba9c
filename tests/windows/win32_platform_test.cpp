// The Win32 platform backend through the seam itself (src/platform/platform.hpp): error
// mapping, UTF-8 paths, per-handle locks, and mappings of files that end inside a 64 KiB
// chunk and grow later (the holes described in src/platform/win32_segments.hpp).
#include "platform/platform.hpp"
#include "platform/win32_calls.hpp"
#include "temp_dir.hpp"
#include "windows_test_util.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace weightcache::test {
namespace {

using platform::File;
using platform::OpenMode;

platform::Platform& pf() { return platform::os(); }

File open_or_die(const std::string& path, OpenMode mode) {
  auto h = pf().open_file(path, mode, 0644, false);
  EXPECT_TRUE(h) << (h ? "" : h.error().message);
  return h ? std::move(h).value() : File();
}

void write_pattern(const File& h, std::uint64_t seed, std::size_t size, std::uint64_t offset) {
  const std::string bytes = pattern_bytes(seed, size);
  auto r = pf().write_at(h, bytes.data(), bytes.size(), offset);
  ASSERT_TRUE(r) << r.error().message;
}

TEST(Win32Platform, FactsAreWindowsOnes) {
  EXPECT_EQ(pf().map_granularity(), 65536u);
  EXPECT_EQ(pf().file_size_limit(), UINT64_MAX);
  EXPECT_EQ(pf().process_id(), static_cast<int>(::GetCurrentProcessId()));
  // Which mapping mode this system gets (src/platform/win32_segments.cpp); shown in the XML report.
  ::testing::Test::RecordProperty("under_wine", under_wine() ? "yes" : "no");
}

// in_use_by_others, asked through a read-only handle (what a read-only opener of an empty file
// has): another handle's shared or exclusive in-use lock shows; its own never counts once let go.
TEST(Win32Platform, InUseByOthersSeesAnotherHandlesInUseLockThroughAReadOnlyHandle) {
  TempDir dir("wc-win32");
  const std::string path = dir.file("inuse.wcache");
  File writer = open_or_die(path, OpenMode::create_new);
  File reader = open_or_die(path, OpenMode::read);
  auto none = pf().in_use_by_others(reader);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_FALSE(none.value());
  for (bool exclusive : {false, true}) {
    auto locked = pf().try_lock_in_use(writer, exclusive);
    ASSERT_TRUE(locked && locked.value());
    auto seen = pf().in_use_by_others(reader);
    ASSERT_TRUE(seen) << seen.error().message;
    EXPECT_TRUE(seen.value()) << (exclusive ? "exclusive" : "shared");
    pf().unlock_in_use(writer);
    auto gone = pf().in_use_by_others(reader);
    ASSERT_TRUE(gone) << gone.error().message;
    EXPECT_FALSE(gone.value());
  }
}

TEST(Win32Platform, MissingFilesReportEnoentWithTheWindowsMessage) {
  TempDir dir("wc-win32");
  auto r = pf().open_file(dir.file("missing.wcache"), OpenMode::read, 0644, false);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().sys_errno, ENOENT);  // what the core tests to decide to create the file
  EXPECT_NE(r.error().message.find("(Windows error 2)"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("missing.wcache"), std::string::npos) << r.error().message;

  auto in_missing_dir = pf().open_file(dir.file("no-such-dir/x.wcache"), OpenMode::read_write, 0644, false);
  ASSERT_FALSE(in_missing_dir);
  EXPECT_EQ(in_missing_dir.error().sys_errno, ENOENT);

  auto st = pf().stat_path(dir.file("missing.wcache"), true);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().sys_errno, ENOENT);
}

TEST(Win32Platform, CreateNewRefusesAnExistingFile) {
  TempDir dir("wc-win32");
  const std::string path = dir.file("a.wcache");
  File h = open_or_die(path, OpenMode::create_new);
  h.close();
  auto again = pf().open_file(path, OpenMode::create_new, 0644, false);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().sys_errno, EEXIST);
}

TEST(Win32Platform, DirectoriesAreNotCacheFiles) {
  TempDir dir("wc-win32");
  auto r = pf().open_file(dir.path().string(), OpenMode::read_write, 0644, false);
  ASSERT_FALSE(r);
  // Not "access denied": the core takes EACCES for a read-only place and maps the cache read-only.
  EXPECT_NE(r.error().sys_errno, EACCES) << r.error().message;
  auto lock = pf().open_file(dir.path().string(), OpenMode::lock_file, 0644, false);
  ASSERT_FALSE(lock);
  EXPECT_NE(lock.error().sys_errno, EACCES) << lock.error().message;
  auto st = pf().stat_path(dir.path().string(), true);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_FALSE(st->regular);
}

TEST(Win32Platform, Utf8PathsReachTheFileSystemAsUnicode) {
  TempDir dir("wc-win32");
  const std::string name = "caf\xC3\xA9-\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87-\xE3\x82\xAD\xE3\x83\xA3.wcache";  // café-ключ-キャ
  const std::string path = dir.file(name);
  File h = open_or_die(path, OpenMode::create_new);
  write_pattern(h, 1, 10, 0);
  auto a = pf().stat_file(h);
  auto b = pf().stat_path(path, false);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->inode, b->inode);
  EXPECT_EQ(a->device, b->device);
  EXPECT_EQ(b->size, 10u);
  EXPECT_TRUE(b->regular);
  h.close();
  // The name on disk is the UTF-16 form of the UTF-8 we passed, not mojibake.
  EXPECT_TRUE(std::filesystem::exists(dir.path() / std::filesystem::u8path(name)));
  pf().remove(path);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / std::filesystem::u8path(name)));
}

TEST(Win32Platform, ShortReadsAreCorruptNotGarbage) {
  TempDir dir("wc-win32");
  File h = open_or_die(dir.file("a"), OpenMode::create_new);
  write_pattern(h, 1, 100, 0);
  char buf[200];
  auto r = pf().read_at(h, buf, sizeof buf, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::corrupt);
  EXPECT_NE(r.error().message.find(dir.file("a")), std::string::npos) << r.error().message;  // the file's name
  h.close();
}

TEST(Win32Platform, AllocateGrowsAndNeverShrinks) {
  TempDir dir("wc-win32");
  File h = open_or_die(dir.file("a"), OpenMode::create_new);
  ASSERT_TRUE(pf().allocate(h, 0, 1 << 20));
  EXPECT_EQ(pf().stat_file(h)->size, 1u << 20);
  ASSERT_TRUE(pf().allocate(h, 0, 4096));
  EXPECT_EQ(pf().stat_file(h)->size, 1u << 20);
  ASSERT_TRUE(pf().truncate(h, 5000));
  EXPECT_EQ(pf().stat_file(h)->size, 5000u);
  h.close();
}

TEST(Win32Platform, LocksBelongToTheHandleAndDieWithIt) {
  TempDir dir("wc-win32");
  const std::string path = dir.file("a.lock");
  File h1 = open_or_die(path, OpenMode::lock_file);
  File h2 = open_or_die(path, OpenMode::lock_file);
  ASSERT_TRUE(pf().try_lock(h1).value());
  EXPECT_FALSE(pf().try_lock(h2).value());  // same process, other handle: refused, as flock
  pf().unlock(h1);
  ASSERT_TRUE(pf().try_lock(h2).value());
  EXPECT_FALSE(pf().try_lock(h1).value());
  h2.close();  // closing releases it
  EXPECT_TRUE(pf().try_lock(h1).value());
  // The lock byte lies far past the content: the lock file stays readable and writable.
  write_pattern(h1, 1, 16, 0);
  h1.close();
}

TEST(Win32Platform, RenameReplacesTheTarget) {
  TempDir dir("wc-win32");
  const std::string a = dir.file("a"), b = dir.file("b");
  File h = open_or_die(a, OpenMode::create_new);
  write_pattern(h, 1, 10, 0);
  h.close();
  h = open_or_die(b, OpenMode::create_new);
  write_pattern(h, 2, 20, 0);
  h.close();
  auto r = pf().rename(a, b);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(pf().stat_path(b, false)->size, 10u);
  EXPECT_FALSE(pf().stat_path(a, false));
  EXPECT_TRUE(pf().sync_parent_dir(b));
}

// Maps the first 128 KiB chunk of a 100000-byte file: the chunk ends past EOF, as the core's
// chunks do. Growing the file makes the rest usable without another map_file call.
TEST(Win32Platform, WritableMappingFollowsTheFileAsItGrows) {
  TempDir dir("wc-win32");
  File h = open_or_die(dir.file("a"), OpenMode::create_new);
  write_pattern(h, 7, 100000, 0);
  auto base = pf().reserve_address_space(8 << 20, 2 << 20);
  ASSERT_TRUE(base) << base.error().message;
  auto* p = static_cast<char*>(base.value());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (2 << 20), 0u);
  auto m = pf().map_file(h, 0, 128 << 10, p, true);
  ASSERT_TRUE(m) << m.error().message;
  const std::string want = pattern_bytes(7, 100000);
  EXPECT_EQ(std::memcmp(p, want.data(), want.size()), 0);

  ASSERT_TRUE(pf().allocate(h, 0, 256 << 10));
  std::memcpy(p + 120000, "grown", 5);  // past the old EOF, inside the first chunk
  auto m2 = pf().map_file(h, 128 << 10, 128 << 10, p + (128 << 10), true);
  ASSERT_TRUE(m2) << m2.error().message;
  std::memcpy(p + 200000, "second", 6);
  ASSERT_TRUE(pf().flush_mapping(p + 100000, 150000, true));
  char buf[6];
  ASSERT_TRUE(pf().read_at(h, buf, 5, 120000));
  EXPECT_EQ(std::string(buf, 5), "grown");
  ASSERT_TRUE(pf().read_at(h, buf, 6, 200000));
  EXPECT_EQ(std::string(buf, 6), "second");
  // Writes through the file show through the mapping (one page cache).
  ASSERT_TRUE(pf().write_at(h, "fresh", 5, 150000));
  EXPECT_EQ(std::string(p + 150000, 5), "fresh");

  // The heap arena: committed memory in the same reservation, zeroed and writable.
  ASSERT_TRUE(pf().commit_memory(p + (4 << 20), 1 << 20));
  EXPECT_EQ(p[(4 << 20) + 12345], 0);
  std::memset(p + (4 << 20), 0x5a, 1 << 20);
  pf().prefetch(p, 128 << 10);

  // Shrinking a mapped file is refused by Windows (and tolerated by the core).
  auto t = pf().truncate(h, 4096);
  EXPECT_FALSE(t);
  pf().release_address_space(p, 8 << 20);
  EXPECT_TRUE(pf().truncate(h, 4096)) << "views should be gone after release_address_space";
  h.close();
}

// A read-only mapper cannot grow the file; it must still see bytes another handle appends
// once it has stat'ed the file, as the core's refresh does.
TEST(Win32Platform, ReadOnlyMappingSeesGrowthAfterStat) {
  TempDir dir("wc-win32");
  const std::string path = dir.file("a");
  File w = open_or_die(path, OpenMode::create_new);
  write_pattern(w, 3, 10000, 0);
  File r = open_or_die(path, OpenMode::read);
  auto base = pf().reserve_address_space(4 << 20, 65536);
  ASSERT_TRUE(base) << base.error().message;
  auto* p = static_cast<const char*>(base.value());
  auto m = pf().map_file(r, 0, 64 << 10, base.value(), false);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::memcmp(p, pattern_bytes(3, 10000).data(), 10000), 0);
  auto before = pf().stat_file(r);
  ASSERT_TRUE(before);
  EXPECT_EQ(before->size, 10000u) << "a read-only mapping must not grow the file";

  // Another writer grows the file and appends inside the same 64 KiB chunk.
  ASSERT_TRUE(pf().allocate(w, 0, 64 << 10));
  write_pattern(w, 4, 30000, 20000);
  ASSERT_TRUE(pf().stat_file(r));
  EXPECT_EQ(std::memcmp(p + 20000, pattern_bytes(4, 30000).data(), 30000), 0);
  // And again without changing the size (the file is preallocated).
  write_pattern(w, 5, 5000, 55000);
  ASSERT_TRUE(pf().stat_file(r));
  EXPECT_EQ(std::memcmp(p + 55000, pattern_bytes(5, 5000).data(), 5000), 0);
  pf().release_address_space(base.value(), 4 << 20);
  r.close();
  w.close();
}

TEST(Win32Platform, MappingOutsideAReservationIsRefused) {
  TempDir dir("wc-win32");
  File h = open_or_die(dir.file("a"), OpenMode::create_new);
  write_pattern(h, 1, 65536, 0);
  auto base = pf().reserve_address_space(1 << 20, 65536);
  ASSERT_TRUE(base);
  auto* p = static_cast<char*>(base.value());
  ASSERT_TRUE(pf().map_file(h, 0, 65536, p, true));
  EXPECT_FALSE(pf().map_file(h, 0, 65536, p, true)) << "the same range twice";
  EXPECT_FALSE(pf().map_file(h, 0, 65536, p + (1 << 20), true)) << "past the reservation";
  EXPECT_FALSE(pf().commit_memory(p, 65536));
  pf().release_address_space(p, 1 << 20);
  h.close();
}

// Legacy mode carves a chunk by releasing its reservation and reserving the rest again; another
// allocation can take part of it meanwhile, and that part is then lost to its owner
// (docs/PLATFORMS.md). Once free again, the system can hand that very range to a new reservation
// of ours. It must not be taken: two reservations over one address, and the owner of the lost
// part would carve its next chunk out of the other's range (under Wine, a heap arena's chunk
// then failed with "commit_memory over a used range" while several threads reserved at once).
// Here the other allocation and the system's choice of address are made to happen through the
// call table.
namespace lost_range {
std::uintptr_t intrude_at = 0, intruder = 0, redirect_to = 0;
std::size_t intruder_size = 0;
platform::Win32Calls below;
LPVOID WINAPI virtual_alloc(LPVOID at, SIZE_T n, DWORD type, DWORD protect) {
  if (intrude_at != 0 && reinterpret_cast<std::uintptr_t>(at) == intrude_at && type == MEM_RESERVE) {
    intrude_at = 0;  // another allocation takes part of the range being reserved again
    intruder = reinterpret_cast<std::uintptr_t>(
        below.virtual_alloc(reinterpret_cast<void*>(intruder), intruder_size, MEM_RESERVE, PAGE_NOACCESS));
  }
  if (redirect_to != 0 && at == nullptr) {
    at = reinterpret_cast<void*>(redirect_to);  // where the system would have chosen
    redirect_to = 0;
  }
  return below.virtual_alloc(at, n, type, protect);
}
}  // namespace lost_range

TEST(Win32Platform, APartLostToAnotherAllocationIsNeverGivenToAnotherReservation) {
  if (!legacy_mapping()) GTEST_SKIP() << "placeholder mode never releases a reserved range";
  constexpr std::size_t g = 65536;
  namespace lr = lost_range;
  auto& calls = platform::win32_calls();
  lr::below = calls;
  struct Restore {
    ~Restore() { platform::win32_calls() = lr::below; }
  } restore;
  calls.virtual_alloc = lr::virtual_alloc;

  auto a = pf().reserve_address_space(4 * g, g);
  ASSERT_TRUE(a) << a.error().message;
  const auto base_a = reinterpret_cast<std::uintptr_t>(a.value());
  lr::intruder = base_a + 2 * g;
  lr::intruder_size = g;
  lr::intrude_at = base_a + g;
  ASSERT_TRUE(pf().commit_memory(a.value(), g));
  ASSERT_EQ(lr::intruder, base_a + 2 * g) << "the other allocation did not happen";
  ASSERT_TRUE(lr::below.virtual_free(reinterpret_cast<void*>(lr::intruder), 0, MEM_RELEASE));
  // [base_a + g, base_a + 4g) is lost to a, and free: the system offers it to the next reservation.
  lr::redirect_to = base_a + g;
  auto b = pf().reserve_address_space(g, g);
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_EQ(lr::redirect_to, 0u);
  const auto base_b = reinterpret_cast<std::uintptr_t>(b.value());
  EXPECT_TRUE(base_b + g <= base_a || base_b >= base_a + 4 * g)
      << "a new reservation inside another's lost part, at offset " << base_b - base_a;

  // Each grows inside its own range; neither sees the other's bytes.
  auto ra = pf().commit_memory(reinterpret_cast<void*>(base_a + g), g);
  auto rb = pf().commit_memory(b.value(), g);
  EXPECT_TRUE(ra) << ra.error().message;
  ASSERT_TRUE(rb) << rb.error().message;
  std::memset(b.value(), 0xbb, g);
  if (ra) {
    std::memset(reinterpret_cast<void*>(base_a + g), 0xaa, g);
    EXPECT_EQ(static_cast<unsigned char*>(b.value())[0], 0xbb);
    EXPECT_EQ(static_cast<unsigned char*>(b.value())[g - 1], 0xbb);
  }
  pf().release_address_space(b.value(), g);
  pf().release_address_space(a.value(), 4 * g);
}

// Offsets past 4 GiB in 64-bit arithmetic everywhere. Under Wine the file is sparse; on NTFS
// it would take 5 GiB of disk, so a real Windows machine runs it only with WEIGHTCACHE_FULL=1.
TEST(Win32Platform, OffsetsPastFourGiB) {
  if (!under_wine() && std::getenv("WEIGHTCACHE_FULL") == nullptr) GTEST_SKIP() << "set WEIGHTCACHE_FULL=1";
  TempDir dir("wc-win32");
  File h = open_or_die(dir.file("big"), OpenMode::create_new);
  const std::uint64_t chunk = std::uint64_t{5} << 30;
  write_pattern(h, 9, 1000, chunk + 12345);   // in the chunk's first whole 64 KiB
  write_pattern(h, 10, 1000, chunk + 70000);  // in its partial second one (EOF at +71000)
  EXPECT_EQ(pf().stat_file(h)->size, chunk + 71000);
  char buf[1000];
  ASSERT_TRUE(pf().read_at(h, buf, sizeof buf, chunk + 12345));
  EXPECT_EQ(std::memcmp(buf, pattern_bytes(9, 1000).data(), 1000), 0);

  auto base = pf().reserve_address_space(std::size_t{6} << 30, 65536);
  ASSERT_TRUE(base) << base.error().message;
  auto* p = static_cast<char*>(base.value());
  auto m = pf().map_file(h, chunk, 128 << 10, p + chunk, false);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::memcmp(p + chunk + 12345, pattern_bytes(9, 1000).data(), 1000), 0);
  EXPECT_EQ(std::memcmp(p + chunk + 70000, pattern_bytes(10, 1000).data(), 1000), 0);

  ASSERT_TRUE(pf().allocate(h, chunk, 256 << 10));
  auto w = pf().map_file(h, chunk + (128 << 10), 128 << 10, p + chunk + (128 << 10), true);
  ASSERT_TRUE(w) << w.error().message;
  std::memcpy(p + chunk + 200000, "far", 3);
  ASSERT_TRUE(pf().flush_mapping(p + chunk + 200000, 3, true));
  ASSERT_TRUE(pf().read_at(h, buf, 3, chunk + 200000));
  EXPECT_EQ(std::string(buf, 3), "far");
  pf().release_address_space(p, std::size_t{6} << 30);
  h.close();
}

}  // namespace
}  // namespace weightcache::test
