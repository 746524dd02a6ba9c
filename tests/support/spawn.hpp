// Runs a helper executable as a real separate process (no shell) and reports how it ended:
// posix_spawn on POSIX, CreateProcessW on Windows. Multi-process tests use it to get a fresh
// address space and a fresh registry.
#pragma once

#include "child_exit.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#ifdef _WIN32
#include "win32_util.hpp"
#else
#include <fcntl.h>
#include <signal.h>
#include <grp.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;
#endif

namespace weightcache::test {

#ifdef _WIN32
/// A started child: its process handle (owned by whoever waits for it), or kNoProcess.
using Process = HANDLE;
inline const Process kNoProcess = nullptr;
#else
using Process = pid_t;
inline constexpr Process kNoProcess = -1;
#endif

struct ExitStatus {
  bool exited = false;  // ended by exit() (on Windows: ended at all); otherwise by a signal, or never started
  int code = -1;        // exit code when exited (on Windows also an exception code such as 0xC0000005)
  int signal = 0;       // terminating signal, 0 if none (always 0 on Windows)
  int spawn_errno = 0;  // nonzero when the process could not be started: errno, or GetLastError() on Windows

  bool ok() const noexcept { return exited && code == 0; }
  std::string describe() const {
#ifdef _WIN32
    if (spawn_errno != 0) return "could not start: Windows error " + std::to_string(spawn_errno);
    if (exited && (code < 0 || code > 255)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(code));
      return std::string("exited with code ") + hex;
    }
#else
    if (spawn_errno != 0) return std::string("could not start: ") + std::strerror(spawn_errno);
    if (!exited && signal != 0)
      return std::string("killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
#endif
    if (exited) return "exited with code " + std::to_string(code) + " (" + child_exit_meaning(code) + ")";
    return "unknown status";
  }
};

/// The helper executable that CMake named `configured` (its full path at build time). A
/// cross build runs the tests elsewhere (Wine sees the build tree as Z:\...), so on Windows the
/// helper is looked up by name next to the running test binary, where CMake builds it.
inline std::string helper_exe(const std::string& configured) {
#ifdef _WIN32
  const auto slash = configured.find_last_of("\\/");
  return sibling_exe(slash == std::string::npos ? configured : configured.substr(slash + 1));
#else
  return configured;
#endif
}

/// Whether a program of this build can start another program of this build itself (an example
/// that runs copies of itself). Not in a cross build run under qemu-user without binfmt_misc: the
/// emulator runs only the program it was given, and the kernel cannot start a foreign one. Tests
/// that need it skip there, saying so.
inline bool programs_start_programs() {
#if defined(WEIGHTCACHE_TEST_EMULATOR) && !defined(_WIN32)
  FILE* f = std::fopen("/proc/sys/fs/binfmt_misc/status", "re");
  if (f == nullptr) return false;
  char state[16] = {};
  const bool on = std::fgets(state, sizeof state, f) != nullptr && std::strncmp(state, "enabled", 7) == 0;
  std::fclose(f);
  return on;  // a registered handler for this architecture is then assumed (qemu-user-binfmt)
#else
  return true;
#endif
}
inline constexpr const char* kNoSelfStart =
    "the program starts copies of itself, which qemu-user cannot run without binfmt_misc";

#ifndef _WIN32
/// The command line that starts `exe` with `args`: through the emulator in a cross build run under
/// qemu-user without binfmt_misc (the kernel cannot start the helper itself; the child is then the
/// emulator running it, so its pid is the one to signal and reap).
inline std::vector<std::string> command_line(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> storage;
  storage.reserve(args.size() + 2);
#ifdef WEIGHTCACHE_TEST_EMULATOR
  storage.push_back(WEIGHTCACHE_TEST_EMULATOR);
#endif
  storage.push_back(exe);
  storage.insert(storage.end(), args.begin(), args.end());
  return storage;
}
/// execve's argv for a command line (pointers into it: keep it alive).
inline std::vector<char*> argv_of(std::vector<std::string>& storage) {
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  return argv;
}
#endif

/// Starts `exe` with `args` (argv[0] is `exe`) and the current environment; kNoProcess on
/// failure with errno (GetLastError() on Windows) in *spawn_errno. A POSIX child inherits every
/// descriptor without FD_CLOEXEC; a Windows child inherits the handles marked inheritable only
/// when `inherit_handles` (bInheritHandles), which suites that hand pipes to children ask for.
inline Process spawn_process(const std::string& exe, const std::vector<std::string>& args, int* spawn_errno = nullptr,
                             [[maybe_unused]] bool inherit_handles = false) {
#ifdef _WIN32
  const std::wstring app = wide(exe);
  std::wstring cmd = quote_arg(app);
  for (const auto& a : args) cmd += L" " + quote_arg(wide(a));
  STARTUPINFOW si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  DWORD error = 0;
  // Process creation is the harness, not the code under test. Under Wine it has failed once in
  // CI on a freshly made prefix (no child ran; the cause was not recorded), so a failed launch
  // is reported with its error and tried again a few times before the test sees it.
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) ::Sleep(100u * static_cast<DWORD>(attempt));
    std::wstring line = cmd;  // CreateProcessW may modify the command line in place
    const BOOL inherit = inherit_handles ? TRUE : FALSE;
    if (::CreateProcessW(app.c_str(), line.data(), nullptr, nullptr, inherit, 0, nullptr, nullptr, &si, &pi) != 0) {
      ::CloseHandle(pi.hThread);
      if (spawn_errno != nullptr) *spawn_errno = 0;
      return pi.hProcess;
    }
    error = ::GetLastError();
    std::fprintf(stderr, "spawn_process: CreateProcessW(%s) attempt %d failed: Windows error %lu\n", exe.c_str(),
                 attempt + 1, static_cast<unsigned long>(error));
  }
  if (spawn_errno != nullptr) *spawn_errno = static_cast<int>(error);
  return kNoProcess;
#else
  std::vector<std::string> storage = command_line(exe, args);
  std::vector<char*> argv = argv_of(storage);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, storage.front().c_str(), nullptr, nullptr, argv.data(), environ);
  if (spawn_errno != nullptr) *spawn_errno = rc;
  return rc == 0 ? pid : kNoProcess;
#endif
}

#ifndef _WIN32
/// Starts `exe` with `args` (argv[0] is `exe`), its stdout and stderr written into the files
/// `out` and `err` (created or truncated); kNoProcess on failure. POSIX only: the suites that
/// run installed programs and parse what they print.
inline Process spawn_to_files(const std::string& exe, const std::vector<std::string>& args, const std::string& out,
                              const std::string& err) {
  std::vector<std::string> storage = command_line(exe, args);
  std::vector<char*> argv = argv_of(storage);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, storage.front().c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : kNoProcess;
}

/// spawn_to_files, the program run as user `uid` and group `gid` with no supplementary groups
/// (a root test's way to run a program unprivileged); kNoProcess on failure, exit 127 when the
/// child could not change user or start the program.
inline Process spawn_to_files_as(uid_t uid, gid_t gid, const std::string& exe, const std::vector<std::string>& args,
                                 const std::string& out, const std::string& err) {
  std::vector<std::string> storage = command_line(exe, args);
  std::vector<char*> argv = argv_of(storage);
  const pid_t pid = ::fork();  // only async-signal-safe calls in the child
  if (pid != 0) return pid > 0 ? pid : kNoProcess;
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(127);
  if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(127);
  ::execve(argv[0], argv.data(), environ);
  ::_exit(127);
}
#endif

/// Waits for `process` to end (retrying EINTR) and releases it.
inline ExitStatus wait_process(Process process) {
  ExitStatus st;
#ifdef _WIN32
  DWORD code = 0;
  if (::WaitForSingleObject(process, INFINITE) != WAIT_OBJECT_0 || ::GetExitCodeProcess(process, &code) == 0) {
    st.spawn_errno = static_cast<int>(::GetLastError());
  } else {
    st.exited = true;
    st.code = static_cast<int>(code);
  }
  ::CloseHandle(process);
#else
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(process, &status, 0);
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
#endif
  return st;
}

#ifdef _WIN32
/// What a Windows process ended by kill_process exits with (128 + SIGKILL, as shells show it).
inline constexpr int kKilledExitCode = 137;
#endif

/// Ends `process` at once, as SIGKILL does (TerminateProcess on Windows): no handler and no
/// clean-up of its own run; the OS closes its files and drops its locks. Neither waits for it
/// nor releases it: wait_process does.
inline bool kill_process(Process process) {
#ifdef _WIN32
  return ::TerminateProcess(process, static_cast<UINT>(kKilledExitCode)) != 0;
#else
  return ::kill(process, SIGKILL) == 0;
#endif
}

/// Whether `st` is how a process ended by kill_process ends.
inline bool ended_by_kill(const ExitStatus& st) {
#ifdef _WIN32
  return st.exited && st.code == kKilledExitCode;
#else
  return !st.exited && st.signal == SIGKILL;
#endif
}

/// Runs `exe` to completion.
inline ExitStatus run_process(const std::string& exe, const std::vector<std::string>& args) {
  int err = 0;
  const Process process = spawn_process(exe, args, &err);
  if (process == kNoProcess) {
    ExitStatus st;
    st.spawn_errno = err != 0 ? err : ECHILD;
    return st;
  }
  return wait_process(process);
}

}  // namespace weightcache::test
