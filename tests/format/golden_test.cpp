// The golden file: a complete two-entry cache written out by hand from the tables in
// docs/FORMAT.md (checksums computed with the xxhsum command-line tool, not with the library).
// The library must read it through the public API, decode it field by field, re-encode it byte
// for byte, and write exactly these bytes itself when asked to store the same two entries.
#include "file_image.hpp"
#include "temp_dir.hpp"
#ifdef _WIN32
#include "win32_util.hpp"
#endif

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

namespace weightcache {
namespace {

using test::Bytes;

// Compatibility key "golden": XXH3-64 = 0x7d263ba9f3ffb622.
constexpr char kCompatKey[] = "golden";
constexpr std::size_t kGoldenSize = 4355;

struct Chunk {
  std::size_t offset;
  const char* hex;
};

// Everything not listed is zero. Integers are little-endian; each line is one field.
const Chunk kGolden[] = {
    // ---- header, fixed part ----
    {0, "57 47 54 43 41 43 48 45"},    // magic "WGTCACHE"
    {8, "04 03 02 01"},                // endian mark 0x01020304
    {12, "01 00 00 00"},               // format_version 1
    {16, "00 00 00 00"},               // feature_flags 0
    {20, "00 10 00 00"},               // header_size 4096
    {24, "40 00 00 00 00 00 00 00"},   // alignment 64
    {32, "01 00 00 00 00 00 00 00"},   // size_alignment 1
    {40, "22 b6 ff f3 a9 3b 26 7d"},   // compat_hash = XXH3-64("golden")
    // 48..119 reserved, zero
    {120, "dc e6 14 8d 3a b8 cb 90"},  // fixed_checksum = XXH3-64(bytes 0..119)
    // ---- slot 0: sequence 2, the two-entry index ----
    {128, "02 00 00 00 00 00 00 00"},  // sequence 2
    {136, "88 10 00 00 00 00 00 00"},  // index_offset 4232
    {144, "67 00 00 00 00 00 00 00"},  // index_size 103
    {152, "03 11 00 00 00 00 00 00"},  // committed_size 4355
    {160, "02 00 00 00 00 00 00 00"},  // entry_count 2
    {168, "00 9e 42 0d 23 89 b6 f9"},  // index_checksum = XXH3-64(bytes 4232..4334)
    {176, "00 00 00 00 00 00 00 00"},  // reserved
    {184, "d8 b9 7c b7 14 08 8b 12"},  // slot_checksum = XXH3-64(bytes 128..183)
    // ---- slot 1: sequence 1, the empty index a fresh file starts with ----
    {192, "01 00 00 00 00 00 00 00"},  // sequence 1
    {200, "00 10 00 00 00 00 00 00"},  // index_offset 4096
    {208, "20 00 00 00 00 00 00 00"},  // index_size 32
    {216, "34 10 00 00 00 00 00 00"},  // committed_size 4148
    {224, "00 00 00 00 00 00 00 00"},  // entry_count 0
    {232, "8e 70 96 a8 3d 6e 9e 31"},  // index_checksum = XXH3-64(bytes 4096..4127)
    {240, "00 00 00 00 00 00 00 00"},  // reserved
    {248, "cc 42 54 ad d0 bb e5 74"},  // slot_checksum = XXH3-64(bytes 192..247)
    // 256..4095 padding, zero
    // ---- index of sequence 1 (empty) at 4096 ----
    {4096, "57 43 49 58"},                // magic "WCIX"
    {4100, "01 00 00 00"},                // version 1
    {4104, "00 00 00 00 00 00 00 00"},    // entry_count 0
    {4112, "00 00 00 00 00 00 00 00"},    // body_size 0
    {4120, "c2 94 d3 38 05 80 06 2d"},    // body_checksum = XXH3-64 of nothing
    {4128, "00 10 00 00 00 00 00 00"},    // footer: index_start 4096
    {4136, "00 00 00 00"},                // footer: entry_count 0
    {4140, "43 57 50 58"},                // footer: magic 0x58505743
    {4144, "01 00 43 57"},                // footer: version 0x57430001
    // 4148..4159 zero: the first entry starts at align_up(4148, 64)
    // ---- entries ----
    {4160, "41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f 50"},  // conv1: "ABCDEFGHIJKLMNOP"
    {4224, "78 79 7a"},                                         // fc: "xyz"
    // ---- index of sequence 2 at 4232 = align_up(4227, 8) ----
    {4232, "57 43 49 58"},               // magic
    {4236, "01 00 00 00"},               // version
    {4240, "02 00 00 00 00 00 00 00"},   // entry_count 2
    {4248, "47 00 00 00 00 00 00 00"},   // body_size 71 = (32 + 5) + (32 + 2)
    {4256, "30 29 a1 d7 5f c7 b2 61"},   // body_checksum = XXH3-64(bytes 4264..4334)
    {4264, "05 00 00 00"},               // record 0: key_size 5
    {4268, "00 00 00 00"},               //   flags 0
    {4272, "40 10 00 00 00 00 00 00"},   //   offset 4160
    {4280, "10 00 00 00 00 00 00 00"},   //   size 16
    {4288, "c4 5e 25 98 e1 b3 0a 2e"},   //   checksum = XXH3-64("ABCDEFGHIJKLMNOP")
    {4296, "63 6f 6e 76 31"},            //   key "conv1"
    {4301, "02 00 00 00"},               // record 1: key_size 2
    {4305, "00 00 00 00"},               //   flags 0
    {4309, "80 10 00 00 00 00 00 00"},   //   offset 4224
    {4317, "03 00 00 00 00 00 00 00"},   //   size 3
    {4325, "1f 1f 41 6f 65 d2 76 62"},   //   checksum = XXH3-64("xyz")
    {4333, "66 63"},                     //   key "fc"
    {4335, "88 10 00 00 00 00 00 00"},   // footer: index_start 4232
    {4343, "02 00 00 00"},               // footer: entry_count 2
    {4347, "43 57 50 58"},               // footer: magic
    {4351, "01 00 43 57"},               // footer: version; EOF at 4355
};

Bytes golden_image() {
  Bytes b(kGoldenSize, std::byte{0});
  for (const auto& c : kGolden) {
    const Bytes v = test::parse_hex(c.hex);
    if (c.offset + v.size() > b.size()) throw std::logic_error("golden chunk past the end");
    std::memcpy(b.data() + c.offset, v.data(), v.size());
  }
  return b;
}

Bytes slice(const Bytes& b, std::size_t from, std::size_t to) { return Bytes(b.begin() + from, b.begin() + to); }

Options golden_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = kCompatKey;
  o.alignment = 64;
  o.size_alignment = 1;
  o.backing = Backing::file;
  return o;
}

std::string served(WeightCache& cache, std::string_view key, std::size_t size) {
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return "<miss>";
  const void* p = cache.offset_to_addr(off);
  if (p == nullptr) return "<no address>";
  return std::string(static_cast<const char*>(p), size);
}

TEST(GoldenFile, HandWrittenChunksDoNotOverlap) {
  // Guards the hand-written table against typos in the offsets: no two chunks overlap.
  std::vector<bool> used(kGoldenSize, false);
  for (const auto& c : kGolden) {
    const auto n = test::parse_hex(c.hex).size();
    for (std::size_t i = c.offset; i < c.offset + n; ++i) {
      ASSERT_FALSE(used[i]) << "byte " << i << " set twice";
      used[i] = true;
    }
  }
}

TEST(GoldenFile, ServedThroughThePublicApi) {
  for (const bool read_only : {true, false}) {
    SCOPED_TRACE(read_only ? "read-only" : "read-write");
    test::TempDir dir("wc-golden");
    const std::string path = dir.file("golden.wcache");
    const Bytes image = golden_image();
    test::write_file(path, image);
    {
      Options o = golden_options(path);
      o.read_only = read_only;
      auto cache = WeightCache::open(o);
      ASSERT_TRUE(cache) << cache.error().message;
      EXPECT_EQ(cache->stats().backing, Backing::file);
      EXPECT_EQ(cache->stats().entries, 2u);
      EXPECT_EQ(cache->look_up("conv1"), 4160u);
      EXPECT_EQ(cache->look_up("fc"), 4224u);
      EXPECT_EQ(served(*cache, "conv1", 16), "ABCDEFGHIJKLMNOP");
      EXPECT_EQ(served(*cache, "fc", 3), "xyz");
      EXPECT_EQ(cache->look_up("conv"), kNotFound);
      EXPECT_EQ(cache->look_up(std::string_view("fc\0", 3)), kNotFound);
      EXPECT_EQ(cache->stats().verify_failures, 0u);
    }
    // Opening and reading must not rewrite a good file. (Windows' legacy mapping mode grows it
    // to a 64 KiB granule while mapped; the close cuts it back.)
    EXPECT_EQ(test::read_file(path), image);
  }
}

TEST(GoldenFile, ReaderAlignmentMustDivideTheFiles) {
  test::TempDir dir("wc-golden");
  const std::string path = dir.file("golden.wcache");
  test::write_file(path, golden_image());
  for (const std::size_t a : {1u, 16u, 64u}) {
    Options o = golden_options(path);
    o.read_only = true;
    o.alignment = a;
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << "alignment " << a << ": " << cache.error().message;
    EXPECT_EQ(served(*cache, "fc", 3), "xyz");
  }
  Options o = golden_options(path);
  o.read_only = true;
  o.alignment = 128;
  auto cache = WeightCache::open(o);
  ASSERT_FALSE(cache);
  EXPECT_EQ(cache.error().code, Errc::incompatible);

  o.alignment = 64;
  o.compat_key = "golden2";
  auto other = WeightCache::open(o);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, Errc::incompatible);
}

TEST(GoldenFile, DecodesToTheDocumentedFields) {
  const Bytes image = golden_image();
  format::DecodedHeader h;
  ASSERT_EQ(format::decode_header(image, &h), format::Problem::none);
  EXPECT_EQ(h.fixed.format_version, 1u);
  EXPECT_EQ(h.fixed.feature_flags, 0u);
  EXPECT_EQ(h.fixed.header_size, 4096u);
  EXPECT_EQ(h.fixed.alignment, 64u);
  EXPECT_EQ(h.fixed.size_alignment, 1u);
  EXPECT_EQ(h.fixed.compat_hash, 0x7d263ba9f3ffb622ull);
  EXPECT_EQ(format::hash_bytes(std::string_view(kCompatKey)), 0x7d263ba9f3ffb622ull);

  ASSERT_TRUE(h.slot_valid[0]);
  ASSERT_TRUE(h.slot_valid[1]);
  const auto& s0 = h.slot[0];
  EXPECT_EQ(s0.sequence, 2u);
  EXPECT_EQ(s0.index_offset, 4232u);
  EXPECT_EQ(s0.index_size, 103u);
  EXPECT_EQ(s0.committed_size, 4355u);
  EXPECT_EQ(s0.entry_count, 2u);
  EXPECT_EQ(s0.index_checksum, 0xf9b689230d429e00ull);
  const auto& s1 = h.slot[1];
  EXPECT_EQ(s1.sequence, 1u);
  EXPECT_EQ(s1.index_offset, 4096u);
  EXPECT_EQ(s1.index_size, 32u);
  EXPECT_EQ(s1.committed_size, 4148u);
  EXPECT_EQ(s1.entry_count, 0u);
  EXPECT_EQ(s1.index_checksum, 0x319e6e3da896708eull);
  EXPECT_TRUE(format::slot_in_bounds(s0, image.size()));
  EXPECT_TRUE(format::slot_in_bounds(s1, image.size()));
  EXPECT_FALSE(format::slot_in_bounds(s0, image.size() - 1));

  std::vector<format::IndexRecord> recs;
  std::string detail;
  ASSERT_EQ(format::decode_trailer(std::span(image).subspan(4232, 103 + 20), s0, 64, &recs, &detail),
            format::Problem::none)
      << detail;
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].key, "conv1");
  EXPECT_EQ(recs[0].offset, 4160u);
  EXPECT_EQ(recs[0].size, 16u);
  EXPECT_EQ(recs[0].checksum, 0x2e0ab3e198255ec4ull);
  EXPECT_EQ(recs[1].key, "fc");
  EXPECT_EQ(recs[1].offset, 4224u);
  EXPECT_EQ(recs[1].size, 3u);
  EXPECT_EQ(recs[1].checksum, 0x6276d2656f411f1full);
  EXPECT_EQ(format::hash_bytes("ABCDEFGHIJKLMNOP", 16), recs[0].checksum);
  EXPECT_EQ(format::hash_bytes("xyz", 3), recs[1].checksum);

  const auto f = format::decode_footer(image.data() + 4335);
  EXPECT_EQ(f.index_start, 4232u);
  EXPECT_EQ(f.entry_count, 2u);
  EXPECT_EQ(f.magic, 0x58505743u);
  EXPECT_EQ(f.version, 0x57430001u);

  ASSERT_EQ(format::decode_trailer(std::span(image).subspan(4096, 32 + 20), s1, 64, &recs, &detail),
            format::Problem::none);
  EXPECT_TRUE(recs.empty());
}

TEST(GoldenFile, EncoderReproducesTheImage) {
  const Bytes image = golden_image();
  format::HeaderFixed fixed;
  fixed.alignment = 64;
  fixed.size_alignment = 1;
  fixed.compat_hash = format::hash_bytes(std::string_view(kCompatKey));

  format::CommitSlot s1;
  s1.sequence = 1;
  const auto empty_trailer = format::encode_trailer({}, 4096, &s1);
  EXPECT_EQ(Bytes(empty_trailer.begin(), empty_trailer.end()), slice(image, 4096, 4148));
  EXPECT_EQ(s1.committed_size, 4148u);

  const std::vector<format::IndexRecord> recs = {
      {"conv1", 4160, 16, format::hash_bytes("ABCDEFGHIJKLMNOP", 16)},
      {"fc", 4224, 3, format::hash_bytes("xyz", 3)},
  };
  format::CommitSlot s0;
  s0.sequence = 2;
  const auto trailer = format::encode_trailer(recs, 4232, &s0);
  EXPECT_EQ(Bytes(trailer.begin(), trailer.end()), slice(image, 4232, 4355));
  EXPECT_EQ(s0.committed_size, 4355u);

  const auto header = format::encode_header(fixed, s0, s1);
  EXPECT_EQ(Bytes(header.begin(), header.end()), slice(image, 0, 4096));
  const auto slot_bytes = format::encode_slot(s0);
  EXPECT_EQ(Bytes(slot_bytes.begin(), slot_bytes.end()), slice(image, 128, 192));

  // The whole file from the encoders plus the entry bytes.
  Bytes built(kGoldenSize, std::byte{0});
  std::memcpy(built.data(), header.data(), header.size());
  std::memcpy(built.data() + 4096, empty_trailer.data(), empty_trailer.size());
  std::memcpy(built.data() + 4160, "ABCDEFGHIJKLMNOP", 16);
  std::memcpy(built.data() + 4224, "xyz", 3);
  std::memcpy(built.data() + 4232, trailer.data(), trailer.size());
  EXPECT_EQ(built, image);
}

TEST(GoldenFile, LibraryWritesExactlyTheseBytes) {
  test::TempDir dir("wc-golden");
  const std::string path = dir.file("golden.wcache");
  {
    Options o = golden_options(path);
    o.backing = Backing::automatic;
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_EQ(cache->stats().backing, Backing::file);
    ASSERT_EQ(cache->insert("conv1", "ABCDEFGHIJKLMNOP"), 4160u);
    ASSERT_EQ(cache->insert("fc", "xyz"), 4224u);
    auto r = cache->finalize();
    ASSERT_TRUE(r) << r.error().message;
  }
  EXPECT_EQ(test::read_file(path), golden_image());
}

TEST(GoldenFile, DamagedNewestSlotFallsBackToTheOlder) {
  test::TempDir dir("wc-golden");
  const std::string path = dir.file("golden.wcache");
  Bytes image = golden_image();
  image[184] ^= std::byte{0x01};  // slot 0's checksum: slot 0 is no longer valid
  test::write_file(path, image);
  Options o = golden_options(path);
  o.read_only = true;
  {
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    EXPECT_EQ(cache->stats().entries, 0u);  // sequence 1: the empty index
    EXPECT_EQ(cache->look_up("conv1"), kNotFound);
  }
  image[248] ^= std::byte{0x01};  // and slot 1's: nothing verifies
  test::write_file(path, image);
  auto cache = WeightCache::open(o);
  ASSERT_FALSE(cache);
  EXPECT_EQ(cache.error().code, Errc::corrupt);
}

TEST(GoldenFile, ForeignByteOrderAndNewerVersionsAreIncompatible) {
  test::TempDir dir("wc-golden");
  const std::string path = dir.file("golden.wcache");
  Options o = golden_options(path);
  o.read_only = true;
  struct Case {
    const char* what;
    std::size_t offset;
    const char* hex;
    bool reseal;
    format::Problem problem;
    Errc code;
  };
  const Case cases[] = {
      // A big-endian host-order writer: the mark reads 0x04030201. Detected before the checksum.
      {"byte-swapped mark", 8, "01 02 03 04", false, format::Problem::byte_order, Errc::incompatible},
      {"format version 2", 12, "02 00 00 00", true, format::Problem::version, Errc::incompatible},
      {"unknown feature bit", 16, "00 00 00 80", true, format::Problem::version, Errc::incompatible},
      {"damaged version", 12, "02 00 00 00", false, format::Problem::bad_checksum, Errc::corrupt},
      {"header_size 8192", 20, "00 20 00 00", true, format::Problem::bad_value, Errc::corrupt},
      {"alignment 48", 24, "30", true, format::Problem::bad_value, Errc::corrupt},
      {"reserved byte", 100, "01", true, format::Problem::bad_value, Errc::corrupt},
      {"padding byte", 4000, "01", false, format::Problem::bad_value, Errc::corrupt},
      {"magic", 0, "77", false, format::Problem::bad_magic, Errc::corrupt},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Bytes image = golden_image();
    const Bytes v = test::parse_hex(c.hex);
    std::memcpy(image.data() + c.offset, v.data(), v.size());
    if (c.reseal) test::reseal_fixed(image);
    format::DecodedHeader h;
    EXPECT_EQ(format::decode_header(image, &h), c.problem);
    test::write_file(path, image);
    auto cache = WeightCache::open(o);
    ASSERT_FALSE(cache);
    EXPECT_EQ(cache.error().code, c.code) << cache.error().message;
  }
}

}  // namespace
}  // namespace weightcache
