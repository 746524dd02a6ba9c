// See file_mappings.hpp. Raw system calls (an ioctl, /proc): no library offers them.
#include "file_mappings.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace weightcache::source {
namespace {

// struct procmap_query of <linux/fs.h> (Linux 6.11), which older kernel headers lack. The kernel
// takes any size from the first version's up, so this layout stays valid on later kernels.
struct ProcmapQuery {
  std::uint64_t size;
  std::uint64_t query_flags;
  std::uint64_t query_addr;
  std::uint64_t vma_start;
  std::uint64_t vma_end;
  std::uint64_t vma_flags;
  std::uint64_t vma_page_size;
  std::uint64_t vma_offset;
  std::uint64_t inode;
  std::uint32_t dev_major;
  std::uint32_t dev_minor;
  std::uint32_t vma_name_size;
  std::uint32_t build_id_size;
  std::uint64_t vma_name_addr;
  std::uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "struct procmap_query is 104 bytes");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr std::uint64_t kVmaWritable = 0x02, kVmaShared = 0x08;

constexpr const char kDeleted[] = " (deleted)";

bool ends_with(const std::string& s, const char* tail) {
  const std::size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

bool Mapping::named_file() const { return ino != 0 && !path.empty() && path[0] == '/' && !ends_with(path, kDeleted); }

std::vector<Mapping> read_maps(bool all, bool* ok) {
  std::vector<Mapping> v;
  if (ok != nullptr) *ok = false;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return v;
  char* line = nullptr;
  std::size_t cap = 0;
  bool good = true;
  try {
    while (::getline(&line, &cap, f) > 0) {
      unsigned long long start = 0, end = 0, offset = 0, inode = 0;
      unsigned major = 0, minor = 0;
      char perms[8] = {};
      int path_at = 0;
      if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset, &major, &minor, &inode,
                      &path_at) < 7 ||
          path_at <= 0)
        continue;
      Mapping m;
      m.start = static_cast<std::uintptr_t>(start);
      m.end = static_cast<std::uintptr_t>(end);
      m.offset = offset;
      m.dev = makedev(major, minor);
      m.ino = static_cast<ino_t>(inode);
      m.shared = perms[3] == 's';
      m.writable = perms[1] == 'w';
      m.path = line + path_at;
      while (!m.path.empty() && (m.path.back() == '\n' || m.path.back() == ' ')) m.path.pop_back();
      if (all || m.named_file()) v.push_back(std::move(m));
    }
  } catch (...) {
    good = false;  // no memory: an incomplete list is no answer
  }
  good = good && !std::ferror(f);
  std::free(line);
  std::fclose(f);
  if (!good) v.clear();
  if (ok != nullptr) *ok = good;
  return v;
}

MappingProbe::Kind MappingProbe::find(const void* p, std::size_t n, Mapping* out) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n == 0) n = 1;
  if (a + n < a) return Kind::changeable;
  Answer ans = Answer::unknown;
  if (how_ == MappingCheck::automatic || how_ == MappingCheck::procmap_query) {
    if (!query_unsupported_) ans = by_query(a, n, out);
    if (ans != Answer::unknown) answered_by_ = MappingCheck::procmap_query;
    if (how_ == MappingCheck::procmap_query && ans == Answer::unknown) return Kind::changeable;
  }
  if (ans == Answer::unknown) ans = by_maps(a, n, out);
  switch (ans) {
    case Answer::file: return Kind::file;
    case Answer::own: return Kind::own;
    default: return Kind::changeable;
  }
}

MappingProbe::Answer MappingProbe::by_query(std::uintptr_t a, std::size_t n, Mapping* out) {
  // Opened per question (a few microseconds): a descriptor kept across questions would answer for
  // the parent in a child after fork, and for whatever process's maps file reused its number if
  // the host closed it.
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Answer::unknown;
  const Answer ans = query(fd, a, n, out);
  ::close(fd);
  return ans;
}

MappingProbe::Answer MappingProbe::query(int fd, std::uintptr_t a, std::size_t n, Mapping* out) {
  const std::uintptr_t end = a + n;
  std::uintptr_t at = a;
  // A range may lie across several mappings; it is the process's own only if each of them is.
  for (int i = 0; i < 64; ++i) {
    char name[4096];
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = at;
    q.vma_name_addr = reinterpret_cast<std::uintptr_t>(name);
    q.vma_name_size = sizeof name;
    if (::ioctl(fd, kProcmapQuery, &q) != 0) {
      const int e = errno;
      if (e == ENOTTY || e == EINVAL || e == ENOSYS || e == EOPNOTSUPP) {
        query_unsupported_ = true;  // a kernel before 6.11, or an emulator's /proc
        return Answer::unknown;
      }
      if (e == ENOENT || e == ENAMETOOLONG) return Answer::changeable;  // nothing mapped there; a path over 4 KiB
      return Answer::unknown;
    }
    if (q.vma_start > at || q.vma_end <= at) return Answer::changeable;
    const bool shared = (q.vma_flags & kVmaShared) != 0;
    if (q.inode != 0 || shared) {
      // A file (or shared memory). Only one mapping of one named file, shared, is the file's bytes.
      if (i != 0 || q.vma_end < end || !shared) return Answer::changeable;
      Mapping m;
      m.start = static_cast<std::uintptr_t>(q.vma_start);
      m.end = static_cast<std::uintptr_t>(q.vma_end);
      m.offset = q.vma_offset;
      m.dev = makedev(q.dev_major, q.dev_minor);
      m.ino = static_cast<ino_t>(q.inode);
      m.shared = true;
      m.writable = (q.vma_flags & kVmaWritable) != 0;
      if (q.vma_name_size == 0 || q.vma_name_size > sizeof name) return Answer::changeable;
      name[q.vma_name_size - 1] = '\0';
      m.path = name;
      if (!m.named_file()) return Answer::changeable;
      *out = std::move(m);
      return Answer::file;
    }
    if (q.vma_end >= end) return Answer::own;
    at = static_cast<std::uintptr_t>(q.vma_end);
  }
  return Answer::changeable;
}

// What a list of mappings says of [a, a + n); `*first` is the line holding a. `unknown` where
// nothing in the list holds a or the range runs into a gap.
MappingProbe::Answer MappingProbe::classify(const std::vector<Mapping>& maps, std::uintptr_t a, std::size_t n,
                                            std::size_t* first) {
  const std::uintptr_t end = a + n;
  std::size_t i = 0;
  while (i < maps.size() && !(a >= maps[i].start && a < maps[i].end)) ++i;
  if (i == maps.size()) return Answer::unknown;
  *first = i;
  const Mapping& m = maps[i];
  if (m.ino != 0 || m.shared) {
    if (end <= m.end && m.shared && m.named_file()) return Answer::file;
    return Answer::changeable;
  }
  for (std::uintptr_t at = m.end; at < end;) {
    if (++i == maps.size() || maps[i].start != at) return Answer::unknown;
    if (maps[i].ino != 0 || maps[i].shared) return Answer::changeable;
    at = maps[i].end;
  }
  return Answer::own;
}

MappingProbe::Answer MappingProbe::by_maps(std::uintptr_t a, std::size_t n, Mapping* out) {
  // Read for this question: a list read for an earlier one may show a mapping since replaced by
  // one of the same file, privately or at another offset (which /proc/self/map_files, giving only
  // the file, would not tell apart: a hostile review served wrong bytes through that).
  bool ok = false;
  const std::vector<Mapping> maps = read_maps(true, &ok);
  if (!ok) return Answer::changeable;
  answered_by_ = MappingCheck::maps_read;
  std::size_t i = 0;
  const Answer ans = classify(maps, a, n, &i);
  if (ans == Answer::file) *out = maps[i];
  return ans == Answer::unknown ? Answer::changeable : ans;
}

}  // namespace weightcache::source
