// WEIGHTCACHE_TEST_PAGE_SIZE=N (16384, 65536): this process's cache library sees pages of N
// bytes and is refused, with EINVAL, every mapping call a kernel with N-byte pages refuses,
// while the kernel underneath (4 KiB pages) does the work. Linked into every test and helper
// executable of a POSIX build (tests/CMakeLists.txt); the variable is inherited by helpers.
//
// Why not just qemu-aarch64 -p N: it reports N but cannot emulate a shared file mapping whose
// file ends inside an N-byte page (a host page of it would lie past EOF), so it refuses to map
// any finalized cache file whose size is not a multiple of N, which a real kernel maps. Here
// the page size the library computes with, and every alignment a kernel demands, are N; only
// the granularity of SIGBUS past EOF stays the host's.
#include "platform/posix_calls.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include <sys/mman.h>
#include <unistd.h>

namespace {

using weightcache::platform::PosixCalls;

std::uintptr_t g_page = 0;
PosixCalls g_os;

bool misaligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % g_page != 0; }

void* shim_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (static_cast<std::uint64_t>(off) % g_page != 0 || ((flags & MAP_FIXED) != 0 && misaligned(addr))) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  if ((flags & MAP_FIXED) != 0) return g_os.mmap(addr, len, prot, flags, fd, off);
  // The kernel picks the address: one with N-byte pages picks a multiple of N.
  const size_t padded = len + g_page;
  void* p = g_os.mmap(nullptr, padded, prot, flags, fd, off);
  if (p == MAP_FAILED || !misaligned(p)) {
    if (p != MAP_FAILED) g_os.munmap(static_cast<char*>(p) + len, g_page);
    return p;
  }
  if (fd >= 0) {  // a file mapping must keep its offset at the start: map it again, aligned
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    g_os.munmap(p, padded);
    void* at = reinterpret_cast<void*>((start + g_page - 1) / g_page * g_page);
    return g_os.mmap(at, len, prot, flags | MAP_FIXED, fd, off);
  }
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (start + g_page - 1) / g_page * g_page;
  g_os.munmap(p, aligned - start);
  g_os.munmap(reinterpret_cast<void*>(aligned + len), start + padded - (aligned + len));
  return reinterpret_cast<void*>(aligned);
}

int shim_munmap(void* addr, size_t len) {
  if (misaligned(addr)) return errno = EINVAL, -1;
  return g_os.munmap(addr, len);
}
int shim_mprotect(void* addr, size_t len, int prot) {
  if (misaligned(addr)) return errno = EINVAL, -1;
  return g_os.mprotect(addr, len, prot);
}
int shim_msync(void* addr, size_t len, int flags) {
  if (misaligned(addr)) return errno = EINVAL, -1;
  return g_os.msync(addr, len, flags);
}
int shim_madvise(void* addr, size_t len, int advice) {
  if (misaligned(addr)) return errno = EINVAL, -1;
  return g_os.madvise(addr, len, advice);
}
long shim_sysconf(int name) {
  if (name == _SC_PAGESIZE) return static_cast<long>(g_page);
  return g_os.sysconf(name);
}

// Before main, so before the library first asks for the page size (it keeps the answer).
[[gnu::constructor]] void install() {
  const char* v = std::getenv("WEIGHTCACHE_TEST_PAGE_SIZE");
  if (v == nullptr || *v == '\0') return;
  const unsigned long long page = std::strtoull(v, nullptr, 10);
  if (page < 4096 || (page & (page - 1)) != 0) return;
  PosixCalls& calls = weightcache::platform::posix_calls();
  g_os = calls;
  g_page = static_cast<std::uintptr_t>(page);
  calls.mmap = shim_mmap;
  calls.munmap = shim_munmap;
  calls.mprotect = shim_mprotect;
  calls.msync = shim_msync;
  calls.madvise = shim_madvise;
  calls.sysconf = shim_sysconf;
}

}  // namespace
