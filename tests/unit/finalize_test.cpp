// finalize: a no-op when nothing is new, re-packing identical weights never grows the file,
// stale bytes under a key are replaced for good, and the file ends with the XPWC footer.
#include "unit_test_util.hpp"

#include "format/format.hpp"

#include <cstring>
#include <fstream>
#include <map>
#include <vector>

namespace weightcache::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

constexpr EntrySetSpec kSet{.seed = 5, .count = 60, .min_size = 0, .max_size = 64 * 1024};

void write_set(const std::string& path, const EntrySetSpec& spec) {
  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  ASSERT_EQ(write_entry_set(cache, spec), "");
  ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
}

TEST(Finalize, NothingNewLeavesFileUntouched) {
  if (open_may_grow_file()) GTEST_SKIP() << "a read-write open grows the file here (Win32 legacy mapping mode)";
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  ASSERT_NO_FATAL_FAILURE(write_set(path, kSet));
  set_past_mtime(path);
  const FileState before = file_state(path);

  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  ASSERT_EQ(verify_entry_set(cache, kSet), "");  // every key hits
  EXPECT_TRUE(cache.is_finalized());
  ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  EXPECT_EQ(cache.stats().commits, 0u);
  EXPECT_EQ(file_state(path), before);
  cache = WeightCache{};  // close
  EXPECT_EQ(file_state(path), before);
}

TEST(Finalize, SecondFinalizeIsNoOp) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  ASSERT_EQ(write_entry_set(cache, kSet), "");
  ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  EXPECT_EQ(cache.stats().commits, 1u);
  set_past_mtime(path);
  const FileState before = file_state(path);
  ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  EXPECT_EQ(cache.stats().commits, 1u);
  EXPECT_EQ(file_state(path), before);
#ifdef _WIN32
  // Windows cannot shrink a file while it is mapped: the finalizes left the preallocated tail,
  // and the last close cuts it. That cut must be all the close does to the file.
  const std::string bytes = read_file(path);
  cache = WeightCache{};
  const std::string after = read_file(path);
  EXPECT_LT(after.size(), bytes.size()) << "the close did not cut the preallocated tail";
  EXPECT_TRUE(bytes.compare(0, after.size(), after) == 0) << "the close changed committed bytes";
#else
  cache = WeightCache{};
  EXPECT_EQ(file_state(path), before);
#endif
}

// Five launches on the file write_set made at `path`: each opens it, puts every entry of kSet in
// again with reinsert(cache, i, existing) (`existing`: the offset the entry already has) and
// finalizes. Each must land on the existing entry, and the file must not grow by a byte.
template <class Reinsert>
void reinsert_cycles_keep_file_size(const std::string& path, Reinsert reinsert) {
  ASSERT_NO_FATAL_FAILURE(write_set(path, kSet));
  const std::uint64_t first_size = file_size(path);
  for (int cycle = 0; cycle < 5; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    {
      WeightCache cache = open_or_fail(file_options(path));
      ASSERT_TRUE(cache);
      for (std::size_t i = 0; i < kSet.count; ++i) {
        const std::size_t existing = cache.look_up(entry_key(i));
        ASSERT_NE(existing, kNotFound) << "entry " << i;
        ASSERT_NO_FATAL_FAILURE(reinsert(cache, i, existing));
      }
      EXPECT_TRUE(cache.is_finalized());
      ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
      EXPECT_EQ(cache.stats().commits, 0u);
      EXPECT_EQ(cache.stats().entries, kSet.count);
    }
    EXPECT_EQ(file_size(path), first_size);
  }
}

// XNNPACK's flow on every launch: reserve, pack the same weights again, look_up_or_insert.
TEST(Finalize, ReopenReinsertCyclesKeepFileSize) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const auto pack_again = [](WeightCache& cache, std::size_t i, std::size_t existing) {
    const std::size_t size = entry_size(kSet, i);
    void* p = cache.reserve(size);
    ASSERT_NE(p, nullptr) << last_error().message;
    fill_entry(kSet, i, p, size);
    EXPECT_EQ(cache.look_up_or_insert(entry_key(i), p, size), existing) << "entry " << i;
  };
  ASSERT_NO_FATAL_FAILURE(reinsert_cycles_keep_file_size(path, pack_again));
  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  EXPECT_EQ(verify_entry_set(cache, kSet), "");
}

TEST(Finalize, ReopenReinsertCyclesViaCopyKeepFileSize) {
  // In Windows' legacy mapping mode an open grows the file to 64 KiB granules; the last close
  // must cut it back, so the size after each cycle is the same there too.
  TempDir dir;
  const auto copy_again = [](WeightCache& cache, std::size_t i, std::size_t existing) {
    EXPECT_EQ(cache.insert(entry_key(i), entry_bytes(kSet, i)), existing) << "entry " << i;
  };
  reinsert_cycles_keep_file_size(dir.file("cache.wcache"), copy_again);
}

// After a model update the packer produces other bytes under the same key (or the old bytes
// rotted): the new bytes must win, in this process and in every later one.
TEST(Finalize, StaleBytesUnderExistingKeyAreReplaced) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string manifest_path = dir.file("manifest.bin");
  Manifest old_entries, new_entries;
  for (int i = 0; i < 12; ++i) {
    const std::string key = "stale/" + std::to_string(i);
    const std::string a = random_bytes(1000 + i, 3000 + 100 * i);
    // Half keep their size (only the content changes), half change size.
    const std::string b = random_bytes(2000 + i, i % 2 == 0 ? a.size() : 500 + 700 * i);
    ASSERT_NE(a, b);
    old_entries.emplace_back(key, a);
    new_entries.emplace_back(key, b);
  }
  ASSERT_TRUE(write_manifest(manifest_path, new_entries));
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (const auto& [k, a] : old_entries) ASSERT_NE(cache.insert(k, a), kNotFound);
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  }
  std::map<std::string, std::size_t> old_offsets, new_offsets;
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (std::size_t i = 0; i < new_entries.size(); ++i) {
      const auto& [k, b] = new_entries[i];
      const std::size_t old_off = cache.look_up(k);
      ASSERT_NE(old_off, kNotFound);
      old_offsets[k] = old_off;
      std::size_t new_off;
      if (i % 3 == 0) {  // some through a reservation, the rest through the copy path
        void* p = cache.reserve(b.size());
        ASSERT_NE(p, nullptr);
        std::memcpy(p, b.data(), b.size());
        new_off = cache.look_up_or_insert(k, p, b.size());
      } else {
        new_off = cache.insert(k, b);
      }
      ASSERT_NE(new_off, kNotFound) << last_error().message;
      EXPECT_NE(new_off, old_off) << k << ": new bytes written over the committed ones in place";
      new_offsets[k] = new_off;
      EXPECT_EQ(cache.look_up(k), new_off) << k;
      EXPECT_EQ(verify_entry(cache, k, b, k), "");
    }
    EXPECT_FALSE(cache.is_finalized());
    EXPECT_EQ(cache.stats().entries, new_entries.size());
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    for (const auto& [k, b] : new_entries) EXPECT_EQ(cache.look_up(k), new_offsets[k]) << k;
  }
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (const auto& [k, b] : new_entries) {
      const std::size_t off = cache.look_up(k);
      EXPECT_NE(off, old_offsets[k]) << k << ": the stale entry came back after reopen";
      EXPECT_EQ(off, new_offsets[k]) << k;
      EXPECT_EQ(verify_entry(cache, k, b, k), "");
    }
    EXPECT_EQ(cache.stats().entries, new_entries.size());
  }
  EXPECT_TRUE(child_succeeds({"verify-manifest", path, manifest_path}));
}

// ---- footer ---------------------------------------------------------------------------------

std::uint64_t le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Decodes the file from its end, as tools that know only the footer do, and checks it names
// exactly `expected` (key -> bytes). Of a closed file on every platform; of an open one only
// where a mapped file can shrink (not Windows: there the last close cuts the preallocated tail).
void expect_footer_describes(const std::string& path, const std::map<std::string, std::string>& expected,
                             bool open = false) {
#ifdef _WIN32
  if (open) return;
#else
  (void)open;
#endif
  const std::string file = read_file(path);
  ASSERT_GE(file.size(), format::kHeaderSize + format::kIndexHeaderSize + format::kFooterSize);
  const std::size_t foot = file.size() - format::kFooterSize;
  const std::uint64_t index_start = le(file, foot, 8);
  EXPECT_EQ(le(file, foot + 8, 4), expected.size()) << "footer entry_count";
  EXPECT_EQ(le(file, foot + 12, 4), 0x58505743u) << "footer magic";
  EXPECT_EQ(le(file, foot + 16, 4), 0x57430001u) << "footer version";

  // index_start names the index block, which runs right up to the footer.
  ASSERT_GE(index_start, format::kHeaderSize);
  ASSERT_LE(index_start + format::kIndexHeaderSize, foot);
  EXPECT_EQ(le(file, index_start, 4), format::kIndexMagic);
  EXPECT_EQ(le(file, index_start + 8, 8), expected.size()) << "index entry_count";
  EXPECT_EQ(index_start + format::kIndexHeaderSize + le(file, index_start + 16, 8), foot) << "index body_size";

  // The records decode (white-box: the library's own decoder) to exactly the live entries.
  std::vector<std::byte> head(format::kHeaderSize);
  std::memcpy(head.data(), file.data(), head.size());
  format::DecodedHeader h;
  ASSERT_EQ(format::decode_header(head, &h), format::Problem::none);
  const int newest = h.slot[1].sequence > h.slot[0].sequence ? 1 : 0;
  ASSERT_TRUE(h.slot_valid[newest]);
  const format::CommitSlot& slot = h.slot[newest];
  EXPECT_EQ(slot.index_offset, index_start);
  EXPECT_EQ(slot.committed_size, file.size());
  EXPECT_EQ(slot.entry_count, expected.size());
  std::vector<std::byte> trailer(file.size() - index_start);
  std::memcpy(trailer.data(), file.data() + index_start, trailer.size());
  std::vector<format::IndexRecord> records;
  std::string detail;
  ASSERT_EQ(format::decode_trailer(trailer, slot, h.fixed.alignment, &records, &detail), format::Problem::none)
      << detail;
  ASSERT_EQ(records.size(), expected.size());
  for (const auto& r : records) {
    auto it = expected.find(r.key);
    ASSERT_NE(it, expected.end()) << "index names an unexpected key";
    EXPECT_EQ(r.size, it->second.size());
    ASSERT_LE(r.offset + r.size, index_start);
    EXPECT_EQ(file.compare(r.offset, r.size, it->second), 0);
  }
}

TEST(Footer, FileEndsWithFooterAfterFinalize) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  std::map<std::string, std::string> live;
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (int i = 0; i < 10; ++i) {
      std::string key = "footer/" + std::to_string(i);
      key.push_back('\0');
      live[key] = random_bytes(i, 1000 * i + 1);
      ASSERT_NE(cache.insert(key, live[key]), kNotFound);
    }
    ASSERT_TRUE(cache.finalize().ok());
    // Growth is preallocated in chunks; finalize must still leave the footer at EOF.
    ASSERT_NO_FATAL_FAILURE(expect_footer_describes(path, live, /*open=*/true));
  }
  ASSERT_NO_FATAL_FAILURE(expect_footer_describes(path, live));
  {
    // Second commit: replace three keys, add two. The count is of live keys, not of records ever
    // written.
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (int i = 0; i < 3; ++i) {
      auto it = std::next(live.begin(), 2 * i);
      it->second = random_bytes(100 + i, 777 + i);
      ASSERT_NE(cache.insert(it->first, it->second), kNotFound);
    }
    for (int i = 0; i < 2; ++i) {
      const std::string key = "footer/new/" + std::to_string(i);
      live[key] = random_bytes(200 + i, 4096);
      ASSERT_NE(cache.insert(key, live[key]), kNotFound);
    }
    // A reservation still being packed during finalize does not keep the footer from EOF...
    void* p = cache.reserve(50000);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5c, 50000);
    ASSERT_TRUE(cache.finalize().ok());
    ASSERT_NO_FATAL_FAILURE(expect_footer_describes(path, live, /*open=*/true));
    // ...and committing it afterwards, in place, is persisted by the next finalize.
    const std::size_t off = cache.look_up_or_insert("footer/reserved", p, 50000);
    ASSERT_NE(off, kNotFound);
    EXPECT_EQ(cache.offset_to_addr(off), p);
    live["footer/reserved"] = std::string(50000, '\x5c');
    ASSERT_TRUE(cache.finalize().ok());
    ASSERT_NO_FATAL_FAILURE(expect_footer_describes(path, live, /*open=*/true));
  }
  ASSERT_NO_FATAL_FAILURE(expect_footer_describes(path, live));
  EXPECT_EQ(live.size(), 13u);
}

// A file filled to the end of its span (max_file_bytes) still commits what it holds: the span
// keeps room for the index after the data. Before, a reservation could take the span's last bytes,
// every finalize then failed for want of room for the index, and nothing was ever kept (each
// later session packed everything again). Entry sizes around 64 KiB put the data's end at every
// distance from the span's end.
TEST(Finalize, ASpanFilledWithEntriesStillHasRoomForItsIndex) {
  TempDir dir;
  int sizes = 0;
  for (std::size_t size = 60 * 1024; size <= 68 * 1024; size += 40) {
    const std::string path = dir.file("span-" + std::to_string(size) + ".wcache");
    Options o = file_options(path);
    o.max_file_bytes = 1u << 20;  // the span: 2 MiB (rounded up to the reservation's alignment)
    std::vector<std::string> kept;
    {
      WeightCache cache = open_or_fail(o);
      ASSERT_TRUE(cache);
      for (int i = 0; i < 64; ++i) {
        void* p = cache.reserve(size);
        if (p == nullptr) break;  // the span is full
        std::memset(p, i + 1, size);
        const std::string key = "entry-" + std::to_string(i);
        ASSERT_NE(cache.look_up_or_insert(key, p, size), kNotFound) << size << ": " << last_error().message;
        kept.push_back(key);
      }
      ASSERT_GT(kept.size(), 10u) << size;
      const auto fin = cache.finalize();
      ASSERT_TRUE(fin.ok()) << "entries of " << size << " bytes: " << last_error().message;
    }
    WeightCache again = open_or_fail(o);
    ASSERT_TRUE(again);
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const std::size_t off = again.look_up(kept[i]);
      ASSERT_NE(off, kNotFound) << size << ": " << kept[i];
      const auto* b = static_cast<const unsigned char*>(again.offset_to_addr(off));
      ASSERT_EQ(b[0], static_cast<unsigned char>(i + 1));
      ASSERT_EQ(b[size - 1], static_cast<unsigned char>(i + 1));
    }
    ++sizes;
  }
  EXPECT_EQ(sizes, 205);
}

// The room a reservation keeps for its index record assumes a key of up to 256 bytes. A commit
// under a longer key that the span cannot index: with WC_BACKING_FILE it says so (no space) and
// leaves the reservation to the caller; with automatic backing the entry goes to heap memory, as
// a reservation the file cannot take does. Either way the file still commits what it holds.
void long_keys(Backing backing) {
  TempDir dir;
  const std::string path = dir.file("long-keys.wcache");
  Options o = file_options(path);
  o.backing = backing;
  o.max_file_bytes = 1u << 20;
  const std::size_t size = 63400;  // fills the 2 MiB span to within the index's room
  std::vector<std::string> inserted;
  int refused = 0;
  std::uint64_t in_memory = 0;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    for (int i = 0; i < 40; ++i) {
      void* p = cache.reserve(size);
      if (p == nullptr) break;
      std::memset(p, i + 1, size);
      const std::string key = std::to_string(i) + std::string(kMaxKeySize - 8, 'k');
      if (cache.look_up_or_insert(key, p, size) == kNotFound) {
        EXPECT_EQ(backing, Backing::file) << "an automatic cache refused an insert: " << last_error().message;
        EXPECT_EQ(last_error().code, Errc::no_space) << last_error().message;
        ASSERT_TRUE(cache.release(p).ok()) << "the refused reservation is not the caller's to release";
        ++refused;
        continue;
      }
      inserted.push_back(key);
    }
    ASSERT_GT(inserted.size(), 10u);
    const auto st = cache.stats();
    in_memory = st.unpersisted_entries;
    if (backing == Backing::file) {
      EXPECT_GT(refused, 0) << "every long key fitted: the test proves nothing";
    } else {
      EXPECT_GT(st.heap_fallbacks, 0u) << "every long key fitted: the test proves nothing";
    }
    const auto fin = cache.finalize();
    if (in_memory == 0) {
      ASSERT_TRUE(fin.ok()) << last_error().message;
    } else {
      EXPECT_EQ(last_error().code, Errc::no_space) << "entries kept in memory, and finalize said " << last_error().message;
    }
  }
  WeightCache again = open_or_fail(o);
  ASSERT_TRUE(again);
  std::uint64_t found = 0;
  for (const std::string& key : inserted) found += again.look_up(key) != kNotFound;
  EXPECT_EQ(found + in_memory, inserted.size());
  EXPECT_GT(found, 10u);
}

TEST(Finalize, ALongKeyThatTheSpanCannotIndexIsRefusedAtCommitWithFileBacking) { long_keys(Backing::file); }
TEST(Finalize, ALongKeyThatTheSpanCannotIndexGoesToTheHeapWithAutomaticBacking) { long_keys(Backing::automatic); }

// A reservation held across a finalize: that finalize wrote its index into the room the
// reservation kept, so its commit checks the span again. Under WC_BACKING_FILE it is refused (no
// space) and stays the caller's; under automatic backing it goes to heap memory. Either way the
// next finalize still commits (a hostile review found every later finalize failing: the commit
// was taken, and no index could follow it).
void reservation_across_finalize(Backing backing) {
  TempDir dir;
  const std::string path = dir.file("across.wcache");
  Options o = file_options(path);
  o.backing = backing;
  o.max_file_bytes = 1u << 20;
  std::vector<std::string> kept;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    void* held = cache.reserve(4096);
    ASSERT_NE(held, nullptr);
    std::memset(held, 0x5a, 4096);
    // Fill the span as tightly as it allows: entries of 63,400 bytes, then ever smaller ones.
    int i = 0;
    for (std::size_t size = 63400; size >= 64; size /= 2) {
      for (;;) {
        const auto before = cache.stats().heap_fallbacks;
        void* p = cache.reserve(size);
        if (p == nullptr || cache.stats().heap_fallbacks != before) {
          if (p != nullptr) {
            ASSERT_TRUE(cache.release(p).ok());
          }
          break;
        }
        std::memset(p, 1 + i % 250, size);
        const std::string key = "fill-" + std::to_string(i++);
        ASSERT_NE(cache.look_up_or_insert(key, p, size), kNotFound) << last_error().message;
        kept.push_back(key);
      }
    }
    ASSERT_GT(kept.size(), 20u);
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    const std::size_t late = cache.look_up_or_insert("late", held, 4096);
    if (backing == Backing::file) {
      EXPECT_EQ(late, kNotFound);
      EXPECT_EQ(last_error().code, Errc::no_space) << last_error().message;
      EXPECT_TRUE(cache.release(held).ok()) << "the refused reservation is not the caller's to release";
      EXPECT_TRUE(cache.finalize().ok()) << "a finalize after the refused commit: " << last_error().message;
    } else {
      ASSERT_NE(late, kNotFound) << last_error().message;
      EXPECT_EQ(static_cast<const unsigned char*>(cache.offset_to_addr(late))[4095], 0x5a);
      EXPECT_EQ(cache.stats().unpersisted_entries, 1u) << "the late entry is not in memory, waiting";
      EXPECT_FALSE(cache.finalize().ok());  // it cannot be kept, and finalize says so
      EXPECT_EQ(last_error().code, Errc::no_space) << last_error().message;
    }
  }
  WeightCache again = open_or_fail(o);
  ASSERT_TRUE(again);
  for (const std::string& key : kept) EXPECT_NE(again.look_up(key), kNotFound) << key;
}

TEST(Finalize, AReservationHeldAcrossAFinalizeIsRefusedWhenTheSpanCannotIndexItWithFileBacking) {
  reservation_across_finalize(Backing::file);
}
TEST(Finalize, AReservationHeldAcrossAFinalizeGoesToTheHeapWhenTheSpanCannotIndexItWithAutomaticBacking) {
  reservation_across_finalize(Backing::automatic);
}

}  // namespace
}  // namespace weightcache::test
