// The statuses the headers promise for a file that refuses, provoked through the platform seam:
// with backing file, wc_reserve_space and a copying wc_look_up_or_insert say why the file could
// not take the bytes (BUSY, NO_SPACE, IO), wc_finalize says why it could not commit (IO), and
// wc_open says why it could not use the file (IO, UNSUPPORTED).
#include "hooks.hpp"
#include "lease_probe.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

namespace {

using namespace weightcache;
using wctest::Call;
using wctest::Decision;

Options file_cache(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "statuses";
  o.backing = Backing::file;
  o.durability = Durability::full;
  o.lease_timeout = std::chrono::milliseconds(50);
  return o;
}

// Fails every call `which` with `err` while alive.
struct FailEvery {
  FailEvery(Call which, int err)
      : hooks([which, err](Call c, std::uint64_t) { return c == which ? Decision{Decision::fail, err} : Decision{}; }) {}
  wctest::Hooks hooks;
};

// wc_reserve_space: "with WC_BACKING_FILE also the reason the file cannot take the bytes: BUSY
// (lease), NO_SPACE (disk full, ...), IO"; wc_look_up_or_insert: "with WC_BACKING_FILE and bytes
// copied from the caller's memory, when the file cannot take them (BUSY, NO_SPACE, IO, as
// wc_reserve_space). Nothing is inserted then".
TEST(Statuses, WithBackingFileReserveAndInsertSayWhyTheFileRefused) {
  const std::string big(8u << 20, 'b');  // more than the file has room for: it must grow
  struct Case {
    const char* what;
    int err;  // 0: the lease is held elsewhere
    Errc code;
  };
  for (const Case& c : {Case{"lease held", 0, Errc::busy}, Case{"disk full", ENOSPC, Errc::no_space},
                        Case{"I/O error", EIO, Errc::io}}) {
    SCOPED_TRACE(c.what);
    test::TempDir dir("wc-statuses");
    const std::string path = dir.file("cache.wc");
    auto opened = WeightCache::open(file_cache(path));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();
    test::LeaseProbe lease(path);
    ASSERT_TRUE(lease.valid());
    std::unique_ptr<FailEvery> fault;
    if (c.err == 0) ASSERT_TRUE(lease.try_take());
    else fault = std::make_unique<FailEvery>(Call::posix_fallocate, c.err);

    EXPECT_EQ(cache.reserve(big.size()), nullptr);
    EXPECT_EQ(last_error().code, c.code) << last_error().message;
    EXPECT_EQ(cache.insert("big", big), kNotFound);
    EXPECT_EQ(last_error().code, c.code) << last_error().message;
    EXPECT_EQ(cache.look_up("big"), kNotFound);
    EXPECT_EQ(cache.stats().entries, 0u);
    EXPECT_EQ(cache.stats().heap_bytes, 0u) << "backing file packed to the heap";
  }
}

// wc_finalize: "WC_ERR_IO the OS refused a write or flush (errno in the message)", and "the
// entries not yet durable stay served from memory in this process".
TEST(Statuses, FinalizeSaysTheOsRefusedAFlush) {
  test::TempDir dir("wc-statuses");
  const std::string path = dir.file("cache.wc");
  auto opened = WeightCache::open(file_cache(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  WeightCache& cache = opened.value();
  const std::size_t off = cache.insert("k", std::string(5000, 'k'));
  ASSERT_NE(off, kNotFound) << last_error().message;
  {
    FailEvery fault(Call::fdatasync, EIO);
    const Result<void> r = cache.finalize();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::io) << r.error().message;
    EXPECT_NE(r.error().message.find(std::strerror(EIO)), std::string::npos) << r.error().message;
  }
  EXPECT_EQ(cache.look_up("k"), off);
}

// wc_open with WC_BACKING_FILE: "WC_ERR_IO, WC_ERR_NO_SPACE, WC_ERR_UNSUPPORTED the OS refused to
// open, create, read, lock or map the file"; with WC_BACKING_AUTO the open falls back instead.
TEST(Statuses, OpenWithBackingFileSaysWhyTheOsRefused) {
  struct Case {
    const char* what;
    Call call;
    int err;
    bool memory;
    Errc code;
  };
  for (const Case& c : {Case{"read", Call::pread, EIO, false, Errc::io},
                        Case{"create", Call::open, ENOSPC, false, Errc::no_space},
                        Case{"memfd", Call::memfd_create, EOPNOTSUPP, true, Errc::unsupported}}) {
    SCOPED_TRACE(c.what);
    test::TempDir dir("wc-statuses");
    const std::string path = dir.file("cache.wc");
    if (!c.memory) {  // a file to read; for "create", a path to create
      if (c.call == Call::pread) {
        auto made = WeightCache::open(file_cache(path));
        ASSERT_TRUE(made.ok());
        ASSERT_NE(made->insert("k", "v"), kNotFound);
        ASSERT_TRUE(made->finalize().ok());
      }
    }
    Options o = file_cache(c.memory ? std::string(kMemoryPath) : path);
    FailEvery fault(c.call, c.err);
    auto refused = WeightCache::open(o);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, c.code) << refused.error().message;
    o.backing = Backing::automatic;
    auto fallback = WeightCache::open(o);
    ASSERT_TRUE(fallback.ok()) << fallback.error().message;
    EXPECT_EQ(fallback->stats().backing, Backing::heap);
  }
}

}  // namespace
