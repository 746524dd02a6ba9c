// A helper process whose descriptor 3 is the write end of a pipe the test reads, line by line.
// Lines written before the child is killed stay in the pipe, so the test learns exactly how far
// the child got.
#pragma once

#include "spawn.hpp"

#include <cerrno>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

namespace weightcache::crash {

class ChildProcess {
 public:
  /// Starts `exe args...` with its report pipe on descriptor `report_fd`; check started().
  ChildProcess(const std::string& exe, const std::vector<std::string>& args, int report_fd) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      spawn_errno_ = errno;
      return;
    }
    // dup2 onto the same number would keep close-on-exec set: keep both ends away from it.
    read_fd_ = move_above(fds[0], report_fd);
    const int write_fd = move_above(fds[1], report_fd);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, write_fd, report_fd);
    std::vector<std::string> storage{exe};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    spawn_errno_ = ::posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(write_fd);  // EOF on read_fd_ once the child is gone
    if (spawn_errno_ != 0) pid_ = -1;
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)test::wait_process(pid_);
    }
    if (read_fd_ >= 0) ::close(read_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const noexcept { return pid_ > 0; }
  int spawn_errno() const noexcept { return spawn_errno_; }
  pid_t pid() const noexcept { return pid_; }

  /// Reads lines until one starts with `prefix` (true) or the child closed the pipe (false).
  bool wait_for_line(const std::string& prefix) {
    for (;;) {
      for (; scanned_ < lines_.size(); ++scanned_)
        if (lines_[scanned_].compare(0, prefix.size(), prefix) == 0) {
          ++scanned_;
          return true;
        }
      if (!read_more()) return false;
    }
  }

  /// SIGKILLs the child (if it still runs) and reaps it.
  test::ExitStatus kill_and_wait() {
    ::kill(pid_, SIGKILL);
    return wait();
  }
  test::ExitStatus wait() {
    const test::ExitStatus st = test::wait_process(pid_);
    pid_ = -1;
    return st;
  }

  /// Every line the child wrote; reads to EOF first (call after the child ended).
  const std::vector<std::string>& all_lines() {
    while (read_more()) {
    }
    return lines_;
  }

 private:
  static int move_above(int fd, int floor) {
    if (fd > floor) return fd;
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, floor + 1);
    ::close(fd);
    return moved;
  }

  bool read_more() {
    char buf[4096];
    ssize_t n;
    do {
      n = ::read(read_fd_, buf, sizeof buf);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      if (!partial_.empty()) lines_.push_back(std::move(partial_));
      partial_.clear();
      return false;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        lines_.push_back(std::move(partial_));
        partial_.clear();
      } else {
        partial_.push_back(buf[i]);
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int spawn_errno_ = 0;
  int read_fd_ = -1;
  std::string partial_;
  std::vector<std::string> lines_;
  std::size_t scanned_ = 0;
};

}  // namespace weightcache::crash
