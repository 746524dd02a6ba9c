// Address space: a cache reserves what it needs, not gigabytes up front. A heap-only cache grows
// its arena chunk by chunk; a file cache's default reservation is a share of what the process
// may reserve (RLIMIT_AS, pointer width), so hundreds of caches open side by side and caches
// open under a low address-space limit; and a fallback that cannot get memory says so.
//
// Reservations are observed through the POSIX call table (mmap and munmap of anonymous memory)
// and limits are set with setrlimit in forked children, so these tests are POSIX-only.
#include "key_content.hpp"
#include "unit_test_util.hpp"

#ifndef _WIN32
#include "platform/posix_calls.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <cstring>

namespace weightcache::test {
namespace {

// Net bytes of anonymous address space mapped by the library while alive (mmap minus munmap of
// ranges it reserved). Install only while no cache is open.
struct ReservationCounter {
  static inline std::atomic<std::int64_t> net{0};
  ReservationCounter() {
    net = 0;
    auto& t = platform::posix_calls();
    t.mmap = [](void* a, size_t n, int prot, int flags, int fd, off_t o) -> void* {
      void* r = platform::default_posix_calls().mmap(a, n, prot, flags, fd, o);
      // A MAP_FIXED map over a reservation (a file chunk) replaces part of it: no new space.
      if (r != MAP_FAILED && fd < 0 && (flags & MAP_FIXED) == 0) net += static_cast<std::int64_t>(n);
      return r;
    };
    t.munmap = [](void* a, size_t n) -> int {
      const int r = platform::default_posix_calls().munmap(a, n);
      if (r == 0) net -= static_cast<std::int64_t>(n);
      return r;
    };
  }
  ~ReservationCounter() {
    platform::posix_calls().mmap = platform::default_posix_calls().mmap;
    platform::posix_calls().munmap = platform::default_posix_calls().munmap;
  }
};

TEST(AddressSpace, AHeapCacheReservesOnlyWhatItUses) {
  ReservationCounter counter;
  {
    Options o;
    o.backing = Backing::heap;
    o.max_file_bytes = 16u << 20;
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    EXPECT_EQ(ReservationCounter::net.load(), 0) << "an empty heap cache reserved address space";
    // 3 MiB of entries: at most twice that is reserved (chunks double), plus one alignment slack.
    std::uint64_t stored = 0;
    for (int i = 0; i < 12; ++i) {
      const std::string key = "k" + std::to_string(i);
      const std::string bytes = bytes_for_key(key, 256u << 10);
      ASSERT_NE(cache.insert(key, bytes), kNotFound) << last_error().message;
      stored += bytes.size();
    }
    EXPECT_LE(ReservationCounter::net.load(), static_cast<std::int64_t>(2 * stored + (4u << 20)));
    EXPECT_GE(ReservationCounter::net.load(), static_cast<std::int64_t>(stored));
    for (int i = 0; i < 12; ++i) {
      const std::string key = "k" + std::to_string(i);
      const std::size_t off = cache.look_up(key);
      ASSERT_NE(off, kNotFound);
      EXPECT_EQ(std::memcmp(cache.offset_to_addr(off), bytes_for_key(key, 256u << 10).data(), 256u << 10), 0);
    }
  }
  EXPECT_EQ(ReservationCounter::net.load(), 0) << "close left heap chunks mapped";
}

// The arena goes on across chunks: entries of growing size, each larger than the chunk before,
// keep their addresses and offsets, and reservations and releases map pointers to offsets.
TEST(AddressSpace, HeapEntriesKeepTheirAddressesAcrossChunks) {
  Options o;
  o.backing = Backing::heap;
  o.alignment = 4096;
  WeightCache cache = open_or_fail(o);
  ASSERT_TRUE(cache);
  std::vector<std::pair<std::size_t, const void*>> seen;
  for (int i = 0; i < 8; ++i) {
    const std::string key = "grow" + std::to_string(i);
    const std::size_t size = (std::size_t{1} << (17 + i)) + 3;  // 128 KiB + 3 ... 16 MiB + 3
    void* p = cache.reserve(size);
    ASSERT_NE(p, nullptr) << last_error().message;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
    std::memset(p, i + 1, size);
    const std::size_t off = cache.look_up_or_insert(key, p, size);
    ASSERT_NE(off, kNotFound) << last_error().message;
    EXPECT_EQ(cache.offset_to_addr(off), p);
    seen.emplace_back(off, p);
    void* spare = cache.reserve(100);  // a reservation given back: its pointer maps to it
    ASSERT_NE(spare, nullptr);
    EXPECT_TRUE(cache.release(spare).ok()) << last_error().message;
  }
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(cache.offset_to_addr(seen[i].first), seen[i].second);
    EXPECT_EQ(static_cast<const unsigned char*>(seen[i].second)[(std::size_t{1} << (17 + i)) + 2], i + 1);
  }
  int outside = 0;
  EXPECT_FALSE(cache.release(&outside).ok());
}

// RLIMIT_NOFILE must allow two descriptors per cache (the file and its lock file).
void allow_descriptors(rlim_t n) {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < n) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, n);
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

#if defined(__SANITIZE_THREAD__)
#define WC_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WC_THREAD_SANITIZER 1
#endif
#endif

// The default file range is a share of the address space: 1/512 of a 64-bit process's 128 TiB
// (256 GiB), so 400 caches fit with room to spare; an eighth of the 2 GiB a 32-bit process surely
// has (256 MiB), so a few fit there beside the host, each with its whole range. (400 cannot fit in
// 4 GiB: the halving retries give later ones less until nothing is left, and the next open fails.)
TEST(AddressSpace, FileCachesWithTheDefaultOpenSideBySide) {
#ifdef WC_THREAD_SANITIZER
  // ThreadSanitizer confines a process's mappings to its application ranges (about 3 TiB for
  // anonymous reservations on x86-64, not 128 TiB): the default is sized for the real address
  // space, and this test is about that.
  GTEST_SKIP() << "ThreadSanitizer leaves a few TiB of address space, not 128 TiB";
#endif
#ifdef WEIGHTCACHE_TEST_EMULATOR
  // scripts/test-arch gives qemu-user's guest 16 GiB (QEMU_RESERVED_VA), which the library cannot
  // see (no RLIMIT_AS says so): the default is sized for 128 TiB, and this test is about that.
  GTEST_SKIP() << "the emulated process has a 16 GiB address space, not 128 TiB";
#endif
  allow_descriptors(2048);
  TempDir dir("wc-400");
  std::vector<WeightCache> caches;
  constexpr bool k64Bit = sizeof(void*) >= 8;
  constexpr int kCaches = k64Bit ? 400 : 6;
  LogCapture log;
  int file_backed = 0;
  for (int i = 0; i < kCaches; ++i) {
    Options o = file_options(dir.file("c" + std::to_string(i) + ".wcache"));
    o.verify = Verify::none;
    ASSERT_EQ(o.max_file_bytes, 0u);  // the default: sized to fit the process
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << "cache " << i << ": " << c.error().message;
    caches.push_back(std::move(c.value()));
    file_backed += caches.back().stats().backing == Backing::file;
  }
  EXPECT_EQ(file_backed, kCaches);
  // In a 32-bit process each got the whole default range: none was cut to what was left.
  if (!k64Bit) {
    EXPECT_EQ(log.count("of address space could be reserved"), 0u) << log.all();
  }
  // Every one of them is usable: an entry goes into its file.
  for (int i = 0; i < kCaches; ++i) {
    const std::string key = "e" + std::to_string(i);
    ASSERT_NE(caches[i].insert(key, bytes_for_key(key, 1000)), kNotFound) << i << ": " << last_error().message;
    EXPECT_EQ(caches[i].stats().heap_bytes, 0u) << i;
  }
}

// ---- under a lowered RLIMIT_AS, in a child process ------------------------------------------

std::uint64_t mapped_now() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long pages = 0;
  const bool ok = std::fscanf(f, "%llu", &pages) == 1;
  std::fclose(f);
  return ok ? pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

std::atomic<int> g_fallback_claims{0}, g_no_heap_either{0};
void count_messages(void*, wc_log_level, const char* m, size_t n) {
  const std::string s(m, n);
  if (s.find("falling back to a heap cache") != std::string::npos) ++g_fallback_claims;
  if (s.find("no memory for a heap cache either") != std::string::npos) ++g_no_heap_either;
}

// qemu-user ignores a guest's RLIMIT_AS (it would limit the emulator itself): the tests that rely
// on it are skipped there.
#ifdef WEIGHTCACHE_TEST_EMULATOR
#define SKIP_WITHOUT_RLIMIT_AS() GTEST_SKIP() << "qemu-user ignores RLIMIT_AS"
#else
#define SKIP_WITHOUT_RLIMIT_AS() (void)0
#endif

// Runs `body` in a forked child whose address space is capped at what it maps now plus
// `headroom` (relative, so the cap also works under sanitizers that map terabytes of shadow).
// The child's message (empty = success) comes back through a pipe.
std::string in_child_with_headroom(std::uint64_t headroom, const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    struct rlimit lim {};
    lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(mapped_now() + headroom);
    const bool capped = ::setrlimit(RLIMIT_AS, &lim) == 0;
    const std::string msg = capped ? body() : "setrlimit failed";
    const bool sent = msg.empty() || ::write(fds[1], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size());
    if (!sent) child_exit(kChildSetupFailed, "cannot send: " + msg);
    child_exit(!capped ? kChildSetupFailed : msg.empty() ? kChildOk : kChildUnexpected);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return "child died of signal " + std::to_string(WTERMSIG(status)) + " " + out;
  if (WEXITSTATUS(status) != 0) return out.empty() ? "child failed" : out;
  return "";
}

std::string insert_and_check(WeightCache& c, const std::string& what, std::size_t size) {
  for (int i = 0; i < 4; ++i) {
    const std::string key = what + std::to_string(i);
    const std::string bytes = bytes_for_key(key, size);
    const std::size_t off = c.insert(key, bytes);
    if (off == kNotFound) return what + ": insert failed: " + last_error().message;
    const void* p = c.offset_to_addr(c.look_up(key));
    if (p == nullptr || std::memcmp(p, bytes.data(), size) != 0) return what + ": wrong bytes";
  }
  return "";
}

TEST(AddressSpace, CachesOpenUnderALowAddressSpaceLimit) {
  SKIP_WITHOUT_RLIMIT_AS();
  TempDir dir("wc-rlimit");
  const std::string file_path = dir.file("file.wcache");
  const std::string auto_path = dir.file("auto.wcache");
  // 200 MiB more than the child maps at the start: less than `ulimit -v 500000` leaves a small
  // program. Each cache used to reserve 1 GiB or more.
  const std::string r = in_child_with_headroom(200u << 20, [&]() -> std::string {
    wc_set_log_callback(&count_messages, nullptr);
    {
      Options o;
      o.backing = Backing::heap;
      o.max_file_bytes = 16u << 20;
      auto c = WeightCache::open(o);
      if (!c) return "heap cache: " + c.error().message;
      if (auto e = insert_and_check(*c, "heap", 1u << 20); !e.empty()) return e;
    }
    {
      Options o = file_options(file_path);  // default max_file_bytes, backing file
      auto c = WeightCache::open(o);
      if (!c) return "file cache: " + c.error().message;
      if (auto e = insert_and_check(*c, "file", 64u << 10); !e.empty()) return e;
      if (c->stats().heap_bytes != 0) return "file cache: entries went to the heap";
    }
    {
      Options o = file_options(auto_path);
      o.backing = Backing::automatic;
      auto c = WeightCache::open(o);
      if (!c) return "auto cache: " + c.error().message;
      if (c->stats().backing != Backing::file) return "auto cache fell back to the heap";
      if (auto e = insert_and_check(*c, "auto", 64u << 10); !e.empty()) return e;
    }
    if (g_fallback_claims != 0) return "a fallback was claimed";
    return "";
  });
  EXPECT_EQ(r, "");
}

// With almost no address space left, the file cannot be mapped and no heap arena can be had:
// the open fails and says both, instead of logging a fallback it then cannot make.
TEST(AddressSpace, AFallbackWithoutMemorySaysSo) {
  SKIP_WITHOUT_RLIMIT_AS();
  TempDir dir("wc-rlimit");
  const std::string path = dir.file("auto.wcache");
  const std::string r = in_child_with_headroom(256u << 10, [&]() -> std::string {
    wc_set_log_callback(&count_messages, nullptr);
    Options o = file_options(path);
    o.backing = Backing::automatic;
    o.max_file_bytes = 64u << 20;
    auto c = WeightCache::open(o);
    if (c) return (c->stats().backing == Backing::file ? std::string("the file cache opened after all (the limit is too loose)")
                                                      : std::string("a heap cache opened without memory")) ;
    if (c.error().code != Errc::no_memory) return std::string("error ") + to_string(c.error().code);
    if (c.error().message.find("no memory for a heap cache either") == std::string::npos)
      return "message: " + c.error().message;
    if (g_fallback_claims != 0) return "a fallback was claimed";
    if (g_no_heap_either != 1) return "not logged";
    return "";
  });
  EXPECT_EQ(r, "");
}

}  // namespace
}  // namespace weightcache::test
#endif  // !_WIN32
