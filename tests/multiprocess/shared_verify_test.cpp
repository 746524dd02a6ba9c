// Verified once per file state (docs/DESIGN.md): separate processes on one file. A process that
// finds the file in exactly the state an earlier process of this boot verified is served without
// hashing; any change to the file (a write of any bytes, with its modification time put back, a
// replacement, a truncation), a record from another boot or state, a damaged record or a lock
// file others may write makes the next process verify everything it serves again, and a bad
// entry is never recorded as verified.
#include "mp_test_util.hpp"

#include "core.hpp"
#include "forwarding_platform.hpp"
#include "verify_record.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <thread>

#if defined(__linux__)
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#endif

namespace weightcache::test::mp {
namespace {

constexpr std::size_t kSize = 64 * 1024;
constexpr std::size_t kCount = 16;

void write_entries(const std::string& path) {
  auto opened = WeightCache::open(cache_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  for (std::size_t j = 0; j < kCount; ++j) {
    const std::string key = own_key("v", j);
    ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound) << last_error().message;
  }
  ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
}

struct Run {
  std::string mode = "shared";
  bool read_only = false;
  std::string missing = "none";  // the entry that must miss
  std::string record_dir;        // Options::record_dir ("": the default)
};

// One fresh process that opens the cache, checks every entry's bytes and reports its stats.
std::map<std::string, std::uint64_t> verify_in_child(TempDir& dir, const std::string& path, const Run& run = {}) {
  static int n = 0;
  const std::string results = dir.file("verify" + std::to_string(n++));
  Children kids;
  kids.start("verify", {arg("path", path), arg("tag", "v"), arg("count", kCount), arg("size", kSize),
                        arg("results", results), arg("mode", run.mode), arg("read_only", run.read_only ? 1 : 0),
                        arg("missing", run.missing), arg("record_dir", run.record_dir)});
  EXPECT_TRUE(kids.all_succeed());
  return read_results(results);
}

#if defined(__linux__)

std::int64_t ctime_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
}

// The change-time window the library takes for the file at `path` (Platform::change_window_ns);
// the coarse one where its file system does not track every change (nothing is trusted there).
std::int64_t window_of(const std::string& path) {
  auto& pf = platform::os();
  auto f = pf.open_file(path, platform::OpenMode::read, 0, /*follow=*/true);
  if (!f) return platform::kCoarseChangeWindowNs;
  auto info = pf.stat_file(f.value());
  const std::int64_t w = info ? pf.change_window_ns(f.value(), info.value()) : 0;
  return w > 0 ? w : platform::kCoarseChangeWindowNs;
}

std::int64_t coarse_clock_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Waits (not a time limit: a condition) until the change clock is `past_ns` past the file's
// change time: by default, until a change made from now on is certain to give the file another
// change time than it has (its file system's window). Without this, a process opening within
// the window of the last change may not record (by design).
void let_change_time_settle(const std::string& path, std::int64_t past_ns = 0) {
  const std::int64_t c = ctime_of(path);
  const std::int64_t window = past_ns > 0 ? past_ns : window_of(path);
  for (int i = 0; i < 10000; ++i) {
    if (change_would_show(c, coarse_clock_ns(), window)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "the clock never moved past the file's change time";
}

std::uint64_t offset_of_key(const std::string& path, const std::string& key) {
  for (const auto& r : decode_file(path).records)
    if (r.key == key) return r.offset;
  ADD_FAILURE() << key << " not in " << path;
  return 0;
}

void write_bytes_at(const std::string& path, std::uint64_t offset, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

// A foreign program's writable shared mapping of `file`, at a byte inside entry `key`: stores
// through it change committed bytes the way a program that maps the cache would.
struct ForeignMapping {
  ForeignMapping(const std::string& file, const std::string& key) {
    const std::uint64_t at = offset_of_key(file, key) + 500;
    const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      ADD_FAILURE() << "cannot open " << file;
      return;
    }
    size = static_cast<std::size_t>(std::filesystem::file_size(file));
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
      ADD_FAILURE() << "cannot map " << file;
      return;
    }
    map = p;
    byte = static_cast<volatile unsigned char*>(map) + at;
  }
  ForeignMapping(const ForeignMapping&) = delete;
  ForeignMapping& operator=(const ForeignMapping&) = delete;
  ~ForeignMapping() {
    if (map != nullptr) ::munmap(map, size);
  }
  void dirty() { *byte = *byte; }                                        // the same value: only the page changes
  void change() { *byte = static_cast<unsigned char>(*byte ^ 0x5a); }  // through the same page
  void* map = nullptr;
  std::size_t size = 0;
  volatile unsigned char* byte = nullptr;
};

// Puts the modification time back to what it was: only the change time (which no one can set)
// still tells.
struct KeepMtime {
  explicit KeepMtime(std::string p) : path(std::move(p)) {
    struct stat st {};
    ::stat(path.c_str(), &st);
    times[0] = st.st_atim;
    times[1] = st.st_mtim;
  }
  ~KeepMtime() { ::utimensat(AT_FDCWD, path.c_str(), times, 0); }
  std::string path;
  struct timespec times[2] {};
};

constexpr long kTmpfsMagic = 0x01021994;

bool on_tmpfs(const std::string& dir) {
  struct statfs fs {};
  return ::statfs(dir.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == kTmpfsMagic;
}

class SharedVerify : public ::testing::Test {
 protected:
  void SetUp() override {
    // tmpfs never moves a file's times for a store through a mapping: the library verifies per
    // process there (tested below), so these tests need a disk file system.
    if (on_tmpfs(dir.path().string())) GTEST_SKIP() << "the temporary directory is on tmpfs; set TMPDIR to a disk";
    path = dir.file("cache.wcache");
    write_entries(path);
    if (HasFatalFailure()) return;
    let_change_time_settle(path);
    // The first process verifies everything by hashing and leaves its record.
    auto first = verify_in_child(dir, path);
    ASSERT_EQ(first["trusted_entries"], 0u);
    ASSERT_EQ(first["hits"], kCount);
    ASSERT_EQ(first["verify_failures"], 0u);
    auto second = verify_in_child(dir, path);
    ASSERT_EQ(second["trusted_entries"], kCount) << "the second process should trust the first's verification";
  }
  TempDir dir{"wc-verify"};
  std::string path;
};

TEST_F(SharedVerify, LaterProcessesTrustTheFirstVerificationAndFirstUseStillHashes) {
  auto third = verify_in_child(dir, path);
  EXPECT_EQ(third["trusted_entries"], kCount);
  EXPECT_EQ(third["hits"], kCount);
  auto reader = verify_in_child(dir, path, {.read_only = true});
  EXPECT_EQ(reader["trusted_entries"], kCount) << "a read-only opener reads the record too";
  auto per_process = verify_in_child(dir, path, {.mode = "first_use"});
  EXPECT_EQ(per_process["trusted_entries"], 0u) << "Verify::first_use verifies in every process";
  EXPECT_EQ(per_process["verify_failures"], 0u);
}

TEST_F(SharedVerify, RewritingTheSameBytesVoidsTheRecordEvenWithTheModificationTimePutBack) {
  const std::uint64_t at = offset_of_key(path, own_key("v", 5));
  {
    KeepMtime keep(path);
    write_bytes_at(path, at, bytes_for_key(own_key("v", 5), kSize).substr(0, 100));
  }
  let_change_time_settle(path);
  auto after = verify_in_child(dir, path);
  EXPECT_EQ(after["trusted_entries"], 0u) << "a write moved the change time: everything is hashed again";
  EXPECT_EQ(after["verify_failures"], 0u);
  auto next = verify_in_child(dir, path);
  EXPECT_EQ(next["trusted_entries"], kCount) << "the new state was verified and recorded";
}

TEST_F(SharedVerify, AnEntryDamagedAfterTheRecordIsHashedServedAsAMissAndNeverRecorded) {
  const std::uint64_t at = offset_of_key(path, own_key("v", 3));
  {
    KeepMtime keep(path);
    write_bytes_at(path, at + 1000, "X");
  }
  let_change_time_settle(path);
  auto after = verify_in_child(dir, path, {.missing = "3"});
  EXPECT_EQ(after["trusted_entries"], 0u);
  EXPECT_EQ(after["verify_failures"], 1u);
  // The state with the damage was recorded without the bad entry: it is hashed (and missed) again.
  auto next = verify_in_child(dir, path, {.missing = "3"});
  EXPECT_EQ(next["trusted_entries"], kCount - 1);
  EXPECT_EQ(next["verify_failures"], 1u);
}

TEST_F(SharedVerify, AReplacedFileWithTheSameBytesAndTimesIsNotTrusted) {
  const std::string copy = dir.file("copy.wcache");
  std::filesystem::copy_file(path, copy);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  std::filesystem::rename(copy, path);
  let_change_time_settle(path);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
}

TEST_F(SharedVerify, ATruncationPutBackIsNotTrusted) {
  const auto size = std::filesystem::file_size(path);
  const std::string last = read_file(path).substr(size - 1);
  {
    KeepMtime keep(path);
    std::filesystem::resize_file(path, size - 1);
    std::filesystem::resize_file(path, size);
    write_bytes_at(path, size - 1, last);
  }
  let_change_time_settle(path);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
}

// The record as it is in the lock file, changed by `edit` and written back with a valid checksum.
template <class Edit>
void forge_record(const std::string& lock_path, Edit edit) {
  const std::string raw = read_file(lock_path);
  auto rec = decode_record(reinterpret_cast<const std::byte*>(raw.data()), raw.size(), 1u << 20);
  ASSERT_TRUE(rec.has_value()) << "no record in the lock file";
  edit(*rec);
  const auto bytes = encode_record(*rec);
  write_bytes_at(lock_path, 0, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

TEST_F(SharedVerify, ARecordOfAnotherBootOrCommitIsIgnored) {
  const std::string lock = path + ".lock";
  forge_record(lock, [](VerifyRecord& r) { r.stamp.boot[0] ^= 1; });
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u) << "a record from another boot";
  forge_record(lock, [](VerifyRecord& r) { r.stamp.sequence += 1; });
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u) << "a record of another commit";
  forge_record(lock, [](VerifyRecord& r) { r.stamp.index_checksum ^= 1; });
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u) << "a record of another index";
}

TEST_F(SharedVerify, ADamagedRecordIsNoRecordAndIsWrittenAgain) {
  const std::string lock = path + ".lock";
  std::string raw = read_file(lock);
  ASSERT_GT(raw.size(), kRecordFixedBytes);
  write_bytes_at(lock, kRecordFixedBytes, std::string(1, raw[kRecordFixedBytes] ^ 0x10));  // one bit of the map flipped
  auto after = verify_in_child(dir, path);
  EXPECT_EQ(after["trusted_entries"], 0u);
  EXPECT_EQ(after["verify_failures"], 0u);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount);
}

TEST_F(SharedVerify, ALockFileOthersMayWriteIsNotTrusted) {
  ASSERT_EQ(::chmod((path + ".lock").c_str(), 0666), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
}

TEST_F(SharedVerify, ALockFileAnotherGroupMayWriteIsNotTrusted) {
  const std::string lock = path + ".lock";
  ASSERT_EQ(::chmod(path.c_str(), 0664), 0);
  ASSERT_EQ(::chmod(lock.c_str(), 0664), 0);
  let_change_time_settle(path);  // the chmod changed the file's state: the next process records it
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount) << "same group, same write bits: trusted";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  if (::chown(lock.c_str(), static_cast<uid_t>(-1), st.st_gid + 1) != 0) GTEST_SKIP() << "cannot change the lock file's group";
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u) << "another group may write the record";
}

// A POSIX access ACL in its extended-attribute form: version 2, then (tag, perm, id) entries
// sorted by tag: the owner rw, user `uid` rw, the group r, the mask rw, others r.
std::string access_acl_granting_write_to(std::uint32_t uid) {
  std::string out;
  auto u32 = [&](std::uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto entry = [&](std::uint16_t tag, std::uint16_t perm, std::uint32_t id) {
    out.append(reinterpret_cast<const char*>(&tag), 2);
    out.append(reinterpret_cast<const char*>(&perm), 2);
    u32(id);
  };
  u32(2);
  entry(0x01, 6, 0xffffffffu);  // ACL_USER_OBJ
  entry(0x02, 6, uid);          // ACL_USER
  entry(0x04, 6, 0xffffffffu);  // ACL_GROUP_OBJ
  entry(0x10, 6, 0xffffffffu);  // ACL_MASK
  entry(0x20, 4, 0xffffffffu);  // ACL_OTHER
  return out;
}

TEST_F(SharedVerify, ALockFileWithAnAccessListIsNotTrusted) {
  const std::string lock = path + ".lock";
  ASSERT_EQ(::chmod(path.c_str(), 0664), 0);
  ASSERT_EQ(::chmod(lock.c_str(), 0664), 0);
  let_change_time_settle(path);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount) << "the same modes without a list: trusted";
  // Another user may now write the lock file, not the cache file: the mode bits do not say so.
  const std::string acl = access_acl_granting_write_to(65534);
  if (::setxattr(lock.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0) != 0)
    GTEST_SKIP() << "this file system takes no access lists";
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u) << "a record another user may write was trusted";
}

TEST_F(SharedVerify, AWriterThatAddsEntriesLeavesNoRecordOfTheOldState) {
  {
    Options o = cache_options(path);
    o.verify = Verify::shared;
    auto opened = WeightCache::open(o);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kCount; ++j) EXPECT_EQ(check_entry(opened.value(), own_key("v", j), kSize), "");
    EXPECT_EQ(opened->stats().trusted_entries, kCount);
    ASSERT_NE(opened->insert("extra", bytes_for_key("extra", kSize)), kNotFound);
    ASSERT_TRUE(opened->finalize().ok());
  }
  let_change_time_settle(path);
  auto after = verify_in_child(dir, path);
  EXPECT_EQ(after["trusted_entries"], 0u) << "the first process after a change verifies everything";
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount) << "(the extra entry is not looked up)";
}

// ---- the record is checked again at each trusted entry's first use, not only at open ----

Options shared_options(const std::string& path, bool read_only = false) {
  Options o = cache_options(path);
  o.verify = Verify::shared;
  o.read_only = read_only;
  return o;
}

TEST_F(SharedVerify, AnEntryTrustedAtOpenIsHashedWhenTheFileChangedBeforeItsFirstUse) {
  auto opened = WeightCache::open(shared_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  // After the open (which found the record), before any look-up: one byte of entry 5 changes,
  // the modification time is put back. The mapping shows the new byte.
  {
    KeepMtime keep(path);
    write_bytes_at(path, offset_of_key(path, own_key("v", 5)) + 1000, "X");
  }
  EXPECT_EQ(opened->look_up(own_key("v", 5)), kNotFound) << "a byte changed after open was served as verified";
  for (std::size_t j = 0; j < kCount; ++j)
    if (j != 5) {
      EXPECT_EQ(check_entry(opened.value(), own_key("v", j), kSize), "");
    }
  EXPECT_EQ(opened->stats().verify_failures, 1u);
  EXPECT_EQ(opened->stats().trusted_entries, 0u) << "the file changed: every entry was hashed";
}

TEST_F(SharedVerify, AnEntryTrustedAtOpenAndCutOffByATruncationIsAMissNotACrash) {
  auto opened = WeightCache::open(shared_options(path, /*read_only=*/true));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  const std::string last = own_key("v", kCount - 1);
  const std::uint64_t at = offset_of_key(path, last);
  std::filesystem::resize_file(path, at + 100);  // entry kCount-1 now runs past the end of the file
  EXPECT_EQ(opened->look_up(last), kNotFound);
  EXPECT_EQ(check_entry(opened.value(), own_key("v", 0), kSize), "");
  EXPECT_EQ(opened->stats().verify_failures, 1u);
}

TEST_F(SharedVerify, TrustedEntriesAreCountedWhenServedAndStillServedWhileTheFileStaysPut) {
  auto opened = WeightCache::open(shared_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened->stats().trusted_entries, 0u) << "none served yet";
  for (std::size_t j = 0; j < kCount; ++j) EXPECT_EQ(check_entry(opened.value(), own_key("v", j), kSize), "");
  EXPECT_EQ(opened->stats().trusted_entries, kCount);
  EXPECT_EQ(opened->stats().verify_failures, 0u);
}

// ---- one check of the file per interval, not one per trusted entry (issue 32) ----

// Counts fstat()s of open files and reads a monotonic clock the test moves by hand.
class PinnedClockPlatform final : public test::ForwardingPlatform {
 public:
  Result<platform::FileInfo> stat_file(const File& h) noexcept override {
    stats.fetch_add(1, std::memory_order_relaxed);
    return os_.stat_file(h);
  }
  std::int64_t monotonic_ns() noexcept override { return now.load(std::memory_order_relaxed); }
  std::atomic<std::uint64_t> stats{0};
  std::atomic<std::int64_t> now{1'000'000'000'000};
};

TEST(SharedVerifyInterval, ATrustingProcessChecksTheFileOncePerIntervalNotOncePerEntry) {
  TempDir dir("wc-verify");
  if (on_tmpfs(dir.path().string())) GTEST_SKIP() << "the temporary directory is on tmpfs; set TMPDIR to a disk";
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kMany = 2000, kSmall = 256;
  {
    auto opened = WeightCache::open(cache_options(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kMany; ++j) {
      const std::string key = own_key("m", j);
      ASSERT_NE(opened->insert(key, bytes_for_key(key, kSmall)), kNotFound) << last_error().message;
    }
    ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
  }
  let_change_time_settle(path);
  {  // the first process hashes every entry and records it
    auto first = WeightCache::open(shared_options(path));
    ASSERT_TRUE(first.ok()) << first.error().message;
    for (std::size_t j = 0; j < kMany; ++j) ASSERT_EQ(check_entry(first.value(), own_key("m", j), kSmall), "");
    ASSERT_EQ(first->stats().trusted_entries, 0u);
  }
  PinnedClockPlatform pf;
  auto opened = Core::open(shared_options(path), pf);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& core = *opened.value();
  const std::uint64_t at_open = pf.stats.load();
  for (std::size_t j = 0; j < kMany; ++j) EXPECT_NE(core.look_up(own_key("m", j)), kNotFound);
  EXPECT_EQ(core.stats().trusted_entries, kMany);
  EXPECT_LE(pf.stats.load() - at_open, 2u) << "the first uses of " << kMany << " trusted entries within one interval";
}

TEST_F(SharedVerify, AChangeIsSeenByTheFirstUseOneIntervalAfterTheLastCheckAndNotBefore) {
  PinnedClockPlatform pf;
  auto opened = Core::open(shared_options(path), pf);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& core = *opened.value();
  EXPECT_NE(core.look_up(own_key("v", 0)), kNotFound);  // checks the file: in the record's state
  EXPECT_EQ(core.stats().trusted_entries, 1u);
  {  // then one byte of entry 3 changes, the modification time put back
    KeepMtime keep(path);
    write_bytes_at(path, offset_of_key(path, own_key("v", 3)) + 1000, "X");
  }
  // Within the interval of that check a first use relies on it (what the promise allows): the
  // check is made at most once per interval.
  pf.now += platform::kFineChangeWindowNs - 1;
  EXPECT_NE(core.look_up(own_key("v", 1)), kNotFound);
  EXPECT_EQ(core.stats().trusted_entries, 2u) << "the file was checked again within the interval of the last check";
  // One interval after the check, the next first use checks again and finds the change.
  pf.now += 1;
  EXPECT_EQ(core.look_up(own_key("v", 3)), kNotFound) << "a byte changed an interval before its first use was served";
  EXPECT_EQ(core.stats().verify_failures, 1u);
  EXPECT_NE(core.look_up(own_key("v", 4)), kNotFound);
  EXPECT_EQ(core.stats().trusted_entries, 2u) << "an entry first used after the change was not hashed";
  const std::uint64_t stats_then = pf.stats.load();
  pf.now += 1;  // the change stays known: no later check may find the file unchanged again
  EXPECT_NE(core.look_up(own_key("v", 5)), kNotFound);
  EXPECT_EQ(core.stats().trusted_entries, 2u);
  EXPECT_LE(pf.stats.load() - stats_then, 1u) << "only the size is asked after a change";
}

// ---- who writes the record, and when not ----

void empty_the_record(const std::string& path) { std::filesystem::resize_file(path + ".lock", 0); }

TEST_F(SharedVerify, OnlyAWritableSharedOpenerWritesTheRecord) {
  const std::string lock = path + ".lock";
  empty_the_record(path);
  verify_in_child(dir, path, {.read_only = true});
  EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "a read-only opener wrote the record";
  for (const char* mode : {"first_use", "on_open", "none"}) {
    auto r = verify_in_child(dir, path, {.mode = mode});
    EXPECT_EQ(r["hits"], kCount) << mode;
    EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "Verify::" << mode << " wrote the record";
  }
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
  EXPECT_GE(std::filesystem::file_size(lock), kRecordFixedBytes) << "Verify::shared did not";
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount);
}

TEST_F(SharedVerify, AForkedChildNeverWritesTheRecord) {
  const std::string lock = path + ".lock";
  empty_the_record(path);
  {
    auto opened = WeightCache::open(shared_options(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child hashes every entry and closes its copy of the cache: its close must leave the
      // lock file (which it shares with the parent) alone.
      int rc = 0;
      for (std::size_t j = 0; j < kCount; ++j)
        if (!check_entry(opened.value(), own_key("v", j), kSize).empty()) rc = 1;
      { auto gone = std::move(opened.value()); }
      ::_exit(rc);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "the forked child wrote the record";
    // The parent looked nothing up: it has nothing to record either.
  }
  EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "a process that verified nothing wrote a record";
}

TEST_F(SharedVerify, AChangeWhileThePublisherHashedLeavesNoRecord) {
  const std::string lock = path + ".lock";
  empty_the_record(path);
  {
    auto opened = WeightCache::open(shared_options(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kCount; ++j) EXPECT_EQ(check_entry(opened.value(), own_key("v", j), kSize), "");
    // All hashed, then (before close records it) the file changes: same bytes, time put back.
    KeepMtime keep(path);
    const std::string key = own_key("v", 2);
    write_bytes_at(path, offset_of_key(path, key), bytes_for_key(key, kSize).substr(0, 64));
  }
  EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "recorded a state the file had left";
}

// A platform whose change clock is exactly the file system's window past the file's change
// time: a change may not move the change time, so what is verified in this state must not be
// recorded.
class CloseClockPlatform final : public test::ForwardingPlatform {
 public:
  explicit CloseClockPlatform(std::int64_t clock_ns) : clock_ns_(clock_ns) {}
  std::int64_t change_clock_ns() noexcept override { return clock_ns_; }

 private:
  std::int64_t clock_ns_;
};

TEST_F(SharedVerify, AStateTooRecentForAChangeToShowIsNotRecorded) {
  const std::string lock = path + ".lock";
  empty_the_record(path);
  CloseClockPlatform close_clock(ctime_of(path) + window_of(path));
  {
    auto opened = Core::open(shared_options(path), close_clock);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    Core& core = *opened.value();
    for (std::size_t j = 0; j < kCount; ++j) EXPECT_NE(core.look_up(own_key("v", j)), kNotFound);
    EXPECT_EQ(core.stats().verify_failures, 0u);
  }
  EXPECT_EQ(std::filesystem::file_size(lock), 0u) << "recorded a state a change could hide in";
  // The same with the real clock (the file's change time settled in SetUp) records it.
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
  EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], kCount);
}

// ---- the writer's own record (issue 32): the process that committed verifies its final state ----

Options writer_options(const std::string& path) {
  Options o = cache_options(path);
  o.durability = Durability::full;
  o.verify = Verify::shared;
  return o;
}

// A platform whose file system has the coarse window (2 s), as FAT's or an unknown one's. Once
// armed with a time (the file's change time after the last commit), its change clock first says
// that time, then 3 s later: a writer that waited for the window would find it over and record.
class CoarseWindowPlatform final : public test::ForwardingPlatform {
 public:
  std::int64_t change_window_ns(const File&, const platform::FileInfo&) noexcept override {
    return platform::kCoarseChangeWindowNs;
  }
  std::int64_t change_clock_ns() noexcept override {
    const std::int64_t at = armed.load();
    if (at == 0) return os_.change_clock_ns();
    return reads.fetch_add(1) == 0 ? at : at + 3 * 1000000000ll;
  }
  std::atomic<std::int64_t> armed{0};
  std::atomic<int> reads{0};
};

// Packs and commits kCount entries through `pf` with `o`, then `before_close`, then closes.
template <class BeforeClose>
void pack_and_close(const Options& o, platform::Platform& pf, BeforeClose before_close) {
  auto opened = Core::open(o, pf);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& core = *opened.value();
  for (std::size_t j = 0; j < kCount; ++j) {
    const std::string key = own_key("v", j);
    std::string bytes = bytes_for_key(key, kSize);
    ASSERT_NE(core.look_up_or_insert(key, bytes.data(), bytes.size()), kNotFound) << last_error().message;
  }
  ASSERT_TRUE(core.finalize().ok()) << last_error().message;
  ASSERT_EQ(core.stats().commits, 1u);
  before_close();
}

class SharedVerifyWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_tmpfs(dir.path().string())) GTEST_SKIP() << "the temporary directory is on tmpfs; set TMPDIR to a disk";
    path = dir.file("cache.wcache");
    // The writer waits out a fine window (10 ms) at close, never the coarse one.
    const std::string probe = dir.file("probe");
    write_entries(probe);
    if (HasFatalFailure()) return;
    if (window_of(probe) != platform::kFineChangeWindowNs)
      GTEST_SKIP() << "the temporary directory's file system does not keep nanosecond change times";
  }
  std::uint64_t record_size() {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path + ".lock", ec);
    return ec ? 0 : n;
  }
  TempDir dir{"wc-verify"};
  std::string path;
  test::ForwardingPlatform os;
};

TEST_F(SharedVerifyWriter, AProcessLaunchedRightAfterTheWriterClosedTrustsEveryEntry) {
  pack_and_close(writer_options(path), os, [] {});
  ASSERT_GE(record_size(), kRecordFixedBytes) << "the writer left no record";
  // No pause: the writer waited out its own window at close.
  auto next = verify_in_child(dir, path);
  EXPECT_EQ(next["trusted_entries"], kCount) << "the first process after the writer hashed what the writer verified";
  EXPECT_EQ(next["hits"], kCount);
  EXPECT_EQ(next["verify_failures"], 0u);
}

// Another program writes other bytes into a committed entry after the commit and before the
// writer's close: the stamp the writer takes at close includes that change time, so only
// hashing again finds it. The entry's state in the writer's memory (good, from its own
// checksum) must not vouch for it.
TEST_F(SharedVerifyWriter, AForeignWriteBeforeTheWritersCloseIsNotVouchedFor) {
  pack_and_close(writer_options(path), os, [&] {
    const std::string key = own_key("v", 5);
    std::string other = bytes_for_key(key, kSize).substr(0, 64);
    other[10] = static_cast<char>(other[10] ^ 0x33);
    write_bytes_at(path, offset_of_key(path, key), other);
  });
  ASSERT_GE(record_size(), kRecordFixedBytes) << "the writer left no record";
  auto next = verify_in_child(dir, path, {.missing = "5"});
  EXPECT_EQ(next["verify_failures"], 1u) << "the entry written over was not hashed";
  EXPECT_EQ(next["trusted_entries"], kCount - 1) << "the writer did not vouch for its other entries";
}

TEST_F(SharedVerifyWriter, OnlyADurableSharedWriterOnAFileSystemWithAFineWindowLeavesARecord) {
  for (Durability d : {Durability::none, Durability::async}) {
    SCOPED_TRACE(d == Durability::none ? "durability none" : "durability async");
    Options o = writer_options(path);
    o.durability = d;
    pack_and_close(o, os, [] {});
    EXPECT_EQ(record_size(), 0u) << "a writer that never waits for the disk left a record";
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".lock");
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
  {
    SCOPED_TRACE("Verify::first_use");
    Options o = writer_options(path);
    o.verify = Verify::first_use;
    pack_and_close(o, os, [] {});
    EXPECT_EQ(record_size(), 0u) << "a Verify::first_use writer left a record";
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
  {
    SCOPED_TRACE("a coarse window (2 s)");
    CoarseWindowPlatform coarse;
    pack_and_close(writer_options(path), coarse, [&] { coarse.armed = ctime_of(path); });
    EXPECT_EQ(record_size(), 0u) << "a writer on a coarse file system held its close for the window";
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
  {
    SCOPED_TRACE("durable, shared, fine window");
    pack_and_close(writer_options(path), os, [] {});
    EXPECT_GE(record_size(), kRecordFixedBytes) << "the writer left no record";
  }
}

// ---- the window per file-system class (Platform::change_window_ns) ----

// Where change times are kept to the nanosecond (ext4 with 256-byte inodes, xfs, btrfs, f2fs),
// the window is one slow clock tick: a process launched 50 ms after a change records what it
// verified, and the next process trusts it. With the flat 2 s of other file systems, neither.
TEST_F(SharedVerify, OnANanosecondFileSystemAProcessLaunched50msAfterAChangeRecordsAndTheNextTrustsIt) {
  // Decided here, not by the library: ext4, xfs or btrfs, and a change time with a sub-second part.
  struct statfs fs {};
  ASSERT_EQ(::statfs(path.c_str(), &fs), 0);
  const auto type = static_cast<std::uint32_t>(fs.f_type);
  if ((type != 0xef53u && type != 0x58465342u && type != 0x9123683eu) || ctime_of(path) % 1000000000 == 0)
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs or btrfs with nanosecond change times";
  EXPECT_EQ(window_of(path), platform::kFineChangeWindowNs);
  // A new state of the file (a commit), then a verifier 50 ms after it and another process
  // right after that.
  {
    auto opened = WeightCache::open(cache_options(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    const std::string key = own_key("v", kCount);
    ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound) << last_error().message;
    ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
  }
  let_change_time_settle(path, 50 * 1000000);
  auto verifier = verify_in_child(dir, path);
  EXPECT_EQ(verifier["trusted_entries"], 0u) << "a new state was trusted";
  EXPECT_EQ(verifier["verify_failures"], 0u);
  auto next = verify_in_child(dir, path);
  EXPECT_EQ(next["trusted_entries"], kCount) << "the verifier, 50 ms after the change, left no record";
  EXPECT_EQ(next["verify_failures"], 0u);
}

// ext4 with 128-byte inodes keeps whole seconds (the kernel then stamps whole seconds): the flat
// 2 s window. A loop-mounted image made so; skipped where the container refuses the mount.
TEST(SharedVerifyWholeSeconds, OnAWholeSecondFileSystemTheWindowIsTwoSeconds) {
  TempDir base("wc-verify-ext4");
  const std::string image = base.file("fs.img"), mnt = base.file("mnt");
  ASSERT_TRUE(std::filesystem::create_directory(mnt));
  {
    std::FILE* f = std::fopen(image.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    std::filesystem::resize_file(image, 32u << 20);
  }
  const std::string mkfs = "mkfs.ext4 -q -F -I 128 " + image + " >/dev/null 2>&1";
  if (std::system(mkfs.c_str()) != 0) GTEST_SKIP() << "mkfs.ext4 is not available here";
  const std::string mount = "mount -o loop " + image + " " + mnt + " >/dev/null 2>&1";
  if (std::system(mount.c_str()) != 0)
    GTEST_SKIP() << "cannot loop-mount an image here: needs root and a container that allows it";
  struct Unmount {
    std::string d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string path = mnt + "/cache.wcache";
  write_entries(path);
  ASSERT_EQ(ctime_of(path) % 1000000000, 0) << "ext4 with 128-byte inodes kept a sub-second change time";
  EXPECT_EQ(window_of(path), platform::kCoarseChangeWindowNs);
  // One second after the change (which the fine window would record), nothing is recorded.
  CloseClockPlatform one_second_on(ctime_of(path) + 1000000000);
  {
    auto opened = Core::open(shared_options(path), one_second_on);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kCount; ++j) EXPECT_NE((*opened)->look_up(own_key("v", j)), kNotFound);
    EXPECT_EQ((*opened)->stats().verify_failures, 0u);
  }
  std::error_code ec;
  EXPECT_EQ(std::filesystem::file_size(path + ".lock", ec), 0u) << "recorded a state a change could hide in";
  // Past the window, the real clock records it, and the next process trusts it.
  let_change_time_settle(path);
  TempDir results("wc-verify");
  EXPECT_EQ(verify_in_child(results, path)["trusted_entries"], 0u);
  EXPECT_EQ(verify_in_child(results, path)["trusted_entries"], kCount);
}

TEST(SharedVerifyTmpfs, VerificationStaysPerProcessOnTmpfs) {
  if (!on_tmpfs("/dev/shm") || ::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable tmpfs at /dev/shm";
  std::string made = "/dev/shm/wc-verify-XXXXXX";
  ASSERT_NE(::mkdtemp(made.data()), nullptr);
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{made};
  TempDir results("wc-verify");
  const std::string path = made + "/cache.wcache";
  write_entries(path);
  let_change_time_settle(path);
  for (int i = 0; i < 2; ++i) {
    auto r = verify_in_child(results, path);
    EXPECT_EQ(r["hits"], kCount);
    EXPECT_EQ(r["trusted_entries"], 0u) << "trusted a record on tmpfs, whose times a store through a mapping never moves";
  }
  EXPECT_EQ(std::filesystem::file_size(path + ".lock"), 0u);
}

// Issue 26, item 5: overlayfs (containers' root file system) stacks on a lower file system, whose
// pages the cache's write-back through the overlay's descriptor cannot clean: the record is
// neither written nor trusted there. Needs root and a kernel that mounts overlayfs here (inside
// some containers it does not): skipped with the reason otherwise.
TEST(SharedVerifyOverlayfs, VerificationStaysPerProcessOnOverlayfs) {
  TempDir base("wc-verify-ovl");
  const std::string lower = base.file("lower"), upper = base.file("upper"), work = base.file("work"),
                    merged = base.file("merged");
  for (const std::string& d : {lower, upper, work, merged}) ASSERT_TRUE(std::filesystem::create_directory(d));
  const std::string opts = "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work;
  if (::mount("overlay", merged.c_str(), "overlay", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount an overlayfs here (" << std::strerror(errno)
                 << "): needs root and a kernel and container that allow it";
  struct Unmount {
    std::string d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{merged};
  struct statfs fs {};
  ASSERT_EQ(::statfs(merged.c_str(), &fs), 0);
  ASSERT_EQ(static_cast<std::uint64_t>(fs.f_type), 0x794c7630u) << "the mount is not an overlayfs";
  // A cache copied up from the lower layer, as a container image ships it, and one made in the
  // overlay: neither is trusted through a record.
  write_entries(lower + "/shipped.wcache");
  TempDir results("wc-verify");
  for (const std::string& path : {merged + "/shipped.wcache", merged + "/made.wcache"}) {
    SCOPED_TRACE(path);
    if (path == merged + "/made.wcache") write_entries(path);
    let_change_time_settle(path);
    for (int i = 0; i < 3; ++i) {
      auto r = verify_in_child(results, path);
      EXPECT_EQ(r["hits"], kCount);
      EXPECT_EQ(r["verify_failures"], 0u);
      EXPECT_EQ(r["trusted_entries"], 0u) << "trusted a record on overlayfs, run " << i;
    }
    std::error_code ec;
    const auto lock_size = std::filesystem::file_size(path + ".lock", ec);
    EXPECT_TRUE(ec || lock_size == 0u) << "a verification record was written on overlayfs (" << lock_size << " bytes)";
  }
}

// ---- read-only mounts (issue 34): the record lives in the record directory ----

// A prebuilt cache on a read-only mount: nothing can be written beside it, so its record is
// kept in the record directory. Five read-only processes one after the other: the first
// hashes, the next four trust its record. Then the file is changed through another, writable
// mount of it (the mtime put back): the next process trusts nothing and serves no changed byte.
void five_processes_then_a_change(TempDir& results, const std::string& path, const std::string& writable_path,
                                  const std::string& records) {
  let_change_time_settle(path);
  for (int i = 0; i < 5; ++i) {
    auto r = verify_in_child(results, path, {.read_only = true, .record_dir = records});
    EXPECT_EQ(r["hits"], kCount) << "process " << i;
    EXPECT_EQ(r["verify_failures"], 0u) << "process " << i;
    EXPECT_EQ(r["trusted_entries"], i == 0 ? 0u : kCount) << "process " << i << (i == 0 ? " trusted a record nobody wrote" : " hashed again");
  }
  {
    KeepMtime keep(writable_path);
    write_bytes_at(writable_path, offset_of_key(writable_path, own_key("v", 3)) + 100, "changed");
  }
  auto r = verify_in_child(results, path, {.read_only = true, .missing = "3", .record_dir = records});
  EXPECT_EQ(r["trusted_entries"], 0u) << "trusted a record after the file changed through another mount";
  EXPECT_EQ(r["verify_failures"], 1u);
}

bool mount_read_only(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && (fs.f_flags & ST_RDONLY) != 0;
}

struct ReadOnlyBind : ::testing::Test {
  void SetUp() override {
    for (const std::string& d : {src, mnt, records}) ASSERT_TRUE(std::filesystem::create_directory(d));
    std::filesystem::permissions(records, std::filesystem::perms(0755));
    write_entries(src + "/c.wcache");
    if (on_tmpfs(src)) GTEST_SKIP() << "the temporary directory is on tmpfs, where verification stays per process";
    if (::mount(src.c_str(), mnt.c_str(), nullptr, MS_BIND, nullptr) != 0)
      GTEST_SKIP() << "cannot bind-mount here (" << std::strerror(errno) << "): needs root and a container that allows it";
    mounted = true;
    ASSERT_EQ(::mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr), 0) << std::strerror(errno);
    ASSERT_TRUE(mount_read_only(mnt));
  }
  void TearDown() override {
    if (mounted) ::umount2(mnt.c_str(), MNT_DETACH);
  }
  TempDir base{"wc-verify-robind"};
  const std::string src = base.file("src"), mnt = base.file("mnt"), records = base.file("records");
  const std::string path = mnt + "/c.wcache";
  bool mounted = false;
};

TEST_F(ReadOnlyBind, TheFirstProcessHashesTheNextFourTrustItAndAChangeElsewhereIsSeen) {
  five_processes_then_a_change(base, path, src + "/c.wcache", records);
}

// Whoever may add or replace a file in the record directory could vouch for bytes: a directory
// others may write is not used, and every process hashes.
TEST_F(ReadOnlyBind, ARecordDirectoryOthersMayWriteIsNotUsed) {
  std::filesystem::permissions(records, std::filesystem::perms(0777));
  let_change_time_settle(path);
  for (int i = 0; i < 2; ++i) {
    auto r = verify_in_child(base, path, {.read_only = true, .record_dir = records});
    EXPECT_EQ(r["hits"], kCount);
    EXPECT_EQ(r["trusted_entries"], 0u) << "trusted a record in a directory anyone may write";
  }
  EXPECT_TRUE(std::filesystem::is_empty(records));
}

// Without record_dir: root's default, /run/weightcache (another user's: $XDG_RUNTIME_DIR/weightcache).
TEST_F(ReadOnlyBind, TheDefaultRecordDirectoryServesTheNode) {
  if (::geteuid() != 0 && std::getenv("XDG_RUNTIME_DIR") == nullptr)
    GTEST_SKIP() << "neither root nor XDG_RUNTIME_DIR: no default record directory";
  let_change_time_settle(path);
  EXPECT_EQ(verify_in_child(base, path, {.read_only = true})["hits"], kCount);
  EXPECT_EQ(verify_in_child(base, path, {.read_only = true})["trusted_entries"], kCount);
}

// A service that runs as another user than the one that verified first reads the node's record
// (root's, in a directory only root writes) and trusts it; it writes none there.
TEST_F(ReadOnlyBind, AnotherUserReadsRootsRecordAndTrustsIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a process as nobody";
  std::filesystem::permissions(base.path(), std::filesystem::perms(0755));
  std::filesystem::permissions(src, std::filesystem::perms(0755));  // and so the mount of it
  const std::string out = base.file("nobody");
  ASSERT_TRUE(std::filesystem::create_directory(out));
  std::filesystem::permissions(out, std::filesystem::perms(0777));
  let_change_time_settle(path);
  EXPECT_EQ(verify_in_child(base, path, {.read_only = true, .record_dir = records})["trusted_entries"], 0u);
  const std::string results = out + "/results";
  const Process p = spawn_to_files_as(65534, 65534, kChildExe,
                                      {"verify", arg("path", path), arg("tag", "v"), arg("count", kCount),
                                       arg("size", kSize), arg("results", results), arg("mode", "shared"),
                                       arg("read_only", 1), arg("missing", "none"), arg("record_dir", records)},
                                      out + "/stdout", out + "/stderr");
  ASSERT_NE(p, kNoProcess);
  const ExitStatus st = wait_process(p);
  ASSERT_TRUE(st.exited && st.code == 0) << st.describe() << "\n" << read_file(out + "/stderr");
  auto r = read_results(results);
  EXPECT_EQ(r["hits"], kCount);
  EXPECT_EQ(r["trusted_entries"], kCount) << "nobody did not trust root's record";
}

// A file system whose times come from somewhere else than the kernel's clock does not qualify,
// read-only or not: squashfs takes them from the image, so two images with the same times and
// one byte of difference would give the same stamp on a reused loop device.
TEST(SharedVerifyImageFs, ASquashfsImageIsVerifiedPerProcess) {
  TempDir base("wc-verify-sqfs");
  const std::string content = base.file("content"), image = base.file("fs.img"), mnt = base.file("mnt");
  for (const std::string& d : {content, mnt}) ASSERT_TRUE(std::filesystem::create_directory(d));
  write_entries(content + "/c.wcache");
  std::filesystem::remove(content + "/c.wcache.lock");
  const std::string mk = "mksquashfs '" + content + "' '" + image + "' -noappend -quiet >/dev/null 2>&1";
  if (std::system(mk.c_str()) != 0) GTEST_SKIP() << "mksquashfs is not available here (Debian's squashfs-tools)";
  const std::string mount = "mount -o loop,ro '" + image + "' '" + mnt + "' >/dev/null 2>&1";
  if (std::system(mount.c_str()) != 0) GTEST_SKIP() << "cannot loop-mount an image here: needs root and a container that allows it";
  struct Unmount {
    std::string d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string path = mnt + "/c.wcache", records = base.file("records");
  ASSERT_TRUE(std::filesystem::create_directory(records));
  std::filesystem::permissions(records, std::filesystem::perms(0755));
  let_change_time_settle(path, platform::kCoarseChangeWindowNs);
  for (int i = 0; i < 3; ++i) {
    auto r = verify_in_child(base, path, {.read_only = true, .record_dir = records});
    EXPECT_EQ(r["hits"], kCount);
    EXPECT_EQ(r["trusted_entries"], 0u) << "trusted a record of a squashfs file, run " << i;
  }
}

// An overlayfs of lower layers only, read-only, as a container runtime mounts an image volume.
// Nothing in it is trusted on a record: its times can be the metadata layer's while the bytes are
// a data layer's (metacopy), its layers' file systems can only be found by resolving paths the
// process does not control, and its pages are out of reach of a write-back through it (two
// hostile reviews served changed bytes through each of those). Every process hashes.
struct ReadOnlyOverlay : ::testing::Test {
  void SetUp() override {
    for (const std::string& d : {lower, lower2, merged, records}) ASSERT_TRUE(std::filesystem::create_directory(d));
    std::filesystem::permissions(records, std::filesystem::perms(0755));
    write_entries(lower + "/c.wcache");
    if (on_tmpfs(lower)) GTEST_SKIP() << "the temporary directory is on tmpfs, where verification stays per process";
    const std::string opts = "lowerdir=" + lower + ":" + lower2;
    if (::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, opts.c_str()) != 0)
      GTEST_SKIP() << "cannot mount an overlayfs here (" << std::strerror(errno)
                   << "): needs root and a kernel and container that allow it";
    mounted = true;
    ASSERT_TRUE(mount_read_only(merged));
  }
  // `count` processes one after the other: each hashes what it serves, none trusts a record.
  void every_process_hashes(int count) {
    for (int i = 0; i < count; ++i) {
      auto r = verify_in_child(base, path, {.read_only = true, .record_dir = records});
      EXPECT_EQ(r["hits"], kCount) << "process " << i;
      EXPECT_EQ(r["trusted_entries"], 0u) << "process " << i << " trusted a record of an overlay's file";
    }
  }
  void TearDown() override {
    if (mounted) ::umount2(merged.c_str(), MNT_DETACH);
  }
  TempDir base{"wc-verify-roovl"};
  const std::string lower = base.file("lower"), lower2 = base.file("lower2"), merged = base.file("merged"),
                    records = base.file("records");
  const std::string path = merged + "/c.wcache";
  bool mounted = false;
};

TEST_F(ReadOnlyOverlay, EveryProcessHashesAndAChangeInTheLowerLayerIsNeverServed) {
  let_change_time_settle(path, platform::kCoarseChangeWindowNs);
  every_process_hashes(5);
  {
    KeepMtime keep(lower + "/c.wcache");
    write_bytes_at(lower + "/c.wcache", offset_of_key(lower + "/c.wcache", own_key("v", 3)) + 100, "changed");
  }
  auto r = verify_in_child(base, path, {.read_only = true, .missing = "3", .record_dir = records});
  EXPECT_EQ(r["verify_failures"], 1u);
  EXPECT_TRUE(std::filesystem::is_empty(records)) << "a record was written for an overlay's file";
}

// The lower file's pages are out of reach of a write-back through the overlay's descriptor: a
// foreign mapping of the lower file keeps a page of entry 7 dirty from before the first
// process, which records; a store through that page afterwards must still be seen.
TEST_F(ReadOnlyOverlay, AStoreThroughAPageOfTheLowerFileKeptDirtyIsNeverTrusted) {
  ForeignMapping foreign(lower + "/c.wcache", own_key("v", 7));
  ASSERT_NE(foreign.byte, nullptr);
  foreign.dirty();
  let_change_time_settle(path, platform::kCoarseChangeWindowNs);
  every_process_hashes(2);
  foreign.change();
  auto next = verify_in_child(base, path, {.read_only = true, .missing = "7", .record_dir = records});
  EXPECT_EQ(next["verify_failures"], 1u) << "a byte changed through a dirty lower page was served on a record";
}

// An overlay whose lower layer is on tmpfs: a store through a writable mapping of the lower file
// moves no time there and no write-back protects its pages, so nothing is trusted (a hostile
// review served a changed byte on a record before the layers were checked).
TEST(SharedVerifyOverlayfs, AReadOnlyOverlayOverTmpfsIsVerifiedPerProcess) {
  TempDir base("wc-verify-ovltmp");
  // Both layers on one tmpfs (the shape a first version trusted, finding them in mountinfo).
  const std::string tmp = base.file("tmp"), lower = tmp + "/lower", lower2 = tmp + "/lower2",
                    merged = base.file("merged"), records = base.file("records");
  for (const std::string& d : {tmp, merged, records}) ASSERT_TRUE(std::filesystem::create_directory(d));
  std::filesystem::permissions(records, std::filesystem::perms(0755));
  if (::mount("tmpfs", tmp.c_str(), "tmpfs", 0, "size=64m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root";
  struct Unmount {
    std::vector<std::string> dirs;
    ~Unmount() {
      for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
    }
  } unmount{{tmp}};
  for (const std::string& d : {lower, lower2}) ASSERT_TRUE(std::filesystem::create_directory(d));
  write_entries(lower + "/c.wcache");
  const std::string opts = "lowerdir=" + lower + ":" + lower2;
  if (::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount an overlayfs here (" << std::strerror(errno) << ")";
  unmount.dirs.push_back(merged);
  const std::string path = merged + "/c.wcache";
  ForeignMapping foreign(lower + "/c.wcache", own_key("v", 7));
  ASSERT_NE(foreign.byte, nullptr);
  let_change_time_settle(path, platform::kCoarseChangeWindowNs);
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(verify_in_child(base, path, {.read_only = true, .record_dir = records})["trusted_entries"], 0u)
        << "trusted a record of an overlay over tmpfs, run " << i;
  foreign.change();
  auto r = verify_in_child(base, path, {.read_only = true, .missing = "7", .record_dir = records});
  EXPECT_EQ(r["verify_failures"], 1u) << "a byte changed in the tmpfs lower layer was served";
}

// ---- a page kept dirty through a shared mapping ----

// A store to a page that is already dirty takes no fault, so it moves no change time. Another
// program keeps such a mapping of the cache: it dirties a page of entry 7 (which moves the time
// once), waits, and once a process verified the file, changes the byte through the same page.
TEST_F(SharedVerify, AStoreThroughAPageKeptDirtyInAForeignMappingIsNeverTrusted) {
  ForeignMapping foreign(path, own_key("v", 7));
  ASSERT_NE(foreign.byte, nullptr);
  foreign.dirty();  // the page is dirty now, the bytes unchanged
  let_change_time_settle(path);
  auto first = verify_in_child(dir, path);  // verifies this state (and records it)
  EXPECT_EQ(first["verify_failures"], 0u);
  foreign.change();
  auto next = verify_in_child(dir, path, {.missing = "7"});
  EXPECT_EQ(next["verify_failures"], 1u) << "a byte changed through a dirty page was served on an earlier verification";
}

// ---- the lock file is written only when it is the cache's own ----

TEST_F(SharedVerify, ALockFileWithOtherContentIsNeverWrittenOver) {
  const std::string lock = path + ".lock";
  const std::string foreign = "12345\nsomebody else's pid file\n";
  std::filesystem::resize_file(lock, 0);
  write_bytes_at(lock, 0, foreign);
  auto r = verify_in_child(dir, path);
  EXPECT_EQ(r["hits"], kCount);
  EXPECT_EQ(r["trusted_entries"], 0u);
  EXPECT_EQ(read_file(lock), foreign) << "the record was written over a file that is not a record";
}

TEST_F(SharedVerify, ALockFileHardLinkedToAnotherFileIsNeverWritten) {
  const std::string lock = path + ".lock";
  const std::string other = dir.file("someone-elses-file");
  {
    std::FILE* f = std::fopen(other.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fclose(f);  // empty, as a fresh lock file is
  }
  std::filesystem::remove(lock);
  std::filesystem::create_hard_link(other, lock);
  for (int i = 0; i < 2; ++i) {
    auto r = verify_in_child(dir, path);
    EXPECT_EQ(r["hits"], kCount);
    EXPECT_EQ(r["trusted_entries"], 0u);
  }
  EXPECT_EQ(std::filesystem::file_size(other), 0u) << "a record was written into a file linked at the lock file's name";
}

// The checks are made again just before the record is written: what the lock file became while
// the cache was open counts, not what it was at open.
TEST_F(SharedVerify, ALockFileThatChangedWhileTheCacheWasOpenIsNotWritten) {
  const std::string lock = path + ".lock";
  const std::string foreign = "pid=4242 owner=otherapp\n";
  const std::string link = dir.file("another-name");
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "other content written into it" : "a second name linked to it");
    empty_the_record(path);
    {
      auto opened = WeightCache::open(shared_options(path));
      ASSERT_TRUE(opened.ok()) << opened.error().message;
      for (std::size_t j = 0; j < kCount; ++j) EXPECT_EQ(check_entry(opened.value(), own_key("v", j), kSize), "");
      if (variant == 0)
        write_bytes_at(lock, 0, foreign);
      else
        std::filesystem::create_hard_link(lock, link);
    }  // close would record what it verified
    if (variant == 0) {
      EXPECT_EQ(read_file(lock), foreign) << "the record was written over content that appeared while open";
    } else {
      EXPECT_EQ(std::filesystem::file_size(link), 0u) << "the record was written into a file with a second name";
      std::filesystem::remove(link);
    }
  }
}

// ---- gc collects a cache whose lock file holds a record ----

TEST_F(SharedVerify, GcRemovesACacheWhoseLockFileHoldsARecord) {
  ASSERT_GE(std::filesystem::file_size(path + ".lock"), kRecordFixedBytes);
  auto report = gc(dir.path().string(), 0);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_EQ(report->removed_files, 1u);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".lock")) << "the lock file with the record stays behind";
}

TEST_F(SharedVerify, GcTakesALockFileForARecordOnlyIfItsHeaderIsOne) {
  // The magic alone is not enough: the version and an entry count the file holds must match too.
  const std::string lock = path + ".lock";
  std::filesystem::resize_file(lock, 0);
  write_bytes_at(lock, 0, "WCVR" + std::string(300, '\xff'));
  auto report = gc(dir.path().string(), 0);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(std::filesystem::exists(lock)) << "removed a file that only starts like a record";
  EXPECT_EQ(report->removed_files, 0u);
}

TEST_F(SharedVerify, GcLeavesALockFileWithForeignBytesAlone) {
  const std::string foreign = "not a record: somebody else's file of some length, " + std::string(200, 'x');
  write_bytes_at(path + ".lock", 0, foreign);
  auto report = gc(dir.path().string(), 0);
  ASSERT_TRUE(report.ok()) << report.error().message;
  // Not this cache's lock file: gc neither removes it nor takes the cache for unused.
  ASSERT_TRUE(std::filesystem::exists(path + ".lock")) << "removed a file that is not a weightcache lock file";
  EXPECT_EQ(read_file(path + ".lock").substr(0, foreign.size()), foreign);
  EXPECT_EQ(report->removed_files, 0u);
  ASSERT_EQ(report->files.size(), 1u);
  EXPECT_NE(report->files[0].detail.find("another program's data"), std::string::npos)
      << "kept, but for the wrong reason: " << report->files[0].detail;
}

TEST(SharedVerifyAhead, TheVerifyAheadThreadRecordsWhileItsProcessStillRuns) {
  TempDir dir("wc-verify");
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kBig = 1 << 20, kBigCount = 20;  // 20 MiB: over the verify-ahead threshold
  {
    auto opened = WeightCache::open(cache_options(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kBigCount; ++j) {
      const std::string key = own_key("v", j);
      ASSERT_NE(opened->insert(key, bytes_for_key(key, kBig)), kNotFound) << last_error().message;
    }
    ASSERT_TRUE(opened->finalize().ok());
  }
  let_change_time_settle(path);
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "no verify-ahead thread on one CPU";
  Options shared = cache_options(path);
  shared.verify = Verify::shared;
  auto first = WeightCache::open(shared);
  ASSERT_TRUE(first.ok()) << first.error().message;
  // No look-up here: the thread alone checks every entry, then records it.
  for (int i = 0; i < 100000 && first->stats().verified_ahead < kBigCount; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(first->stats().verified_ahead, kBigCount);
  // The record follows the last verdict; wait for it to land in the lock file.
  for (int i = 0; i < 100000 && read_file(path + ".lock").size() < kRecordFixedBytes; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string results = dir.file("child");
  Children kids;
  kids.start("verify", {arg("path", path), arg("tag", "v"), arg("count", kBigCount), arg("size", kBig),
                        arg("results", results)});
  ASSERT_TRUE(kids.all_succeed());
  auto r = read_results(results);
  EXPECT_EQ(r["trusted_entries"], kBigCount) << "a process started while the verifier still runs";
  EXPECT_EQ(r["verify_failures"], 0u);
}

#else

TEST(SharedVerify, VerificationStaysPerProcessWhereTheOSCannotTell) {
  TempDir dir("wc-verify");
  const std::string path = dir.file("cache.wcache");
  write_entries(path);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(verify_in_child(dir, path)["trusted_entries"], 0u);
}

#endif

}  // namespace
}  // namespace weightcache::test::mp
