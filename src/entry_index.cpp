#include "entry_index.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace weightcache {

std::uint64_t EntryIndex::hash_key(std::string_view key) const noexcept {
  return XXH3_64bits_withSeed(key.data(), key.size(), seed_);
}

}  // namespace weightcache
