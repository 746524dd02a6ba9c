// GoogleTest side of the multi-process suite: spawning helper processes (and never leaving one
// behind), pipes for start gates and ready signals, and an independent decode of a cache file
// through the format code, so a test checks the file itself and not only what the API says.
// The lease is probed with tests/support/lease_probe.hpp.
#pragma once

#include "lease_probe.hpp"
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

#ifndef _WIN32
#include <fcntl.h>
#include <unistd.h>
#endif

namespace weightcache::test::mp {

#ifndef WEIGHTCACHE_MP_CHILD
#error "WEIGHTCACHE_MP_CHILD must name the helper executable (see tests/multiprocess/CMakeLists.txt)"
#endif
inline const std::string kChildExe = helper_exe(WEIGHTCACHE_MP_CHILD);

/// A pipe whose one end is inherited by spawned helpers (the other is not), so a parent can
/// release many children at once (gate: children read, parent closes its end) or collect
/// "ready" bytes (children write; EOF once every child wrote and closed, or died). On Windows
/// the inherited end is an inheritable handle and Children starts helpers with bInheritHandles.
class Pipe {
 public:
  enum class Inherit { read_end, write_end };
  explicit Pipe(Inherit which) {
#ifdef _WIN32
    HANDLE r = nullptr, w = nullptr;
    if (::CreatePipe(&r, &w, nullptr, 0) == 0) throw std::runtime_error("CreatePipe failed");
    read_ = reinterpret_cast<PipeEnd>(r);
    write_ = reinterpret_cast<PipeEnd>(w);
    const HANDLE inherited = which == Inherit::read_end ? r : w;
    ::SetHandleInformation(inherited, HANDLE_FLAG_INHERIT, HANDLE_FLAG_INHERIT);
#else
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read_ = fds[0];
    write_ = fds[1];
    const int inherited = which == Inherit::read_end ? fds[0] : fds[1];
    ::fcntl(inherited, F_SETFD, 0);
#endif
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  PipeEnd read_fd() const noexcept { return read_; }
  PipeEnd write_fd() const noexcept { return write_; }
  void close_read() noexcept {
    close_pipe_end(read_);
    read_ = kNoPipe;
  }
  void close_write() noexcept {
    close_pipe_end(write_);
    write_ = kNoPipe;
  }
  /// Reads `n` bytes, one per child; false when the writers closed early (a child failed).
  bool read_bytes(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (!read_byte(read_)) return false;
    return true;
  }

 private:
  PipeEnd read_ = kNoPipe, write_ = kNoPipe;
};

/// Helper processes of one test. Whatever happens to the test, none outlives it: the destructor
/// kills and reaps those not waited for.
class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    for (Process p : procs_)
      if (p != kNoProcess) {
        kill_process(p);
        (void)wait_process(p);
      }
  }

  /// Starts `mp_child <mode> args...` (with the inheritable pipe ends); returns its index.
  std::size_t start(const std::string& mode, std::vector<std::string> args) {
    args.insert(args.begin(), mode);
    int err = 0;
    const Process p = spawn_process(kChildExe, args, &err, /*inherit_handles=*/true);
    if (p == kNoProcess) {
      ExitStatus st;
      st.spawn_errno = err;
      ADD_FAILURE() << "cannot start " << kChildExe << ": " << st.describe();
    }
    procs_.push_back(p);
    return procs_.size() - 1;
  }
  /// Ends child `i` at once (SIGKILL; TerminateProcess on Windows); wait(i) then reaps it.
  bool kill(std::size_t i) {
    const Process p = procs_.at(i);
    return p != kNoProcess && kill_process(p);
  }
  std::size_t size() const noexcept { return procs_.size(); }

  ExitStatus wait(std::size_t i) {
    const Process p = procs_.at(i);
    if (p == kNoProcess) return ExitStatus{};
    procs_[i] = kNoProcess;
    return wait_process(p);
  }
  /// Asserts that every child not yet waited for exits 0.
  ::testing::AssertionResult all_succeed() {
    std::string failures;
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      if (procs_[i] == kNoProcess) continue;
      const ExitStatus st = wait(i);
      if (!st.ok()) failures += " child " + std::to_string(i) + " " + st.describe() + ";";
    }
    if (failures.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "helper processes failed:" << failures
                                         << " (exit codes: 11 cache error, 12 wrong or missing bytes, "
                                            "13 heap fallback; their stderr is above)";
  }

 private:
  std::vector<Process> procs_;
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
  // (slot_in_bounds: the index lies within `raw`, so its size fits a size_t.)
  const std::span<const std::byte> trailer(b + fi.slot.index_offset,
                                           static_cast<std::size_t>(fi.slot.index_size + format::kFooterSize));
  const auto p = format::decode_trailer(trailer, fi.slot, h.fixed.alignment, &fi.records, &detail);
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
