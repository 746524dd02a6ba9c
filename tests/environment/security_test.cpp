// What the cache does with the file system it is given: permission bits of what it creates,
// descriptors that do not leak into programs the host starts, symlinks refused unless allowed
// (and then followed faithfully), the key size limit, and a directory or FIFO at the path.
#include "child_process.hpp"
#include "env_common.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weightcache.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using namespace weightcache;
using namespace weightcache::env;

constexpr const char* kChild = WC_ENV_CHILD;

/// Sets the umask for the lifetime of the object.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

unsigned mode_bits(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

/// Everything about a file that a cache must not change: bytes, size, inode, mtime, kind.
struct Snapshot {
  std::string bytes;
  struct stat st {};
  bool operator==(const Snapshot& o) const {
    return bytes == o.bytes && st.st_ino == o.st.st_ino && st.st_size == o.st.st_size &&
           st.st_mode == o.st.st_mode && st.st_mtim.tv_sec == o.st.st_mtim.tv_sec &&
           st.st_mtim.tv_nsec == o.st.st_mtim.tv_nsec;
  }
};

Snapshot snapshot(const std::string& path) {
  Snapshot s;
  EXPECT_EQ(::lstat(path.c_str(), &s.st), 0) << path;
  if (S_ISREG(s.st.st_mode)) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    s.bytes = ss.str();
  } else if (S_ISLNK(s.st.st_mode)) {
    s.bytes = fs::read_symlink(path).string();
  }
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Creates a valid cache at `path` holding entries [first, first + count).
std::vector<Packed> make_cache(const std::string& path, std::uint64_t first, std::uint64_t count) {
  std::vector<Packed> out;
  auto c = WeightCache::open(cache_options(path, Backing::file));
  EXPECT_TRUE(c.ok()) << c.error().message;
  if (!c.ok()) return out;
  for (std::uint64_t i = first; i < first + count; ++i) {
    Packed e;
    EXPECT_TRUE(pack(c.value(), i, 3000 + i, &e)) << last_error().message;
    out.push_back(e);
  }
  auto r = c.value().finalize();
  EXPECT_TRUE(r.ok()) << r.error().message;
  return out;
}

// ---- permission bits ----

TEST(Security, NewFileModeIs0644UnderUmask022) {
  ScopedUmask mask(022);
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  make_cache(path, 0, 2);
  EXPECT_EQ(mode_bits(path), 0644u);
  EXPECT_EQ(mode_bits(path + ".lock"), 0644u);
}

TEST(Security, ConfiguredFileModeIsUsedExactly) {
  ScopedUmask mask(0);
  for (unsigned mode : {0600u, 0640u, 0664u}) {
    test::TempDir dir("wc-sec");
    const std::string path = dir.file("cache.wc");
    Options o = cache_options(path, Backing::file);
    o.file_mode = mode;
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(mode_bits(path), mode) << std::oct << "file_mode 0" << mode;
    EXPECT_EQ(mode_bits(path + ".lock"), mode) << std::oct << "file_mode 0" << mode;
    // A corrupt file is rebuilt as a new file: it gets file_mode too, not the old file's bits.
    c = Error{};
    write_file(path, std::string(100, 'x'));
    ::chmod(path.c_str(), 0600);
    c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(mode_bits(path), mode) << std::oct << "rebuilt with file_mode 0" << mode;
  }
}

TEST(Security, FileModeBeyondPermissionBitsIsRefused) {
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  for (unsigned mode : {04644u, 02644u, 01644u, 010644u}) {
    Options o = cache_options(path, Backing::file);
    o.file_mode = mode;
    auto c = WeightCache::open(o);
    ASSERT_FALSE(c.ok()) << std::oct << "file_mode 0" << mode << " was accepted";
    EXPECT_EQ(c.error().code, Errc::invalid_argument);
    EXPECT_FALSE(fs::exists(path)) << "a refused open created the file";
  }
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.file_mode = 06755;
  wc_cache* cc = nullptr;
  EXPECT_EQ(wc_open(&o, &cc), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(cc, nullptr);
}

// ---- descriptors ----

/// Descriptors of this process that name `paths`, as "<fd> -> <target>".
std::vector<std::pair<int, std::string>> fds_naming(const std::vector<std::string>& paths) {
  std::vector<std::pair<int, std::string>> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::error_code ec;
    const std::string target = fs::read_symlink(std::string("/proc/self/fd/") + e->d_name, ec).string();
    for (const auto& p : paths)
      if (!ec && target == p) out.emplace_back(std::atoi(e->d_name), target);
  }
  ::closedir(d);
  return out;
}

TEST(Security, DescriptorsAreCloseOnExec) {
  if (!fs::is_directory("/proc/self/fd")) GTEST_SKIP() << "needs /proc/self/fd";
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  make_cache(path, 0, 2);
  auto c = WeightCache::open(cache_options(path, Backing::file));
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_NE(c.value().reserve(1000), nullptr) << last_error().message;  // holds the writer lease
  const std::vector<std::string> names{fs::canonical(path).string(), fs::canonical(path + ".lock").string()};
  const auto ours = fds_naming(names);
  ASSERT_GE(ours.size(), 2u) << "expected descriptors on the cache file and its .lock in this process";
  for (const auto& [fd, target] : ours) EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << fd << " -> " << target;

  // What a program started now inherits. Its report pipe sits far above the descriptors under
  // test, so it cannot hide one of them.
  constexpr int kListFd = 200;
  crash::ChildProcess child(kChild, {"list-fds", std::to_string(kListFd)}, kListFd);
  ASSERT_TRUE(child.started()) << std::strerror(child.spawn_errno());
  const auto st = child.wait();
  EXPECT_TRUE(st.ok()) << st.describe();
  std::size_t listed = 0;
  for (const auto& line : child.all_lines()) {
    ++listed;
    for (const auto& n : names) EXPECT_EQ(line.find(n), std::string::npos) << "inherited: " << line;
  }
  EXPECT_GE(listed, 3u);  // at least stdin, stdout, stderr: the listing itself worked
}

// ---- symlinks ----

struct SymlinkSetup {
  test::TempDir dir{"wc-sec"};
  std::string target = dir.file("real.wc");
  std::string link = dir.file("link.wc");
};

// Opens the cache through the symlink with allow_symlink, checks that it holds `present`, packs
// entry `seed` (7000 bytes) into it, appended to *added, and finalizes.
void pack_through_symlink(const SymlinkSetup& s, const std::vector<Packed>& present, std::uint64_t seed,
                          std::vector<Packed>* added) {
  Options o = cache_options(s.link, Backing::file);
  o.allow_symlink = true;
  auto c = WeightCache::open(o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  for (const auto& e : present) EXPECT_EQ(check(c.value(), e), "");
  Packed e;
  ASSERT_TRUE(pack(c.value(), seed, 7000, &e)) << last_error().message;
  added->push_back(e);
  auto r = c.value().finalize();
  ASSERT_TRUE(r.ok()) << r.error().message;
}

TEST(Security, SymlinkRefusedWithFileBacking) {
  for (bool valid_target : {false, true}) {
    SymlinkSetup s;
    if (valid_target) make_cache(s.target, 0, 3);
    else write_file(s.target, "not a cache: a file the symlink points at, which must stay as it is");
    fs::create_symlink("real.wc", s.link);
    const Snapshot before_target = snapshot(s.target), before_link = snapshot(s.link);
    auto c = WeightCache::open(cache_options(s.link, Backing::file));
    EXPECT_FALSE(c.ok()) << "a symlink at the path was opened with backing=file";
    if (!c.ok()) {
      EXPECT_NE(c.error().message, "");
    }
    EXPECT_TRUE(snapshot(s.target) == before_target) << "the symlink's target was changed";
    EXPECT_TRUE(snapshot(s.link) == before_link) << "the symlink was replaced";
  }
}

TEST(Security, SymlinkFallsBackToHeapWithAutomaticBacking) {
  SymlinkSetup s;
  make_cache(s.target, 0, 3);
  fs::create_symlink("real.wc", s.link);
  const Snapshot before_target = snapshot(s.target), before_link = snapshot(s.link);
  LogCapture log;
  {
    auto c = WeightCache::open(cache_options(s.link, Backing::automatic));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c.value().stats().backing, Backing::heap);
    EXPECT_EQ(c.value().look_up(key_of(0)), kNotFound) << "entries were read through a refused symlink";
    Packed e;
    ASSERT_TRUE(pack(c.value(), 50, 5000, &e)) << last_error().message;
    EXPECT_EQ(check(c.value(), e), "");
    auto r = c.value().finalize();  // a heap cache standing in for the refused file: not durable
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(check(c.value(), e), "");
  }
  EXPECT_NE(log.all(), "") << "the fallback must be logged";
  EXPECT_TRUE(snapshot(s.target) == before_target) << "the symlink's target was changed";
  EXPECT_TRUE(snapshot(s.link) == before_link) << "the symlink was replaced";
}

TEST(Security, AllowSymlinkUsesTheTarget) {
  SymlinkSetup s;
  std::vector<Packed> first = make_cache(s.target, 0, 3);
  fs::create_symlink("real.wc", s.link);
  std::vector<Packed> added;
  ASSERT_NO_FATAL_FAILURE(pack_through_symlink(s, first, 60, &added));
  EXPECT_TRUE(fs::is_symlink(s.link)) << "the symlink was replaced by a file";
  auto c = WeightCache::open(cache_options(s.target, Backing::file));
  ASSERT_TRUE(c.ok()) << c.error().message;
  for (const auto* set : {&first, &added})
    for (const auto& e : *set) EXPECT_EQ(check(c.value(), e), "") << "read back through the target";
}

// The usual way to put a cache on another disk: a symlink made before the first run. With
// allow_symlink a new cache (first run, or a rebuild of a corrupt one) must be written at the
// target, and the symlink kept.
TEST(Security, AllowSymlinkBuildsTheCacheAtTheTarget) {
  for (bool corrupt_target : {false, true}) {
    SCOPED_TRACE(corrupt_target ? "target is a corrupt file" : "target does not exist yet");
    SymlinkSetup s;
    if (corrupt_target) write_file(s.target, "not a cache");
    fs::create_symlink("real.wc", s.link);
    std::vector<Packed> added;
    ASSERT_NO_FATAL_FAILURE(pack_through_symlink(s, {}, 70, &added));
    EXPECT_TRUE(fs::is_symlink(s.link)) << "the symlink was replaced by a regular file";
    if (!fs::is_regular_file(s.target)) {
      ADD_FAILURE() << "nothing was created at the symlink's target";
      continue;
    }
    auto c = WeightCache::open(cache_options(s.target, Backing::file));
    ASSERT_TRUE(c.ok()) << c.error().message;
    for (const auto& e : added) EXPECT_EQ(check(c.value(), e), "") << "the cache was not built at the target";
  }
}

/// Runs a helper process that holds the writer lease of `child_path`, then reserves through
/// `our_path` in this process: the reservation must wait out the lease and fall back to the heap.
void expect_lease_shared(const std::string& child_path, bool child_allow_symlink, const std::string& our_path) {
  crash::ChildProcess holder(kChild, {"hold-lease", child_path, child_allow_symlink ? "1" : "0"}, 3);
  ASSERT_TRUE(holder.started()) << std::strerror(holder.spawn_errno());
  ASSERT_TRUE(holder.wait_for_line("L")) << "the helper could not take the lease (its stderr says why)";
  LogCapture log;
  Options o = cache_options(our_path, Backing::automatic);
  o.lease_timeout = std::chrono::milliseconds(100);
  auto c = WeightCache::open(o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c.value().stats().backing, Backing::file);
  ASSERT_NE(c.value().reserve(4096), nullptr) << last_error().message;
  EXPECT_EQ(c.value().stats().heap_fallbacks, 1u)
      << "two processes held the writer lease of one file at once (through '" << child_path << "' and '"
      << our_path << "'): both append at the same offset";
  EXPECT_TRUE(log.contains("WC_ERR_BUSY")) << log.all();
}

TEST(Security, WriterLeaseHeldByAnotherProcessIsRespected) {
  SymlinkSetup s;
  make_cache(s.target, 0, 1);
  expect_lease_shared(s.target, false, s.target);
}

// With allow_symlink the file has two names; its writer lease must still be one.
TEST(Security, AllowSymlinkSharesTheWriterLeaseWithTheTarget) {
  SymlinkSetup s;
  make_cache(s.target, 0, 1);
  fs::create_symlink("real.wc", s.link);
  expect_lease_shared(s.link, true, s.target);
}

// ---- keys ----

TEST(Security, KeysLongerThanTheLimitAreRejected) {
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  const std::string longest(kMaxKeySize, 'k'), too_long(kMaxKeySize + 1, 'k');
  {
    auto c = WeightCache::open(cache_options(path, Backing::file));
    ASSERT_TRUE(c.ok()) << c.error().message;
    WeightCache& cache = c.value();
    void* p = cache.reserve(64);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5a, 64);
    EXPECT_EQ(cache.look_up_or_insert(too_long, p, 64), kNotFound);
    EXPECT_EQ(last_error().code, Errc::invalid_argument);
    EXPECT_EQ(cache.insert(too_long, "bytes"), kNotFound);
    EXPECT_EQ(last_error().code, Errc::invalid_argument);
    // Leave another error behind first, so the check below sees the look-up's own.
    (void)WeightCache::open(cache_options(dir.file("no-such-dir/cache.wc"), Backing::file));
    ASSERT_NE(last_error().code, Errc::invalid_argument);
    EXPECT_EQ(cache.look_up(too_long), kNotFound);
    EXPECT_EQ(last_error().code, Errc::invalid_argument) << "a look-up of an over-long key should say why it missed";
    EXPECT_EQ(cache.stats().entries, 0u);
    EXPECT_NE(cache.look_up_or_insert(longest, p, 64), kNotFound) << last_error().message;
    auto r = cache.finalize();
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  {
    auto c = WeightCache::open(cache_options(path, Backing::file));
    ASSERT_TRUE(c.ok()) << c.error().message;
    const std::size_t off = c.value().look_up(longest);
    ASSERT_NE(off, kNotFound) << "a key of exactly kMaxKeySize bytes did not survive a reopen";
    EXPECT_EQ(static_cast<const unsigned char*>(c.value().offset_to_addr(off))[63], 0x5a);
    EXPECT_EQ(c.value().stats().entries, 1u);
  }
  // The C ABI says the same.
  wc_options o;
  wc_options_init(&o);
  wc_cache* cc = nullptr;
  ASSERT_EQ(wc_open(&o, &cc), WC_OK);
  EXPECT_EQ(wc_look_up_or_insert(cc, too_long.data(), too_long.size(), const_cast<char*>("x"), 1), WC_NOT_FOUND);
  EXPECT_NE(wc_look_up_or_insert(cc, longest.data(), longest.size(), const_cast<char*>("x"), 1), WC_NOT_FOUND);
  wc_close(cc);
}

// ---- not a regular file at the path ----

enum class Kind { directory, fifo };

void make_node(const std::string& path, Kind kind) {
  if (kind == Kind::directory) ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << std::strerror(errno);
  else ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << std::strerror(errno);
}

void expect_clean_refusal(const std::string& node, const std::string& cache_path, Kind kind) {
  const Snapshot before = snapshot(node);
  for (bool read_only : {false, true}) {
    Options o = cache_options(cache_path, Backing::file);
    o.read_only = read_only;
    auto c = WeightCache::open(o);  // a blocking open of a FIFO would hang here
    EXPECT_FALSE(c.ok()) << (kind == Kind::fifo ? "FIFO" : "directory") << " at '" << node
                         << "' opened with backing=file" << (read_only ? ", read-only" : "");
    o.backing = Backing::automatic;
    c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c.value().stats().backing, Backing::heap);
    EXPECT_NE(c.value().insert(key_of(1), "bytes"), kNotFound);
    EXPECT_FALSE(c.value().finalize().ok()) << "finalize said durable for an entry only in memory";
    EXPECT_EQ(c.value().stats().unpersisted_entries, 1u);
  }
  const Snapshot after = snapshot(node);
  EXPECT_EQ(after.st.st_ino, before.st.st_ino) << "'" << node << "' was replaced";
  EXPECT_EQ(after.st.st_mode, before.st.st_mode) << "'" << node << "' was changed";
}

TEST(Security, DirectoryAtThePath) {
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  make_node(path, Kind::directory);
  expect_clean_refusal(path, path, Kind::directory);
  EXPECT_TRUE(fs::is_empty(path));
}

TEST(Security, FifoAtThePath) {
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  make_node(path, Kind::fifo);
  expect_clean_refusal(path, path, Kind::fifo);
}

TEST(Security, FifoAtTheLockPath) {
  test::TempDir dir("wc-sec");
  const std::string path = dir.file("cache.wc");
  make_node(path + ".lock", Kind::fifo);
  expect_clean_refusal(path + ".lock", path, Kind::fifo);
}

}  // namespace
