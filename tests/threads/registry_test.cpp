// The process-wide registry: one cache (one set of mappings, shared entries) per file however
// its path is spelled; different files at once without interference; everything released with
// the last handle; private_cache opts out. On Linux, descriptors and mappings are counted from
// /proc; Windows has no such view of a process, so there the tests check what the API reports
// and whether anything still holds the file open (which a mapping does too).
#include "lease_probe.hpp"
#include "thread_test_util.hpp"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#ifdef _WIN32
#include "win32_util.hpp"
#else
#include "smaps.hpp"
#endif

namespace weightcache::test {
namespace {

namespace fs = std::filesystem;

WeightCache open_ok(const Options& o) {
  auto r = WeightCache::open(o);
  EXPECT_TRUE(r.ok()) << "open('" << o.path << "'): " << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r.value()) : WeightCache{};
}

#ifndef _WIN32
/// Descriptors of this process open on `path` (as /proc/self/fd resolves them).
std::size_t open_descriptors(const std::string& path) {
  std::error_code ec;
  const fs::path want = fs::weakly_canonical(path, ec);
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    std::error_code lec;
    const fs::path target = fs::read_symlink(e.path(), lec);
    if (!lec && target == want) ++n;
  }
  return n;
}
#endif

/// Whether the file is in use: mapped by this process on Linux (smaps); on Windows, held by
/// some handle or view (an open that shares nothing is refused).
bool in_use(const std::string& path) {
#ifdef _WIN32
  return file_held_open(path);
#else
  return smaps_usage(path).mappings > 0;
#endif
}

#ifdef _WIN32
/// Goes back to the working directory it found by restore(), or at the latest on destruction.
class WorkingDirectory {
 public:
  WorkingDirectory() : saved_(fs::current_path()) {}
  ~WorkingDirectory() { restore(); }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;
  void restore() {
    std::error_code ec;
    if (!saved_.empty()) fs::current_path(saved_, ec);
    saved_.clear();
  }

 private:
  fs::path saved_;
};
#endif

TEST(Registry, EverySpellingOfOnePathGivesTheSameCache) {
  TempDir dir("wc-registry");
  fs::create_directory(dir.path() / "real");
  const std::string path = (dir.path() / "real" / "cache.wcache").string();

  WeightCache first = open_ok(thread_options(path));
  ASSERT_TRUE(first);
  const std::string bytes = bytes_for_key("w", 100000);
  void* p = first.reserve(bytes.size());
  ASSERT_NE(p, nullptr);
  std::memcpy(p, bytes.data(), bytes.size());
  const std::size_t off = first.look_up_or_insert("w", p, bytes.size());
  ASSERT_NE(off, kNotFound);
#ifndef _WIN32
  const SmapsUsage one = smaps_usage(path);
  ASSERT_GT(one.mappings, 0u);
#endif

  std::vector<Options> spellings;
  std::error_code ec;
#ifdef _WIN32
  // A path relative to the working directory, which may lie on another drive than the
  // temporary directory: go there for the opens (the registry resolves the path at open time).
  WorkingDirectory cwd;
  fs::current_path(dir.path(), ec);
  ASSERT_FALSE(ec) << ec.message();
  spellings.push_back(thread_options("real\\cache.wcache"));
  spellings.push_back(thread_options("./real/../real/cache.wcache"));
  // Forward slashes, another letter case (NTFS, and Wine, look names up case-insensitively),
  // and the 8.3 short name where the volume makes them.
  std::string slashes = path;
  for (char& c : slashes)
    if (c == '\\') c = '/';
  spellings.push_back(thread_options(slashes));
  std::string upper = path;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  spellings.push_back(thread_options(upper));
  {
    std::wstring shortp(32768, L'\0');
    const DWORD n = ::GetShortPathNameW(wide(path).c_str(), shortp.data(), static_cast<DWORD>(shortp.size()));
    shortp.resize(n < shortp.size() ? n : 0);
    if (!shortp.empty() && narrow(shortp) != path) spellings.push_back(thread_options(narrow(shortp)));
  }
#else
  const std::string relative = fs::relative(path, fs::current_path(), ec).string();
  ASSERT_FALSE(ec);
  ASSERT_FALSE(relative.empty());
  ASSERT_NE(relative.front(), '/');
  spellings.push_back(thread_options(relative));
  spellings.push_back(thread_options((dir.path() / "real" / ".." / "real" / "cache.wcache").string()));
#endif
  // Through a symlinked directory; creating one needs a privilege on Windows.
  fs::create_directory_symlink(dir.path() / "real", dir.path() / "link", ec);
#ifdef _WIN32
  if (ec) std::printf("no directory symlink here (%s): that spelling is not tried\n", ec.message().c_str());
#else
  ASSERT_FALSE(ec) << ec.message();
#endif
  if (!ec) {
    Options via_link = thread_options((dir.path() / "link" / "cache.wcache").string());
    via_link.allow_symlink = true;
    spellings.push_back(via_link);
  }

  std::vector<WeightCache> others;
  for (const Options& o : spellings) {
    others.push_back(open_ok(o));
    WeightCache& c = others.back();
    ASSERT_TRUE(c) << o.path;
    // The uncommitted entry of the first handle, at the same address: one cache, not a reload.
    EXPECT_EQ(c.look_up("w"), off) << o.path;
    EXPECT_EQ(c.offset_to_addr(off), p) << o.path;
    EXPECT_FALSE(c.is_finalized()) << o.path;
    EXPECT_EQ(c.stats().mappings, first.stats().mappings) << o.path;
  }
#ifdef _WIN32
  cwd.restore();
  std::printf("%zu spellings of the path gave the same cache\n", spellings.size());
#else
  // One set of mappings: the file's virtual footprint did not grow with the handles.
  const SmapsUsage all = smaps_usage(path);
  EXPECT_EQ(all.size, one.size) << "a second set of mappings of the same file";
  // One lease file descriptor and one file descriptor, whatever the number of handles.
  EXPECT_EQ(open_descriptors(path), 1u);
  EXPECT_EQ(open_descriptors(path + ".lock"), 1u);
#endif

  // An entry added through any spelling is everyone's.
  const std::size_t off2 = others.back().insert("x", "from the last spelling");
  ASSERT_NE(off2, kNotFound);
  EXPECT_EQ(first.look_up("x"), off2);
  EXPECT_EQ(others[0].offset_to_addr(off2), first.offset_to_addr(off2));
  EXPECT_EQ(first.stats().entries, 2u);

  // A finalize through one spelling ends packing for all.
  ASSERT_TRUE(others[1].finalize().ok()) << last_error().message;
  EXPECT_TRUE(first.is_finalized());
}

TEST(Registry, ThreadsOpeningANewFileAtOnceGetOneCache) {
  TempDir dir("wc-registry");
  constexpr std::size_t kThreads = 8, kRounds = 10;  // rounds: more chances for the threads to overlap
  for (std::size_t round = 0; round < kRounds; ++round) {
    const std::string name = "cache" + std::to_string(round) + ".wcache";
    const std::string path = dir.file(name);  // does not exist yet
    const std::string dotted = (dir.path() / "." / name).string();
    std::vector<WeightCache> handles(kThreads);
    std::vector<std::size_t> offsets(kThreads, kNotFound);
    Barrier start(kThreads);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        Options o = thread_options(t % 2 == 0 ? path : dotted);
        o.lease_timeout = std::chrono::milliseconds(3000);  // bounded, should two caches fight over the lease
        start.arrive_and_wait();
        auto r = WeightCache::open(o);
        if (!r.ok()) return;
        handles[t] = std::move(r.value());
        offsets[t] = handles[t].insert("k" + std::to_string(t), bytes_for_key("k" + std::to_string(t), 5000));
      });
    for (auto& th : threads) th.join();
    for (std::size_t t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(handles[t]) << "round " << round << ": thread " << t << " could not open";
      ASSERT_NE(offsets[t], kNotFound) << "round " << round;
    }
    // Every thread's entry is visible, at one address, through every other thread's handle.
    for (std::size_t t = 0; t < kThreads; ++t) {
      ASSERT_EQ(handles[t].stats().entries, kThreads) << "round " << round << ": thread " << t << " got its own cache";
      EXPECT_EQ(handles[t].stats().backing, Backing::file);
      for (std::size_t u = 0; u < kThreads; ++u) {
        EXPECT_EQ(handles[t].look_up("k" + std::to_string(u)), offsets[u]);
        EXPECT_EQ(handles[t].offset_to_addr(offsets[u]), handles[u].offset_to_addr(offsets[u]));
      }
    }
#ifndef _WIN32
    EXPECT_EQ(open_descriptors(path), 1u);
#endif
  }
}

// A symlink at the path is never opened without allow_symlink; but a symlink to a file this
// process already has open as a cache names that cache, and shares it (nothing is opened or
// written through the link that was not open already).
TEST(Registry, ASymlinkToTheFileIsRefusedUnlessAllowedOrAlreadyOpen) {
  TempDir dir("wc-registry");
  const std::string path = dir.file("cache.wcache");
  const std::string link = dir.file("link.wcache");
  std::error_code ec;
  fs::create_symlink(path, link, ec);
#ifdef _WIN32
  if (ec) GTEST_SKIP() << "cannot create a symlink here (it needs a privilege on Windows): " << ec.message();
#else
  ASSERT_FALSE(ec) << ec.message();
#endif
  {
    WeightCache real = open_ok(thread_options(path));
    ASSERT_TRUE(real);
    ASSERT_NE(real.insert("k", "bytes"), kNotFound);
    ASSERT_TRUE(real.finalize().ok());
  }
  Options refused = thread_options(link);
  refused.backing = Backing::file;
  auto r = WeightCache::open(refused);
  EXPECT_FALSE(r.ok()) << "a symlink at the cache path was followed without allow_symlink";

  WeightCache real = open_ok(thread_options(path));
  ASSERT_TRUE(real);
  const std::size_t off = real.look_up("k");
  ASSERT_NE(off, kNotFound);
  WeightCache shared = open_ok(refused);  // backing=file, no allow_symlink: the open cache
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared.look_up("k"), off);
  EXPECT_EQ(shared.offset_to_addr(off), real.offset_to_addr(off));

  Options allowed = thread_options(link);
  allowed.allow_symlink = true;
  WeightCache via = open_ok(allowed);
  ASSERT_TRUE(via);
  EXPECT_EQ(via.look_up("k"), off);
  EXPECT_EQ(via.offset_to_addr(off), real.offset_to_addr(off));
}

TEST(Registry, DifferentFilesAreOpenAtOnceWithoutInterfering) {
  TempDir dir("wc-registry");
  const std::string path_a = dir.file("a.wcache"), path_b = dir.file("b.wcache");
  constexpr std::size_t kKeys = 24;
  {
    WeightCache a = open_ok(thread_options(path_a));
    WeightCache b = open_ok(thread_options(path_b));
    ASSERT_TRUE(a && b);
    // The same keys with different bytes, packed at the same time from two threads.
    Errors errors;
    auto pack = [&](WeightCache& c, const std::string& salt) {
      for (std::size_t i = 0; i < kKeys; ++i) {
        const std::string key = "k" + std::to_string(i);
        const std::size_t size = size_for(i);
        void* p = c.reserve(size);
        if (p == nullptr) return errors.add("reserve: " + last_error().message);
        fill_for_key(salt + key, p, size);
        if (c.look_up_or_insert(key, p, size) == kNotFound) errors.add("insert: " + last_error().message);
      }
      if (!c.finalize().ok()) errors.add("finalize: " + last_error().message);
    };
    std::thread ta(pack, std::ref(a), "a/");
    std::thread tb(pack, std::ref(b), "b/");
    ta.join();
    tb.join();
    ASSERT_TRUE(errors.none());
    EXPECT_EQ(a.stats().entries, kKeys);
    EXPECT_EQ(b.stats().entries, kKeys);
    for (std::size_t i = 0; i < kKeys; ++i) {
      const std::string key = "k" + std::to_string(i);
      EXPECT_EQ(check_bytes(a, key, bytes_for_key("a/" + key, size_for(i))), "");
      EXPECT_EQ(check_bytes(b, key, bytes_for_key("b/" + key, size_for(i))), "");
      EXPECT_NE(a.offset_to_addr(a.look_up(key)), b.offset_to_addr(b.look_up(key)));
    }
    EXPECT_TRUE(in_use(path_a));
    EXPECT_TRUE(in_use(path_b));
  }
  // And each file kept only its own bytes.
  WeightCache a = open_ok(thread_options(path_a));
  WeightCache b = open_ok(thread_options(path_b));
  for (std::size_t i = 0; i < kKeys; ++i) {
    const std::string key = "k" + std::to_string(i);
    EXPECT_EQ(check_bytes(a, key, bytes_for_key("a/" + key, size_for(i))), "");
    EXPECT_EQ(check_bytes(b, key, bytes_for_key("b/" + key, size_for(i))), "");
  }
}

TEST(Registry, DifferentCompatibilityKeysOnDifferentFilesCoexist) {
  TempDir dir("wc-registry");
  Options oa = thread_options(dir.file("a.wcache")), ob = thread_options(dir.file("b.wcache"));
  oa.compat_key = "model A / packer 1";
  ob.compat_key = "model B / packer 2";
  for (int launch = 0; launch < 2; ++launch) {
    WeightCache a = open_ok(oa);
    WeightCache b = open_ok(ob);
    WeightCache a2 = open_ok(oa);
    ASSERT_TRUE(a && b && a2);
    if (launch == 0) {
      ASSERT_NE(a.insert("w", "bytes for A"), kNotFound);
      ASSERT_NE(b.insert("w", "bytes for B!"), kNotFound);
      ASSERT_TRUE(a.finalize().ok());
      ASSERT_TRUE(b.finalize().ok());
    }
    // Second launch: both files were kept (neither looked incompatible to the other's cache).
    EXPECT_EQ(check_bytes(a, "w", "bytes for A"), "") << "launch " << launch;
    EXPECT_EQ(check_bytes(b, "w", "bytes for B!"), "") << "launch " << launch;
    EXPECT_EQ(a2.look_up("w"), a.look_up("w"));
    EXPECT_EQ(a2.offset_to_addr(a2.look_up("w")), a.offset_to_addr(a.look_up("w")));
    EXPECT_NE(b.offset_to_addr(b.look_up("w")), a.offset_to_addr(a.look_up("w")));
    EXPECT_EQ(a.stats().entries, 1u);
    EXPECT_EQ(b.stats().entries, 1u);
  }
}

// One file under two compatibility keys in one process: the second open would find the file
// incompatible and rebuild it, under a lease this process already holds (a wait of lease_timeout
// against itself) or by renaming a new file over the live cache. It is refused at once instead.
TEST(Registry, OneFileUnderAnotherCompatibilityKeyIsRefusedWithoutHarm) {
  TempDir dir("wc-registry");
  const std::string path = dir.file("cache.wcache");
  Options oa = thread_options(path), ob = thread_options(path);
  oa.compat_key = "model A / packer 1";
  ob.compat_key = "model B / packer 2";
  ob.lease_timeout = std::chrono::milliseconds(1000);
  {
    WeightCache a = open_ok(oa);
    ASSERT_TRUE(a);
    ASSERT_NE(a.insert("w", "bytes for A"), kNotFound);  // holds the writer lease until finalize

    ob.backing = Backing::file;
    auto refused = WeightCache::open(ob);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::incompatible) << refused.error().message;

    ob.backing = Backing::automatic;
    WeightCache b = open_ok(ob);
    ASSERT_TRUE(b);
    EXPECT_EQ(b.stats().backing, Backing::heap);
    EXPECT_EQ(b.look_up("w"), kNotFound) << "B must not see A's entries";
    ASSERT_NE(b.insert("w", "bytes for B!"), kNotFound);
    auto fin = b.finalize();  // B's entry lives only in B's memory: not durable, and said so
    EXPECT_FALSE(fin.ok());
    EXPECT_EQ(fin.error().code, Errc::incompatible) << fin.error().message;
    EXPECT_EQ(check_bytes(b, "w", "bytes for B!"), "");

    EXPECT_EQ(check_bytes(a, "w", "bytes for A"), "");
    ASSERT_TRUE(a.finalize().ok()) << last_error().message;
    EXPECT_EQ(a.stats().heap_fallbacks, 0u);
  }
  // A's file was neither replaced nor changed by B.
  WeightCache a = open_ok(oa);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.stats().backing, Backing::file);
  EXPECT_EQ(check_bytes(a, "w", "bytes for A"), "");
}

TEST(Registry, ClosingTheLastHandleReleasesEverything) {
  TempDir dir("wc-registry");
  const std::string path = dir.file("cache.wcache");
  const std::string bytes = bytes_for_key("w", 300000);
  {
    WeightCache a = open_ok(thread_options(path));
    WeightCache b = open_ok(thread_options(path));
    ASSERT_TRUE(a && b);
    const std::size_t off = a.insert("w", bytes);
    ASSERT_NE(off, kNotFound);
    ASSERT_TRUE(a.finalize().ok());
    EXPECT_TRUE(in_use(path));
#ifndef _WIN32
    EXPECT_EQ(open_descriptors(path), 1u);
#endif

    // Closing one handle keeps the other's cache, mappings and pointers.
    const void* p = b.offset_to_addr(off);
    a = WeightCache{};
    EXPECT_TRUE(in_use(path));
    EXPECT_EQ(b.offset_to_addr(off), p);
    EXPECT_EQ(check_bytes(b, "w", bytes), "");
  }
#ifdef _WIN32
  // A handle or a view of either file left behind would refuse an open that shares nothing.
  EXPECT_FALSE(file_held_open(path)) << "the file is still open or mapped after its last handle closed";
  EXPECT_FALSE(file_held_open(path + ".lock"));
#else
  EXPECT_EQ(smaps_usage(path).mappings, 0u) << "the file is still mapped after its last handle closed";
  EXPECT_EQ(open_descriptors(path), 0u);
  EXPECT_EQ(open_descriptors(path + ".lock"), 0u);
#endif
  // Nothing left behind holds the lease either: a handle of our own can take it.
  {
    LeaseProbe lease(path);
    ASSERT_TRUE(lease.valid());
    EXPECT_TRUE(lease.try_take());
  }

  // A new open is a new cache, loaded from the file.
  WeightCache c = open_ok(thread_options(path));
  ASSERT_TRUE(c);
  EXPECT_EQ(check_bytes(c, "w", bytes), "");
  EXPECT_TRUE(c.is_finalized());
}

TEST(Registry, AnOpenWaitingForTheLeaseDoesNotHoldUpOpensOfOtherFiles) {
  TempDir dir("wc-registry");
  const std::string x = dir.file("x.wcache"), y = dir.file("y.wcache");
  // Not a cache file: its opener rebuilds it, under the writer lease, which we hold here as
  // another process packing x would.
  std::ofstream(x, std::ios::binary) << std::string(8192, 'z');
  LeaseProbe lease(x);
  ASSERT_TRUE(lease.valid());
  ASSERT_TRUE(lease.try_take());

  // The rebuild warning is logged right before the opener starts waiting for the lease; the
  // fallback warning when it gives up, still inside its open.
  static std::atomic<bool> waiting{false}, gave_up{false};
  static std::mutex log_mu;
  static std::string log;  // every warning, for the failure messages
  waiting = false;
  gave_up = false;
  log.clear();
  set_log_level(LogLevel::warn);
  set_log_callback(
      [](void*, wc_log_level, const char* message, size_t size) {
        const std::string_view m(message, size);
        {
          std::lock_guard<std::mutex> lock(log_mu);
          log.append(m).append("\n");
        }
        if (m.find("building a fresh one") != std::string_view::npos) waiting = true;
        if (m.find("falling back") != std::string_view::npos) gave_up = true;
      },
      nullptr);
  std::atomic<bool> x_done{false};
  Backing x_backing = Backing::automatic;
  std::thread opener([&] {
    Options ox = thread_options(x);
    ox.lease_timeout = std::chrono::milliseconds(3000);
    auto r = WeightCache::open(ox);
    if (r.ok()) x_backing = r->stats().backing;
    x_done = true;
  });
  while (!waiting && !x_done) std::this_thread::yield();
  const bool saw_wait = waiting;

  // x's opener is now waiting for the lease (up to its lease_timeout). A cache on another
  // file has nothing to wait for.
  auto ry = WeightCache::open(thread_options(y));
  const bool y_waited_for_x = gave_up;
  // Let go: an opener still waiting gets the lease now and ends with a file cache.
  lease.release();
  opener.join();
  set_log_callback(nullptr, nullptr);

  ASSERT_TRUE(saw_wait) << "x's opener never reached the lease wait (did the rebuild warning change?)";
  ASSERT_TRUE(ry.ok()) << ry.error().message;
  EXPECT_EQ(ry->stats().backing, Backing::file);
  EXPECT_FALSE(y_waited_for_x) << "opening y returned only after x's open gave up on the lease: the registry holds "
                                  "its process-wide mutex while an open waits for a file's writer lease";
  EXPECT_EQ(x_backing, Backing::file) << "x's opener fell back to heap although the lease was released in time "
                                         "(the warnings below say why)";
  std::lock_guard<std::mutex> lock(log_mu);
  if (HasFailure()) std::printf("warnings logged:\n%s", log.c_str());
}

TEST(Registry, APrivateCacheIsNotShared) {
  TempDir dir("wc-registry");
  const std::string path = dir.file("cache.wcache");
  WeightCache shared = open_ok(thread_options(path));
  ASSERT_TRUE(shared);
  ASSERT_NE(shared.insert("shared", "shared bytes"), kNotFound);
  ASSERT_TRUE(shared.finalize().ok());

  Options po = thread_options(path);
  po.private_cache = true;
  WeightCache mine = open_ok(po);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine.stats().backing, Backing::heap);
  EXPECT_EQ(mine.look_up("shared"), kNotFound) << "a private cache reads nothing from the file";
  ASSERT_NE(mine.insert("private", "mine only"), kNotFound);
  EXPECT_EQ(shared.look_up("private"), kNotFound);
  EXPECT_EQ(check_bytes(mine, "private", "mine only"), "");
  WeightCache mine2 = open_ok(po);
  EXPECT_EQ(mine2.look_up("private"), kNotFound) << "two private caches are independent";
}

}  // namespace
}  // namespace weightcache::test
