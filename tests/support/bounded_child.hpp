// A forked child whose hang the parent detects (POSIX only): for tests of fork() beside threads,
// where a lock held by a parent thread at the fork would make the child wait forever. The bound
// detects a hang; it does not measure speed.
#pragma once

#if defined(__linux__) || defined(__APPLE__)
#include "child_exit.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace weightcache::test {

// ASan's allocator (clang 14's compiler-rt) keeps its own lock across fork, so a child forked
// while another thread allocates may wait in ASan itself, whatever the code under test does.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif
#else
inline constexpr bool kUnderAsan = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif
#else
inline constexpr bool kUnderTsan = false;
#endif

// Generous: a child that opens a small cache and logs a line takes milliseconds; only a child
// that waits for a lock nobody will release takes this long.
inline constexpr std::chrono::seconds kHangBound{20};

/// Forks; the child runs `body` and exits with its result. The parent waits for it at most
/// kHangBound, then kills it. "" when the child exited 0, else what happened.
template <typename Body>
std::string run_child_bounded(Body body) {
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) child_exit(body());
  const auto deadline = std::chrono::steady_clock::now() + kHangBound;
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0) return "waitpid failed";
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return "the child hung (killed after " + std::to_string(kHangBound.count()) +
             " s): it waited for a lock a parent thread held at the fork";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildOk) return {};
  if (WIFEXITED(status))
    return "the child exited " + std::to_string(WEXITSTATUS(status)) + " (" +
           child_exit_meaning(WEXITSTATUS(status)) + ")";
  return "the child died of signal " + std::to_string(WTERMSIG(status));
}

}  // namespace weightcache::test
#endif
