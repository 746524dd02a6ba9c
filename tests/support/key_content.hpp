// Entry bytes that follow from the key alone: a writer and a verifier (another thread, another
// process, or a reopen after a crash) agree on what a key must hold without telling each other.
// Standard C++ only, so every platform's suites can share it.
#pragma once

#include "random_bytes.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weightcache::test {

/// FNV-1a of the key's bytes: the same seed in every process, build and platform.
inline std::uint64_t key_seed(std::string_view key) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// Fills `out` with the first `size` bytes of `key`'s content.
inline void fill_for_key(std::string_view key, void* out, std::size_t size) noexcept {
  Rng(key_seed(key)).fill(out, size);
}

/// The first `size` bytes of `key`'s content, as fill_for_key writes them.
inline std::string bytes_for_key(std::string_view key, std::size_t size) {
  std::string s(size, '\0');
  fill_for_key(key, s.data(), s.size());
  return s;
}

}  // namespace weightcache::test
