// A host may unload the library (dlclose) as soon as wc_close returns: no thread of the
// library's may still be running its code then. Before the fix, the write-back thread (finalize
// with durability none or async) and the verify-ahead thread said they were done and were
// detached; close waited for the "done", and the thread was still returning through the
// library's code (and the C++ runtime the library had brought in) when dlclose unmapped it: a C
// host crashed (SIGSEGV) within a few hundred rounds, pinned to one CPU (a hostile review's
// finding). weightcache_unload_child is that host.
#include <gtest/gtest.h>

#include "temp_dir.hpp"

#include "spawn.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace {

using weightcache::test::ExitStatus;
using weightcache::test::spawn_process;
using weightcache::test::TempDir;
using weightcache::test::wait_process;

void run_host(const std::string& mode, int rounds) {
  // Under emulation a round costs about 200 ms (qemu translates the library afresh at each load),
  // and the suite runs at three page sizes: a fiftieth of the rounds, a smoke test there.
  if (rounds > 1 && std::getenv("WEIGHTCACHE_EMULATED") != nullptr) rounds = std::max(rounds / 50, 2);
  TempDir dir("wc-unload");
  // Leak detection off for the host in a sanitized build (ASAN_OPTIONS wins over the host's own
  // default): the library's never-destroyed process-wide state stays behind each unload by design,
  // and LeakSanitizer would report it at the host's exit. This process read its own options at
  // start; the change reaches the child only.
  std::string asan = "detect_leaks=0";
  if (const char* old = std::getenv("ASAN_OPTIONS"); old != nullptr && *old != '\0') asan = std::string(old) + ":" + asan;
  ASSERT_EQ(::setenv("ASAN_OPTIONS", asan.c_str(), 1), 0);
  const ExitStatus st = wait_process(
      spawn_process(WEIGHTCACHE_UNLOAD_CHILD, {WEIGHTCACHE_SHARED_LIBRARY, mode, dir.file(""), std::to_string(rounds)}));
  ASSERT_EQ(st.spawn_errno, 0) << st.describe();
  ASSERT_TRUE(st.exited) << "the host " << st.describe() << " (" << mode << ")";
  if (st.code == 3)
    GTEST_SKIP() << "dlclose did not unload the library here (a sanitizer's runtime may hold it): nothing to test";
  ASSERT_EQ(st.code, 0) << "a setup step failed in the host (" << mode << "), exit code " << st.code
                        << " (127: its loader or a library could not be found)";
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
