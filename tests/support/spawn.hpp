// Runs a helper executable as a real separate process (posix_spawn, no shell) and reports how
// it ended. Multi-process tests use it to get a fresh address space and a fresh registry.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

extern char** environ;

namespace weightcache::test {

struct ExitStatus {
  bool exited = false;  // ended by exit(); otherwise by a signal, or never started
  int code = -1;        // exit code when exited
  int signal = 0;       // terminating signal, 0 if none
  int spawn_errno = 0;  // nonzero when the process could not be started

  bool ok() const noexcept { return exited && code == 0; }
  std::string describe() const {
    if (spawn_errno != 0) return std::string("could not start: ") + std::strerror(spawn_errno);
    if (exited) return "exited with code " + std::to_string(code);
    if (signal != 0) return std::string("killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
    return "unknown status";
  }
};

/// Starts `exe` with `args` (argv[0] is `exe`) and the current environment; -1 on failure with
/// the errno in *spawn_errno.
inline pid_t spawn_process(const std::string& exe, const std::vector<std::string>& args, int* spawn_errno = nullptr) {
  std::vector<std::string> storage;
  storage.reserve(args.size() + 1);
  storage.push_back(exe);
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ);
  if (spawn_errno != nullptr) *spawn_errno = rc;
  return rc == 0 ? pid : -1;
}

/// Waits for `pid` to end (retrying EINTR).
inline ExitStatus wait_process(pid_t pid) {
  ExitStatus st;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    st.spawn_errno = errno;
    return st;
  }
  if (WIFEXITED(status)) {
    st.exited = true;
    st.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    st.signal = WTERMSIG(status);
  }
  return st;
}

/// Runs `exe` to completion.
inline ExitStatus run_process(const std::string& exe, const std::vector<std::string>& args) {
  int err = 0;
  const pid_t pid = spawn_process(exe, args, &err);
  if (pid < 0) {
    ExitStatus st;
    st.spawn_errno = err != 0 ? err : ECHILD;
    return st;
  }
  return wait_process(pid);
}

}  // namespace weightcache::test
