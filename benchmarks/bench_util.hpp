// Shared pieces of the benchmarks: a scratch directory on a real filesystem, deterministic size
// mixes, and the per-run record that the closing summary turns into ratios.
#pragma once

#include "proc_smaps.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include <weightcache/weight_cache.hpp>

namespace weightcache::bench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// This process's CPU seconds (user + system: page faults are system time).
double process_cpu_seconds();
/// The calling thread's CPU seconds.
double thread_cpu_seconds();

/// Wall and CPU time of one timed section. On a shared machine the wall time includes waiting
/// for a core; the CPU time does not, so the summary shows both.
struct Lap {
  double wall = 0;
  double cpu = 0;
};
class Stopwatch {
 public:
  Stopwatch() : wall0_(Clock::now()), cpu0_(process_cpu_seconds()) {}
  Lap lap() const { return {seconds_since(wall0_), process_cpu_seconds() - cpu0_}; }

 private:
  Clock::time_point wall0_;
  double cpu0_;
};

/// The directory benchmark files go to: $WEIGHTCACHE_BENCH_DIR, else the benchmark binary's
/// build directory (a disk filesystem, unlike a tmpfs /tmp). Made once, removed at exit.
const std::string& scratch_dir();
/// Filesystem type of the scratch directory ("ext4", "tmpfs", ...), for the report.
std::string scratch_fs_type();
/// A fresh path inside scratch_dir() (the file does not exist).
std::string scratch_path(const std::string& stem);
/// Removes a cache file and its lock sidecar.
void remove_cache_file(const std::string& path);

/// Sizes in [lo, hi] (uniform when !log_uniform, else log-uniform) adding up to about `total`.
std::vector<std::size_t> mixed_sizes(std::uint64_t total, std::size_t lo, std::size_t hi, std::uint64_t seed,
                                     bool log_uniform);
/// `count` sizes in [lo, hi], log-uniform.
std::vector<std::size_t> mixed_sizes_n(std::size_t count, std::size_t lo, std::size_t hi, std::uint64_t seed);

/// Writes a pattern over [p, p + size) the way a packer would: every byte stored once.
void fill_pattern(void* p, std::size_t size, std::uint64_t seed);

/// The writing loop of a packer on the cache: reserves each of `sizes` in turn, writes it with
/// fill_pattern (when `fill`) and commits it under keys[i] with look_up_or_insert (when `insert`).
/// False at the first call that fails; last_error() says why.
bool reserve_fill_insert(WeightCache& cache, const std::vector<std::size_t>& sizes,
                         const std::vector<std::string>& keys, bool fill, bool insert);

/// Live mappings (VMAs) of the file at `path` in this process, from /proc/self/maps.
std::size_t file_vmas(const std::string& path);

/// Memory counters of a process, in bytes (from /proc/<pid>/smaps_rollup or smaps); `readable`
/// is false when they could not be read.
using MemFigures = smaps::MappingUsage;
/// The whole process (smaps_rollup).
MemFigures process_memory(pid_t pid);
/// Only the mappings of the file at `path` (smaps, matched by device and inode).
MemFigures file_memory(pid_t pid, const std::string& path);

/// fdatasync of the file: its page-cache pages become clean (a dirty page mapped by one process
/// counts as its Private_Dirty even in a shared file mapping).
bool sync_file(const std::string& path);
/// Drops the file's pages from the page cache (fdatasync, then POSIX_FADV_DONTNEED) and returns
/// the fraction of its pages still resident afterwards (mincore), or -1 on failure. Pages mapped
/// by a live process cannot be dropped.
double drop_file_cache(const std::string& path);

// ---- helper processes ------------------------------------------------------------------------
/// A weightcache-bench-child started with posix_spawn; its stdin and stdout are pipes.
struct Child {
  pid_t pid = -1;
  int to_child = -1;    // closing it tells the child to exit
  int from_child = -1;  // one result line per child
};
/// Starts the helper binary with `args`; pid == -1 on failure.
Child spawn_child(const std::vector<std::string>& args);
/// The child's next line (without the newline); empty on EOF.
std::string read_child_line(const Child& c);
/// Closes the child's stdin and waits for it; true when it exited with status 0.
bool finish_child(Child& c);

// ---- the shared warm file ----------------------------------------------------------------------
/// A finalized cache of kWarmEntries entries of 4-48 KiB (about 254 MiB, in the page cache),
/// built once per run: the warm-load, thread and process benchmarks read it.
inline constexpr std::size_t kWarmEntries = 10000;
struct WarmFile {
  std::string path;
  std::string compat = "bench-warm";
  std::string keys_path;  // the keys, one per line, for helper processes
  std::vector<std::string> keys;
  std::vector<std::size_t> sizes;
  std::uint64_t payload = 0;
  std::string error;
};
const WarmFile& warm_file();
/// The warm file, or nullptr once `state` (a benchmark::State) is marked skipped with the reason
/// it could not be built.
template <class State>
const WarmFile* warm_file_or_skip(State& state) {
  const WarmFile& f = warm_file();
  if (f.error.empty()) return &f;
  state.SkipWithError(f.error.c_str());
  return nullptr;
}

// ---- the summary -----------------------------------------------------------------------------
/// One iteration's times of one benchmark, kept for the summary printed after the run.
void record_time(const std::string& name, const Lap& lap);
/// A measured quantity (a count, a size) for the summary.
void record_value(const std::string& name, double value);
bool has_time(const std::string& name);
/// Median over the iterations of the wall (cpu == false) or CPU seconds.
double median_time(const std::string& name, bool cpu = false);
bool has_value(const std::string& name);
double value(const std::string& name);
/// One iteration's measured quantity; the summary takes the median of the samples.
void record_sample(const std::string& name, double value);
bool has_sample(const std::string& name);
double median_sample(const std::string& name);

/// Options for a benchmark cache file: no flushes (durability is not what is measured).
Options bench_options(const std::string& path, const std::string& compat);

}  // namespace weightcache::bench
