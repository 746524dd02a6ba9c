// Space past a cache file's last commit may be a hole: a writer that crashed after growing the
// file, then a sparse copy of it (cp --sparse, rsync -S, fallocate --dig-holes), or another
// writer's growth. A store through the mapping into a hole that a full disk cannot back kills
// the process with SIGBUS. So every allocation inside the file's existing size allocates its
// disk space first, as growth past the end always did, and a full disk is an error there.
#include "key_content.hpp"
#include "platform/posix_calls.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

using weightcache::Backing;
using weightcache::Errc;
using weightcache::kNotFound;
using weightcache::Options;
using weightcache::WeightCache;
namespace platform = weightcache::platform;

constexpr std::size_t kEntry = 1 << 20;
constexpr off_t kSparseTail = 8 << 20;

// Records posix_fallocate calls on the cache file; with `full`, fails them with ENOSPC.
struct FallocateHook {
  static inline ino_t inode = 0;
  static inline bool full = false;
  static inline std::mutex mu;
  static inline std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;

  static int fallocate(int fd, off_t off, off_t len) {
    struct stat st {};
    if (platform::default_posix_calls().fstat(fd, &st) == 0 && st.st_ino == inode) {
      std::lock_guard<std::mutex> g(mu);
      calls.emplace_back(static_cast<std::uint64_t>(off), static_cast<std::uint64_t>(len));
      if (full) return ENOSPC;
    }
    return platform::default_posix_calls().posix_fallocate(fd, off, len);
  }
  FallocateHook(const std::string& path, bool disk_full) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    inode = st.st_ino;
    full = disk_full;
    calls.clear();
    platform::posix_calls().posix_fallocate = &fallocate;
  }
  ~FallocateHook() { platform::posix_calls().posix_fallocate = platform::default_posix_calls().posix_fallocate; }
  // Whether one recorded call covers [off, off + len).
  static bool covered(std::uint64_t off, std::uint64_t len) {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& [o, n] : calls)
      if (o <= off && off + len <= o + n) return true;
    return false;
  }
};

Options options_for(const std::string& path) {
  Options o;
  o.path = path;
  o.backing = Backing::file;
  o.verify_ahead = false;
  return o;
}

// A committed cache whose file then gets kSparseTail bytes of hole past its commit.
void committed_with_sparse_tail(const std::string& path) {
  {
    auto c = WeightCache::open(options_for(path));
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_NE(c->insert("first", weightcache::test::bytes_for_key("first", 4096)), kNotFound);
    ASSERT_TRUE(c->finalize());
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(::truncate(path.c_str(), st.st_size + kSparseTail), 0);
}

TEST(SparseTail, ACopyInsertIntoAHoleAllocatesItsDiskSpaceFirst) {
  weightcache::test::TempDir dir("wc-sparse-tail");
  const std::string path = dir.file("c.wc");
  committed_with_sparse_tail(path);
  if (HasFatalFailure()) return;
  FallocateHook hook(path, false);
  auto c = WeightCache::open(options_for(path));
  ASSERT_TRUE(c) << c.error().message;
  const std::string bytes = weightcache::test::bytes_for_key("copied", kEntry);
  const std::size_t off = c->insert("copied", bytes);
  ASSERT_NE(off, kNotFound) << weightcache::last_error().message;
  EXPECT_TRUE(FallocateHook::covered(off, kEntry)) << "stored into the file's tail without allocating it";
  // Only what the entry needs: a damaged or hostile file's tail may claim a terabyte, and a
  // fallocate of it would fill the disk for everyone.
  for (const auto& [o, n] : FallocateHook::calls) EXPECT_LT(n, std::uint64_t{kSparseTail} / 2) << "at " << o;
  void* p = c->reserve(kEntry);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(c->release(p));
  ASSERT_TRUE(c->finalize());
}

TEST(SparseTail, OnAFullDiskAnInsertIntoAHoleFailsInsteadOfFaulting) {
  weightcache::test::TempDir dir("wc-sparse-tail");
  const std::string path = dir.file("c.wc");
  committed_with_sparse_tail(path);
  if (HasFatalFailure()) return;
  FallocateHook hook(path, true);
  auto c = WeightCache::open(options_for(path));
  ASSERT_TRUE(c) << c.error().message;
  // A SIGBUS here ends the test binary: the failure is the crash itself.
  EXPECT_EQ(c->insert("copied", weightcache::test::bytes_for_key("copied", kEntry)), kNotFound);
  EXPECT_EQ(weightcache::last_error().code, Errc::no_space) << weightcache::last_error().message;
  EXPECT_EQ(c->reserve(kEntry), nullptr);
  EXPECT_EQ(weightcache::last_error().code, Errc::no_space) << weightcache::last_error().message;
  EXPECT_NE(c->look_up("first"), kNotFound);
}

}  // namespace
