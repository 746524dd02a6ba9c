// A WEIGHTCACHE_MOBILE library: wc_gc and canonical compaction are still in the C ABI (and gc in
// the C++ API) but fail with WC_ERR_UNSUPPORTED and a message that says what to do instead; what
// the build keeps (a cache's whole life, compaction without WC_COMPACT_CANONICAL) works.
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using weightcache::test::TempDir;

wc_options c_options(const std::string& path) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  static const char kCompat[] = "mobile";
  o.compat_key = kCompat;
  o.compat_key_size = sizeof kCompat - 1;
  o.durability = WC_DURABILITY_NONE;
  return o;
}

// A cache file at `path` holding one entry.
void make_cache(const std::string& path) {
  const wc_options o = c_options(path);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  static const char kBytes[] = "packed weights";
  void* p = wc_reserve_space(c, sizeof kBytes);
  ASSERT_NE(p, nullptr) << wc_last_error();
  std::memcpy(p, kBytes, sizeof kBytes);
  ASSERT_NE(wc_look_up_or_insert(c, "k", 1, p, sizeof kBytes), WC_NOT_FOUND) << wc_last_error();
  ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
  wc_close(c);
}

TEST(Mobile, GcSaysItIsNotInThisBuildAndWhatToDo) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  make_cache(path);
  wc_gc_report report;
  wc_gc_report_init(&report);
  EXPECT_EQ(wc_gc(dir.path().string().c_str(), 0, &report), WC_ERR_UNSUPPORTED);
  const std::string message = wc_last_error();
  EXPECT_NE(message.find("wc_gc"), std::string::npos) << message;
  EXPECT_NE(message.find("WEIGHTCACHE_MOBILE"), std::string::npos) << message;
  EXPECT_NE(message.find("weightcache gc"), std::string::npos) << message;
  EXPECT_EQ(report.removed_files, 0u);

  auto r = weightcache::gc(dir.path().string(), 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, weightcache::Errc::unsupported);
  EXPECT_NE(r.error().message.find("WEIGHTCACHE_MOBILE"), std::string::npos) << r.error().message;

  // Nothing was removed: the cache opens with its entry.
  const wc_options o = c_options(path);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  EXPECT_NE(wc_look_up(c, "k", 1), WC_NOT_FOUND);
  wc_close(c);
}

TEST(Mobile, CanonicalCompactionSaysItIsNotInThisBuildAndWhatToDo) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  make_cache(path);
  const wc_options o = c_options(path);
  wc_compact_report report;
  wc_compact_report_init(&report);
  EXPECT_EQ(wc_compact_ex(&o, WC_COMPACT_CANONICAL, &report), WC_ERR_UNSUPPORTED);
  const std::string message = wc_last_error();
  EXPECT_NE(message.find("WC_COMPACT_CANONICAL"), std::string::npos) << message;
  EXPECT_NE(message.find("WEIGHTCACHE_MOBILE"), std::string::npos) << message;
  EXPECT_NE(message.find("weightcache compact --canonical"), std::string::npos) << message;
  EXPECT_EQ(report.compacted, 0);
}

TEST(Mobile, CompactionWithoutCanonicalAndTheCacheItselfWork) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  make_cache(path);
  const wc_options o = c_options(path);
  wc_compact_report report;
  wc_compact_report_init(&report);
  ASSERT_EQ(wc_compact_ex(&o, 0, &report), WC_OK) << wc_last_error();
  EXPECT_EQ(report.entries, 1u);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  const std::size_t at = wc_look_up(c, "k", 1);
  ASSERT_NE(at, WC_NOT_FOUND);
  EXPECT_STREQ(static_cast<const char*>(wc_offset_to_addr(c, at)), "packed weights");
  wc_close(c);
}

// The mobile build formats its log lines with its own formatter, not fmt (src/log.hpp): the lines
// still carry their arguments, strings and numbers, in the text the default build writes.
std::vector<std::pair<wc_log_level, std::string>>& captured() {
  static std::vector<std::pair<wc_log_level, std::string>> lines;
  return lines;
}
void capture(void*, wc_log_level level, const char* text, size_t size) { captured().emplace_back(level, std::string(text, size)); }

TEST(Mobile, LogLinesCarryTheirArgumentsFormattedWithoutFmt) {
  TempDir dir;
  captured().clear();
  wc_set_log_level(WC_LOG_WARN);
  wc_set_log_callback(capture, nullptr);
  wc_set_log_level(static_cast<wc_log_level>(4 + 1));  // refused, with a warning naming the value
  const std::string path = dir.file("missing-directory/cache.wcache");
  const wc_options o = c_options(path);
  wc_cache* c = nullptr;
  EXPECT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();  // a heap cache, with a warning naming the path
  wc_close(c);
  wc_set_log_callback(nullptr, nullptr);
  ASSERT_EQ(captured().size(), 2u);
  EXPECT_EQ(captured()[0].first, WC_LOG_WARN);
  EXPECT_EQ(captured()[0].second,
            "log level 5 is not one of wc_log_level's values (0 to 4, or 6 for off); the level stays as it was");
  EXPECT_EQ(captured()[1].first, WC_LOG_WARN);
  const std::string& line = captured()[1].second;
  EXPECT_EQ(line.rfind("cannot use cache file '" + path + "' (WC_ERR_", 0), 0u) << line;
  EXPECT_NE(line.find("); falling back to a heap cache for this process"), std::string::npos) << line;
  EXPECT_EQ(line.find('{'), std::string::npos) << line;
}

}  // namespace
