// GoogleTest side of the multi-process suite: spawning helper processes (and never leaving one
// behind), pipes for start gates and ready signals, and an independent decode of a cache file
// through the format code, so a test checks the file itself and not only what the API says.
#pragma once

#include "mp_util.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include "format/format.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

namespace weightcache::test::mp {

#ifndef WEIGHTCACHE_MP_CHILD
#error "WEIGHTCACHE_MP_CHILD must name the helper executable (see tests/multiprocess/CMakeLists.txt)"
#endif
inline const std::string kChildExe = WEIGHTCACHE_MP_CHILD;

/// A pipe whose one end is inherited by spawned helpers (the other stays close-on-exec), so a
/// parent can release many children at once (gate: children read, parent closes its end) or
/// collect "ready" bytes (children write; EOF once every child wrote and closed, or died).
class Pipe {
 public:
  enum class Inherit { read_end, write_end };
  explicit Pipe(Inherit which) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read_ = fds[0];
    write_ = fds[1];
    const int inherited = which == Inherit::read_end ? read_ : write_;
    ::fcntl(inherited, F_SETFD, 0);
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int read_fd() const noexcept { return read_; }
  int write_fd() const noexcept { return write_; }
  void close_read() noexcept {
    if (read_ >= 0) ::close(read_);
    read_ = -1;
  }
  void close_write() noexcept {
    if (write_ >= 0) ::close(write_);
    write_ = -1;
  }
  /// Reads `n` bytes, one per child; false when the writers closed early (a child failed).
  bool read_bytes(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (!read_byte(read_)) return false;
    return true;
  }

 private:
  int read_ = -1, write_ = -1;
};

/// Helper processes of one test. Whatever happens to the test, none outlives it: the destructor
/// kills and reaps those not waited for.
class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    for (pid_t pid : pids_)
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        (void)wait_process(pid);
      }
  }

  /// Starts `mp_child <mode> args...`; returns its index (its pid is pid(index)).
  std::size_t start(const std::string& mode, std::vector<std::string> args) {
    args.insert(args.begin(), mode);
    int err = 0;
    const pid_t pid = spawn_process(kChildExe, args, &err);
    EXPECT_GT(pid, 0) << "cannot start " << kChildExe << ": " << std::strerror(err);
    pids_.push_back(pid);
    return pids_.size() - 1;
  }
  pid_t pid(std::size_t i) const { return pids_.at(i); }
  std::size_t size() const noexcept { return pids_.size(); }

  ExitStatus wait(std::size_t i) {
    const pid_t pid = pids_.at(i);
    if (pid <= 0) return ExitStatus{};
    pids_[i] = -1;
    return wait_process(pid);
  }
  /// Asserts that every child not yet waited for exits 0.
  ::testing::AssertionResult all_succeed() {
    std::string failures;
    for (std::size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] <= 0) continue;
      const ExitStatus st = wait(i);
      if (!st.ok()) failures += " child " + std::to_string(i) + " " + st.describe() + ";";
    }
    if (failures.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "helper processes failed:" << failures
                                         << " (exit codes: 11 cache error, 12 wrong or missing bytes, "
                                            "13 heap fallback; their stderr is above)";
  }

 private:
  std::vector<pid_t> pids_;
};

/// A descriptor of our own on "<cache>.lock": a separate open file description, so its flock
/// conflicts with every library writer's, in this process and others.
class LeaseProbe {
 public:
  explicit LeaseProbe(const std::string& cache_path)
      : fd_(::open((cache_path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {}
  ~LeaseProbe() {
    if (fd_ >= 0) ::close(fd_);
  }
  LeaseProbe(const LeaseProbe&) = delete;
  LeaseProbe& operator=(const LeaseProbe&) = delete;
  bool valid() const noexcept { return fd_ >= 0; }
  /// True when the lease was free and is now ours.
  bool try_take() noexcept { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
  void release() noexcept { (void)::flock(fd_, LOCK_UN); }

 private:
  int fd_ = -1;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The committed contents of a cache file, decoded with the format code alone (no Core).
struct FileIndex {
  std::string problem;  // empty when the file decodes
  std::uint64_t file_size = 0;
  format::CommitSlot slot;
  std::vector<format::IndexRecord> records;

  std::uint64_t payload() const {
    std::uint64_t n = 0;
    for (const auto& r : records) n += r.size;
    return n;
  }
  std::set<std::string> keys() const {
    std::set<std::string> k;
    for (const auto& r : records) k.insert(r.key);
    return k;
  }
};

/// Decodes the newest valid commit of `path` and checks every record's bytes against its
/// checksum and against bytes_for_key (every entry in these tests is derived from its key).
inline FileIndex decode_file(const std::string& path) {
  FileIndex fi;
  const std::string raw = read_file(path);
  fi.file_size = raw.size();
  const auto* b = reinterpret_cast<const std::byte*>(raw.data());
  if (raw.size() < format::kHeaderSize) {
    fi.problem = "shorter than a header";
    return fi;
  }
  format::DecodedHeader h;
  if (auto p = format::decode_header({b, format::kHeaderSize}, &h); p != format::Problem::none) {
    fi.problem = std::string("header: ") + format::to_string(p);
    return fi;
  }
  int best = -1;
  for (int i = 0; i < 2; ++i)
    if (h.slot_valid[i] && format::slot_in_bounds(h.slot[i], raw.size()) &&
        (best < 0 || h.slot[i].sequence > h.slot[best].sequence))
      best = i;
  if (best < 0) {
    fi.problem = "no valid commit slot";
    return fi;
  }
  fi.slot = h.slot[best];
  std::string detail;
  const auto p = format::decode_trailer({b + fi.slot.index_offset, fi.slot.index_size + format::kFooterSize}, fi.slot,
                                        h.fixed.alignment, &fi.records, &detail);
  if (p != format::Problem::none) {
    fi.problem = std::string("index: ") + format::to_string(p) + " " + detail;
    return fi;
  }
  for (const auto& r : fi.records) {
    if (format::hash_bytes(b + r.offset, r.size) != r.checksum) {
      fi.problem = "entry '" + r.key + "' fails its checksum";
      return fi;
    }
    if (bytes_for_key(r.key, r.size) != std::string_view(raw.data() + r.offset, r.size)) {
      fi.problem = "entry '" + r.key + "' holds bytes other than its key's";
      return fi;
    }
  }
  return fi;
}

inline std::string entries_to_string(const std::set<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += k + " ";
  return s;
}

}  // namespace weightcache::test::mp
