// Where an EntryIndex's storage comes from (entries, keys, hash tables).
//
// An open builds the in-memory index of every entry at once: for 10,000 entries about 2 MiB
// touched for the first time, which from the C++ heap is about 500 page faults, each a trap, a
// page allocation and a clearing (2-3 us apiece with a hypervisor's memory accounting, most of a
// new process's open). The index never frees anything before it dies (entries and keys stay at
// their address for lock-free readers; a grown table's old copy stays readable), so its storage
// is a monotonic arena. What the arena asks for in chunks of kMapBytes or more comes from an
// anonymous mapping of the library's own (Linux): aligned to 2 MiB and advised MADV_HUGEPAGE, so
// that the kernel backs it with huge pages where transparent huge pages are allowed (one fault
// per 2 MiB), and populated in one call (MADV_POPULATE_WRITE) when the open knows its size, so
// that where huge pages are not allowed it is one system call instead of one trap per page.
// Smaller chunks, other systems and a failed mapping use operator new, as before. See
// docs/DESIGN.md, "The index's memory".
#pragma once

#include <cstddef>
#include <memory_resource>
#include <vector>

namespace weightcache {

/// The upstream of an EntryIndex's arena. Not thread-safe: the index's writer lock covers it.
class IndexMemory final : public std::pmr::memory_resource {
 public:
  /// Chunks of at least this many bytes are mapped (on Linux).
  static constexpr std::size_t kMapBytes = std::size_t{1} << 20;
  /// The size and alignment of a mapped chunk's pages (x86-64's and arm64's 4 KiB-page PMD size).
  static constexpr std::size_t kHugeBytes = std::size_t{2} << 20;

  /// Chunks of `map_bytes` or more are mapped (Linux); a scratch buffer that dies with its call
  /// (an index read at open) can use a lower bar than the index that stays.
  explicit IndexMemory(std::size_t map_bytes = kMapBytes) noexcept : map_bytes_(map_bytes) {}
  IndexMemory(const IndexMemory&) = delete;
  IndexMemory& operator=(const IndexMemory&) = delete;
  ~IndexMemory() override;

  /// Pre-fault the next mapped chunk at once (the open, which knows it will fill it).
  void populate_next() noexcept { populate_next_ = true; }

  /// Bytes in mapped chunks now (for tests and stats).
  std::size_t mapped_bytes() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  struct Chunk {
    void* base;
    std::size_t len;
  };
  std::vector<Chunk> mapped_;
  std::size_t map_bytes_;
  bool populate_next_ = false;
};

/// A monotonic arena over an IndexMemory: bump allocation in chunks, all freed when it dies. The
/// first chunk can be sized by the open (size_hint) and is pre-faulted; chunks after it start at
/// 16 KiB and double up to 8 MiB (or the allocation's size), whatever the first chunk's size:
/// std::pmr::monotonic_buffer_resource grows each chunk from the last, so the first insert after
/// opening a large index would have mapped half as much again as the whole index.
class IndexArena final : public std::pmr::memory_resource {
 public:
  static constexpr std::size_t kFirstChunk = 16 * 1024;
  static constexpr std::size_t kMaxGrowth = std::size_t{8} << 20;
  static constexpr std::size_t kChunkAlign = 64;  // the most any of the index's allocations asks

  IndexArena() = default;
  IndexArena(const IndexArena&) = delete;
  IndexArena& operator=(const IndexArena&) = delete;
  ~IndexArena() override;

  /// Before the first allocation: the first chunk holds `bytes` and is pre-faulted. Later: no effect.
  void size_hint(std::size_t bytes) noexcept {
    if (chunks_.empty()) hint_ = bytes;
  }

  const IndexMemory& upstream() const noexcept { return upstream_; }
  /// Bytes of all chunks (mapped or not).
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override;
  void do_deallocate(void*, std::size_t, std::size_t) override {}  // freed when the arena dies
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  struct Chunk {
    void* base;
    std::size_t len;
  };
  IndexMemory upstream_;  // declared first: outlives the chunks it gave
  std::vector<Chunk> chunks_;
  char* cur_ = nullptr;
  char* end_ = nullptr;
  std::size_t hint_ = 0;
  std::size_t next_ = kFirstChunk;
  std::size_t chunk_bytes_ = 0;
};

}  // namespace weightcache
