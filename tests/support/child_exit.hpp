// Exit codes of the tests' child processes, helper executables and forked children alike: one
// set for every suite, so that a code means the same thing wherever a parent reads it (and
// ExitStatus::describe() can say what). A child that fails says what failed on stderr too.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace weightcache::test {

inline constexpr int kChildOk = 0;
/// Wrong bytes served, or a key missing (or present) where it must not be.
inline constexpr int kChildMismatch = 1;
/// Started with arguments it does not take.
inline constexpr int kChildUsage = 2;
/// A library call failed: open, reserve, insert, finalize, refresh, compact...
inline constexpr int kChildCacheError = 3;
/// The child could not set up what the test needs: drop privileges, set a limit, write its
/// report or log.
inline constexpr int kChildSetupFailed = 4;
/// The library worked and served the right bytes, but what the child saw is still not what the
/// test expects: a count, a state, a fallback, a log (an entry packed where every look-up should
/// hit, a warning logged twice). The message says which.
inline constexpr int kChildUnexpected = 5;
/// An entry went to the heap where the file was expected.
inline constexpr int kChildFellBack = 6;
/// The OS refused to rename a file over one that others hold open.
inline constexpr int kChildRefused = 7;
/// A forked child that was to become another program could not (redirecting its standard
/// streams or exec failed): the shell's code, outside the range of any program's own codes.
inline constexpr int kChildExecFailed = 127;

/// What a child's exit code means, for a parent's failure message.
inline const char* child_exit_meaning(int code) {
  switch (code) {
    case kChildOk: return "ok";
    case kChildMismatch: return "wrong or missing bytes";
    case kChildUsage: return "bad arguments";
    case kChildCacheError: return "a library call failed";
    case kChildSetupFailed: return "the child's setup failed";
    case kChildUnexpected: return "not what the test expects";
    case kChildFellBack: return "fell back to the heap";
    case kChildRefused: return "the OS refused to replace an open file";
    case kChildExecFailed: return "could not start the program";
    default: return "not a child exit code (a crash?)";
  }
}

/// In a helper executable: says on stderr what failed and returns `code`, for main to return.
inline int child_failed(int code, const std::string& what) {
  if (what.empty()) std::fprintf(stderr, "child: %s\n", child_exit_meaning(code));
  else std::fprintf(stderr, "child: %s (%s)\n", what.c_str(), child_exit_meaning(code));
  std::fflush(stderr);
  return code;
}

/// In a forked child: says on stderr what failed and ends the process at once, without running
/// the parent's atexit handlers or static destructors (the child has a copy of the parent's
/// state, which is not its to tear down).
[[noreturn]] inline void child_exit(int code, const std::string& what = {}) {
  if (code != kChildOk) child_failed(code, what);
  std::_Exit(code);
}

}  // namespace weightcache::test
