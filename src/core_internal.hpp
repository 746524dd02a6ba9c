// Constants and small helpers the parts of Core share (core*.cpp); not part of any API.
#pragma once

#include <bit>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <system_error>
#include <thread>

namespace weightcache::core_detail {

// Entry::state. kVerifying: one thread (a look-up or the verify-ahead thread) is hashing it;
// others wait for its verdict instead of hashing the same bytes again.
// kTrusted: an earlier process verified it in the state the file was in at open (core_trust.cpp);
// first use checks the file is still in that state (one fstat) or hashes it.
inline constexpr std::uint8_t kUnverified = 0, kGood = 1, kBad = 2, kVerifying = 3, kTrusted = 4;
// Verify ahead only when there is enough to gain from a second core.
inline constexpr std::uint64_t kVerifyAheadMinBytes = 16ull << 20;
// Entries this big have their pages mapped in one call before they are hashed.
inline constexpr std::uint64_t kPopulateMinBytes = 256ull << 10;
// Entries are hashed in pieces of this size, each mapped in one call just before: the
// verify-ahead thread looks at its stop flag between pieces, so close waits for one piece at
// most (~0.5 ms warm, a few ms from disk), never for a whole multi-GiB entry.
inline constexpr std::uint64_t kHashChunk = 8ull << 20;
// File entries this big are looked up in the file system's allocation map before they are read:
// a range without disk blocks in one is corruption (the writer allocates every byte with
// posix_fallocate before it writes), and reading a hole costs as much as reading data (a hostile
// 100 GiB sparse entry took 67 s). Below it, hashing even a hole costs ~10 ms at most.
inline constexpr std::uint64_t kHoleCheckMinBytes = 16ull << 20;
inline constexpr std::uint64_t kMinChunk = 1ull << 20;       // first growth of the file
inline constexpr std::uint64_t kMapGranularity = 1ull << 16;  // Windows' allocation granularity; a
                                                              // multiple of every page size we know
// The largest default reservation for a file, and the share of the address space it may take:
// 1/512 leaves room for hundreds of caches (400 take 78% at most) and for the host.
inline constexpr std::uint64_t kMaxDefaultFileSpan = 256ull << 30;
inline constexpr std::uint64_t kDefaultSpanShare = 512;
// No entry or reservation is larger (the format allows more; no machine has that memory).
// In a 32-bit process, more than half the address space is as implausible as 2^48 is in a 64-bit
// one (and SIZE_MAX itself is below 2^48 there).
inline constexpr std::uint64_t kMaxEntrySize =
    sizeof(std::size_t) >= 8 ? 1ull << 48 : static_cast<std::uint64_t>(SIZE_MAX / 2);
inline constexpr const char* kMaxEntrySizeText =
    sizeof(std::size_t) >= 8 ? "2^48 bytes" : "2^31 - 1 bytes (half the address space)";

inline constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }
inline constexpr bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
inline constexpr std::uint64_t floor_pow2(std::uint64_t v) { return v == 0 ? 0 : std::uint64_t{1} << (63 - std::countl_zero(v)); }

// Joins a library thread that has said it is done (it is at most returning through this
// library's code), so that no thread runs that code once close returns and a host may unload the
// library. A join that fails (it cannot, short of a bug) leaves the thread detached instead of
// terminating the host.
inline void join_thread(std::unique_ptr<std::thread>& t) noexcept {
  if (!t || !t->joinable()) return;
  try {
    t->join();
  } catch (const std::system_error&) {
    try {
      t->detach();
    } catch (const std::system_error&) {
      (void)t.release();  // neither: never destroyed (a joinable std::thread would terminate)
    }
  }
}

}  // namespace weightcache::core_detail
