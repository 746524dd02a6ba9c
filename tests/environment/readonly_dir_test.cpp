// A cache in a directory the process cannot write (a system image, another user's cache) is
// still mapped and served, read-only; new entries go to memory. Needs an unprivileged user, so
// the check runs in a forked child that drops to "nobody" (skipped when not root).
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <cstring>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

TEST(ReadOnlyDirectory, ExistingCacheIsServedReadOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged user";
  weightcache::test::TempDir dir;
  const std::string sub = dir.file("ro");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  weightcache::Options o;
  o.path = sub + "/c.wc";
  o.compat_key = "ro";
  const std::string bytes(100000, 'r');
  {
    auto c = weightcache::WeightCache::open(o);
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("w", bytes), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize());
  }
  ASSERT_EQ(::unlink((o.path + ".lock").c_str()), 0);
  ASSERT_EQ(::chmod(o.path.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  struct stat before {};
  ASSERT_EQ(::stat(o.path.c_str(), &before), 0);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    weightcache::set_log_level(weightcache::LogLevel::off);
    auto c = weightcache::WeightCache::open(o);
    if (!c.ok()) ::_exit(11);
    if (c->stats().backing != weightcache::Backing::file) ::_exit(12);
    const std::size_t off = c->look_up("w");
    if (off == weightcache::kNotFound || std::memcmp(c->offset_to_addr(off), bytes.data(), bytes.size()) != 0)
      ::_exit(13);
    void* p = c->reserve(64);  // memory, not the file
    if (p == nullptr) ::_exit(14);
    std::memset(p, 1, 64);
    if (c->look_up_or_insert("new", p, 64) == weightcache::kNotFound) ::_exit(15);
    // Not durable (the file cannot take it): finalize says so, with the reason.
    if (auto f = c->finalize(); f.ok() || f.error().code != weightcache::Errc::read_only) ::_exit(16);
    if (c->stats().unpersisted_entries != 1) ::_exit(18);
    if (c->stats().heap_bytes != 64) ::_exit(17);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  struct stat after {};
  ASSERT_EQ(::stat(o.path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  ::chmod(sub.c_str(), 0755);
}

}  // namespace
