// MappingProbe (src/integrations/common/file_mappings.hpp): what holds a runtime's source bytes,
// checked now, by each of its ways of asking (the kernel's PROCMAP_QUERY; a read of /proc/self/maps
// made for the question), as root and as an unprivileged user, and in a child after fork. The ggml buffer type trusts a GGUF's identity only for a `file` answer.
#include <gtest/gtest.h>

#include "../../src/integrations/common/file_mappings.hpp"
#include "temp_dir.hpp"

#include <cstring>
#include <ostream>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace weightcache::source {
// GoogleTest's name for a parameter in messages.
void PrintTo(MappingCheck how, std::ostream* os);
}  // namespace weightcache::source

namespace {

using weightcache::source::Mapping;
using weightcache::source::MappingCheck;
using weightcache::source::MappingProbe;
using weightcache::test::TempDir;
using Kind = MappingProbe::Kind;

const char* name_of(MappingCheck how) {
  switch (how) {
    case MappingCheck::automatic: return "automatic";
    case MappingCheck::procmap_query: return "procmap_query";
    case MappingCheck::maps_read: return "maps_read";
  }
  return "?";
}

}  // namespace

void weightcache::source::PrintTo(MappingCheck how, std::ostream* os) { *os << name_of(how); }

namespace {

std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// A file of `pages` pages of `fill`, readable by everyone, in a directory everyone may enter.
std::string make_file(const TempDir& dir, const std::string& name, std::size_t pages, char fill) {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << std::string(pages * page(), fill);
  ::chmod(path.c_str(), 0644);
  ::chmod(dir.path().c_str(), 0755);
  return path;
}

// A shared read-only mapping of `path` from page `first` on, `pages` long.
void* map_file(const std::string& path, std::size_t first, std::size_t pages, int flags = MAP_SHARED,
               void* at = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MAP_FAILED;
  void* p = ::mmap(at, pages * page(), PROT_READ, flags | (at != nullptr ? MAP_FIXED : 0), fd,
                   static_cast<off_t>(first * page()));
  ::close(fd);
  return p;
}

struct Ino {
  dev_t dev;
  ino_t ino;
};
Ino ino_of(const std::string& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return {st.st_dev, st.st_ino};
}

// Every answer the probe owes, by one way of asking; "" when all hold, else what failed. Runs in
// the test process or in a child (as another user): no GoogleTest assertions inside.
std::string check_all(MappingCheck how, const TempDir& dir, MappingCheck expect_answered_by) {
  std::string failed;
  auto fail = [&](const std::string& what) { failed += what + "; "; };
  const std::size_t pg = page();
  const std::string a = dir.file("a.bin"), b = dir.file("b.bin");
  MappingProbe probe(how);
  Mapping m;

  // A shared mapping of a named file, from its third page: that file, at that offset.
  void* p = map_file(a, 2, 4);
  if (p == MAP_FAILED) return "cannot map a.bin";
  const char* at = static_cast<const char*>(p) + pg + 100;
  if (probe.find(at, 1000, &m) != Kind::file) {
    fail("a shared file mapping is not a file");
  } else {
    const Ino id = ino_of(a);
    if (m.dev != id.dev || m.ino != id.ino) fail("the file's device or inode is wrong");
    if (m.path != a) fail("the path is '" + m.path + "'");
    if (m.offset + (reinterpret_cast<std::uintptr_t>(at) - m.start) != 3 * pg + 100) fail("the offset is wrong");
    if (probe.answered_by() != expect_answered_by)
      fail(std::string("answered by ") + name_of(probe.answered_by()) + ", not " + name_of(expect_answered_by));
  }
  // The same file mapped again over the same range from another offset: that offset (an answer
  // from an earlier look, checked only for the file, gave the old one: a hostile review served
  // wrong bytes through it).
  if (map_file(a, 0, 4, MAP_SHARED, p) != p) return failed + "cannot map a.bin again";
  if (probe.find(at, 1000, &m) != Kind::file || m.ino != ino_of(a).ino ||
      m.offset + (reinterpret_cast<std::uintptr_t>(at) - m.start) != pg + 100)
    fail("the same file mapped again from another offset was taken at the old offset");
  // ... and privately, at the first offset: changeable, not the shared mapping it replaced.
  if (map_file(a, 2, 4, MAP_PRIVATE, p) != p) return failed + "cannot map a.bin privately";
  if (probe.find(at, 1000, &m) != Kind::changeable) fail("the same file mapped again privately was taken as shared");
  // The same range after another file was mapped over it: the new file, never the old one's
  // identity.
  if (map_file(b, 0, 4, MAP_SHARED, p) != p) return failed + "cannot map b.bin over a.bin";
  if (probe.find(at, 1000, &m) != Kind::file || m.ino != ino_of(b).ino || m.path != b)
    fail("a mapping replaced since the last question was taken for the old one");
  // Running past the mapping's end into the next mapping: not one file's bytes.
  void* after = ::mmap(static_cast<char*>(p) + 4 * pg, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (after == static_cast<char*>(p) + 4 * pg) {
    if (probe.find(static_cast<char*>(p) + 3 * pg, 2 * pg, &m) != Kind::changeable)
      fail("a range over a file mapping and anonymous memory is not changeable");
    ::munmap(after, pg);
  }
  // A private mapping of the file: its pages follow the file until the process writes them.
  if (map_file(a, 0, 4, MAP_PRIVATE, p) != p) return failed + "cannot map a.bin privately";
  if (probe.find(at, 1000, &m) != Kind::changeable) fail("a private file mapping is not changeable");
  ::munmap(p, 4 * pg);

  // The process's own memory: anonymous, private; also across two mappings that differ (their
  // protections keep them apart).
  std::vector<char> heap(3 * pg, 'h');
  if (probe.find(heap.data(), heap.size(), &m) != Kind::own) fail("heap memory is not the process's own");
  char* two = static_cast<char*>(::mmap(nullptr, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (two != MAP_FAILED) {
    ::mprotect(two + pg, pg, PROT_READ);
    if (probe.find(two + 10, pg, &m) != Kind::own) fail("memory over two anonymous mappings is not the process's own");
    ::munmap(two, 2 * pg);
  }
  // Shared memory that no path names: another process may write it.
  const int mfd = ::memfd_create("wc-probe", MFD_CLOEXEC);
  if (mfd >= 0 && ::ftruncate(mfd, static_cast<off_t>(pg)) == 0) {
    void* q = ::mmap(nullptr, pg, PROT_READ, MAP_SHARED, mfd, 0);
    if (q != MAP_FAILED) {
      if (probe.find(q, 64, &m) != Kind::changeable) fail("a memfd mapping is not changeable");
      ::munmap(q, pg);
    }
  }
  if (mfd >= 0) ::close(mfd);
  void* shm = ::mmap(nullptr, pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm != MAP_FAILED) {
    if (probe.find(shm, 64, &m) != Kind::changeable) fail("shared anonymous memory is not changeable");
    ::munmap(shm, pg);
  }
  // A file removed after it was mapped: its path names nothing (or something else) now.
  const std::string gone = make_file(dir, "gone.bin", 1, 'g');
  void* g = map_file(gone, 0, 1);
  ::unlink(gone.c_str());
  if (g != MAP_FAILED) {
    if (probe.find(g, 64, &m) != Kind::changeable) fail("a deleted file's mapping is not changeable");
    ::munmap(g, pg);
  }
  return failed;
}

// How each way answers here, or why it cannot be tested: the kernel may lack PROCMAP_QUERY (before
// 6.11; qemu-user does not emulate it).
MappingCheck expected_answer(MappingCheck how, const std::string& file, std::string* skip) {
  if (how == MappingCheck::maps_read) return MappingCheck::maps_read;
  void* p = map_file(file, 0, 1);
  MappingProbe probe(how);
  Mapping m;
  const Kind k = p == MAP_FAILED ? Kind::changeable : probe.find(p, 1, &m);
  if (p != MAP_FAILED) ::munmap(p, page());
  if (k != Kind::file)
    *skip = how == MappingCheck::procmap_query
                ? "this kernel has no PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11 and later have it)"
                : "this process cannot check its mappings (no /proc/self/maps?)";
  return how == MappingCheck::automatic ? probe.answered_by() : how;
}

class FileMappings : public ::testing::TestWithParam<MappingCheck> {};

TEST_P(FileMappings, EachAnswerHoldsNowForThisProcess) {
  TempDir dir("wc-mappings");
  make_file(dir, "a.bin", 8, 'a');
  make_file(dir, "b.bin", 8, 'b');
  std::string skip;
  const MappingCheck by = expected_answer(GetParam(), dir.file("a.bin"), &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  if (GetParam() == MappingCheck::automatic)
    std::printf("[ INFO     ] automatically answered by %s here\n", name_of(by));
  EXPECT_EQ(check_all(GetParam(), dir, by), "");
}

// As nobody (who may not follow /proc/self/map_files, which the check used before): every way
// still answers every question right.
TEST_P(FileMappings, EachAnswerHoldsForAnUnprivilegedProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  TempDir dir("wc-mappings");
  make_file(dir, "a.bin", 8, 'a');
  make_file(dir, "b.bin", 8, 'b');
  std::string skip;
  (void)expected_answer(GetParam(), dir.file("a.bin"), &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      out = "cannot become nobody";
    } else {
      std::string ignored;
      const MappingCheck by = expected_answer(GetParam(), dir.file("a.bin"), &ignored);
      out = check_all(GetParam(), dir, by);
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(r));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(out, "");
}

// A probe made before fork answers in the child for the child: the child mapped another file where
// the parent's is, and must not be told the parent's (a descriptor of /proc/self/maps opened in the
// parent would answer for it).
TEST_P(FileMappings, AProbeFromBeforeForkAnswersForTheChild) {
  TempDir dir("wc-mappings");
  const std::string a = make_file(dir, "a.bin", 2, 'a'), b = make_file(dir, "b.bin", 2, 'b');
  std::string skip;
  (void)expected_answer(GetParam(), a, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  void* p = map_file(a, 0, 2);
  ASSERT_NE(p, MAP_FAILED);
  MappingProbe probe(GetParam());
  Mapping m;
  ASSERT_EQ(probe.find(p, 64, &m), Kind::file);
  ASSERT_EQ(m.ino, ino_of(a).ino);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (map_file(b, 0, 2, MAP_SHARED, p) != p) ::_exit(2);
    Mapping c;
    const Kind k = probe.find(p, 64, &c);
    ::_exit(k == Kind::file && c.ino == ino_of(b).ino ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 2) << "the child could not map b.bin";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child was told its parent's mapping";
  // The parent's answer is still its own.
  ASSERT_EQ(probe.find(p, 64, &m), Kind::file);
  EXPECT_EQ(m.ino, ino_of(a).ino);
  ::munmap(p, 2 * page());
}

INSTANTIATE_TEST_SUITE_P(Ways, FileMappings,
                         ::testing::Values(MappingCheck::automatic, MappingCheck::procmap_query, MappingCheck::maps_read),
                         [](const ::testing::TestParamInfo<MappingCheck>& info) { return name_of(info.param); });

}  // namespace
