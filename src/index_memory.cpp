#include "index_memory.hpp"

#include <algorithm>
#include <cstdint>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace weightcache {

namespace {

#ifdef __linux__
constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14; older kernels: EINVAL

// [base, base + len) of fresh zeroed memory aligned to `huge`, len a multiple of it, or nullptr.
void* map_aligned(std::size_t len, std::size_t huge) noexcept {
  // Over-map by one huge page and trim both ends: mmap only promises page alignment.
  const std::size_t over = len + huge;
  void* raw = ::mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto a = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (a + huge - 1) & ~(static_cast<std::uintptr_t>(huge) - 1);
  if (start > a) (void)::munmap(raw, start - a);
  const std::size_t tail = (a + over) - (start + len);
  if (tail > 0) (void)::munmap(reinterpret_cast<void*>(start + len), tail);
  return reinterpret_cast<void*>(start);
}
#endif

}  // namespace

IndexMemory::~IndexMemory() {
  // The arena returns its chunks before this dies; anything left is unmapped here.
#ifdef __linux__
  for (const Chunk& c : mapped_) (void)::munmap(c.base, c.len);
#endif
}

std::size_t IndexMemory::mapped_bytes() const noexcept {
  std::size_t n = 0;
  for (const Chunk& c : mapped_) n += c.len;
  return n;
}

void* IndexMemory::do_allocate(std::size_t bytes, std::size_t align) {
  const bool populate = populate_next_;
  populate_next_ = false;
#ifdef __linux__
  if (bytes >= map_bytes_ && align <= kHugeBytes && bytes <= SIZE_MAX - 2 * kHugeBytes) {
    mapped_.reserve(mapped_.size() + 1);  // may throw; before the mapping, so nothing leaks
    const std::size_t len = (bytes + kHugeBytes - 1) & ~(kHugeBytes - 1);
    if (void* p = map_aligned(len, kHugeBytes)) {
      // Both advisory: a kernel without transparent huge pages, or older than 5.14, faults the
      // pages in one at a time as the index fills them, as it would for the heap.
      (void)::madvise(p, len, MADV_HUGEPAGE);
      if (populate) (void)::madvise(p, std::min(len, bytes), kPopulateWrite);
      mapped_.push_back(Chunk{p, len});
      return p;
    }
    // No address space or memory for a mapping: the heap may still have some.
  }
#else
  (void)populate;
#endif
  return ::operator new(bytes, std::align_val_t{align});
}

void IndexMemory::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t align) {
  const auto it = std::find_if(mapped_.begin(), mapped_.end(), [p](const Chunk& c) { return c.base == p; });
  if (it == mapped_.end()) {
    ::operator delete(p, std::align_val_t{align});  // unsized: clang before 19 has no sized deallocation by default
    return;
  }
#ifdef __linux__
  (void)::munmap(it->base, it->len);
#endif
  mapped_.erase(it);
}

IndexArena::~IndexArena() {
  for (const Chunk& c : chunks_) upstream_.deallocate(c.base, c.len, kChunkAlign);
}

void* IndexArena::do_allocate(std::size_t bytes, std::size_t align) {
  if (align > kChunkAlign) throw std::bad_alloc();  // nothing in the index asks for more
  if (cur_ != nullptr) {
    const auto c = reinterpret_cast<std::uintptr_t>(cur_);
    const std::uintptr_t at = (c + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
    if (at >= c && at - c <= static_cast<std::size_t>(end_ - cur_) &&
        bytes <= static_cast<std::size_t>(end_ - cur_) - (at - c)) {
      cur_ = reinterpret_cast<char*>(at + bytes);
      return reinterpret_cast<void*>(at);
    }
  }
  if (bytes > SIZE_MAX - kChunkAlign) throw std::bad_alloc();
  std::size_t len;
  if (hint_ != 0) {
    // The open's chunk: made for the whole index the file holds, and filled at once.
    len = std::max(hint_, bytes);
    if (len >= IndexMemory::kMapBytes) upstream_.populate_next();
    hint_ = 0;
  } else {
    len = std::max(next_, bytes);
    next_ = std::min(next_ * 2, kMaxGrowth);
  }
  chunks_.reserve(chunks_.size() + 1);  // may throw: before the chunk, so nothing leaks
  void* c = upstream_.allocate(len, kChunkAlign);
  chunks_.push_back(Chunk{c, len});
  chunk_bytes_ += len;
  // A chunk is aligned to kChunkAlign, so the allocation fits at its start.
  cur_ = static_cast<char*>(c) + bytes;
  end_ = static_cast<char*>(c) + len;
  return c;
}

}  // namespace weightcache
