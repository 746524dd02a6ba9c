// Helper process for the environment tests: the things a test cannot do to its own process
// (lower RLIMIT_FSIZE with SIGXFSZ at its default action, look at the descriptors a new program
// inherits, hold a writer lease in another process).
//
//   env_child fsize <cache> <limit> auto|file
//       commits a few entries, then keeps reserving 256 KiB under the file size limit: with
//       auto every reservation must succeed, some on the heap; with file the first refused one
//       must say no_space. Either way WC_ERR_NO_SPACE must be logged.
//   env_child fsize-finalize <cache>
//       commits 4 entries, packs 4 more in the file, lowers the limit to the end of their data
//       and finalizes: that finalize must fail with no_space (the 4 committed stay loadable).
//   env_child list-fds <fd>
//       writes "<fd> <target>" for each open descriptor to <fd>
//   env_child hold-lease <cache> <allow_symlink>
//       opens with backing=file, reserves (taking the writer lease), writes "L" to descriptor 3
//       and waits to be killed
//
// Exit codes: child_exit.hpp (stderr says what failed). Death by SIGXFSZ
// means the library grew the file past the limit without checking it first.
#include "child_exit.hpp"
#include "env_common.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

using namespace weightcache;
using namespace weightcache::env;
using namespace weightcache::test;

namespace {

bool set_file_limit(std::uint64_t limit) {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_FSIZE, &rl) != 0) return false;
  rl.rlim_cur = static_cast<rlim_t>(limit);
  return ::setrlimit(RLIMIT_FSIZE, &rl) == 0;
}

int commit_some(WeightCache& cache, std::uint64_t first, std::uint64_t count, std::vector<Packed>* out) {
  for (std::uint64_t i = first; i < first + count; ++i) {
    Packed e;
    if (!pack(cache, i, 4096 + 512 * i, &e))
      return child_failed(kChildCacheError, "pack of a committed entry: " + last_error().message);
    out->push_back(e);
  }
  if (auto r = cache.finalize(); !r)
    return child_failed(kChildCacheError, "finalize of the committed entries: " + r.error().message);
  return kChildOk;
}

int run_fsize(const std::string& path, std::uint64_t limit, bool file_backing) {
  LogCapture log;
  if (!set_file_limit(limit)) return child_failed(kChildSetupFailed, std::string("setrlimit: ") + std::strerror(errno));
  auto opened = WeightCache::open(cache_options(path, file_backing ? Backing::file : Backing::automatic));
  if (!opened) return child_failed(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  if (cache.stats().backing != Backing::file)
    return child_failed(kChildFellBack, "the cache did not start file-backed");
  std::vector<Packed> entries;
  if (int rc = commit_some(cache, 0, 4, &entries); rc != kChildOk) return rc;
  constexpr std::size_t kChunk = 256 * 1024;
  const std::uint64_t max_chunks = limit / kChunk + 8;  // enough to cross the limit
  bool refused = false;
  for (std::uint64_t i = 100; i < 100 + max_chunks && !refused; ++i) {
    Packed e;
    if (!pack(cache, i, kChunk, &e)) {
      if (!file_backing)
        return child_failed(kChildCacheError, "reserve with backing=auto failed: " + last_error().message);
      if (last_error().code != Errc::no_space)
        return child_failed(kChildUnexpected,
                            "reserve failed with " + std::string(to_string(last_error().code)) + ", not no_space: " +
                                last_error().message);
      refused = true;
      break;
    }
    entries.push_back(e);
    refused = e.heap;
  }
  if (!refused) return child_failed(kChildUnexpected, "never ran into the file size limit");
  if (file_backing && cache.stats().heap_fallbacks != 0)
    return child_failed(kChildFellBack, "backing=file fell back to the heap");
  if (!file_backing && cache.stats().heap_fallbacks == 0)
    return child_failed(kChildUnexpected, "no heap fallback was counted");
  if (!log.contains("WC_ERR_NO_SPACE"))
    return child_failed(kChildUnexpected, "WC_ERR_NO_SPACE was not logged; the log was:\n" + log.all());
  for (const auto& e : entries)
    if (auto err = check(cache, e); !err.empty()) return child_failed(kChildMismatch, err);
  return kChildOk;
}

int run_fsize_finalize(const std::string& path) {
  LogCapture log;
  auto opened = WeightCache::open(cache_options(path, Backing::file));
  if (!opened) return child_failed(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  std::vector<Packed> committed, pending;
  if (int rc = commit_some(cache, 0, 4, &committed); rc != kChildOk) return rc;
  std::uint64_t data_end = 0;
  for (std::uint64_t i = 10; i < 14; ++i) {
    Packed e;
    if (!pack(cache, i, 10000, &e)) return child_failed(kChildCacheError, "pack: " + last_error().message);
    pending.push_back(e);
    data_end = std::max<std::uint64_t>(data_end, e.offset + e.size);
  }
  // The index and footer go after the data: nothing of them can be written under this limit.
  if (!set_file_limit(data_end))
    return child_failed(kChildSetupFailed, std::string("setrlimit: ") + std::strerror(errno));
  auto r = cache.finalize();
  if (r) return child_failed(kChildUnexpected, "finalize succeeded past the file size limit");
  if (r.error().code != Errc::no_space)
    return child_failed(kChildUnexpected,
                        "finalize failed with " + std::string(to_string(r.error().code)) + ", not no_space: " +
                            r.error().message);
  if (!log.contains("WC_ERR_NO_SPACE"))
    return child_failed(kChildUnexpected, "WC_ERR_NO_SPACE was not logged; the log was:\n" + log.all());
  // A failed finalize poisons nothing: every entry is still served from memory.
  for (const auto* set : {&committed, &pending})
    for (const auto& e : *set)
      if (auto err = check(cache, e); !err.empty())
        return child_failed(kChildMismatch, "after the failed finalize: " + err);
  return kChildOk;
}

int run_list_fds(int out_fd) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr)
    return child_failed(kChildSetupFailed, std::string("opendir /proc/self/fd: ") + std::strerror(errno));
  std::string listing;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n < 0) continue;
    listing += std::string(e->d_name) + " " + std::string(target, static_cast<std::size_t>(n)) + "\n";
  }
  ::closedir(d);
  if (::write(out_fd, listing.data(), listing.size()) != static_cast<ssize_t>(listing.size()))
    return child_failed(kChildSetupFailed, "cannot write the listing");
  return kChildOk;
}

int run_hold_lease(const std::string& path, bool allow_symlink) {
  Options o = cache_options(path, Backing::file);
  o.allow_symlink = allow_symlink;
  auto opened = WeightCache::open(o);
  if (!opened) return child_failed(kChildCacheError, "open: " + opened.error().message);
  if (opened.value().reserve(4096) == nullptr)
    return child_failed(kChildCacheError, "reserve: " + last_error().message);
  const char line[] = "L\n";
  if (::write(3, line, 2) != 2) return child_failed(kChildSetupFailed, "cannot report");
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __linux__
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);  // hold-lease must not outlive a test that died
#endif
  std::signal(SIGXFSZ, SIG_DFL);  // the test is that it is never raised
  if (argc < 3) return kChildUsage;
  const std::string mode = argv[1];
  if (mode == "fsize" && argc == 5)
    return run_fsize(argv[2], std::strtoull(argv[3], nullptr, 10), std::string(argv[4]) == "file");
  if (mode == "fsize-finalize" && argc == 3) return run_fsize_finalize(argv[2]);
  if (mode == "list-fds" && argc == 3) return run_list_fds(std::atoi(argv[2]));
  if (mode == "hold-lease" && argc == 4) return run_hold_lease(argv[2], std::atoi(argv[3]) != 0);
  std::fprintf(stderr, "env_child: bad arguments (see the comment at the top of env_child.cpp)\n");
  return kChildUsage;
}
