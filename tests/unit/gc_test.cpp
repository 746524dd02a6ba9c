// Garbage collection of a cache directory (wc_gc / gc): least recently used first by the lock
// file's time, never a file in use or anything that is not a cache file, and a report whose
// numbers add up. Times are set explicitly (utimensat), never waited for.
//
// POSIX only for now: the tests use symlinks, flock and permission bits, and the Windows backend's
// gc has not been run under Wine yet.
#ifndef _WIN32

#include "unit_test_util.hpp"

#include "forwarding_platform.hpp"
#include "gc.hpp"

#include <weightcache/weightcache.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::test {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kSecond = 1000000000;
constexpr std::int64_t kBase = std::int64_t{1700000000} * kSecond;  // 2023-11-14

// Disk space of a file as gc counts it: allocated blocks (0 when absent).
std::uint64_t allocated(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}
std::uint64_t cache_bytes(const std::string& path) { return allocated(path) + allocated(path + ".lock"); }

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A finalized cache of `size` bytes of payload; its lock file says it was last used at
// `used_ns` and the file itself was last written long before.
void make_cache(const std::string& path, std::size_t size, std::int64_t used_ns) {
  {
    auto c = open_or_fail(file_options(path));
    ASSERT_TRUE(c);
    ASSERT_NE(c.insert("weights", random_bytes(size, size)), kNotFound);
    ASSERT_TRUE(c.finalize().ok());
  }
  ASSERT_TRUE(set_file_mtime(path, kBase - 1000 * kSecond));
  ASSERT_TRUE(set_file_mtime(path + ".lock", used_ns));
}

Result<GcReport> run_gc(const TempDir& dir, std::uint64_t max_bytes) {
  auto r = gc(dir.path().string(), max_bytes);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r;
}

const GcFile* find(const GcReport& r, const std::string& path) {
  for (const auto& f : r.files)
    if (f.path == path) return &f;
  return nullptr;
}

TEST(Gc, RemovesTheLeastRecentlyUsedByTheLockFilesTimeUntilWithinBudget) {
  TempDir dir;
  // Name order is not use order: "used" gives each cache's rank, oldest first.
  const std::map<std::string, int> used = {{"e.wcache", 0}, {"a.wcache", 1}, {"d.wcache", 2},
                                           {"b.wcache", 3}, {"c.wcache", 4}, {"f.wcache", 5}};
  for (const auto& [name, rank] : used) make_cache(dir.file(name), 64 * 1024, kBase + rank * kSecond);
  // "f" has the oldest lock-file time but was written last: the later of the two counts.
  ASSERT_TRUE(set_file_mtime(dir.file("f.wcache.lock"), kBase - 2000 * kSecond));
  ASSERT_TRUE(set_file_mtime(dir.file("f.wcache"), kBase + 10 * kSecond));

  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> bytes;
  for (const auto& [name, rank] : used) total += bytes[name] = cache_bytes(dir.file(name));
  // Room for the three most recently used: f, c, b.
  const std::uint64_t budget = bytes["f.wcache"] + bytes["c.wcache"] + bytes["b.wcache"];

  auto r = run_gc(dir, budget);
  ASSERT_TRUE(r.ok());
  for (const char* gone : {"e.wcache", "a.wcache", "d.wcache"}) {
    EXPECT_FALSE(exists(dir.file(gone))) << gone;
    EXPECT_FALSE(exists(dir.file(std::string(gone) + ".lock"))) << gone;
  }
  for (const char* kept : {"b.wcache", "c.wcache", "f.wcache"}) {
    EXPECT_TRUE(exists(dir.file(kept))) << kept;
    EXPECT_TRUE(exists(dir.file(std::string(kept) + ".lock"))) << kept;
  }
  // The report: every cache in use order, the numbers adding up.
  ASSERT_EQ(r->files.size(), 6u);
  const std::vector<std::string> order = {"e.wcache", "a.wcache", "d.wcache", "b.wcache", "c.wcache", "f.wcache"};
  for (std::size_t i = 0; i < order.size(); ++i) {
    const GcFile& f = r->files[i];
    EXPECT_EQ(f.path, dir.file(order[i]));
    EXPECT_EQ(f.bytes, bytes[order[i]]) << order[i];
    EXPECT_EQ(f.removed, i < 3) << order[i];
    EXPECT_EQ(f.reason, i < 3 ? GcReason::least_recently_used : GcReason::within_budget) << order[i];
  }
  EXPECT_EQ(r->files[0].last_used_ns, kBase + 0 * kSecond);
  EXPECT_EQ(r->files[5].last_used_ns, kBase + 10 * kSecond);
  EXPECT_EQ(r->max_bytes, budget);
  EXPECT_EQ(r->total_before, total);
  EXPECT_EQ(r->total_after, budget);
  EXPECT_EQ(r->removed_files, 3u);
  EXPECT_EQ(r->removed_bytes, bytes["e.wcache"] + bytes["a.wcache"] + bytes["d.wcache"]);
  EXPECT_EQ(r->kept_files, 3u);
  EXPECT_EQ(r->kept_bytes, budget);
  EXPECT_EQ(r->kept_in_use, 0u);
  EXPECT_EQ(r->kept_unremovable, 0u);
  EXPECT_TRUE(r->within_budget());

  // Within budget now: a second run removes nothing.
  auto again = run_gc(dir, budget);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->removed_files, 0u);
  EXPECT_EQ(again->total_before, budget);
  EXPECT_EQ(again->total_after, budget);
}

TEST(Gc, OpeningForWritingMakesACacheRecentlyUsed) {
  TempDir dir;
  make_cache(dir.file("old.wcache"), 32 * 1024, kBase);
  make_cache(dir.file("new.wcache"), 32 * 1024, kBase + kSecond);
  // A writable open (no entries added) touches the lock file: "old" becomes the newest.
  { auto c = open_or_fail(file_options(dir.file("old.wcache"))); }
  auto r = run_gc(dir, cache_bytes(dir.file("old.wcache")));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(exists(dir.file("old.wcache")));
  EXPECT_FALSE(exists(dir.file("new.wcache")));
}

TEST(Gc, TouchesNothingButCacheFiles) {
  TempDir dir, elsewhere;
  make_cache(dir.file("real.wcache"), 16 * 1024, kBase);
  // Not caches: another file with a cache's name, a header-sized file of other bytes, a file
  // whose header has the magic but fails its checksum, an empty lock file, a text file.
  const std::string other = random_bytes(7, 8192);
  write(dir.file("x.wcache"), other);
  write(dir.file("notes.txt"), "not a cache\n");
  write(dir.file("stray.lock"), "");
  std::string damaged = contents(dir.file("real.wcache"));
  damaged[100] = static_cast<char>(damaged[100] ^ 0x5a);
  write(dir.file("damaged.wcache"), damaged);
  // A directory holding a cache (gc does not descend), and symlinks to caches inside and outside.
  ASSERT_TRUE(fs::create_directory(dir.file("sub.wcache")));
  make_cache(dir.file("sub.wcache") + "/inner.wcache", 16 * 1024, kBase);
  make_cache(elsewhere.file("target.wcache"), 16 * 1024, kBase);
  ASSERT_EQ(::symlink(elsewhere.file("target.wcache").c_str(), dir.file("link.wcache").c_str()), 0);
  ASSERT_EQ(::symlink(dir.file("real.wcache").c_str(), dir.file("inner-link.wcache").c_str()), 0);
  const std::string target = contents(elsewhere.file("target.wcache"));

  auto r = run_gc(dir, 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_EQ(r->files[0].path, dir.file("real.wcache"));
  EXPECT_TRUE(r->files[0].removed);
  EXPECT_FALSE(exists(dir.file("real.wcache")));
  EXPECT_EQ(r->total_after, 0u);
  EXPECT_TRUE(r->within_budget());

  EXPECT_EQ(contents(dir.file("x.wcache")), other);
  EXPECT_EQ(contents(dir.file("notes.txt")), "not a cache\n");
  EXPECT_EQ(contents(dir.file("damaged.wcache")), damaged);
  EXPECT_TRUE(exists(dir.file("stray.lock")));
  EXPECT_TRUE(exists(dir.file("sub.wcache") + "/inner.wcache"));
  EXPECT_TRUE(exists(dir.file("sub.wcache") + "/inner.wcache.lock"));
  EXPECT_TRUE(fs::is_symlink(dir.file("link.wcache")));
  EXPECT_TRUE(fs::is_symlink(dir.file("inner-link.wcache")));  // dangling now, but left alone
  EXPECT_EQ(contents(elsewhere.file("target.wcache")), target);
  EXPECT_TRUE(exists(elsewhere.file("target.wcache.lock")));
}

TEST(Gc, KeepsCachesThisProcessHasOpen) {
  TempDir dir;
  make_cache(dir.file("writer.wcache"), 32 * 1024, kBase);
  make_cache(dir.file("reader.wcache"), 32 * 1024, kBase + 1 * kSecond);
  make_cache(dir.file("idle.wcache"), 32 * 1024, kBase + 2 * kSecond);
  const std::string payload = random_bytes(32 * 1024, 32 * 1024);
  auto writer = open_or_fail(file_options(dir.file("writer.wcache")));
  Options ro = file_options(dir.file("reader.wcache"));
  ro.read_only = true;
  auto reader = open_or_fail(ro);
  ASSERT_TRUE(writer && reader);
  // Opening touched the writer's lock file: put both back to the oldest times.
  ASSERT_TRUE(set_file_mtime(dir.file("writer.wcache.lock"), kBase));
  const std::uint64_t in_use = cache_bytes(dir.file("writer.wcache")) + cache_bytes(dir.file("reader.wcache"));

  auto r = run_gc(dir, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(exists(dir.file("writer.wcache")));
  EXPECT_TRUE(exists(dir.file("writer.wcache.lock")));
  EXPECT_TRUE(exists(dir.file("reader.wcache")));
  EXPECT_FALSE(exists(dir.file("idle.wcache")));
  EXPECT_EQ(r->removed_files, 1u);
  EXPECT_EQ(r->kept_in_use, 2u);
  EXPECT_EQ(r->kept_in_use_bytes, in_use);
  EXPECT_EQ(r->total_after, in_use);
  EXPECT_FALSE(r->within_budget());
  for (const char* name : {"writer.wcache", "reader.wcache"}) {
    const GcFile* f = find(r.value(), dir.file(name));
    ASSERT_NE(f, nullptr) << name;
    EXPECT_FALSE(f->removed) << name;
    EXPECT_EQ(f->reason, GcReason::in_use) << name;
    EXPECT_FALSE(f->detail.empty()) << name;
  }
  // Both still serve their bytes, and the writer can still commit to its file.
  EXPECT_EQ(verify_entry(writer, "weights", payload, "writer"), "");
  EXPECT_EQ(verify_entry(reader, "weights", payload, "reader"), "");
  ASSERT_NE(writer.insert("more", "bytes"), kNotFound);
  EXPECT_TRUE(writer.finalize().ok());
  EXPECT_EQ(writer.stats().heap_fallbacks, 0u);
}

TEST(Gc, KeepsACacheWhoseWriterLeaseIsHeld) {
  TempDir dir;
  make_cache(dir.file("leased.wcache"), 16 * 1024, kBase);
  // Another process's writer lease, through a descriptor of our own.
  const int fd = ::open(dir.file("leased.wcache.lock").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto r = run_gc(dir, 0);
  ::close(fd);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_EQ(r->files[0].reason, GcReason::in_use);
  EXPECT_NE(r->files[0].detail.find("lease"), std::string::npos) << r->files[0].detail;
  EXPECT_TRUE(exists(dir.file("leased.wcache")));
  EXPECT_TRUE(exists(dir.file("leased.wcache.lock")));
  // Released: now it goes.
  auto again = run_gc(dir, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->removed_files, 1u);
  EXPECT_FALSE(exists(dir.file("leased.wcache")));
}

TEST(Gc, RemovesACacheWithoutALockFile) {
  TempDir dir;
  make_cache(dir.file("bare.wcache"), 16 * 1024, kBase);
  ASSERT_EQ(::unlink(dir.file("bare.wcache.lock").c_str()), 0);
  ASSERT_TRUE(set_file_mtime(dir.file("bare.wcache"), kBase + 5 * kSecond));
  auto r = run_gc(dir, 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_EQ(r->files[0].last_used_ns, kBase + 5 * kSecond);  // the file's own time
  EXPECT_TRUE(r->files[0].removed);
  EXPECT_FALSE(exists(dir.file("bare.wcache")));
  EXPECT_FALSE(exists(dir.file("bare.wcache.lock")));  // not created on the way
}

TEST(Gc, KeepsAFileItCannotOpenForWritingAndSaysWhy) {
  if (::geteuid() == 0) GTEST_SKIP() << "root opens a 0444 file for writing";
  TempDir dir;
  make_cache(dir.file("ro.wcache"), 16 * 1024, kBase);
  ASSERT_EQ(::chmod(dir.file("ro.wcache").c_str(), 0444), 0);
  auto r = run_gc(dir, 0);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_FALSE(r->files[0].removed);
  EXPECT_EQ(r->files[0].reason, GcReason::not_writable);
  EXPECT_NE(r->files[0].detail.find("writing"), std::string::npos) << r->files[0].detail;
  EXPECT_EQ(r->kept_unremovable, 1u);
  EXPECT_EQ(r->kept_in_use, 0u);
  EXPECT_TRUE(exists(dir.file("ro.wcache")));
  EXPECT_TRUE(exists(dir.file("ro.wcache.lock")));
}

TEST(Gc, RemovesDeadWritersTemporariesOnlyWithTheirCache) {
  TempDir dir;
  make_cache(dir.file("old.wcache"), 16 * 1024, kBase);
  make_cache(dir.file("new.wcache"), 16 * 1024, kBase + kSecond);
  // Temporaries of dead writers, one holding a complete cache file (never taken for a cache).
  write(dir.file("old.wcache.tmp.4242.0"), contents(dir.file("old.wcache")));
  write(dir.file("old.wcache.tmp.77.compact"), "partial");
  write(dir.file("new.wcache.tmp.4242.1"), contents(dir.file("new.wcache")));
  write(dir.file("old.wcache.tmpfile"), "not a temporary's name");
  auto r = run_gc(dir, cache_bytes(dir.file("new.wcache")));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->files.size(), 2u);  // the temporaries are not caches
  EXPECT_FALSE(exists(dir.file("old.wcache")));
  EXPECT_FALSE(exists(dir.file("old.wcache.tmp.4242.0")));
  EXPECT_FALSE(exists(dir.file("old.wcache.tmp.77.compact")));
  EXPECT_EQ(r->removed_temporaries, 2u);
  EXPECT_TRUE(exists(dir.file("new.wcache.tmp.4242.1")));  // its cache was not removed
  EXPECT_TRUE(exists(dir.file("old.wcache.tmpfile")));
}

TEST(Gc, TemporaryNames) {
  std::string base;
  EXPECT_TRUE(temporary_name("m.wcache.tmp.123.0", &base));
  EXPECT_EQ(base, "m.wcache");
  EXPECT_TRUE(temporary_name("m.tmp.9.compact", &base));
  EXPECT_EQ(base, "m");
  EXPECT_FALSE(temporary_name("m.tmp.", &base));
  EXPECT_FALSE(temporary_name("m.tmp.12", &base));
  EXPECT_FALSE(temporary_name("m.tmp.12.", &base));
  EXPECT_FALSE(temporary_name("m.tmp.x.0", &base));
  EXPECT_FALSE(temporary_name(".tmp.1.0", &base));
}

// A platform whose deletes of one name fail: the file is kept and the report says why.
class RefusingDelete final : public ForwardingPlatform {
 public:
  explicit RefusingDelete(std::string name) : name_(std::move(name)) {}
  Result<void> remove_file(const std::string& p) noexcept override {
    if (p == name_) return Error{Errc::io, EACCES, "cannot delete '" + p + "': Permission denied."};
    return ForwardingPlatform::remove_file(p);
  }

 private:
  std::string name_;
};

TEST(Gc, AFailedDeleteKeepsTheFileAndItsLockFile) {
  TempDir dir;
  make_cache(dir.file("a.wcache"), 16 * 1024, kBase);
  make_cache(dir.file("b.wcache"), 16 * 1024, kBase + kSecond);
  RefusingDelete pf(dir.file("a.wcache"));
  auto r = collect_garbage(pf, dir.path().string(), 0);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(exists(dir.file("a.wcache")));
  EXPECT_TRUE(exists(dir.file("a.wcache.lock")));
  EXPECT_FALSE(exists(dir.file("b.wcache")));
  EXPECT_EQ(r->files[0].reason, GcReason::failed);
  EXPECT_NE(r->files[0].detail.find("Permission denied"), std::string::npos) << r->files[0].detail;
  EXPECT_EQ(r->kept_unremovable, 1u);
  EXPECT_EQ(r->removed_files, 1u);
  EXPECT_FALSE(r->within_budget());
}

// The same through a platform that refuses the read-write open, as the OS does for a 0444 file
// when not root (so this runs under root too).
class RefusingWriteOpen final : public ForwardingPlatform {
 public:
  Result<File> open_file(const std::string& p, platform::OpenMode m, unsigned perm, bool f) override {
    if (m == platform::OpenMode::read_write) return platform::os_error(EACCES, "cannot open", p);
    return ForwardingPlatform::open_file(p, m, perm, f);
  }
};

TEST(Gc, KeepsAFileThePlatformWillNotOpenForWriting) {
  TempDir dir;
  make_cache(dir.file("ro.wcache"), 16 * 1024, kBase);
  RefusingWriteOpen pf;
  auto r = collect_garbage(pf, dir.path().string(), 0);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_FALSE(r->files[0].removed);
  EXPECT_EQ(r->files[0].reason, GcReason::not_writable);
  EXPECT_NE(r->files[0].detail.find("proven unused"), std::string::npos) << r->files[0].detail;
  EXPECT_EQ(r->kept_unremovable, 1u);
  EXPECT_EQ(r->total_after, r->total_before);
  EXPECT_TRUE(exists(dir.file("ro.wcache")));
  EXPECT_TRUE(exists(dir.file("ro.wcache.lock")));
}

// A process starting to open the cache while gc works on it: its first step creates the lock
// file that was not there at the scan. gc keeps the file, and that lock file, for it.
class OpenerArrives final : public ForwardingPlatform {
 public:
  explicit OpenerArrives(std::string path) : path_(std::move(path)) {}
  Result<File> open_file(const std::string& p, platform::OpenMode m, unsigned perm, bool f) override {
    if (m == platform::OpenMode::read_write && p == path_) {
      const int fd = ::open((path_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
    }
    return ForwardingPlatform::open_file(p, m, perm, f);
  }

 private:
  std::string path_;
};

TEST(Gc, KeepsAFileWhoseLockFileAppearsWhileItWorks) {
  TempDir dir;
  make_cache(dir.file("a.wcache"), 16 * 1024, kBase);
  ASSERT_EQ(::unlink(dir.file("a.wcache.lock").c_str()), 0);
  OpenerArrives pf(dir.file("a.wcache"));
  auto r = collect_garbage(pf, dir.path().string(), 0);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->files.size(), 1u);
  EXPECT_FALSE(r->files[0].removed);
  EXPECT_EQ(r->files[0].reason, GcReason::changed);
  EXPECT_TRUE(exists(dir.file("a.wcache")));
  EXPECT_TRUE(exists(dir.file("a.wcache.lock")));
}

TEST(Gc, CApi) {
  TempDir dir;
  make_cache(dir.file("a.wcache"), 16 * 1024, kBase);
  make_cache(dir.file("b.wcache"), 16 * 1024, kBase + kSecond);
  const std::uint64_t a = cache_bytes(dir.file("a.wcache")), b = cache_bytes(dir.file("b.wcache"));

  EXPECT_EQ(wc_gc(nullptr, 0, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_gc("", 0, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_gc(dir.file("absent").c_str(), 0, nullptr), WC_ERR_IO);
  EXPECT_NE(std::string(wc_last_error()).find("absent"), std::string::npos) << wc_last_error();
  EXPECT_EQ(wc_gc(dir.file("a.wcache").c_str(), 0, nullptr), WC_ERR_IO);  // not a directory
  wc_gc_report unset{};
  EXPECT_EQ(wc_gc(dir.path().c_str(), 0, &unset), WC_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(exists(dir.file("a.wcache")));

  // A caller built against a first version of the struct (up to total_after) gets that part
  // only; the bytes past it are left alone.
  struct {
    wc_gc_report r;
    char guard[8];
  } old{};
  std::memset(&old, 0x7f, sizeof old);
  old.r.struct_size = offsetof(wc_gc_report, total_after) + sizeof(uint64_t);
  ASSERT_EQ(wc_gc(dir.path().c_str(), b, &old.r), WC_OK) << wc_last_error();
  EXPECT_EQ(old.r.max_bytes, b);
  EXPECT_EQ(old.r.caches, 2u);
  EXPECT_EQ(old.r.total_before, a + b);
  EXPECT_EQ(old.r.total_after, b);
  EXPECT_EQ(old.r.removed_files, 0x7f7f7f7f7f7f7f7fu);
  EXPECT_EQ(old.guard[0], 0x7f);
  EXPECT_FALSE(exists(dir.file("a.wcache")));

  wc_gc_report full;
  wc_gc_report_init(&full);
  EXPECT_EQ(full.struct_size, sizeof(wc_gc_report));
  ASSERT_EQ(wc_gc(dir.path().c_str(), 0, &full), WC_OK);
  EXPECT_EQ(full.caches, 1u);
  EXPECT_EQ(full.total_before, b);
  EXPECT_EQ(full.total_after, 0u);
  EXPECT_EQ(full.removed_files, 1u);
  EXPECT_EQ(full.removed_bytes, b);
  EXPECT_EQ(full.kept_files, 0u);
  EXPECT_EQ(full.kept_in_use, 0u);
  EXPECT_EQ(full.within_budget, 1);
  EXPECT_EQ(wc_gc(dir.path().c_str(), 0, nullptr), WC_OK);  // an empty directory is fine
}

}  // namespace
}  // namespace weightcache::test

#endif  // _WIN32
