// gc under failing system calls: the Nth call of a run fails, once or from then on. Whatever
// fails, gc never removes a file in use or a file that is not a cache, returns only the errors it
// documents, and its report says exactly what is gone.
#include "gc.hpp"
#include "hooks.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/stat.h>

namespace {

using weightcache::test::TempDir;
using wctest::Call;
using wctest::Decision;

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

weightcache::Options options(const std::string& path) {
  weightcache::Options o;
  o.path = path;
  o.compat_key = "gc-fault";
  o.backing = weightcache::Backing::file;
  o.durability = weightcache::Durability::none;
  return o;
}

// A copy of one cache file (and its lock file) written by the library once: a sweep makes
// hundreds of directories.
void make_cache(const std::string& path) {
  static TempDir source("wc-gc-fault-source");
  static const std::string made = [] {
    const std::string f = source.file("made.wcache");
    auto c = weightcache::WeightCache::open(options(f));
    EXPECT_TRUE(c.ok()) << c.error().message;
    EXPECT_NE(c->insert("k", std::string(20000, 'w')), weightcache::kNotFound);
    EXPECT_TRUE(c->finalize().ok());
    return f;
  }();
  namespace fs = std::filesystem;
  ASSERT_TRUE(fs::copy_file(made, path));
  ASSERT_TRUE(fs::copy_file(made + ".lock", path + ".lock"));
}

struct Fault {
  std::uint64_t at = 0;  // 0: none
  bool persistent = false;
  int err = EIO;
};

// One run over a fresh directory: three idle caches, one this process holds open, a file that is
// not a cache; budget 0, so gc tries every cache. Returns the number of OS calls gc made.
std::uint64_t run_once(const Fault& fault) {
  TempDir dir("wc-gc-fault");
  for (const char* n : {"a.wcache", "b.wcache", "c.wcache", "held.wcache"}) make_cache(dir.file(n));
  { std::ofstream(dir.file("other.wcache"), std::ios::binary) << std::string(8192, 'x'); }
  auto held = weightcache::WeightCache::open(options(dir.file("held.wcache")));
  EXPECT_TRUE(held.ok());
  const std::string what = "fault at call " + std::to_string(fault.at) + (fault.persistent ? " onwards" : "") +
                           " (" + std::strerror(fault.err) + ")";

  std::uint64_t calls = 0;
  weightcache::Result<weightcache::GcReport> r = weightcache::Error{};
  {
    wctest::Hooks hooks([&](Call, std::uint64_t i) {
      if (fault.at != 0 && (i == fault.at || (fault.persistent && i > fault.at))) return Decision{Decision::fail, fault.err};
      return Decision{};
    });
    r = weightcache::collect_garbage(weightcache::platform::os(), dir.path().string(), 0);
    calls = hooks.calls();
  }

  // Never the file in use, never what is not a cache.
  EXPECT_TRUE(exists(dir.file("held.wcache"))) << what;
  EXPECT_TRUE(exists(dir.file("held.wcache.lock"))) << what;
  EXPECT_EQ(contents(dir.file("other.wcache")), std::string(8192, 'x')) << what;
  EXPECT_NE(held->look_up("k"), weightcache::kNotFound) << what;
  if (!r) {
    EXPECT_TRUE(r.error().code == weightcache::Errc::io || r.error().code == weightcache::Errc::no_memory)
        << what << ": " << r.error().message;
    return calls;
  }
  // The report is the truth: removed files are gone with their lock files, kept files are there.
  std::uint64_t removed = 0, kept = 0, before = 0;
  for (const auto& f : r->files) {
    before += f.bytes;
    EXPECT_NE(f.path, dir.file("other.wcache")) << what;
    if (f.removed) {
      ++removed;
      EXPECT_FALSE(exists(f.path)) << what << ": " << f.path;
      if (f.detail.empty()) {
        EXPECT_FALSE(exists(f.path + ".lock")) << what << ": " << f.path;
      }
    } else {
      ++kept;
      EXPECT_TRUE(exists(f.path)) << what << ": " << f.path;
      EXPECT_NE(f.reason, weightcache::GcReason::within_budget) << what;  // budget 0: each was tried
      EXPECT_FALSE(f.detail.empty()) << what << ": " << f.path;
    }
    if (f.path == dir.file("held.wcache")) {
      EXPECT_FALSE(f.removed) << what;
    }
  }
  EXPECT_EQ(r->removed_files, removed) << what;
  EXPECT_EQ(r->kept_files, kept) << what;
  EXPECT_EQ(r->total_before, before) << what;
  EXPECT_EQ(r->total_after, r->total_before - r->removed_bytes) << what;
  return calls;
}

TEST(GcFaults, EveryFailingCallLeavesFilesInUseAndTheReportTrue) {
  const std::uint64_t total = run_once(Fault{});
  ASSERT_GT(total, 20u);
  // EIO once and from then on; EACCES and ENOENT once (a file made unreadable, or removed, just
  // then: gc must not take either for a licence to remove anything).
  for (std::uint64_t n = 1; n <= total; ++n) {
    for (const Fault& f : {Fault{n, false, EIO}, Fault{n, true, EIO}, Fault{n, false, EACCES}, Fault{n, false, ENOENT}})
      run_once(f);
    if (::testing::Test::HasFailure()) return;  // one failing call is enough to read
  }
}

}  // namespace
