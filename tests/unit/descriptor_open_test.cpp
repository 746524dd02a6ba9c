// Caches on a caller's descriptor (wc_options.fd; Windows handles: tests/windows/handle_test.cpp)
// behave as by path where this process or another holds the same file:
//  - under another compatibility key while this process has the file open, the open is refused
//    as incompatible (backing file) or gets a private heap cache (automatic), never a wait for
//    the lease this process holds itself ending in BUSY;
//  - a read-only opener of an empty file waits while another holder may be setting it up, and
//    fails at once when nobody has it open.
#include "unit_test_util.hpp"

#ifdef __linux__
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace weightcache::test {
namespace {

Options on_descriptor(int fd, const std::string& key) {
  Options o;
  o.fd = fd;
  o.compat_key = key;
  o.lease_timeout = std::chrono::seconds(20);
  return o;
}

TEST(DescriptorOpen, AnotherCompatibilityKeyOnAFileThisProcessHasOpenIsIncompatibleNotBusy) {
  TempDir dir("wc-fd");
  const std::string path = dir.file("cache.wcache");
  for (const bool first_by_path : {true, false}) {
    SCOPED_TRACE(first_by_path ? "first open by path" : "first open by descriptor");
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".lock");
    const int fd0 = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd0, 0);
    Options a = first_by_path ? Options{} : on_descriptor(fd0, "key A");
    if (first_by_path) {
      a.path = path;
      a.compat_key = "key A";
    }
    WeightCache first = open_or_fail(a);
    ASSERT_NE(first.insert("w", "bytes of key A"), kNotFound) << last_error().message;
    ASSERT_TRUE(first.finalize().ok());

    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    Options b = on_descriptor(fd, "key B");
    b.backing = Backing::file;
    auto refused = WeightCache::open(b);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::incompatible) << refused.error().message;
    EXPECT_NE(refused.error().message.find("another compatibility key"), std::string::npos) << refused.error().message;

    b.backing = Backing::automatic;
    WeightCache heap = open_or_fail(b);
    EXPECT_EQ(heap.stats().backing, Backing::heap);
    EXPECT_EQ(heap.look_up("w"), kNotFound);
    // The first cache and its file are untouched.
    EXPECT_NE(first.look_up("w"), kNotFound);
    ::close(fd);
    ::close(fd0);
  }
}

// Two threads open one file at once under two keys, by path or descriptor: the opens take
// turns, so the second is refused as incompatible; never BUSY (the loser waiting for a rebuild
// that the winner's cache keeps from happening).
TEST(DescriptorOpen, TwoKeysOpeningOneFileAtOnceGiveOneCacheAndOneIncompatibleNeverBusy) {
  TempDir dir("wc-fd");
  const std::string path = dir.file("race.wcache");
  enum How { by_path, by_fd };
  for (const auto& [how_a, how_b] : {std::pair{by_path, by_path}, std::pair{by_path, by_fd}, std::pair{by_fd, by_fd}}) {
    for (int round = 0; round < 15; ++round) {
      SCOPED_TRACE(std::to_string(how_a) + "/" + std::to_string(how_b) + " round " + std::to_string(round));
      std::filesystem::remove(path);
      std::filesystem::remove(path + ".lock");
      {
        Options o;
        o.path = path;
        o.compat_key = "key A";
        WeightCache w = open_or_fail(o);
        ASSERT_NE(w.insert("w", "bytes of key A"), kNotFound) << last_error().message;
        ASSERT_TRUE(w.finalize().ok());
      }
      const int fd_a = ::open(path.c_str(), O_RDWR | O_CLOEXEC), fd_b = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      ASSERT_GE(fd_a, 0);
      ASSERT_GE(fd_b, 0);
      auto options = [&](How how, int fd, const char* key) {
        Options o = how == by_fd ? on_descriptor(fd, key) : Options{};
        if (how == by_path) {
          o.path = path;
          o.compat_key = key;
        }
        o.backing = Backing::file;
        o.lease_timeout = std::chrono::seconds(20);
        return o;
      };
      std::atomic<int> ready{0};
      Result<WeightCache> a = Error{Errc::io, 0, "not run"}, b = Error{Errc::io, 0, "not run"};
      auto run = [&](Result<WeightCache>* out, Options o) {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        *out = WeightCache::open(o);
      };
      std::thread ta(run, &a, options(how_a, fd_a, "key A")), tb(run, &b, options(how_b, fd_b, "key B"));
      ta.join();
      tb.join();
      for (const Result<WeightCache>* r : {&a, &b})
        if (!r->ok()) {
          EXPECT_EQ(r->error().code, Errc::incompatible) << r->error().message;
        }
      EXPECT_TRUE(a.ok() || b.ok()) << "neither got a cache";
      // By path, a "key B" open that went first rebuilt the file under a new name's inode: a
      // descriptor of the old file then opens that (a file of its own, still "key A"). Two opens
      // of one name, or of one descriptor's file, give exactly one cache.
      if (how_a == how_b) {
        EXPECT_NE(a.ok(), b.ok()) << "both got a cache of one file under two keys";
      }
      a = Error{Errc::io, 0, "closed"};
      b = Error{Errc::io, 0, "closed"};
      ::close(fd_a);
      ::close(fd_b);
    }
  }
}

TEST(DescriptorOpen, AReadOnlyOpenerOfAnEmptyFileWaitsForTheWriterSettingItUp) {
  TempDir dir("wc-fd");
  const std::string path = dir.file("cache.wcache");
  const int fd_w = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  const int fd_r = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd_w, 0);
  ASSERT_GE(fd_r, 0);
  // Another holder of the empty file: a writer that opened it and has not set it up yet (the
  // in-use lock every opener holds shared; docs/DESIGN.md).
  const int holder = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct flock fl {};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(1) << 62;
  fl.l_len = 1;
  ASSERT_EQ(::fcntl(holder, F_OFD_SETLK, &fl), 0);

  std::atomic<bool> done{false};
  Result<WeightCache> reader = Error{Errc::io, 0, "not run"};
  std::thread t([&] {
    Options r = on_descriptor(fd_r, "key");
    r.read_only = true;
    r.backing = Backing::file;
    reader = WeightCache::open(r);
    done = true;
  });
  // The writer opens while the holder still has the file (it waits to be alone to set it up),
  // so that from the reader's first look on somebody has it open until it is set up: a writer
  // opened only after the holder let go left a moment with nobody, which a reader slow to start
  // (a loaded machine) took for an abandoned empty file.
  Result<WeightCache> writer = Error{Errc::io, 0, "not run"};
  std::thread tw([&] { writer = WeightCache::open(on_descriptor(fd_w, "key")); });
  // The reader is waiting, not failed (checked once the writer is in: it must then succeed).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load()) << "the read-only opener gave up on a file another holder had open: "
                            << (reader.ok() ? std::string("ok") : reader.error().message);
  ::close(holder);  // the writer sets it up, alone
  tw.join();
  {
    ASSERT_TRUE(writer.ok()) << writer.error().message;
    ASSERT_NE(writer->insert("w", "bytes"), kNotFound) << last_error().message;
    ASSERT_TRUE(writer->finalize().ok());
    writer = Error{Errc::io, 0, "closed"};
  }
  t.join();
  ASSERT_TRUE(reader.ok()) << reader.error().message;
  // The reader may have opened the file as soon as the writer set it up, before its commit of
  // "w": what another process committed since is a refresh away.
  ASSERT_TRUE(reader->refresh().ok()) << last_error().message;
  EXPECT_NE(reader->look_up("w"), kNotFound);
  ::close(fd_w);
  ::close(fd_r);
}

TEST(DescriptorOpen, AReadOnlyOpenerOfAnEmptyFileNobodyHasOpenFailsAtOnce) {
  TempDir dir("wc-fd");
  const std::string path = dir.file("empty.wcache");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  Options r = on_descriptor(fd, "key");
  r.read_only = true;
  r.backing = Backing::file;  // automatic would fall back to a heap cache
  auto opened = WeightCache::open(r);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().code, Errc::corrupt) << opened.error().message;
  EXPECT_NE(opened.error().message.find("is empty"), std::string::npos) << opened.error().message;
  ::close(fd);
}

}  // namespace
}  // namespace weightcache::test
#endif
