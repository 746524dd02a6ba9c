// Caches on descriptors (wc_options.fd) and anonymous ":memory:" caches shared with another
// process through their descriptor, as sandboxed runtimes need: the parent packs into a memfd,
// hands the descriptor over a UNIX socket to a process started afterwards (not forked from it),
// and that process finds every entry without packing, mapping the very same pages.
#include "mp_test_util.hpp"

#ifndef _WIN32
#include "smaps.hpp"

#include <weightcache/weightcache.h>

#include <cstring>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

namespace weightcache::test::mp {
namespace {

constexpr std::size_t kCount = 16, kSize = 1 << 20;

WeightCache open_ok(const Options& o) {
  auto r = WeightCache::open(o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r.value()) : WeightCache{};
}

std::string check_bytes_of(WeightCache& c, const std::string& key, const std::string& want) {
  const std::size_t off = c.look_up(key);
  if (off == kNotFound) return key + " misses";
  return std::memcmp(c.offset_to_addr(off), want.data(), want.size()) == 0 ? "" : key + " has other bytes";
}

bool send_fd(int sock, int fd) {
  char byte = 'f';
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &msg, 0) == 1;
}

TEST(Descriptors, AMemoryCacheIsSharedWithAnotherProcessThroughItsDescriptor) {
  TempDir dir("wc-mp");
  Options o;
  o.path = kMemoryPath;
  o.compat_key = "multiprocess-test";
  o.backing = Backing::file;
  o.durability = Durability::none;
  auto opened = WeightCache::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  WeightCache& cache = opened.value();
  EXPECT_EQ(cache.stats().backing, Backing::file);
  for (std::size_t j = 0; j < kCount; ++j) ASSERT_EQ(pack_key(cache, own_key("mem", j), kSize), "");
  ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  const int fd = cache.descriptor();
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file(":memory:"))) << "':memory:' created a file";

  int socks[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, socks), 0);
  ::fcntl(socks[1], F_SETFD, 0);  // the child's end crosses exec; the cache's descriptor does not
  const std::string results = dir.file("reader");
  Children kids;
  kids.start("fd_reader", {arg("sock", static_cast<std::uint64_t>(socks[1])), arg("results", results),
                           arg("count", kCount), arg("size", kSize)});
  ::close(socks[1]);
  ASSERT_TRUE(send_fd(socks[0], fd));
  char byte = 0;
  ASSERT_EQ(::read(socks[0], &byte, 1), 1) << "the child could not use the cache (see its output)";
  // Both processes have touched every page: measure each one's share of the file's pages.
  const SmapsUsage mine = smaps_usage("/proc/self/fd/" + std::to_string(fd));
  ASSERT_EQ(::write(socks[0], "g", 1), 1);
  ASSERT_EQ(::read(socks[0], &byte, 1), 1);
  const auto theirs = read_results(results);
  ASSERT_EQ(::write(socks[0], "x", 1), 1);
  ::close(socks[0]);
  ASSERT_TRUE(kids.all_succeed());

  EXPECT_EQ(theirs.at("entries"), kCount);
  EXPECT_EQ(theirs.at("heap_fallbacks"), 0u);
  const double weights = static_cast<double>(kCount * kSize);
  const double pss = static_cast<double>(mine.pss + theirs.at("pss"));
  std::printf(":memory: shared through SCM_RIGHTS: parent Pss %.1f MiB, child Pss %.1f MiB, sum %.3fx the weights "
              "(child Rss %.1f MiB, Private_Dirty %.1f MiB)\n",
              mine.pss / 1048576.0, theirs.at("pss") / 1048576.0, pss / weights, theirs.at("rss") / 1048576.0,
              theirs.at("private_dirty") / 1048576.0);
  EXPECT_GE(theirs.at("rss"), kCount * kSize) << "the child did not map the weights";
  EXPECT_LE(pss, 1.05 * weights + (1 << 20)) << "two copies, not one shared";
  EXPECT_LT(theirs.at("private_dirty"), std::uint64_t{1} << 20) << "the child holds private copies";
}

TEST(Descriptors, ACacheOnACallersDescriptorPersistsAndTheCallerKeepsItsOwn) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("by-fd.wcache");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);  // empty: initialised
  ASSERT_GE(fd, 0);
  wc_options o;
  wc_options_init(&o);
  EXPECT_EQ(o.fd, -1);
  o.fd = fd;
  o.compat_key = "fd";
  o.compat_key_size = 2;
  o.backing = WC_BACKING_FILE;
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  ASSERT_GE(wc_get_fd(c), 0);
  EXPECT_NE(wc_get_fd(c), fd) << "the cache must hold a descriptor of its own";
  const std::string bytes(300000, 'q');
  void* p = wc_reserve_space(c, bytes.size());
  ASSERT_NE(p, nullptr) << wc_last_error();
  std::memcpy(p, bytes.data(), bytes.size());
  ASSERT_NE(wc_look_up_or_insert(c, "k", 1, p, bytes.size()), WC_NOT_FOUND);
  ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
  wc_close(c);
  // The caller's descriptor is still open and usable.
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_GT(st.st_size, static_cast<off_t>(bytes.size()));
  ::close(fd);
  EXPECT_FALSE(std::filesystem::exists(path + ".lock")) << "a descriptor cache made a lock file";
  // The file is an ordinary cache file: a path open finds the entry.
  Options by_path;
  by_path.path = path;
  by_path.compat_key = "fd";
  by_path.read_only = true;
  auto r = WeightCache::open(by_path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::size_t off = r->look_up("k");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(std::memcmp(r->offset_to_addr(off), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(wc_get_fd(nullptr), -1);
}

// A read-only descriptor never becomes a writable cache: reopening /proc/self/fd/N read-write
// would give a reader the access its host took away.
TEST(Descriptors, AReadOnlyDescriptorNeverWrites) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("ro-fd.wcache");
  {
    WeightCache w = open_ok(cache_options(path));
    ASSERT_TRUE(w);
    ASSERT_NE(w.insert("k", "value"), kNotFound);
    ASSERT_TRUE(w.finalize().ok());
  }
  const std::string before = read_file(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Options o = cache_options("");
  o.fd = fd;
  o.backing = Backing::file;
  auto refused = WeightCache::open(o);
  ASSERT_FALSE(refused.ok()) << "a read-only descriptor opened as a writable cache";
  EXPECT_EQ(refused.error().code, Errc::read_only) << refused.error().message;
  o.backing = Backing::automatic;
  {
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(check_bytes_of(c.value(), "k", "value"), "");
    ASSERT_NE(c->insert("new", "bytes"), kNotFound);
    auto f = c->finalize();
    EXPECT_FALSE(f.ok());
    EXPECT_EQ(f.error().code, Errc::read_only) << f.error().message;
  }
  ::close(fd);
  EXPECT_EQ(read_file(path), before) << "a read-only descriptor's cache changed the file";
}

// Another program renames a new file over the path while this process holds the lease with an
// insert pending: finalize must not say OK for entries committed into the unlinked file.
TEST(Descriptors, AFileReplacedWhileTheLeaseIsHeldIsNotCalledDurable) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("x.wcache");
  {
    WeightCache other = open_ok(cache_options(dir.file("other.wcache")));
    ASSERT_NE(other.insert("o", "other"), kNotFound);
    ASSERT_TRUE(other.finalize().ok());
  }
  WeightCache c = open_ok(cache_options(path));
  ASSERT_TRUE(c);
  void* p = c.reserve(1000);  // takes the lease
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 1000);
  ASSERT_NE(c.look_up_or_insert("pre", p, 1000), kNotFound);
  ASSERT_EQ(std::rename(dir.file("other.wcache").c_str(), path.c_str()), 0);
  auto f = c.finalize();
  EXPECT_FALSE(f.ok()) << "finalize said OK for entries written into a file no longer at the path";
  if (!f.ok()) {
    EXPECT_NE(f.error().message.find("replaced"), std::string::npos) << f.error().message;
  }
}

}  // namespace
}  // namespace weightcache::test::mp
#endif
