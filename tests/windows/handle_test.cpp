// Caches on a caller's HANDLE (wc_options.handle) and ":memory:" caches handed to another process
// by their handle, the Windows counterparts of tests/multiprocess/descriptor_test.cpp: the caller
// closes its own handle and the cache goes on; a handle without write access never writes; a
// child started with CreateProcess, given the handle by inheritance, finds every entry of a
// ":memory:" cache in the same pages without packing, and a read-only child changes no byte.
#include "temp_dir.hpp"
#include "lease_exclusion.hpp"
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace weightcache::test {
namespace {

const std::string kChild = win_child_exe();


// Every byte of the file behind `h`, read through the handle.
std::string contents(HANDLE h) {
  LARGE_INTEGER size{};
  if (!::GetFileSizeEx(h, &size)) return "(cannot query)";
  std::string out(static_cast<std::size_t>(size.QuadPart), '\0');
  std::size_t at = 0;
  while (at < out.size()) {
    OVERLAPPED ov{};
    ov.Offset = static_cast<DWORD>(at);
    ov.OffsetHigh = static_cast<DWORD>(static_cast<std::uint64_t>(at) >> 32);
    DWORD got = 0;
    const DWORD want = static_cast<DWORD>(std::min<std::size_t>(out.size() - at, 1u << 24));
    if (!::ReadFile(h, &out[at], want, &got, &ov) || got == 0) return "(cannot read)";
    at += got;
  }
  return out;
}

// A duplicate of `h` that a child started with bInheritHandles inherits, with `access` (0: the
// same access as `h`).
HANDLE inheritable(HANDLE h, DWORD access) {
  HANDLE out = nullptr;
  const DWORD options = access == 0 ? DUPLICATE_SAME_ACCESS : 0;
  if (!::DuplicateHandle(::GetCurrentProcess(), h, ::GetCurrentProcess(), &out, access, TRUE, options)) return nullptr;
  return out;
}

TEST(WindowsHandle, ACacheOnACallersHandleWorksAfterTheCallerClosesItAndPersists) {
  TempDir dir;
  const std::string path = dir.file("by-handle.wcache");
  HANDLE mine = open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW);  // empty: initialised
  ASSERT_NE(mine, INVALID_HANDLE_VALUE);
  const auto entries = shared_entries(9);
  {
    wc_options o;
    wc_options_init(&o);
    EXPECT_EQ(o.handle, nullptr);
    o.handle = mine;
    o.compat_key = "weightcache-windows-suite";
    o.compat_key_size = std::strlen("weightcache-windows-suite");
    o.backing = WC_BACKING_FILE;
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    void* ours = wc_get_handle(c);
    ASSERT_NE(ours, nullptr);
    EXPECT_NE(ours, mine) << "the cache must hold a handle of its own";
    EXPECT_EQ(wc_get_fd(c), -1);
    ASSERT_TRUE(::CloseHandle(mine));  // "the caller keeps its handle and may close it"

    for (const auto& e : entries) {
      const std::string bytes = pattern_bytes(e.seed, e.size);
      void* p = wc_reserve_space(c, bytes.size());
      ASSERT_NE(p, nullptr) << wc_last_error();
      std::memcpy(p, bytes.data(), bytes.size());
      ASSERT_NE(wc_look_up_or_insert(c, e.key.data(), e.key.size(), p, bytes.size()), WC_NOT_FOUND) << wc_last_error();
    }
    ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
    wc_stats s;
    wc_stats_init(&s);
    ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
    EXPECT_EQ(s.backing, WC_BACKING_FILE);
    EXPECT_EQ(s.heap_bytes, 0u);
    EXPECT_EQ(wc_get_handle(c), ours) << "the handle changed while the cache lives";
    wc_close(c);
  }
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::u8path(path + ".lock"))) << "a handle cache made a lock file";
  // An ordinary cache file: an open by path finds every entry.
  Options by_path = suite_options(path);
  by_path.read_only = true;
  auto r = WeightCache::open(by_path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (const auto& e : entries) EXPECT_EQ(entry_problem(*r, e), "");
  EXPECT_EQ(wc_get_handle(nullptr), nullptr);
}

// Two opens on one handle are two caches, each on a handle of its own, and only one of them holds
// the writer lease at a time, as two processes would.
TEST(WindowsHandle, TwoCachesOnOneHandleExcludeEachOtherThroughTheLease) {
  TempDir dir;
  const std::string path = dir.file("two.wcache");
  HANDLE mine = open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW);
  ASSERT_NE(mine, INVALID_HANDLE_VALUE);
  Options o = on_handle(mine);
  o.lease_timeout = std::chrono::milliseconds(100);
  auto x = WeightCache::open(o);
  auto y = WeightCache::open(o);
  ::CloseHandle(mine);
  ASSERT_TRUE(x.ok()) << x.error().message;
  ASSERT_TRUE(y.ok()) << y.error().message;
  EXPECT_NE(x->file_handle(), y->file_handle());
  expect_refused_until_holder_finalizes(x.value(), y.value(), "same file");
}

// A handle without write access never becomes a writable cache: ReOpenFile checks the file's
// ACL, not the handle, so the library asks the handle what it was granted.
TEST(WindowsHandle, AHandleWithoutWriteAccessNeverWrites) {
  TempDir dir;
  const std::string path = dir.file("ro.wcache");
  const auto entries = shared_entries(4);
  {
    auto w = WeightCache::open(suite_options(path));
    ASSERT_TRUE(w.ok()) << w.error().message;
    for (const auto& e : entries) ASSERT_NE(pack_entry(*w, e), kNotFound);
    ASSERT_TRUE(w->finalize().ok());
  }
  HANDLE ro = open_handle(path, GENERIC_READ, OPEN_EXISTING);
  ASSERT_NE(ro, INVALID_HANDLE_VALUE);
  const std::string before = contents(ro);

  auto refused = WeightCache::open(on_handle(ro));
  ASSERT_FALSE(refused.ok()) << "a read-only handle opened as a writable cache";
  EXPECT_EQ(refused.error().code, Errc::read_only) << refused.error().message;

  Options automatic = on_handle(ro);
  automatic.backing = Backing::automatic;
  Options read_only = on_handle(ro);
  read_only.read_only = true;
  for (const Options& o : {automatic, read_only}) {
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->stats().backing, Backing::file);
    for (const auto& e : entries) {
      EXPECT_EQ(entry_problem(*c, e), "");
      MEMORY_BASIC_INFORMATION mbi{};
      ASSERT_EQ(::VirtualQuery(c->offset_to_addr(c->look_up(e.key)), &mbi, sizeof mbi), sizeof mbi);
      EXPECT_EQ(mbi.Protect, static_cast<DWORD>(PAGE_READONLY)) << e.key << " is mapped writable";
    }
    ASSERT_NE(c->insert("new", "bytes"), kNotFound);
    auto f = c->finalize();
    EXPECT_FALSE(f.ok());
    EXPECT_EQ(f.error().code, Errc::read_only) << f.error().message;
  }
  EXPECT_EQ(contents(ro), before) << "a cache on a read-only handle changed the file";
  ::CloseHandle(ro);
}

// Another compatibility key on a file this process has open (by path, or by handle): refused
// as incompatible (backing file) or a private heap cache (automatic), as by path, never a wait
// for our own lease ending in BUSY (tests/unit/descriptor_open_test.cpp for descriptors).
TEST(WindowsHandle, AnotherCompatibilityKeyOnAFileThisProcessHasOpenIsIncompatibleNotBusy) {
  for (const bool first_by_path : {true, false}) {
    SCOPED_TRACE(first_by_path ? "first open by path" : "first open by handle");
    TempDir dir;
    const std::string path = dir.file("keys.wcache");
    // By path the library creates the file; by handle the caller does.
    HANDLE h0 = first_by_path ? nullptr : open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW);
    ASSERT_NE(h0, INVALID_HANDLE_VALUE);
    Options a = first_by_path ? suite_options(path) : on_handle(h0);
    a.compat_key = "key A";
    auto first = WeightCache::open(a);
    ASSERT_TRUE(first.ok()) << first.error().message;
    ASSERT_NE(first->insert("w", "bytes of key A"), kNotFound) << last_error().message;
    ASSERT_TRUE(first->finalize().ok());

    HANDLE h = open_handle(path, GENERIC_READ | GENERIC_WRITE, OPEN_EXISTING);
    ASSERT_NE(h, INVALID_HANDLE_VALUE);
    Options b = on_handle(h);
    b.compat_key = "key B";
    b.backing = Backing::file;
    b.lease_timeout = std::chrono::seconds(20);
    auto refused = WeightCache::open(b);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::incompatible) << refused.error().message;
    b.backing = Backing::automatic;
    auto heap = WeightCache::open(b);
    ASSERT_TRUE(heap.ok()) << heap.error().message;
    EXPECT_EQ(heap->stats().backing, Backing::heap);
    EXPECT_NE(first->look_up("w"), kNotFound);
    ::CloseHandle(h);
    if (h0 != nullptr) ::CloseHandle(h0);
  }
}

// A read-only opener of an empty file by handle waits while another handle has it open (a
// writer may be setting it up), and fails at once when nobody has.
TEST(WindowsHandle, AReadOnlyOpenerOfAnEmptyFileWaitsForTheWriterAndFailsAtOnceAlone) {
  TempDir dir;
  const std::string path = dir.file("empty.wcache");
  HANDLE w = open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW);
  HANDLE r = open_handle(path, GENERIC_READ, OPEN_EXISTING);
  ASSERT_NE(w, INVALID_HANDLE_VALUE);
  ASSERT_NE(r, INVALID_HANDLE_VALUE);
  Options ro = on_handle(r);
  ro.read_only = true;
  ro.backing = Backing::file;
  ro.lease_timeout = std::chrono::seconds(20);
  {
    auto alone = WeightCache::open(ro);
    ASSERT_FALSE(alone.ok());
    EXPECT_EQ(alone.error().code, Errc::corrupt) << alone.error().message;
  }
  // Another holder of the in-use lock: a writer that opened the file and has not set it up yet.
  HANDLE holder = open_handle(path, GENERIC_READ | GENERIC_WRITE, OPEN_EXISTING);
  ASSERT_NE(holder, INVALID_HANDLE_VALUE);
  OVERLAPPED ov{};
  ov.Offset = 0;
  ov.OffsetHigh = static_cast<DWORD>((std::uint64_t{1} << 41) >> 32);
  ASSERT_TRUE(::LockFileEx(holder, LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov));
  Result<WeightCache> reader = Error{Errc::io, 0, "not run"};
  std::thread t([&] { reader = WeightCache::open(ro); });
  // The writer opens while the holder still has the file, so that from the reader's first look
  // on somebody always has it open until the writer has set it up (it waits to be alone); a
  // writer opened only after the holder let go left a moment with nobody, which a reader slow to
  // start (a loaded machine, under Wine) took for an abandoned empty file.
  Result<WeightCache> writer = Error{Errc::io, 0, "not run"};
  std::thread tw([&] { writer = WeightCache::open(on_handle(w)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::CloseHandle(holder);  // the writer sets it up, alone
  tw.join();
  {
    ASSERT_TRUE(writer.ok()) << writer.error().message;
    ASSERT_NE(writer->insert("w", "bytes"), kNotFound) << last_error().message;
    ASSERT_TRUE(writer->finalize().ok());
    writer = Error{Errc::io, 0, "closed"};
  }
  t.join();
  ASSERT_TRUE(reader.ok()) << reader.error().message;
  // The reader may have opened the file as soon as the writer set it up, before its commit.
  ASSERT_TRUE(reader->refresh().ok()) << last_error().message;
  EXPECT_NE(reader->look_up("w"), kNotFound);
  ::CloseHandle(w);
  ::CloseHandle(r);
}

// fd is POSIX's: on Windows it fails like a file that cannot be used, and fd with handle is a
// caller's mistake whatever the backing.
TEST(WindowsHandle, FdIsUnsupportedAndFdWithHandleIsInvalid) {
  Options o = suite_options("");
  o.fd = 0;
  auto fd = WeightCache::open(o);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, Errc::unsupported) << fd.error().message;
  o.handle = ::GetStdHandle(STD_OUTPUT_HANDLE);
  for (Backing b : {Backing::file, Backing::automatic}) {
    o.backing = b;
    auto both = WeightCache::open(o);
    ASSERT_FALSE(both.ok());
    EXPECT_EQ(both.error().code, Errc::invalid_argument) << both.error().message;
  }
}

// The ":memory:" cache's parent half: packs shared_entries(count), finalizes, and returns the
// cache (backing file, no file at the path).
WeightCache packed_memory_cache(std::size_t count) {
  Options o = suite_options(kMemoryPath);
  auto opened = WeightCache::open(o);
  EXPECT_TRUE(opened.ok()) << (opened.ok() ? "" : opened.error().message);
  if (!opened.ok()) return WeightCache{};
  WeightCache cache = std::move(opened.value());
  EXPECT_EQ(cache.stats().backing, Backing::file);
  for (const auto& e : shared_entries(count)) EXPECT_NE(pack_entry(cache, e), kNotFound) << last_error().message;
  EXPECT_TRUE(cache.finalize().ok()) << last_error().message;
  EXPECT_FALSE(std::filesystem::exists(kMemoryPath)) << "':memory:' created a file by that name";
  EXPECT_EQ(cache.descriptor(), -1);
  return cache;
}

constexpr std::size_t kShared = 12;

TEST(WindowsMemory, AChildGivenTheHandleFindsEveryEntryInTheSamePagesAndAddsOne) {
  WeightCache cache = packed_memory_cache(kShared);
  ASSERT_TRUE(cache);
  ASSERT_NE(cache.file_handle(), nullptr);
  HANDLE theirs = inheritable(static_cast<HANDLE>(cache.file_handle()), 0);
  ASSERT_NE(theirs, nullptr);
  const long rc = run_child(kChild, {"handle-writer", handle_arg(theirs), std::to_string(kShared)}, nullptr, nullptr, true);
  ::CloseHandle(theirs);
  ASSERT_EQ(rc, 0) << "the child could not use the cache (see its output)";
  // What the child added through its own lease is the parent's after a refresh.
  ASSERT_TRUE(cache.refresh().ok()) << last_error().message;
  EXPECT_EQ(entry_problem(cache, PatternEntry{"child/added", 99, 100000}), "");
  for (const auto& e : shared_entries(kShared)) EXPECT_EQ(entry_problem(cache, e), "");
}

TEST(WindowsMemory, AReadOnlyChildCannotChangeAByte) {
  WeightCache cache = packed_memory_cache(kShared);
  ASSERT_TRUE(cache);
  HANDLE h = static_cast<HANDLE>(cache.file_handle());
  const std::string before = contents(h);
  ASSERT_GT(before.size(), 0u);
  HANDLE theirs = inheritable(h, FILE_GENERIC_READ);  // "a duplicate without write access"
  ASSERT_NE(theirs, nullptr);
  const long rc = run_child(kChild, {"handle-reader", handle_arg(theirs), std::to_string(kShared)}, nullptr, nullptr, true);
  ::CloseHandle(theirs);
  EXPECT_EQ(rc, 0) << "see the child's output";
  EXPECT_EQ(contents(h), before) << "a read-only child changed the file";
  for (const auto& e : shared_entries(kShared)) EXPECT_EQ(entry_problem(cache, e), "");
}

// The anonymous file goes with its last handle: nothing is left in the temporary directory.
TEST(WindowsMemory, TheFileIsGoneOnceTheLastHandleCloses) {
  std::wstring name(32768, L'\0');
  {
    WeightCache cache = packed_memory_cache(2);
    ASSERT_TRUE(cache);
    const DWORD n = ::GetFinalPathNameByHandleW(static_cast<HANDLE>(cache.file_handle()), name.data(),
                                                static_cast<DWORD>(name.size()), FILE_NAME_NORMALIZED);
    ASSERT_GT(n, 0u);
    name.resize(n);
    EXPECT_NE(::GetFileAttributesW(name.c_str()), INVALID_FILE_ATTRIBUTES) << "the file should exist while open";
  }
  EXPECT_EQ(::GetFileAttributesW(name.c_str()), INVALID_FILE_ATTRIBUTES) << narrow(name) << " outlived its cache";
}

}  // namespace
}  // namespace weightcache::test
