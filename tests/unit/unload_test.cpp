// A host may unload the library (dlclose) as soon as wc_close returns: no thread of the
// library's may still be running its code then. Before the fix, the write-back thread (finalize
// with durability none or async) and the verify-ahead thread said they were done and were
// detached; close waited for the "done", and the thread was still returning through the
// library's code (and the C++ runtime the library had brought in) when dlclose unmapped it: a C
// host crashed (SIGSEGV) within a few hundred rounds, pinned to one CPU (a hostile review's
// finding). weightcache_unload_child is that host.
#include <gtest/gtest.h>

#include "temp_dir.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

using weightcache::test::TempDir;

void run_host(const std::string& mode, int rounds) {
  if (rounds > 1) {
#if defined(__i386__)
    // Open: in a 32-bit process the library loaded a second time crashes in pthread_create
    // (Debian 12's lib32 glibc; libstdc++ loaded and unloaded with it). To be understood.
    GTEST_SKIP() << "loading the library again in one i386 process crashes in pthread_create (under study)";
#endif
    // Not yet run under qemu-user (scripts/test-arch), where the i386 crash's cause may also apply.
    if (std::getenv("WEIGHTCACHE_EMULATED") != nullptr)
      GTEST_SKIP() << "reloading the library is not yet verified under emulation";
  }
  TempDir dir("wc-unload");
  const std::string dir_path = dir.file("");
  std::string r = std::to_string(rounds);
  const char* argv[] = {WEIGHTCACHE_UNLOAD_CHILD, WEIGHTCACHE_SHARED_LIBRARY, mode.c_str(), dir_path.c_str(),
                        r.c_str(), nullptr};
  // The host's environment, with leak detection off for it in a sanitized build (ASAN_OPTIONS wins
  // over the host's own default): the library's never-destroyed process-wide state stays behind
  // each unload by design, and LeakSanitizer would report it at the host's exit.
  std::vector<std::string> env_strings;
  bool asan_set = false;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v = *e;
    if (v.rfind("ASAN_OPTIONS=", 0) == 0) {
      v += ":detect_leaks=0";
      asan_set = true;
    }
    env_strings.push_back(v);
  }
  if (!asan_set) env_strings.push_back("ASAN_OPTIONS=detect_leaks=0");
  std::vector<char*> envp;
  for (auto& v : env_strings) envp.push_back(v.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, WEIGHTCACHE_UNLOAD_CHILD, nullptr, nullptr, const_cast<char**>(argv), envp.data()), 0);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) ASSERT_EQ(errno, EINTR);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the host died of signal " << WTERMSIG(status) << " (" << mode << ")";
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3)
    GTEST_SKIP() << "dlclose did not unload the library here (a sanitizer's runtime may hold it): nothing to test";
  ASSERT_EQ(WEXITSTATUS(status), 0) << "a setup step failed in the host (" << mode << ")";
}

// finalize with durability none or async starts the write-back thread; close waits for it.
TEST(Unload, RightAfterCloseOfANoneWriterWhoseFinalizeStartedWriteBack) { run_host("none", 1000); }
TEST(Unload, RightAfterCloseOfAnAsyncWriterWhoseFinalizeStartedWriteBack) { run_host("async", 1000); }

// Opening a cache of 16 MiB or more with first-use verification starts the verify-ahead thread;
// closing at once stops and waits for it.
TEST(Unload, RightAfterCloseOfAReaderWhoseOpenStartedVerifyAhead) { run_host("verify-ahead", 2000); }

// A host closes a cache from an exit handler it registered before it loaded the library: that
// handler runs after the library's static destructors (a hostile review's finding: the platform
// layer was one of them, and the close freed its mapping table twice).
TEST(Unload, ACacheClosedFromAnExitHandlerThatRunsAfterTheLibrarysStaticDestructors) { run_host("atexit-close", 1); }

}  // namespace
