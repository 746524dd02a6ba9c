// A cache in a directory the process cannot write (a system image, another user's cache) is
// still mapped and served, read-only; new entries go to memory. Needs an unprivileged user, so
// the check runs in a forked child that drops to "nobody" (skipped when not root).
#include "child_exit.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <cstring>
#include <functional>
#include <vector>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using weightcache::test::child_exit;
using weightcache::test::child_exit_meaning;
using weightcache::test::child_failed;
using weightcache::test::kChildCacheError;
using weightcache::test::kChildFellBack;
using weightcache::test::kChildMismatch;
using weightcache::test::kChildOk;
using weightcache::test::kChildSetupFailed;
using weightcache::test::kChildUnexpected;

// Makes the directory `sub` and in it a cache holding the entry "w" (`bytes`), finalized, whose
// lock file is then removed: the tests take away the permission that would create it again.
// *o: the cache's options.
void make_cache_holding_w(const std::string& sub, const std::string& bytes, weightcache::Options* o) {
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  o->path = sub + "/c.wc";
  o->compat_key = "ro";
  {
    auto c = weightcache::WeightCache::open(*o);
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("w", bytes), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize());
  }
  ASSERT_EQ(::unlink((o->path + ".lock").c_str()), 0);
}

TEST(ReadOnlyDirectory, ExistingCacheIsServedReadOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged user";
  weightcache::test::TempDir dir;
  const std::string sub = dir.file("ro");
  weightcache::Options o;
  const std::string bytes(100000, 'r');
  ASSERT_NO_FATAL_FAILURE(make_cache_holding_w(sub, bytes, &o));
  ASSERT_EQ(::chmod(o.path.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  struct stat before {};
  ASSERT_EQ(::stat(o.path.c_str(), &before), 0);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) child_exit(kChildSetupFailed, "cannot become nobody");
    weightcache::set_log_level(weightcache::LogLevel::off);
    auto c = weightcache::WeightCache::open(o);
    if (!c.ok()) child_exit(kChildCacheError, "open: " + c.error().message);
    if (c->stats().backing != weightcache::Backing::file) child_exit(kChildFellBack, "not served from the file");
    const std::size_t off = c->look_up("w");
    if (off == weightcache::kNotFound || std::memcmp(c->offset_to_addr(off), bytes.data(), bytes.size()) != 0)
      child_exit(kChildMismatch, "entry w");
    void* p = c->reserve(64);  // memory, not the file
    if (p == nullptr) child_exit(kChildCacheError, "reserve");
    std::memset(p, 1, 64);
    if (c->look_up_or_insert("new", p, 64) == weightcache::kNotFound) child_exit(kChildCacheError, "insert");
    // Not durable (the file cannot take it): finalize says so, with the reason.
    if (auto f = c->finalize(); f.ok() || f.error().code != weightcache::Errc::read_only)
      child_exit(kChildUnexpected, "finalize did not say read_only");
    if (c->stats().unpersisted_entries != 1) child_exit(kChildUnexpected, "unpersisted_entries is not 1");
    if (c->stats().heap_bytes != 64) child_exit(kChildUnexpected, "heap_bytes is not 64");
    child_exit(kChildOk);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kChildOk) << child_exit_meaning(WEXITSTATUS(status)) << " (its stderr says where)";
  struct stat after {};
  ASSERT_EQ(::stat(o.path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  ::chmod(sub.c_str(), 0755);
}


// In the child: a new entry goes in, and finalize says the cache cannot keep it (read_only).
int new_entry_is_not_durable(weightcache::WeightCache& c) {
  if (c.insert("new", "bytes") == weightcache::kNotFound) return child_failed(kChildCacheError, "insert");
  auto fin = c.finalize();
  if (fin.ok() || fin.error().code != weightcache::Errc::read_only)
    return child_failed(kChildUnexpected, "finalize did not say read_only");
  return kChildOk;
}

// Runs `body` in a child that dropped to "nobody"; returns its exit code (kChildOk: all held).
int as_nobody(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) child_exit(kChildSetupFailed, "cannot become nobody");
    weightcache::set_log_level(weightcache::LogLevel::off);
    child_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -2;
  return WEXITSTATUS(status);
}

// A writable cache file whose lock file cannot be created: backing=file is an error at open (it
// used to be a silent read-only cache whose finalize said OK), backing=auto a read-only cache whose
// finalize says the new entry is not durable.
TEST(ReadOnlyDirectory, LockFileThatCannotBeCreatedIsAnErrorForBackingFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged user";
  weightcache::test::TempDir dir;
  const std::string sub = dir.file("ro");
  weightcache::Options o;
  ASSERT_NO_FATAL_FAILURE(make_cache_holding_w(sub, std::string(5000, 'w'), &o));
  ASSERT_EQ(::chmod(o.path.c_str(), 0666), 0);  // the file is writable, its directory is not
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const int st = as_nobody([&] {
    weightcache::Options f = o;
    f.backing = weightcache::Backing::file;
    auto c = weightcache::WeightCache::open(f);
    if (c.ok()) return child_failed(kChildUnexpected, "backing=file opened");
    if (c.error().code != weightcache::Errc::read_only) return child_failed(kChildUnexpected, c.error().message);
    if (c.error().message.find(".lock") == std::string::npos)
      return child_failed(kChildUnexpected, "the message names no lock file: " + c.error().message);
    weightcache::Options a = o;
    a.backing = weightcache::Backing::automatic;
    auto r = weightcache::WeightCache::open(a);
    if (!r.ok() || r->look_up("w") == weightcache::kNotFound) return child_failed(kChildMismatch, "entry w");
    return new_entry_is_not_durable(*r);
  });
  EXPECT_EQ(st, kChildOk) << child_exit_meaning(st) << " (its stderr says where)";
  ::chmod(sub.c_str(), 0755);
}

// A writer whose cache file is mode 0444 (its directory writable): automatic backing serves the
// file's entries read-only (it used to ignore them and start an empty heap cache); file backing
// says the file is not writable.
TEST(ReadOnlyDirectory, ReadOnlyFileServesItsEntriesToAWriter) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged user";
  weightcache::test::TempDir dir;
  const std::string sub = dir.file("rw");
  ASSERT_EQ(::mkdir(sub.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(sub.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  weightcache::Options o;
  o.path = sub + "/c.wc";
  o.compat_key = "ro-file";
  std::vector<std::string> keys;
  {
    auto c = weightcache::WeightCache::open(o);
    ASSERT_TRUE(c.ok());
    for (int i = 0; i < 10; ++i) {
      keys.push_back("w" + std::to_string(i));
      ASSERT_NE(c->insert(keys.back(), std::string(3000 + i, static_cast<char>('a' + i))), weightcache::kNotFound);
    }
    ASSERT_TRUE(c->finalize());
  }
  ASSERT_EQ(::chmod(o.path.c_str(), 0444), 0);
  struct stat before {};
  ASSERT_EQ(::stat(o.path.c_str(), &before), 0);
  const int st = as_nobody([&] {
    {
      weightcache::Options f = o;
      f.backing = weightcache::Backing::file;
      auto refused = weightcache::WeightCache::open(f);
      if (refused.ok() || refused.error().code != weightcache::Errc::read_only)
        return child_failed(kChildUnexpected, "backing=file was not refused as read_only");
    }
    auto c = weightcache::WeightCache::open(o);
    if (!c.ok()) return child_failed(kChildCacheError, "open: " + c.error().message);
    if (c->stats().backing != weightcache::Backing::file)
      return child_failed(kChildFellBack, "not served from the file");
    for (int i = 0; i < 10; ++i) {
      const std::size_t off = c->look_up(keys[i]);
      if (off == weightcache::kNotFound ||
          std::memcmp(c->offset_to_addr(off), std::string(3000 + i, static_cast<char>('a' + i)).data(), 3000 + i) != 0)
        return child_failed(kChildMismatch, keys[i]);
    }
    return new_entry_is_not_durable(*c);
  });
  EXPECT_EQ(st, kChildOk) << child_exit_meaning(st) << " (its stderr says where)";
  struct stat after {};
  ASSERT_EQ(::stat(o.path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
}

}  // namespace
