// POSIX implementation of the platform seam (Linux first; any POSIX with mmap works).
// We call the OS directly rather than through Boost.Interprocess's mapped_region / file_lock:
// we need MAP_FIXED placement inside one reserved range, posix_fallocate before mapping, msync
// of sub-ranges, and descriptor-owned (flock) rather than process-owned (fcntl) locks. See
// docs/DESIGN.md, "Dependencies, and where we use system calls instead".
#include "platform/errors.hpp"
#include "platform/platform.hpp"
#include "platform/posix_calls.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include <fcntl.h>
#include <pthread.h>
#ifdef __linux__
#include <linux/fiemap.h>
#include <linux/fs.h>
#endif
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

namespace weightcache::platform {
namespace {

// The byte the "in use" lock covers: past any offset a cache file reaches, so it never overlaps
// a lock some other tool takes on real data.
static_assert(sizeof(off_t) == 8, "32-bit builds need -D_FILE_OFFSET_BITS=64 (CMakeLists.txt sets it)");
constexpr off_t kInUseOffset = off_t{1} << 62;

constexpr PosixCalls kDefaultCalls = {
#define WC_POSIX_CALL_DEFAULT(name, impl, result, params) .name = impl,
    WC_POSIX_CALLS(WC_POSIX_CALL_DEFAULT)
#undef WC_POSIX_CALL_DEFAULT
};
// Designated initializers let an entry go missing (as a null pointer) without a word.
constexpr bool every_entry_set(const PosixCalls& t) {
  bool all = true;
  for_each_posix_call([&](auto entry) { all = all && t.*decltype(entry)::member != nullptr; });
  return all;
}
static_assert(every_entry_set(kDefaultCalls), "an entry of WC_POSIX_CALLS has no default");

PosixCalls g_calls = kDefaultCalls;
PosixCalls& sys() { return g_calls; }

FileInfo info_of(const struct stat& st) {
  FileInfo i;
  i.size = static_cast<std::uint64_t>(st.st_size);
  i.device = static_cast<std::uint64_t>(st.st_dev);
  i.inode = static_cast<std::uint64_t>(st.st_ino);
  i.regular = S_ISREG(st.st_mode);
  i.symlink = S_ISLNK(st.st_mode);
  i.mode = static_cast<unsigned>(st.st_mode) & 0777u;
  i.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  i.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  i.owner = static_cast<std::uint32_t>(st.st_uid);
  i.group = static_cast<std::uint32_t>(st.st_gid);
  i.links = static_cast<std::uint64_t>(st.st_nlink);
  i.allocated = static_cast<std::uint64_t>(st.st_blocks) * 512;  // st_blocks counts 512-byte units
  return i;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

int fd_of(const File& f) noexcept { return static_cast<int>(f.handle()); }

Error file_size_limit_reached(const File& f) {
  return Error{Errc::no_space, EFBIG,
               "the process's file size limit (RLIMIT_FSIZE) is reached while growing '" + f.path() + "'"};
}

class PosixPlatform final : public Platform {
 public:
  Result<File> open_file(const std::string& path, OpenMode mode, unsigned perm, bool follow_symlink) override {
    std::string name = path;  // before the open: nothing may fail once the descriptor is ours
    // O_NONBLOCK so that a FIFO planted at the path cannot block open(); cleared below.
    int flags = O_CLOEXEC | O_NONBLOCK;
    if (!follow_symlink) flags |= O_NOFOLLOW;
    switch (mode) {
      case OpenMode::read: flags |= O_RDONLY; break;
      case OpenMode::read_write: flags |= O_RDWR; break;
      case OpenMode::create_new: flags |= O_RDWR | O_CREAT | O_EXCL; break;
      case OpenMode::lock_file: flags |= O_RDWR | O_CREAT; break;
    }
    int fd;
    do {
      fd = sys().open(path.c_str(), flags, static_cast<mode_t>(perm));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP && !follow_symlink)
        return os_error(err, "refusing to open a symlink at", path,
                        "Point the cache at a regular file, or set allow_symlink.");
      return os_error(err, "cannot open", path,
                      err == ENOENT ? "Create the directory first, or pick another path." : nullptr);
    }
    File file(*this, static_cast<Handle>(fd), std::move(name));  // closed on the ways out below
    struct stat st {};
    if (sys().fstat(fd, &st) != 0) return os_error(errno, "cannot stat", path);
    if (!S_ISREG(st.st_mode)) return not_a_regular_file(path);
    // Harmless if it fails: on a regular file O_NONBLOCK changes nothing on Linux, and where it
    // could (mandatory locks) a read would fail with EAGAIN, which read_at reports as an error.
    const int fl = sys().fcntl(fd, F_GETFL, 0);
    if (fl >= 0) (void)sys().fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return file;
  }

  void close_file(Handle h) noexcept override {
    if (h < 0) return;
    (void)sys().close(static_cast<int>(h));
  }

  Result<FileInfo> stat_file(const File& f) override {
    struct stat st {};
    if (sys().fstat(fd_of(f), &st) != 0) return os_error(errno, "fstat failed on", f.path());
    return info_of(st);
  }

  Result<FileInfo> stat_path(const std::string& path, bool follow) override {
    struct stat st {};
    const int rc = follow ? sys().stat(path.c_str(), &st) : sys().lstat(path.c_str(), &st);
    if (rc != 0) return os_error(errno, "cannot stat", path);
    return info_of(st);
  }

  // Calls `call` (pread or pwrite) until all `size` bytes at `offset` are moved: a call may move
  // fewer, or be interrupted (EINTR). An error says `failed` and the path; a call that moves no
  // byte ends the loop with stalled().
  template <class Byte, class Call, class Stalled>
  static Result<void> transfer_all(const File& f, Byte* p, std::size_t size, std::uint64_t offset,
                                   Call PosixCalls::*call, const char* failed, Stalled stalled) {
    while (size > 0) {
      const ssize_t n = (sys().*call)(fd_of(f), p, size, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return os_error(errno, failed, f.path());
      }
      if (n == 0) return stalled();
      p += n;
      size -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
    return {};
  }

  Result<void> read_at(const File& f, void* buf, std::size_t size, std::uint64_t offset) override {
    return transfer_all(f, static_cast<char*>(buf), size, offset, &PosixCalls::pread, "read failed on", [&] {
      return Error{Errc::corrupt, 0, "unexpected end of file while reading '" + f.path() + "'"};
    });
  }

  Result<void> write_at(const File& f, const void* buf, std::size_t size, std::uint64_t offset) override {
    if (offset + size > file_size_limit()) return file_size_limit_reached(f);
    return transfer_all(f, static_cast<const char*>(buf), size, offset, &PosixCalls::pwrite, "write failed on",
                        [&] { return Error{Errc::io, 0, "write made no progress on '" + f.path() + "'"}; });
  }

  Result<void> allocate(const File& f, std::uint64_t offset, std::uint64_t len) override {
    if (offset + len > file_size_limit()) return file_size_limit_reached(f);
    int rc;
    do {
      rc = sys().posix_fallocate(fd_of(f), static_cast<off_t>(offset), static_cast<off_t>(len));
    } while (rc == EINTR);
    if (rc != 0) return os_error(rc, "cannot allocate disk space for", f.path(), "Free disk space.");
    return {};
  }

  Result<void> truncate(const File& f, std::uint64_t size) override {
    int rc;
    do {
      rc = sys().ftruncate(fd_of(f), static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return os_error(errno, "cannot resize", f.path());
    return {};
  }

  Result<void> sync(const File& f) override {
    int rc;
    do {
      rc = sys().fdatasync(fd_of(f));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return os_error(errno, "fdatasync failed on", f.path());
    return {};
  }

  Result<void> rename(const std::string& from, const std::string& to) override {
    if (sys().rename(from.c_str(), to.c_str()) != 0) return os_error(errno, "cannot rename a new cache file onto", to);
    return {};
  }

  Result<void> sync_parent_dir(const std::string& path) override {
    const int fd = sys().open(parent_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return os_error(errno, "cannot open the directory of", path);
    const int rc = sys().fsync(fd);
    const int err = errno;
    sys().close(fd);
    if (rc != 0 && err != EINVAL) return os_error(err, "cannot sync the directory of", path);
    return {};
  }

  // A file left behind is a temporary that the next writer's clean-up removes.
  void remove(const std::string& path) noexcept override { (void)sys().unlink(path.c_str()); }

  Result<std::vector<std::string>> list_directory(const std::string& dir) override {
    DIR* d = sys().opendir(dir.c_str());
    if (d == nullptr) return os_error(errno, "cannot read the directory", dir);
    struct Closer {
      DIR* d;
      ~Closer() { (void)sys().closedir(d); }
    } closer{d};
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const struct dirent* e = sys().readdir(d);
      if (e == nullptr) {
        if (errno != 0) return os_error(errno, "cannot read the directory", dir);
        return names;
      }
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    }
  }

  Result<void> remove_file(const std::string& path) override {
    if (sys().unlink(path.c_str()) != 0) return os_error(errno, "cannot delete", path);
    return {};
  }

  Result<void*> reserve_address_space(std::size_t size, std::size_t align) override {
    const std::size_t total = size + align;
    void* p = sys().mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      return Error{Errc::no_memory, errno,
                   "cannot reserve " + std::to_string(size >> 20) +
                       " MiB of address space; lower max_file_bytes or raise the address-space limit"};
    // Trim the head and tail so the range starts on `align`.
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t aligned = (start + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
    if (aligned > start) sys().munmap(p, aligned - start);
    const std::uintptr_t tail = start + total - (aligned + size);
    if (tail > 0) sys().munmap(reinterpret_cast<void*>(aligned + size), tail);
    return reinterpret_cast<void*>(aligned);
  }

  void release_address_space(void* base, std::size_t size) noexcept override {
    if (base == nullptr || size == 0) return;
    forget_mappings(base, size);
    sys().munmap(base, size);
  }

  Result<void> map_file(const File& f, std::uint64_t offset, std::size_t len, void* at,
                        bool writable) override {
    const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    void* p = sys().mmap(at, len, prot, MAP_SHARED | MAP_FIXED, fd_of(f), static_cast<off_t>(offset));
    if (p != MAP_FAILED) remember_mapping(at, len, f);
    if (p == MAP_FAILED) {
      const int err = errno;
      // A failed MAP_FIXED may have unmapped part of our reservation; take the range back at
      // once so no other allocation can land inside the cache's address range.
      (void)sys().mmap(at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      return os_error(err, "cannot map", f.path());
    }
#ifdef __linux__
    // Ask for huge pages: a fault in such a mapping fills the page cache with 2 MiB folios, and
    // any process mapping them later (at addresses that agree with the file offsets modulo
    // 2 MiB, as ours do) gets one page-table entry per 2 MiB instead of 512. Advisory: a kernel
    // without file THP ignores it, so its result does not matter.
    (void)sys().madvise(p, len, MADV_HUGEPAGE);
#endif
    return {};
  }

  Result<void> commit_memory(void* at, std::size_t len) override {
    if (sys().mprotect(at, len, PROT_READ | PROT_WRITE) != 0)
      return Error{Errc::no_memory, errno, "cannot commit " + std::to_string(len) + " bytes of heap memory"};
    return {};
  }

  Result<void> flush_mapping(void* addr, std::size_t len, bool wait) override {
    // msync wants a page-aligned start.
    const std::size_t page = map_granularity();
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    const std::uintptr_t start = a & ~(static_cast<std::uintptr_t>(page) - 1);
    if (sys().msync(reinterpret_cast<void*>(start), len + (a - start), wait ? MS_SYNC : MS_ASYNC) != 0)
      return os_error(errno, "msync failed on", mapped_path(addr));
    return {};
  }

  void prefetch(void* addr, std::size_t len) noexcept override {
    const std::size_t page = map_granularity();
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    const std::uintptr_t start = a & ~(static_cast<std::uintptr_t>(page) - 1);
    (void)sys().madvise(reinterpret_cast<void*>(start), len + (a - start), MADV_WILLNEED);
  }

  bool populate_read(void* addr, std::size_t len) noexcept override {
#ifdef __linux__
    constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ, Linux 5.14; older kernels: EINVAL
    const std::size_t page = map_granularity();
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    const std::uintptr_t start = a & ~(static_cast<std::uintptr_t>(page) - 1);
    // EAGAIN is "try again", but only a few times: populating is an optimization, and the
    // caller's reads fault the pages in anyway. Only EFAULT and EHWPOISON say they cannot.
    for (int again = 0;;) {
      if (sys().madvise(reinterpret_cast<void*>(start), len + (a - start), kPopulateRead) == 0) return true;
      if (errno == EINTR || (errno == EAGAIN && ++again < 4)) continue;
      return errno != EFAULT && errno != EHWPOISON;
    }
#else
    (void)addr;
    (void)len;
    return true;
#endif
  }

  void touch(const File& f) noexcept override { (void)sys().futimens(fd_of(f), nullptr); }

  Result<File> reopen(int descriptor, bool writable) override {
    try {
      std::string label = "fd " + std::to_string(descriptor);
      struct stat st {};
      if (sys().fstat(descriptor, &st) != 0) return os_error(errno, "cannot use", label);
      if (!S_ISREG(st.st_mode))
        return Error{Errc::invalid_argument, 0, "'" + label + "' is not a regular file (or memfd); pass a cache file"};
      // Never more access than the caller gave: reopening /proc/self/fd/N read-write would turn a
      // read-only descriptor (a host's way of keeping a reader from writing) into a writable one.
      const int mode = sys().fcntl(descriptor, F_GETFL, 0);
      if (mode < 0) return os_error(errno, "cannot use", label);
      if (writable && (mode & O_ACCMODE) == O_RDONLY)
        return Error{Errc::read_only, EBADF,
                     "'" + label + "' was opened read-only: pass a read-write descriptor to add entries, or set read_only"};
      // A description of our own: flock and OFD locks belong to the description, and a dup
      // would share the caller's (two caches of one process would then both hold "the" lease).
      const std::string proc = "/proc/self/fd/" + std::to_string(descriptor);
      int fd = -1;
      do {
        fd = sys().open(proc.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
      } while (fd < 0 && errno == EINTR);
      if (fd < 0 && (errno == EACCES || errno == EPERM) && writable)
        return os_error(errno, "cannot open for writing", label, "Pass a descriptor opened read-write, or set read_only.");
      if (fd < 0) fd = sys().fcntl(descriptor, F_DUPFD_CLOEXEC, 0);  // no /proc: share the description
      if (fd < 0) return os_error(errno, "cannot duplicate", label);
      return File(*this, static_cast<Handle>(fd), std::move(label));
    } catch (...) {
      return Error{Errc::no_memory, 0, "out of memory"};
    }
  }

  Result<File> create_anonymous(const char* name) override {
#if defined(__linux__) && defined(MFD_ALLOW_SEALING)
    std::string label = ":memory:";  // before the call: nothing may fail once the descriptor is ours
    const int fd = sys().memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return os_error(errno, "cannot create an anonymous file for", label);
    File file(*this, static_cast<Handle>(fd), std::move(label));
    // Nobody holding the descriptor may ever cut pages from under a reader's mapping (SIGBUS).
    if (sys().fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return os_error(errno, "cannot seal", file.path());
    return file;
#else
    (void)name;
    return Error{Errc::unsupported, 0, "':memory:' caches need memfd_create (Linux)"};
#endif
  }

  bool vanishes_with_holders(const File& f) noexcept override {
#if defined(__linux__) && defined(F_GET_SEALS)
    // Every shmem file answers F_GET_SEALS, and one that is not a sealable memfd (a tmpfs file,
    // a memfd made without MFD_ALLOW_SEALING) answers F_SEAL_SEAL alone, which it can never
    // lose. Anything else is a memfd made sealable, ":memory:"'s among them (F_SEAL_SHRINK).
    const int seals = sys().fcntl(fd_of(f), F_GET_SEALS, 0);
    return seals >= 0 && seals != F_SEAL_SEAL;
#else
    (void)f;
    return false;
#endif
  }

  int native_descriptor(const File& f) const noexcept override { return fd_of(f); }
  Result<std::uint64_t> first_hole(const File& f, std::uint64_t offset, std::uint64_t len) override {
    const std::uint64_t end = offset + len;
#ifdef SEEK_HOLE
    const int fd = fd_of(f);
    std::uint64_t at = offset;
    // ext4, XFS and btrfs report a preallocated extent that was never written as a hole, like
    // one that has no blocks at all; only the second is damage. Each hole SEEK_HOLE finds is
    // checked against the extent map, and the walk goes on past allocated extents. A file cut
    // into more pieces than this is not walked: the checksum decides.
    for (int pieces = 0; pieces < 64; ++pieces) {
      // The file offset this moves is never used: every read and write says where it goes.
      const off_t found = sys().lseek(fd, static_cast<off_t>(at), SEEK_HOLE);
      if (found < 0) {
        const int err = errno;
        if (err == ENXIO) return at;  // at or past the end of the file: nothing there at all
        // EINVAL: a kernel or file system without SEEK_HOLE. Not knowing is not a hole.
        if (err == EINVAL || errc_of_errno(err) == Errc::unsupported) return end;
        return os_error(err, "cannot look for holes in", f.path());
      }
      const auto hole = static_cast<std::uint64_t>(found);
      if (hole >= end) return end;
      const std::uint64_t allocated = allocated_from(fd, hole, end);
      if (allocated <= hole) return hole;
      at = allocated;
      if (at >= end) return end;
    }
    return end;
#else
    (void)f;
    return end;
#endif
  }

  // The end of the run of allocated extents (written or not) that covers `at`, up to `end`; `at`
  // itself when no extent covers it, or when the file system keeps no extent map we can read.
  static std::uint64_t allocated_from(int fd, std::uint64_t at, std::uint64_t end) noexcept {
#if defined(__linux__) && defined(FS_IOC_FIEMAP)
    constexpr unsigned kExtents = 32;
    alignas(struct fiemap) unsigned char buf[sizeof(struct fiemap) + kExtents * sizeof(struct fiemap_extent)];
    auto* map = reinterpret_cast<struct fiemap*>(buf);
    std::uint64_t covered = at;
    for (int rounds = 0; rounds < 8 && covered < end; ++rounds) {
      std::memset(buf, 0, sizeof buf);
      map->fm_start = covered;
      map->fm_length = end - covered;
      map->fm_extent_count = kExtents;
      if (sys().ioctl(fd, FS_IOC_FIEMAP, map) != 0) return covered;
      const unsigned n = std::min(map->fm_mapped_extents, kExtents);
      bool last = n == 0;
      for (unsigned i = 0; i < n; ++i) {
        const struct fiemap_extent& x = map->fm_extents[i];
        if (x.fe_logical > covered) return covered;  // a gap: a real hole begins here
        covered = std::max<std::uint64_t>(covered, x.fe_logical + x.fe_length);
        if (x.fe_flags & FIEMAP_EXTENT_LAST) last = true;
      }
      if (last || n < kExtents) break;
    }
    return std::min(covered, end);
#else
    (void)fd;
    (void)end;
    return at;
#endif
  }

  Result<bool> try_lock(const File& f) override {
    for (;;) {
      if (sys().flock(fd_of(f), LOCK_EX | LOCK_NB) == 0) return true;
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK) return false;
      return os_error(errno, "cannot lock", f.path());
    }
  }

  void unlock(const File& f) noexcept override { (void)sys().flock(fd_of(f), LOCK_UN); }

  // An open-file-description lock (Linux 3.15+): owned by the descriptor like flock, not by the
  // process like a classic fcntl lock (which any close of any descriptor of the file would drop),
  // and independent of the lease's flock. A read lock for "in use", a write lock to replace.
  Result<bool> try_lock_in_use(const File& f, bool exclusive) override {
#ifdef F_OFD_SETLK
    struct flock fl {};
    fl.l_type = static_cast<short>(exclusive ? F_WRLCK : F_RDLCK);
    fl.l_whence = SEEK_SET;
    fl.l_start = kInUseOffset;
    fl.l_len = 1;
    for (;;) {
      if (sys().fcntl_lock(fd_of(f), F_OFD_SETLK, &fl) == 0) return true;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EACCES) return false;
      return os_error(errno, exclusive ? "cannot lock (exclusively)" : "cannot lock (shared)", f.path());
    }
#else
    (void)f;
    (void)exclusive;
    return Error{Errc::unsupported, 0, "open-file-description locks are not available on this system"};
#endif
  }

  Result<bool> in_use_by_others(const File& f) override {
#ifdef F_OFD_GETLK
    // Would an exclusive lock conflict? F_OFD_GETLK needs no write access, unlike taking it.
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kInUseOffset;
    fl.l_len = 1;
    for (;;) {
      if (sys().fcntl_lock(fd_of(f), F_OFD_GETLK, &fl) == 0) return fl.l_type != F_UNLCK;
      if (errno == EINTR) continue;
      return os_error(errno, "cannot ask for the in-use lock", f.path());
    }
#else
    (void)f;
    return Error{Errc::unsupported, 0, "open-file-description locks are not available on this system"};
#endif
  }

  void unlock_in_use(const File& f) noexcept override {
#ifdef F_OFD_SETLK
    struct flock fl {};
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kInUseOffset;
    fl.l_len = 1;
    (void)sys().fcntl_lock(fd_of(f), F_OFD_SETLK, &fl);
#else
    (void)f;
#endif
  }

  std::size_t map_granularity() const noexcept override {
    // Cannot fail where mmap exists; if it somehow did, a wrong guess makes maps fail (an
    // error), where a page of -1 would make every alignment in the cache wrong.
    static const std::size_t page = [] {
      const long p = sys().sysconf(_SC_PAGESIZE);
      return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
    }();
    return page;
  }

  int process_id() const noexcept override { return static_cast<int>(sys().getpid()); }

  std::uint64_t file_size_limit() const noexcept override {
    struct rlimit rl {};
    // getrlimit fails only for a bad resource or pointer, neither of which this call has.
    if (sys().getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return static_cast<std::uint64_t>(rl.rlim_cur);
  }

 private:
  // File chunks mapped into reservations, by start address, with their file's path: what
  // flush_mapping, which gets only an address, names in its errors.
  struct Mapped {
    std::uintptr_t end;
    std::string path;
  };

  void remember_mapping(void* at, std::size_t len, const File& f) noexcept {
    try {
      std::string path = f.path();
      std::lock_guard<std::mutex> lock(mapped_mu_);
      const auto a = reinterpret_cast<std::uintptr_t>(at);
      mapped_[a] = Mapped{a + len, std::move(path)};
    } catch (...) {
    }
  }

  void forget_mappings(void* base, std::size_t size) noexcept {
    std::lock_guard<std::mutex> lock(mapped_mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(base);
    mapped_.erase(mapped_.lower_bound(a), mapped_.lower_bound(a + size));
  }

  std::string mapped_path(const void* addr) const {
    std::lock_guard<std::mutex> lock(mapped_mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    auto it = mapped_.upper_bound(a);
    if (it == mapped_.begin() || (--it)->second.end <= a) return "(unknown file)";
    return it->second.path;
  }

  mutable std::mutex mapped_mu_;
  std::map<std::uintptr_t, Mapped> mapped_;

 public:
  std::uint64_t address_space_limit() const noexcept override {
    struct rlimit rl {};
    if (sys().getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return static_cast<std::uint64_t>(rl.rlim_cur);
  }

  bool boot_id(std::uint8_t (&out)[16]) noexcept override {
    // Read once per process, when it first succeeds: it cannot change while we run. Outside the
    // call table, like sysconf(_SC_PAGESIZE): a once-per-process read that would make the first
    // open's calls differ from every later one's (a failure is handled: verification per process).
    std::lock_guard<std::mutex> lock(boot_mu_);
    if (!boot_known_) {
      const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
      if (fd < 0) return false;
      char text[37] = {};
      const ssize_t n = ::pread(fd, text, 36, 0);
      ::close(fd);
      if (n != 36 || !parse_uuid(text, boot_)) return false;
      boot_known_ = true;
    }
    std::memcpy(out, boot_, sizeof boot_);
    return true;
  }

  std::int64_t change_clock_ns() noexcept override {
#if defined(CLOCK_REALTIME_COARSE)
    struct timespec ts {};
    if (sys().clock_gettime(CLOCK_REALTIME_COARSE, &ts) != 0) return 0;
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
#else
    return 0;
#endif
  }

  std::int64_t monotonic_ns() noexcept override {
    struct timespec ts {};
    if (sys().clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }

  Result<void> prepare_for_stores(const File& f, std::uint64_t offset, std::uint64_t len) override {
    // One page of zeros, never written (so it stays the kernel's shared zero page), named
    // kIovecs times in each pwritev: 1 MiB per call, as many calls as writing a 1 MiB buffer
    // took, without 1 MiB of .bss in every process that loads the library. The iovecs (4 KiB)
    // are on the stack.
    constexpr std::size_t kZeros = 4096, kIovecs = 256;
    alignas(64) static std::byte zeros[kZeros];
    struct iovec iov[kIovecs];
    while (len > 0) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(len, kZeros * kIovecs));
      if (offset + n > file_size_limit()) return file_size_limit_reached(f);
      // The 1 MiB piece, over as many calls as it takes (interrupted, or short: the next call
      // starts where the last one ended).
      for (std::size_t done = 0; done < n;) {
        int count = 0;
        for (std::size_t put = done; put < n; put += kZeros) iov[count++] = {zeros, std::min(kZeros, n - put)};
        const ssize_t w = sys().pwritev(fd_of(f), iov, count, static_cast<off_t>(offset + done));
        if (w < 0) {
          if (errno == EINTR) continue;
          return os_error(errno, "write failed on", f.path());
        }
        if (w == 0) return Error{Errc::io, 0, "write made no progress on '" + f.path() + "'"};
        done += static_cast<std::size_t>(w);
      }
      offset += n;
      len -= n;
    }
    return {};
  }

  void start_write_back(const File& f, std::uint64_t offset, std::uint64_t size) noexcept override {
#if defined(__linux__)
    if (size > 0)
      (void)sys().sync_file_range(static_cast<int>(f.handle()), static_cast<off_t>(offset), static_cast<off_t>(size),
                                  SYNC_FILE_RANGE_WRITE);
#else
    // Elsewhere no range write-back without a mapping: the finalize does it all.
    (void)f;
    (void)offset;
    (void)size;
#endif
  }

  bool write_back(const File& f, std::uint64_t offset, std::uint64_t size) noexcept override {
#if defined(__linux__)
    if (size == 0) return true;
    const unsigned flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
    for (;;) {
      if (sys().sync_file_range(static_cast<int>(f.handle()), static_cast<off_t>(offset), static_cast<off_t>(size),
                                flags) == 0)
        return true;
      if (errno != EINTR) return false;
    }
#else
    (void)f;
    (void)offset;
    (void)size;
    return false;
#endif
  }

  bool has_access_list(const File& f) noexcept override {
    const ssize_t n = sys().fgetxattr(static_cast<int>(f.handle()), "system.posix_acl_access", nullptr, 0);
    if (n >= 0) return true;
    return errno != ENODATA && errno != ENOTSUP;  // absent, or a file system without ACLs
  }

  Mount mount_of(const File& f) noexcept override {
    Mount m;
#if defined(__linux__)
    struct statfs fs {};
    if (sys().fstatfs(static_cast<int>(f.handle()), &fs) != 0) return m;
    m.read_only = (fs.f_flags & ST_RDONLY) != 0;
    // Not overlayfs, which is not in the list: a stacked file's times, pages and file system are
    // its layers', which nothing here can reach without trusting paths (docs/DESIGN.md,
    // "Read-only mounts and prebuilt caches").
    m.kernel_times = kernel_keeps_times(fs);
#else
    (void)f;
#endif
    return m;
  }

  Result<void> make_directory(const std::string& path, unsigned mode) override {
    if (sys().mkdir(path.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
      return os_error(errno, "cannot create the directory", path);
    return {};
  }

  std::optional<std::uint32_t> effective_user() noexcept override { return static_cast<std::uint32_t>(sys().geteuid()); }

  std::int64_t change_window_ns(const File& f, const FileInfo& info) noexcept override {
    struct statfs fs {};
    if (sys().fstatfs(static_cast<int>(f.handle()), &fs) != 0) return 0;
    switch (static_cast<std::uint64_t>(static_cast<unsigned long>(fs.f_type)) & 0xffffffffu) {
      // File systems whose change times another machine or a user-space server may not keep, or
      // that this process may see late (attribute caches), or that a store through a shared
      // mapping never moves (tmpfs, ramfs: no write fault updates their times): verification
      // stays per process there.
      case 0x01021994:  // tmpfs (and /dev/shm)
      case 0x858458f6:  // ramfs
      // Stacked file systems: the pages are the lower file's, so writing back through this
      // descriptor leaves them dirty (write_back cannot make a store fault).
      case 0x794c7630:  // overlayfs (containers' root)
      case 0x61756673:  // aufs
      case 0xf15f:      // eCryptfs
      case 0x6969:      // NFS
      case 0xfe534d42:  // SMB2
      case 0xff534d42:  // CIFS
      case 0x517b:      // SMB
      case 0x65735546:  // FUSE
      case 0x01021997:  // 9p
      case 0x00c36400:  // Ceph
      case 0x5346414f:  // AFS
      case 0x73757245:  // Coda
      case 0x01161970:  // GFS2
      case 0x7461636f:  // OCFS2
      case 0x0bd00bd0:  // Lustre
      case 0x47504653:  // GPFS
      case 0x564c:      // NCP
        return 0;
      // File systems that keep nanoseconds where the inode has room for them. ext2/3/4 (one
      // magic) keep whole seconds in 128-byte inodes: the kernel then stamps whole seconds (the
      // super block's time granularity), so a change time with a sub-second part proves this
      // file's are kept to the nanosecond. A whole-second one takes the flat window: at worst a
      // one-in-a-billion fine time costs one process's trust, never a missed change.
      case 0xef53:      // ext2, ext3, ext4
      case 0x58465342:  // xfs
      case 0x9123683e:  // btrfs
      case 0xf2f52010:  // f2fs (Android's data partition)
      case 0x2fc12fc1:  // zfs
      case 0xca451a4e:  // bcachefs
        if (info.ctime_ns % 1000000000 != 0) return kFineChangeWindowNs;
        return kCoarseChangeWindowNs;
      // FAT (even seconds), exFAT (10 ms, but whole seconds for what it calls a change time on
      // some kernels), ntfs3, UDF, ISO 9660 and everything unknown: the flat window.
      default:
        return kCoarseChangeWindowNs;
    }
  }

 private:
  static std::uint64_t fs_type(const struct statfs& fs) noexcept {
    return static_cast<std::uint64_t>(static_cast<unsigned long>(fs.f_type)) & 0xffffffffu;
  }
  // Local file systems on which every change to a file's bytes (a write, a store through a
  // mapping's write fault) moves a change time the kernel sets from its clock.
  static bool kernel_keeps_times(const struct statfs& fs) noexcept {
    switch (fs_type(fs)) {
      case 0xef53: case 0x58465342: case 0x9123683e: case 0xf2f52010: case 0x2fc12fc1: case 0xca451a4e:
        return true;
      default:
        return false;
    }
  }
  static bool parse_uuid(const char* text, std::uint8_t (&out)[16]) noexcept {
    int nibbles = 0;
    for (const char* c = text; *c != '\0' && nibbles < 32; ++c) {
      int v;
      if (*c >= '0' && *c <= '9') v = *c - '0';
      else if (*c >= 'a' && *c <= 'f') v = *c - 'a' + 10;
      else if (*c >= 'A' && *c <= 'F') v = *c - 'A' + 10;
      else if (*c == '-') continue;
      else return false;
      out[nibbles / 2] = static_cast<std::uint8_t>(nibbles % 2 == 0 ? v << 4 : (out[nibbles / 2] | v));
      ++nibbles;
    }
    return nibbles == 32;
  }

  std::mutex boot_mu_;
  bool boot_known_ = false;
  std::uint8_t boot_[16] = {};

 public:
  void lock_for_fork() noexcept {
    boot_mu_.lock();
    mapped_mu_.lock();
  }
  void unlock_after_fork() noexcept {
    mapped_mu_.unlock();
    boot_mu_.unlock();
  }
};

PosixPlatform& posix_platform() noexcept {
  // Never destroyed, as the registry and the log are not: a host may close a cache from an exit
  // handler it registered before it loaded the library (dlopen), and such handlers run after the
  // library's own static destructors. A destroyed platform there freed its mapping table twice.
  static PosixPlatform& platform = *new PosixPlatform;
  return platform;
}

}  // namespace

PosixCalls& posix_calls() noexcept { return g_calls; }
const PosixCalls& default_posix_calls() noexcept { return kDefaultCalls; }

Platform& os() noexcept { return posix_platform(); }

void lock_for_fork() noexcept { posix_platform().lock_for_fork(); }
void unlock_after_fork() noexcept { posix_platform().unlock_after_fork(); }

namespace {
std::atomic<std::uint64_t> g_fork_generation{0};
void count_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

std::uint64_t fork_generation() noexcept {
  // Outside the call table: registering a handler is neither I/O nor anything a test needs to
  // fail (a failure is handled: the caller falls back to comparing process ids).
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &count_fork_in_child) == 0;
  return registered ? g_fork_generation.load(std::memory_order_relaxed) : kForkGenerationUnknown;
}

}  // namespace weightcache::platform
