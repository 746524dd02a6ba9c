#include "output.hpp"

#include <cstdio>

#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif

namespace weightcache::cli {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

// Progress appears only once a run has lasted this long, so quick runs never flicker a line.
constexpr auto kProgressDelay = std::chrono::milliseconds(500);
constexpr auto kProgressInterval = std::chrono::milliseconds(250);

bool stderr_is_terminal() {
#if defined(_WIN32)
  return _isatty(_fileno(stderr)) != 0;
#else
  return ::isatty(STDERR_FILENO) == 1;
#endif
}

}  // namespace

std::string hex64(std::uint64_t v) {
  std::string out = "0x0000000000000000";
  for (int i = 0; i < 16; ++i) out[17 - i] = kHexDigits[(v >> (4 * i)) & 15];
  return out;
}

std::string human_bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

Progress::Progress(std::string label, std::uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(total > 0 && stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::add(std::uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < kProgressDelay || (drawn_ && now - last_draw_ < kProgressInterval)) return;
  last_draw_ = now;
  drawn_ = true;
  const double pct = total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done_) / static_cast<double>(total_);
  std::fprintf(stderr, "\r%s: %s / %s (%.0f%%)\x1b[K", label_.c_str(), human_bytes(done_).c_str(),
               human_bytes(total_).c_str(), pct);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace weightcache::cli
