// One process, one file, two caches: one opened by path, one on a descriptor of the same file
// (wc_options.fd). Both take the writer lease on the file itself, so while one holds it the
// other must be told at once that its own process holds it (busy), never wait lease_timeout for
// itself; once the holder finalizes, the other writes.
#include "lease_exclusion.hpp"
#include "unit_test_util.hpp"

#ifndef _WIN32
#include <weightcache/weight_cache.hpp>

#include <chrono>

#include <fcntl.h>
#include <unistd.h>

namespace weightcache::test {
namespace {

Options base(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "same-file-lease";
  o.backing = Backing::file;  // a lease refused is an error, not a quiet heap fallback
  o.lease_timeout = std::chrono::minutes(10);  // a wait would hang the test: ctest's timeout fails it
  return o;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

class SameFileLease : public ::testing::Test {
 protected:
  void SetUp() override {
    path = dir.file("cache.wcache");
    auto by_path = WeightCache::open(base(path));
    ASSERT_TRUE(by_path.ok()) << by_path.error().message;
    ASSERT_NE(by_path->insert("first", std::string(4096, 'a')), kNotFound);
    ASSERT_TRUE(by_path->finalize().ok());
    path_cache = std::move(by_path.value());
    fd.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd.fd, 0);
    Options o = base("cache by descriptor");
    o.fd = fd.fd;
    auto by_fd = WeightCache::open(o);
    ASSERT_TRUE(by_fd.ok()) << by_fd.error().message;
    fd_cache = std::move(by_fd.value());
  }

  TempDir dir{"wc-lease-self"};
  std::string path;
  Fd fd;
  WeightCache path_cache, fd_cache;
};

TEST_F(SameFileLease, ADescriptorCacheIsRefusedAtOnceWhileAPathCacheOfTheFileHoldsTheLease) {
  expect_refused_until_holder_finalizes(path_cache, fd_cache, "this process already holds the writer lease");
}

TEST_F(SameFileLease, APathCacheIsRefusedAtOnceWhileADescriptorCacheOfTheFileHoldsTheLease) {
  expect_refused_until_holder_finalizes(fd_cache, path_cache, "this process already holds the writer lease");
}

}  // namespace
}  // namespace weightcache::test
#endif
