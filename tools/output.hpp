// Presentation helpers of the command-line tool: hex and human sizes, and the progress line.
// Keys are shown and parsed as the library does (inspect::display_key, parse_key).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace weightcache::cli {

/// Exit status of every command (docs/CLI.md lists them).
enum ExitCode : int {
  kExitOk = 0,
  kExitProblems = 1,  // verify found problems; cat: no such entry, or it is damaged
  kExitUsage = 2,
  kExitCannotRead = 3,  // cannot open or read the file, or it is not a usable cache file
  kExitBusy = 4,        // a writer holds the lease
  kExitIo = 5,          // any other I/O failure (writing, syncing, renaming)
};

/// "0x" + 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

/// "1.5 GiB" style size for humans.
std::string human_bytes(std::uint64_t n);

/// A progress line on stderr, shown only when stderr is a terminal and the run has already lasted
/// a moment: short runs and pipes never see it.
class Progress {
 public:
  Progress(std::string label, std::uint64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(std::uint64_t bytes);
  /// add() as a callback for the library's inspection calls; this Progress must outlive it.
  std::function<void(std::uint64_t)> callback() {
    return [this](std::uint64_t bytes) { add(bytes); };
  }
  /// Clears the line (if one was drawn).
  void finish();

 private:
  std::string label_;
  std::uint64_t total_ = 0;
  std::uint64_t done_ = 0;
  bool enabled_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace weightcache::cli
