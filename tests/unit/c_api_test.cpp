// The C ABI: a full round trip, status strings, error messages, NULL arguments, and callers
// compiled against an older, smaller wc_options / wc_stats.
#include "unit_test_util.hpp"

#include <weightcache/weightcache.h>

#include <cstddef>
#include <set>
#include <thread>

namespace weightcache::test {
namespace {

// `path` must outlive the returned struct, which points into it.
wc_options c_options(const std::string& path) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  static const char kCompat[] = "c-api";
  o.compat_key = kCompat;
  o.compat_key_size = sizeof kCompat - 1;
  o.durability = WC_DURABILITY_NONE;
  return o;
}

TEST(CApi, RoundTrip) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const wc_options o = c_options(path);
  const std::string key("weights\0conv1", 13);
  const std::string bytes = random_bytes(1, 50000);
  std::size_t offset = WC_NOT_FOUND;
  {
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(wc_look_up(c, key.data(), key.size()), WC_NOT_FOUND);
    void* p = wc_reserve_space(c, bytes.size());
    ASSERT_NE(p, nullptr) << wc_last_error();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
    std::memcpy(p, bytes.data(), bytes.size());
    offset = wc_look_up_or_insert(c, key.data(), key.size(), p, bytes.size());
    ASSERT_NE(offset, WC_NOT_FOUND) << wc_last_error();
    EXPECT_EQ(wc_offset_to_addr(c, offset), p);
    EXPECT_EQ(wc_is_finalized(c), 0);
    ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
    EXPECT_EQ(wc_is_finalized(c), 1);
    wc_stats s;
    wc_stats_init(&s);
    ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
    EXPECT_EQ(s.entries, 1u);
    EXPECT_EQ(s.backing, WC_BACKING_FILE);
    EXPECT_EQ(s.mapped_bytes, bytes.size());
    EXPECT_EQ(s.file_bytes, file_size(path));
    EXPECT_EQ(s.commits, 1u);
    wc_close(c);
  }
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_look_up(c, key.data(), key.size()), offset);
  EXPECT_EQ(wc_look_up(c, key.data(), key.size() - 1), WC_NOT_FOUND) << "a key prefix is another key";
  const void* p = wc_offset_to_addr(c, offset);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(wc_offset_to_addr(c, WC_NOT_FOUND), nullptr);
  EXPECT_EQ(wc_is_finalized(c), 1);
  wc_stats s;
  wc_stats_init(&s);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(wc_finalize(c), WC_OK);
  EXPECT_EQ(wc_refresh(c), WC_OK);
  wc_close(c);
}

// wc_get_path and wc_cpu_features write as snprintf does: never past the capacity, always a
// NUL, and the full length returned whatever the capacity.
TEST(CApi, PathAndCpuFeaturesAreCutAsSnprintfCutsThem) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const wc_options o = c_options(path);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_get_path(c, nullptr, 0), path.size());
  char small[6];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(wc_get_path(c, small, 4), path.size());
  EXPECT_EQ(std::string(small, 4), path.substr(0, 3) + '\0');
  EXPECT_EQ(small[4], 'x') << "written past the capacity";
  std::string full(path.size() + 1, 'x');
  EXPECT_EQ(wc_get_path(c, full.data(), full.size()), path.size());
  EXPECT_EQ(full, path + '\0');
  wc_stats s;
  wc_stats_init(&s);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  EXPECT_EQ(s.prebuilt, 0u);
  wc_close(c);
  EXPECT_EQ(wc_get_path(nullptr, small, sizeof small), 0u);

  const std::size_t n = wc_cpu_features(nullptr, 0);
  ASSERT_GT(n, 0u);
  std::string features(n + 1, 'x');
  EXPECT_EQ(wc_cpu_features(features.data(), features.size()), n);
  features.pop_back();
#if defined(__x86_64__)
  EXPECT_EQ(features.rfind("x86_64:", 0), 0u) << features;
#elif defined(__aarch64__) && defined(__linux__)
  EXPECT_EQ(features.rfind("aarch64:hwcap=", 0), 0u) << features;
#endif
  std::printf("  this CPU's features: %s\n", features.c_str());
}

TEST(CApi, StatusStringsNeverNull) {
  std::set<std::string> names;
  for (int code = WC_OK; code <= WC_ERR_READ_ONLY; ++code) {
    const char* s = wc_status_string(static_cast<wc_status>(code));
    ASSERT_NE(s, nullptr) << code;
    EXPECT_STRNE(s, "") << code;
    names.insert(s);
    EXPECT_STREQ(to_string(static_cast<Errc>(code)), s);
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(WC_ERR_READ_ONLY) + 1) << "two codes share a name";
  // Values without a name (kept within the enum's range, where the C++ cast is defined).
  for (int unknown : {10, 15}) EXPECT_NE(wc_status_string(static_cast<wc_status>(unknown)), nullptr);
  EXPECT_NE(wc_version(), nullptr);
  EXPECT_NE(wc_last_error(), nullptr);
}

// weightcache.h: "Version 0.1 (see wc_version), not yet released"; "a static string, never NULL".
TEST(CApi, VersionIsTheUnreleasedOneTheHeadersName) {
  const char* v = wc_version();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v, wc_version()) << "not one static string";
  EXPECT_EQ(std::string(v).rfind("0.1.", 0), 0u)
      << v << ": the headers say 0.1 and not yet stable; update them with the version";
  // "wc_status_string and wc_version return static strings"
  const char* busy = wc_status_string(WC_ERR_BUSY);
  std::thread([busy] { EXPECT_EQ(wc_status_string(WC_ERR_BUSY), busy); }).join();
  EXPECT_STREQ(busy, "busy");
}

// weightcache.h: a message longer than about 1000 bytes is cut and ends in "... [truncated]"
// (the thread's last error is a fixed buffer, so that no failure needs an allocation to say so).
TEST(CApi, ALongLastErrorIsCutVisibly) {
  TempDir dir;
  std::string deep = dir.file("missing");
  for (int i = 0; i < 8; ++i) deep += "/" + std::string(200, static_cast<char>('a' + i));
  const std::string path = deep + "/cache.wcache";  // 1,600+ bytes in a directory that is not there
  wc_options f = c_options(path);
  f.backing = WC_BACKING_FILE;
  wc_cache* c = nullptr;
  EXPECT_NE(wc_open(&f, &c), WC_OK);
  EXPECT_EQ(c, nullptr);
  const std::string message = wc_last_error();
  const std::string tail = "... [truncated]";
  EXPECT_LE(message.size(), 1024u) << message;
  ASSERT_GE(message.size(), tail.size()) << message;
  EXPECT_EQ(message.substr(message.size() - tail.size()), tail) << message;
  EXPECT_NE(message.find(dir.file("missing")), std::string::npos) << "the start of the path is kept: " << message;
}

TEST(CApi, LastErrorExplainsFailedOpen) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");  // outlives every wc_options naming it
  wc_options o = c_options(path);
  o.alignment = 3;
  wc_cache* c = reinterpret_cast<wc_cache*>(0x1);
  EXPECT_EQ(wc_open(&o, &c), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr) << "a failed open must clear *out";
  EXPECT_NE(std::string(wc_last_error()).find("alignment"), std::string::npos) << wc_last_error();

  const std::string bad_path = dir.file("missing-dir/cache.wcache");
  wc_options f = c_options(bad_path);
  f.backing = WC_BACKING_FILE;
  const wc_status st = wc_open(&f, &c);
  EXPECT_NE(st, WC_OK);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(wc_last_error()).find(bad_path), std::string::npos) << wc_last_error();

  wc_options uninitialised{};
  EXPECT_EQ(wc_open(&uninitialised, &c), WC_ERR_INVALID_ARGUMENT);
  EXPECT_STRNE(wc_last_error(), "");
}

// A C caller can store any int in an enum field. Stored here the way C would (a C++ cast to an
// out-of-range enum value would itself be undefined); the library must reject it without
// undefined behaviour of its own (UBSan's -fsanitize=enum checks that).
TEST(CApi, OutOfRangeEnumFieldsAreRejected) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const int kBogus = 17;
  const std::size_t fields[] = {offsetof(wc_options, backing), offsetof(wc_options, durability),
                                offsetof(wc_options, verify)};
  for (std::size_t field : fields) {
    wc_options o = c_options(path);
    std::memcpy(reinterpret_cast<char*>(&o) + field, &kBogus, sizeof kBogus);
    wc_cache* c = nullptr;
    EXPECT_EQ(wc_open(&o, &c), WC_ERR_INVALID_ARGUMENT) << "field at offset " << field;
    EXPECT_EQ(c, nullptr);
    wc_close(c);
  }
  static_assert(sizeof(wc_backing) == sizeof(int) && sizeof(wc_durability) == sizeof(int) &&
                sizeof(wc_verify) == sizeof(int));
}

TEST(CApi, NullArgumentsAreErrors) {
  wc_options o;
  wc_options_init(&o);  // heap-only
  wc_cache* c = nullptr;
  EXPECT_EQ(wc_open(nullptr, &c), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_open(&o, nullptr), WC_ERR_INVALID_ARGUMENT);
  wc_options_init(nullptr);
  wc_stats_init(nullptr);
  wc_close(nullptr);

  char key[] = "k";
  char buf[8] = {};
  EXPECT_EQ(wc_look_up(nullptr, key, 1), WC_NOT_FOUND);
  EXPECT_EQ(wc_reserve_space(nullptr, 8), nullptr);
  EXPECT_EQ(wc_look_up_or_insert(nullptr, key, 1, buf, 8), WC_NOT_FOUND);
  EXPECT_EQ(wc_offset_to_addr(nullptr, 0), nullptr);
  EXPECT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_is_finalized(nullptr), 0);
  EXPECT_EQ(wc_refresh(nullptr), WC_ERR_INVALID_ARGUMENT);
  wc_stats s;
  wc_stats_init(&s);
  EXPECT_EQ(wc_get_stats(nullptr, &s), WC_ERR_INVALID_ARGUMENT);

  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_get_stats(c, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_look_up(c, nullptr, 5), WC_NOT_FOUND);
  EXPECT_EQ(wc_look_up_or_insert(c, nullptr, 5, buf, 8), WC_NOT_FOUND);
  EXPECT_EQ(wc_look_up_or_insert(c, nullptr, 0, buf, 8), WC_NOT_FOUND) << "the empty key is invalid";
  EXPECT_EQ(wc_look_up_or_insert(c, key, 1, nullptr, 8), WC_NOT_FOUND) << "NULL ptr is a look-up";
  wc_stats zero{};  // struct_size 0: an uninitialised struct
  EXPECT_EQ(wc_get_stats(c, &zero), WC_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  EXPECT_EQ(s.entries, 0u);
  wc_close(c);
}

// A caller built against an older header, whose wc_options ended before `verify`, sets a
// struct_size that says so. Whatever lies past its struct (here: 0xFF garbage) must not be read,
// and the fields it does not have take their defaults.
TEST(CApi, OlderCallerOptionsStillOpen) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  wc_options current = c_options(path);
  wc_cache* first = nullptr;
  ASSERT_EQ(wc_open(&current, &first), WC_OK) << wc_last_error();

  wc_options old = c_options(path);
  old.struct_size = offsetof(wc_options, verify);
  std::memset(reinterpret_cast<char*>(&old) + old.struct_size, 0xFF, sizeof old - old.struct_size);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&old, &c), WC_OK) << wc_last_error();
  wc_stats s;
  wc_stats_init(&s);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  EXPECT_EQ(s.backing, WC_BACKING_FILE);
  // Defaults for the missing fields: not a private cache, so it shares entries with `first`.
  const std::size_t off = wc_look_up_or_insert(c, "k", 1, const_cast<char*>("value"), 5);
  ASSERT_NE(off, WC_NOT_FOUND) << wc_last_error();
  EXPECT_EQ(wc_look_up(first, "k", 1), off);
  EXPECT_EQ(wc_offset_to_addr(first, off), wc_offset_to_addr(c, off));
  EXPECT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
  wc_close(c);
  wc_close(first);

  ASSERT_EQ(wc_open(&current, &c), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_look_up(c, "k", 1), off) << "the older caller's finalize did not persist";
  wc_close(c);
}

// Same for wc_stats: an older caller's smaller struct is filled up to its size and not beyond.
TEST(CApi, OlderCallerStatsAreNotOverrun) {
  wc_options o;
  wc_options_init(&o);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK);
  ASSERT_NE(wc_look_up_or_insert(c, "k", 1, const_cast<char*>("value"), 5), WC_NOT_FOUND);
  wc_stats s;
  std::memset(&s, 0xAB, sizeof s);
  s.struct_size = offsetof(wc_stats, dead_bytes);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK) << wc_last_error();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.backing, WC_BACKING_HEAP);
  const auto* tail = reinterpret_cast<const unsigned char*>(&s) + offsetof(wc_stats, dead_bytes);
  for (std::size_t i = 0; i < sizeof s - offsetof(wc_stats, dead_bytes); ++i)
    ASSERT_EQ(tail[i], 0xAB) << "byte " << i << " past the caller's struct was written";
  wc_close(c);
}

}  // namespace
}  // namespace weightcache::test
