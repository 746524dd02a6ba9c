// The change-time window per file-system class (Platform::change_window_ns, docs/DESIGN.md "How a
// change is known"), through the POSIX call table's fstatfs: what the library would decide on a
// file system this machine cannot mount (vfat, exFAT, xfs, btrfs, f2fs, NFS, ...). The real
// ext4, ext4 with 128-byte inodes, tmpfs and overlayfs cases run in the multiprocess suite
// (shared_verify_test.cpp).
#include <gtest/gtest.h>

#if defined(__linux__)
#include "platform/platform.hpp"
#include "platform/posix_calls.hpp"

#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace weightcache {
namespace {

using platform::kCoarseChangeWindowNs;
using platform::kFineChangeWindowNs;

// The file system type fstatfs reports, for every descriptor, while installed; -1: it fails.
struct FakeFsType {
  static inline std::int64_t type = 0;
  explicit FakeFsType(std::int64_t t) {
    type = t;
    platform::posix_calls().fstatfs = [](int, struct statfs* st) -> int {
      if (type < 0) {
        errno = EIO;
        return -1;
      }
      *st = {};
      // As the kernel fills it: on i386 f_type is a signed 32-bit int, so magics at and above
      // 0x80000000 (btrfs, SMB2, ...) come negative.
      st->f_type = static_cast<decltype(st->f_type)>(static_cast<std::uint32_t>(type));
      return 0;
    };
  }
  ~FakeFsType() { platform::posix_calls().fstatfs = platform::default_posix_calls().fstatfs; }
};

class ChangeWindow : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("wc-window-" + std::to_string(::getpid()))).string();
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    auto opened = platform::os().open_file(path_, platform::OpenMode::read, 0, true);
    ASSERT_TRUE(opened) << opened.error().message;
    file_ = std::move(opened).value();
  }
  void TearDown() override {
    file_ = platform::File();
    std::filesystem::remove(path_);
  }
  // The window for a file whose change time has (or has no) sub-second part, on file system `type`.
  std::int64_t window(std::int64_t type, bool sub_second) {
    FakeFsType fake(type);
    platform::FileInfo info;
    info.ctime_ns = 1764000000LL * 1000000000 + (sub_second ? 123456789 : 0);
    info.mtime_ns = info.ctime_ns;
    return platform::os().change_window_ns(file_, info);
  }
  std::string path_;
  platform::File file_;
};

TEST_F(ChangeWindow, FileSystemsThatKeepNanosecondsGetOneSlowTickWhereThisFileHasThem) {
  for (std::int64_t type : {0xef53LL /* ext4 */, 0x58465342LL /* xfs */, 0x9123683eLL /* btrfs */,
                            0xf2f52010LL /* f2fs */, 0x2fc12fc1LL /* zfs */, 0xca451a4eLL /* bcachefs */}) {
    SCOPED_TRACE(type);
    EXPECT_EQ(window(type, true), kFineChangeWindowNs);
    // Whole seconds: ext4 with 128-byte inodes (or a one-in-a-billion fine time): the flat 2 s.
    EXPECT_EQ(window(type, false), kCoarseChangeWindowNs);
  }
}

TEST_F(ChangeWindow, CoarseAndUnknownFileSystemsGetTwoSecondsEvenWithASubSecondPart) {
  // vfat (even seconds), exFAT (10 ms), ntfs3 (100 ns), UDF, ISO 9660, HFS+, an unknown magic: a
  // sub-second part alone proves nothing about the granularity.
  for (std::int64_t type : {0x4d44LL, 0x2011bab0LL, 0x7366746eLL, 0x15013346LL, 0x9660LL, 0x482bLL, 0x12345678LL}) {
    SCOPED_TRACE(type);
    EXPECT_EQ(window(type, true), kCoarseChangeWindowNs);
    EXPECT_EQ(window(type, false), kCoarseChangeWindowNs);
  }
}

TEST_F(ChangeWindow, FileSystemsWhereNotEveryChangeShowsTrustNothing) {
  // tmpfs and ramfs (a store through a mapping moves no time), stacked (overlayfs, aufs,
  // eCryptfs) and network or user-space ones (NFS, SMB2, CIFS, FUSE, 9p, Ceph), and a failed fstatfs.
  for (std::int64_t type : {0x01021994LL, 0x858458f6LL, 0x794c7630LL, 0x61756673LL, 0xf15fLL, 0x6969LL,
                            0xfe534d42LL, 0xff534d42LL, 0x65735546LL, 0x01021997LL, 0x00c36400LL, -1LL}) {
    SCOPED_TRACE(type);
    EXPECT_EQ(window(type, true), 0);
    EXPECT_EQ(window(type, false), 0);
  }
}

}  // namespace
}  // namespace weightcache

#endif
