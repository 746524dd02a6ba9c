// The in-memory index of a Core: where entries and their keys live, and the two hash tables that
// find an entry by key (look_up) and by offset (offset_to_addr).
//
// Readers never lock. Entries and keys are append-only and stay at their address until the
// index dies; the tables are insert-or-replace only, and a table that grows is replaced by a
// bigger copy while the old one stays readable. Writers (insert, replace, grow) must be
// serialized by the caller (Core holds write_mu_). See docs/DESIGN.md, "The index".
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <memory_resource>
#include <new>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <vector>

#include "index_memory.hpp"

namespace weightcache {

// 64 bytes (one cache line; an open builds one per entry of the file): the 8-byte fields first,
// then the small ones, with no padding between.
struct Entry {
  std::string_view key;      // bytes owned by the EntryIndex's arena
  std::uint64_t offset = 0;  // file offset, or the Core's file_span_ + arena offset for heap entries
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  // The value Core::finalizes_started() reaches with the first finalize that starts after this insert;
  // 0 for entries that came committed (loaded or merged from an index). Under write_mu_ only.
  std::uint64_t awaits_finalize = 0;
  std::atomic<Entry*> moved{nullptr};  // its bytes were moved from the heap into the file, as this entry
  std::uint32_t number = 0;            // position in the EntryIndex's storage
  bool in_file = false;
  std::atomic<bool> durable{false};    // named by a committed index (read by stats without write_mu_)
  std::atomic<std::uint8_t> state{0};  // kUnverified, kGood, kBad (core.cpp)
  std::atomic<bool> replaced{false};   // a later entry took its key: no longer an entry's offset
};
// The arena that holds entries never runs destructors.
static_assert(std::is_trivially_destructible_v<Entry>);

namespace index_detail {

/// Entry number -> Entry. An open makes one block of exactly the entries the file holds
/// (plan_first); entries after those go in blocks of 256, 512, 1024, ..., so that the directory has
/// a fixed size (no reallocation under readers) and an entry's address never changes. A block is
/// raw storage from the arena; an entry is constructed when it is added, so the pages of a block's
/// unused tail are never touched (and the open's block has no tail).
class EntryBlocks {
 public:
  static constexpr unsigned kFirstShift = 8;
  static constexpr unsigned kMaxBlocks = 40;

  explicit EntryBlocks(std::pmr::memory_resource* arena) : arena_(arena) {}

  /// Before the first add(): entries [0, n) go in one block of n. Later: no effect.
  void plan_first(std::uint64_t n) noexcept {
    if (count_ == 0) first_n_ = n;
  }

  Entry* at(std::uint64_t i) const noexcept {
    if (i < first_n_) return first_ + i;  // first_n_ and first_ are set before any entry exists
    const std::uint64_t j = (i - first_n_) + (std::uint64_t{1} << kFirstShift);
    const unsigned b = static_cast<unsigned>(std::bit_width(j)) - 1 - kFirstShift;
    return blocks_[b].load(std::memory_order_acquire) + (j - (std::uint64_t{1} << (b + kFirstShift)));
  }

  /// A fresh entry and its number. Throws std::bad_alloc.
  std::pair<Entry*, std::uint64_t> add() {
    const std::uint64_t i = count_;
    if (i < first_n_) {
      if (first_ == nullptr) first_ = static_cast<Entry*>(arena_->allocate(sizeof(Entry) * first_n_, alignof(Entry)));
    } else {
      const std::uint64_t j = (i - first_n_) + (std::uint64_t{1} << kFirstShift);
      const unsigned b = static_cast<unsigned>(std::bit_width(j)) - 1 - kFirstShift;
      if (blocks_[b].load(std::memory_order_relaxed) == nullptr) {
        void* raw = arena_->allocate(sizeof(Entry) << (b + kFirstShift), alignof(Entry));
        blocks_[b].store(static_cast<Entry*>(raw), std::memory_order_release);
      }
    }
    Entry* e = ::new (static_cast<void*>(at(i))) Entry();
    ++count_;
    return {e, i};
  }

  std::uint64_t size() const noexcept { return count_; }

 private:
  std::pmr::memory_resource* arena_;
  std::uint64_t first_n_ = 0;
  Entry* first_ = nullptr;
  std::atomic<Entry*> blocks_[kMaxBlocks] = {};
  std::uint64_t count_ = 0;  // writer only
};

/// Open addressing with linear probing over 64-bit slots: the high 32 bits are a tag from the
/// hash, the low 32 bits the entry number + 1 (0 = empty). A probe compares tags and touches an
/// entry only when they match.
class Table {
 public:
  /// A table of `capacity` (a power of two) empty slots in the arena. Throws std::bad_alloc.
  static Table* make(std::pmr::memory_resource* arena, std::size_t capacity) {
    void* raw = arena->allocate(capacity * sizeof(std::atomic<std::uint64_t>), 64);
    auto* slots = static_cast<std::atomic<std::uint64_t>*>(raw);
    for (std::size_t i = 0; i < capacity; ++i) ::new (static_cast<void*>(slots + i)) std::atomic<std::uint64_t>(0);
    return ::new (arena->allocate(sizeof(Table), alignof(Table))) Table(capacity, slots);
  }


  std::size_t capacity() const noexcept { return mask_ + 1; }
  std::atomic<std::uint64_t>& slot(std::size_t i) const noexcept { return slots_[i & mask_]; }
  std::size_t home(std::uint64_t hash) const noexcept { return static_cast<std::size_t>(hash) & mask_; }

  static std::uint64_t pack(std::uint64_t hash, std::uint64_t entry_no) noexcept {
    return (hash & 0xffffffff00000000ull) | (entry_no + 1);
  }
  static std::uint32_t tag_of(std::uint64_t slot) noexcept { return static_cast<std::uint32_t>(slot >> 32); }
  static std::uint32_t tag_of_hash(std::uint64_t hash) noexcept { return static_cast<std::uint32_t>(hash >> 32); }
  static std::uint64_t entry_of(std::uint64_t slot) noexcept { return (slot & 0xffffffffull) - 1; }

 private:
  Table(std::size_t capacity, std::atomic<std::uint64_t>* slots) : mask_(capacity - 1), slots_(slots) {}

  std::size_t mask_;
  std::atomic<std::uint64_t>* slots_;  // in the arena
};
static_assert(std::is_trivially_destructible_v<Table>);

}  // namespace index_detail

/// Entries by key and by offset. Lock-free readers, one writer at a time (see the file comment).
class EntryIndex {
 public:
  /// Up to 2^32 - 1 entries (the slot format); far beyond any file max_file_bytes allows.
  static constexpr std::uint64_t kMaxEntries = 0xffffffffull;

  explicit EntryIndex(std::uint64_t seed) : seed_(seed) {}
  EntryIndex(const EntryIndex&) = delete;
  EntryIndex& operator=(const EntryIndex&) = delete;

  /// Before the first make(): the index will hold about `entries` entries with `key_bytes` of keys
  /// (an open, from the file's index), so its storage is made for them at once. Later: no effect.
  void size_hint(std::uint64_t entries, std::uint64_t key_bytes) noexcept {
    if (entries_.size() != 0 || entries == 0 || entries > kMaxEntries || key_bytes > (std::uint64_t{1} << 40)) return;
    std::uint64_t cap = kFirstCapacity;
    while (cap / 2 < entries) cap *= 2;
    // In 64 bits: on a 32-bit system a hint past the address space is no hint (the open then fails
    // where it allocates, as it would have).
    const std::uint64_t bytes = entries * sizeof(Entry) + 2 * (cap * 8 + sizeof(index_detail::Table) + 64) +
                                entries * sizeof(by_start_[0]) + key_bytes + kHintSlack;
    if (bytes > SIZE_MAX / 2) return;
    entries_.plan_first(entries);
    arena_.size_hint(static_cast<std::size_t>(bytes));
  }

  /// Bytes of the index's storage in mappings of its own (docs/DESIGN.md, "The index's memory").
  std::size_t mapped_bytes() const noexcept { return arena_.upstream().mapped_bytes(); }
  /// Bytes of the index's storage in all (mapped or heap).
  std::size_t storage_bytes() const noexcept { return arena_.chunk_bytes(); }

  // --- readers: any thread, no lock ---------------------------------------------------------

  Entry* find_key(std::string_view key) const noexcept {
    return find(by_key_, hash_key(key), [&](const Entry& e) { return e.key == key; });
  }

  Entry* find_offset(std::uint64_t offset) const noexcept {
    return find(by_offset_, hash_offset(offset), [&](const Entry& e) { return e.offset == offset; });
  }

  /// Live keys (each key once). Safe beside a writer: sees some of its new entries or none.
  std::uint64_t live_count() const noexcept { return live_.load(std::memory_order_acquire); }

  /// Calls f(Entry&) for each live entry (the one its key maps to now).
  template <class F>
  void for_each_live(F&& f) const {
    const index_detail::Table* t = by_key_.load(std::memory_order_acquire);
    if (t == nullptr) return;
    for (std::size_t i = 0; i < t->capacity(); ++i) {
      const std::uint64_t s = t->slot(i).load(std::memory_order_acquire);
      if (s != 0) f(*entries_.at(index_detail::Table::entry_of(s)));
    }
  }

  // --- writer: one thread at a time (the caller's lock) -----------------------------------

  /// A new, unpublished entry with a copy of `key`; fill it, then publish(). Throws
  /// std::bad_alloc, or std::length_error past kMaxEntries.
  Entry* make(std::string_view key) {
    if (entries_.size() >= kMaxEntries) throw std::length_error("too many entries");
    char* bytes = static_cast<char*>(arena_.allocate(key.size() == 0 ? 1 : key.size(), 1));
    if (!key.empty()) std::memcpy(bytes, key.data(), key.size());
    const std::string_view k(bytes, key.size());
    auto [e, no] = entries_.add();
    e->key = k;
    e->number = static_cast<std::uint32_t>(no);
    return e;
  }

  /// Publishes an entry from make(), filled in, under its key and its offset: readers find it
  /// from now on. Returns the entry the key mapped to before (now replaced), or nullptr. Throws
  /// std::bad_alloc, and then nothing changed.
  Entry* publish(Entry* e) {
    reserve(live_.load(std::memory_order_relaxed) + 1, offsets_ + 1);
    by_start_.emplace_back(e->offset, e->number);  // the last thing that can throw
    // Offset first: a reader that finds the key must also find its offset (offset_to_addr).
    if (put(*by_offset_.load(std::memory_order_relaxed), hash_offset(e->offset), e->number,
            [&](const Entry& x) { return x.offset == e->offset; }) == nullptr)
      ++offsets_;
    Entry* old = put(*by_key_.load(std::memory_order_relaxed), hash_key(e->key), e->number,
                     [&](const Entry& x) { return x.key == e->key; });
    if (old == nullptr) live_.fetch_add(1, std::memory_order_release);
    else old->replaced.store(true, std::memory_order_release);
    if (e->in_file) {
      ++file_entries_;
      file_key_bytes_ += e->key.size();
    }
    if (old != nullptr && old->in_file) {
      --file_entries_;
      file_key_bytes_ -= old->key.size();
    }
    return old;
  }

  /// How many live entries are in the file, and their keys' bytes: what the next committed index
  /// holds (Core keeps room for it in the file span). Writer only.
  std::uint64_t file_entries() const noexcept { return file_entries_; }
  std::uint64_t file_key_bytes() const noexcept { return file_key_bytes_; }

  /// The published entry, live or replaced, whose bytes [offset, offset + size) hold `offset`, or
  /// nullptr. Writer only: it may sort its list (entries arrive mostly in offset order, so that
  /// is a merge of what came since the last call). Throws std::bad_alloc.
  const Entry* containing(std::uint64_t offset) {
    if (sorted_ < by_start_.size()) {
      const auto mid = by_start_.begin() + static_cast<std::ptrdiff_t>(sorted_);
      std::sort(mid, by_start_.end());
      std::inplace_merge(by_start_.begin(), mid, by_start_.end());
      sorted_ = by_start_.size();
    }
    auto it = std::upper_bound(by_start_.begin(), by_start_.end(), std::make_pair(offset, ~std::uint32_t{0}));
    while (it != by_start_.begin()) {
      --it;
      const Entry* e = entries_.at(it->second);
      if (offset - e->offset < e->size) return e;
      // Another entry may start at the same offset (one replaced by another process's commit).
      if (it == by_start_.begin() || std::prev(it)->first != it->first) break;
    }
    return nullptr;
  }

  /// Room for `n` more publish() calls: none of them then allocates, so a batch is published
  /// whole or not at all. Throws std::bad_alloc, and then nothing changed that readers see.
  void reserve_publishes(std::uint64_t n) {
    reserve(live_.load(std::memory_order_relaxed) + n, offsets_ + n);
    // Geometric: the arena never gets an outgrown buffer back, so growing by each batch's size
    // (a refresh merges a few entries at a time) would leave a copy behind per batch.
    const std::size_t want = by_start_.size() + static_cast<std::size_t>(n);
    if (want > by_start_.capacity()) by_start_.reserve(std::max(want, 2 * by_start_.capacity()));
  }

  /// Room for `keys` live keys and `offsets` offsets without growing (growth copies a table).
  void reserve(std::uint64_t keys, std::uint64_t offsets) {
    grow(by_key_, keys, [this](const Entry& e) { return hash_key(e.key); });
    grow(by_offset_, offsets, [](const Entry& e) { return hash_offset(e.offset); });
  }

 private:
  std::uint64_t hash_key(std::string_view key) const noexcept;  // entry_index.cpp
  static std::uint64_t hash_offset(std::uint64_t offset) noexcept {
    // A 64-bit finalizer (splitmix64): offsets are multiples of the alignment, so their low bits
    // alone would collide.
    std::uint64_t z = offset + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  /// The entry in `table` with hash `h` that `match` accepts, or nullptr. Lock-free.
  template <class Match>
  Entry* find(const std::atomic<index_detail::Table*>& table, std::uint64_t h, Match&& match) const noexcept {
    const index_detail::Table* t = table.load(std::memory_order_acquire);
    if (t == nullptr) return nullptr;
    for (std::size_t i = t->home(h);; ++i) {
      const std::uint64_t s = t->slot(i).load(std::memory_order_acquire);
      if (s == 0) return nullptr;
      if (index_detail::Table::tag_of(s) != index_detail::Table::tag_of_hash(h)) continue;
      Entry* e = entries_.at(index_detail::Table::entry_of(s));
      if (match(*e)) return e;
    }
  }

  /// Points the slot of the matching entry, or the first empty one, at entry `no`. Returns the
  /// entry it pointed at before, or nullptr for an empty slot.
  template <class Match>
  Entry* put(index_detail::Table& t, std::uint64_t h, std::uint64_t no, Match&& match) {
    for (std::size_t i = t.home(h);; ++i) {
      auto& slot = t.slot(i);
      const std::uint64_t s = slot.load(std::memory_order_relaxed);
      if (s == 0) {
        slot.store(index_detail::Table::pack(h, no), std::memory_order_release);
        return nullptr;
      }
      if (index_detail::Table::tag_of(s) != index_detail::Table::tag_of_hash(h)) continue;
      Entry* x = entries_.at(index_detail::Table::entry_of(s));
      if (match(*x)) {
        slot.store(index_detail::Table::pack(h, no), std::memory_order_release);
        return x;
      }
    }
  }

  template <class Hash>
  void grow(std::atomic<index_detail::Table*>& cur, std::uint64_t need, Hash&& hash) {
    index_detail::Table* t = cur.load(std::memory_order_relaxed);
    // Load factor at most 1/2: short probe sequences even for unlucky hashes.
    if (t != nullptr && need <= t->capacity() / 2) return;
    std::size_t cap = t == nullptr ? kFirstCapacity : t->capacity();
    while (cap / 2 < need) cap *= 2;
    index_detail::Table* fresh = index_detail::Table::make(&arena_, cap);
    if (t != nullptr) {
      for (std::size_t i = 0; i < t->capacity(); ++i) {
        const std::uint64_t s = t->slot(i).load(std::memory_order_relaxed);
        if (s == 0) continue;
        const std::uint64_t h = hash(*entries_.at(index_detail::Table::entry_of(s)));
        std::size_t j = fresh->home(h);
        while (fresh->slot(j).load(std::memory_order_relaxed) != 0) ++j;
        fresh->slot(j).store(s, std::memory_order_relaxed);
      }
    }
    // Readers still inside the old table finish there; it stays in the arena until the index dies
    // (all old tables together are smaller than the current one).
    cur.store(fresh, std::memory_order_release);
  }

  static constexpr std::size_t kFirstCapacity = 64;
  // What the arena adds to a chunk, and the alignment of the tables and blocks inside it.
  static constexpr std::size_t kHintSlack = 4096;

  std::uint64_t seed_;
  IndexArena arena_;  // first: everything below lives in it, and it outlives them
  index_detail::EntryBlocks entries_{&arena_};
  std::atomic<index_detail::Table*> by_key_{nullptr};
  std::atomic<index_detail::Table*> by_offset_{nullptr};
  std::atomic<std::uint64_t> live_{0};
  std::uint64_t offsets_ = 0;  // distinct offsets in by_offset_ (writer only)
  std::uint64_t file_entries_ = 0, file_key_bytes_ = 0;  // live entries with in_file; writer only
  // (offset, number) of every published entry, for containing(); [0, sorted_) is sorted. Writer only.
  std::pmr::vector<std::pair<std::uint64_t, std::uint32_t>> by_start_{&arena_};
  std::size_t sorted_ = 0;
};

}  // namespace weightcache
