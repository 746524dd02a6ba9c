// The file identities the ONNX Runtime provider and the ggml buffer type key external weights by
// (src/integrations/common/source_identity.*; docs/DESIGN.md, "ONNX Runtime keys"): the window a
// file's change time must be older than, and open_writers(), without which nothing hashed is
// recorded (issue 32).
#include "../../src/integrations/common/source_identity.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"
#include "times_track_stores.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace weightcache::source;
using weightcache::test::TempDir;

constexpr std::int64_t kMs = 1'000'000, kS = 1'000'000'000;

struct stat file_stat(std::int64_t ctime_ns) {
  struct stat st {};
  st.st_mode = S_IFREG | 0644;
  st.st_size = 4096;
  st.st_ctim.tv_sec = ctime_ns / kS;
  st.st_ctim.tv_nsec = ctime_ns % kS;
  st.st_mtim = st.st_ctim;
  return st;
}

// The cache file's rule: 10 ms after a change kept to the nanosecond, 2 s after a whole-second one,
// counted from the clock read before the stat; a host's floor on top; never where times do not
// follow every store.
TEST(SourceIdentity, AFileIsTrustedOnceItsChangeIsOlderThanItsFileSystemsWindow) {
  const std::int64_t clock = 1'800'000'000 * kS;
  const auto fine = [&](std::int64_t age) { return file_stat(clock - age + 1); };  // a sub-second part
  EXPECT_EQ(change_window_ns(fine(0)), 10 * kMs);
  EXPECT_TRUE(file_part_of(fine(5 * kMs), true, clock, 0).file.empty()) << "trusted 5 ms after a change";
  EXPECT_TRUE(file_part_of(fine(10 * kMs), true, clock, 0).file.empty()) << "trusted at the window's edge";
  EXPECT_FALSE(file_part_of(fine(11 * kMs), true, clock, 0).file.empty()) << "not trusted 11 ms after a change";
  EXPECT_TRUE(file_part_of(fine(11 * kMs), true, clock, 2000 * kMs).file.empty()) << "the host's floor was ignored";
  EXPECT_FALSE(file_part_of(fine(2001 * kMs), true, clock, 2000 * kMs).file.empty());
  EXPECT_TRUE(file_part_of(fine(60 * kS), false, clock, 0).file.empty()) << "trusted where times miss stores";
  // Whole seconds: the 2 s window.
  const struct stat whole = file_stat(clock - kS);
  EXPECT_EQ(change_window_ns(whole), 2 * kS);
  EXPECT_TRUE(file_part_of(whole, true, clock, 0).file.empty()) << "a whole-second change trusted after 1 s";
  EXPECT_FALSE(file_part_of(file_stat(clock - 3 * kS), true, clock, 0).file.empty());
  EXPECT_TRUE(file_part_of(fine(60 * kS), true, 0, 0).file.empty()) << "trusted without a clock";
}

// What a mapping is recorded under is the file's bytes now, read by pread: a range past the end of
// the file is no identity (never a SIGBUS).
TEST(SourceIdentity, TheFilesOwnBytesAreReadAsTheyAreNow) {
  TempDir dir("wc-source");
  const std::string path = dir.file("data.bin");
  std::vector<unsigned char> bytes(3u << 20);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  WeightSource w;
  w.data = bytes.data() + 4096;
  w.bytes = bytes.size() - 8192;
  w.element_type = 1;
  w.dims = {static_cast<std::int64_t>(w.bytes / 4)};
  w.external_path = path;
  w.external_offset = 4096;
  const Recording r(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(file_content_identity(r, w), content_identity(w));
  // Changed in the file, not in the caller's copy.
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(2u << 20));
    io.put('x');
  }
  EXPECT_NE(file_content_identity(r, w), content_identity(w));
  ::truncate(path.c_str(), 8192);
  EXPECT_EQ(file_content_identity(r, w), "") << "a range past the end of the file was given an identity";
}

// A crash may lose a file's last bytes while its new change time survives (or the reverse): an
// identity names the boot it was taken in, so nothing recorded before a crash is used after it.
TEST(SourceIdentity, AnIdentityNamesTheBootItWasTakenIn) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  if (!std::getline(in, boot)) GTEST_SKIP() << "no boot id here";
  boot.erase(std::remove(boot.begin(), boot.end(), '-'), boot.end());
  const std::int64_t clock = 1'800'000'000 * kS;
  const FileIdentity f = file_part_of(file_stat(clock - kS + 1), true, clock, 0);
  ASSERT_FALSE(f.file.empty());
  EXPECT_NE(f.file.find("|boot" + boot), std::string::npos) << f.file;
}

// Every question of a recording goes to one descriptor: a file put in the path's place after the
// identity was taken (a rename over it) is not recorded under the first file's identity.
TEST(SourceIdentity, AFileRenamedOverThePathAfterItsIdentityIsNotRecordedUnderIt) {
  TempDir dir("wc-source");
  const std::string path = dir.file("data.bin"), other = dir.file("other.bin");
  std::ofstream(path, std::ios::binary) << std::string(8192, 'A');
  std::ofstream(other, std::ios::binary) << std::string(8192, 'A');
  if (!weightcache::test::times_track_stores(path))
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs, btrfs or f2fs: no file identity is used there";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  WeightSource w;
  w.bytes = 4096;
  w.element_type = 1;
  w.dims = {1024};
  w.external_path = path;
  const std::string fid = file_identity(w, 0);
  ASSERT_FALSE(fid.empty());
  {
    const Recording r = may_record(w, fid, 0);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(still(r, w, fid, 0));
  }
  const Recording held = may_record(w, fid, 0);
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  EXPECT_FALSE(still(held, w, fid, 0)) << "the path names another file now";
  EXPECT_FALSE(may_record(w, fid, 0).ok()) << "a recording opened another file under the first one's identity";
}

// Whether anybody has the file open for writing decides whether what is hashed may be recorded
// (issue 32): a write in progress, direct I/O included, and a writable mapping each hold such an
// opening; with none, any later change needs a new one and moves the change time.
TEST(SourceIdentity, AnOpenWriterOrAWritableMappingIsSeenAndNoneOnceTheyAreGone) {
  TempDir dir("wc-source");
  const std::string path = dir.file("data.bin");
  std::ofstream(path, std::ios::binary) << std::string(8192, 'A');
  if (!weightcache::test::times_track_stores(path))
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs, btrfs or f2fs: no file identity is used there";
  ASSERT_EQ(open_writers(path), Writers::none) << "no lease on a file nobody writes (leases off here?)";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(open_writers(path), Writers::writer) << "an idle writer was not seen";
  ::close(fd);
  EXPECT_EQ(open_writers(path), Writers::none);
  const int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(rw, 0);
  void* map = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  ASSERT_NE(map, MAP_FAILED);
  ::close(rw);
  EXPECT_EQ(open_writers(path), Writers::writer) << "a writable shared mapping (its descriptor closed) was not seen";
  ::munmap(map, 8192);
  EXPECT_EQ(open_writers(path), Writers::none);
}

// A process that cannot ask for a lease (the file is another user's) falls back to the rule from
// before issue 32: a file changed less than 60 s ago is not recorded.
TEST(SourceIdentity, WithoutALeaseAFileYoungerThanAMinuteIsNotRecorded) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a child as another user";
  TempDir dir("wc-source");
  const std::string path = dir.file("data.bin");
  std::ofstream(path, std::ios::binary) << std::string(8192, 'A');
  if (!weightcache::test::times_track_stores(path))
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs, btrfs or f2fs: no file identity is used there";
  ::chmod(dir.path().c_str(), 0755);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the 10 ms window
  WeightSource w;
  w.bytes = 4096;
  w.element_type = 1;
  w.dims = {1024};
  w.external_path = path;
  w.external_offset = 0;
  const std::string fid = file_identity(w, 0);
  ASSERT_FALSE(fid.empty());
  EXPECT_TRUE(may_record(w, fid, 0).ok()) << "the owner (root) may record a file 50 ms old";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(3);
    if (::access(path.c_str(), R_OK) != 0) ::_exit(6);  // the answer must be the lease's, not the open's
    if (open_writers(path) != Writers::unknown) ::_exit(4);
    ::_exit(may_record(w, fid, 0).ok() ? 5 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 3) << "could not become another user";
  EXPECT_NE(WEXITSTATUS(status), 4) << "another user's process was given a lease (or saw a writer)";
  EXPECT_NE(WEXITSTATUS(status), 6) << "another user cannot read the file here: the test proves nothing";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a process without a lease recorded a file changed 50 ms ago";
}

// A buffered write(2) sets the file's change time when it begins and copies its bytes after: one
// held in the middle (its source is a page that userfaultfd keeps missing until the test lets it
// go) is seen as a writer at once, and asking never waits for it (a hostile review hung a session
// on a write held this way when the provider waited for writes to end).
TEST(SourceIdentity, AWriteHeldInTheMiddleIsAWriterAndAskingNeverWaitsForIt) {
  TempDir dir("wc-source");
  const std::string path = dir.file("data.bin");
  const long page = ::sysconf(_SC_PAGESIZE);
  constexpr int kPages = 64;
  {
    std::vector<char> a(static_cast<std::size_t>(page) * kPages, 'A');
    std::ofstream(path, std::ios::binary).write(a.data(), static_cast<std::streamsize>(a.size()));
  }
  if (!weightcache::test::times_track_stores(path))
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs, btrfs or f2fs: no file identity is used there";
  const int uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (uffd < 0)
    GTEST_SKIP() << "userfaultfd is not available here (" << std::strerror(errno)
                 << "): needs root, or vm.unprivileged_userfaultfd=1, and a kernel and sandbox that allow it";
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } close_uffd{uffd};
  uffdio_api api{};
  api.api = UFFD_API;
  ASSERT_EQ(::ioctl(uffd, UFFDIO_API, &api), 0) << std::strerror(errno);
  const std::size_t len = static_cast<std::size_t>(page) * kPages, half = len / 2;
  auto* region = static_cast<char*>(::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  std::memset(region, 'B', half);  // present; the second half faults into the handler
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<std::uintptr_t>(region) + half;
  reg.range.len = half;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  ASSERT_EQ(::ioctl(uffd, UFFDIO_REGISTER, &reg), 0) << std::strerror(errno);

  std::atomic<bool> faulted{false}, release{false}, written{false};
  std::thread handler([&] {
    std::vector<char> b(static_cast<std::size_t>(page), 'B');
    while (!written.load()) {
      pollfd p{uffd, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      uffd_msg m{};
      if (::read(uffd, &m, sizeof m) != static_cast<ssize_t>(sizeof m) || m.event != UFFD_EVENT_PAGEFAULT) continue;
      faulted.store(true);
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      uffdio_copy c{};
      c.dst = m.arg.pagefault.address & ~static_cast<std::uint64_t>(page - 1);
      c.src = reinterpret_cast<std::uintptr_t>(b.data());
      c.len = static_cast<std::uint64_t>(page);
      (void)::ioctl(uffd, UFFDIO_COPY, &c);
    }
  });
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ssize_t wrote = -1;
  std::thread writer([&] {
    wrote = ::pwrite(fd, region, len, 0);
    written.store(true);
  });
  while (!faulted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // Asked from another thread while the write is held: it must answer, and answer "a writer".
  std::atomic<bool> answered{false};
  Writers seen = Writers::none;
  std::thread asker([&] {
    seen = open_writers(path);
    answered.store(true);
  });
  for (int i = 0; i < 30000 && !answered.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(answered.load()) << "asking for writers waited for a write held in the middle";
  release.store(true);
  writer.join();
  asker.join();
  handler.join();
  EXPECT_EQ(seen, Writers::writer) << "a write in progress was not seen";
  ::close(fd);
  ::munmap(region, len);
  EXPECT_EQ(wrote, static_cast<ssize_t>(len));
  EXPECT_EQ(open_writers(path), Writers::none);
}

}  // namespace
