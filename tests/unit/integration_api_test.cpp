// The calls weightcache.h offers integrations built on the public API (the XNNPACK adapter is
// one): finalize tickets, the address of an offset kept across a replacement, logging on the
// library's logger, and reporting an error through wc_last_error. Each test holds the header's
// words to the behaviour.
#include "unit_test_util.hpp"

#include <weightcache/weightcache.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

namespace weightcache::test {
namespace {

// `path` must outlive the returned struct, which points into it.
wc_options c_file_options(const std::string& path) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = "unit-test";
  o.compat_key_size = 9;
  o.backing = WC_BACKING_FILE;
  o.durability = WC_DURABILITY_NONE;
  return o;
}

struct CCache {
  wc_cache* c = nullptr;
  explicit CCache(const wc_options& o) { EXPECT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error(); }
  ~CCache() { wc_close(c); }
  CCache(const CCache&) = delete;
  CCache& operator=(const CCache&) = delete;
};

/// Inserts `bytes` under `key` through wc_look_up_or_insert_ex; returns the offset, the ticket in *ticket.
std::size_t insert_ex(wc_cache* c, const std::string& key, std::string bytes, std::uint64_t* ticket) {
  void* p = wc_reserve_space(c, bytes.size());
  EXPECT_NE(p, nullptr) << wc_last_error();
  if (p == nullptr) return WC_NOT_FOUND;
  std::memcpy(p, bytes.data(), bytes.size());
  const std::size_t off = wc_look_up_or_insert_ex(c, key.data(), key.size(), p, bytes.size(), ticket);
  EXPECT_NE(off, WC_NOT_FOUND) << wc_last_error();
  return off;
}

struct LevelGuard {  // leaves the process's logging as the other tests expect it
  ~LevelGuard() {
    wc_set_log_callback(nullptr, nullptr);
    wc_set_log_level(WC_LOG_WARN);
  }
};

// ---- wc_look_up_or_insert_ex / wc_is_finalized_through -----------------------------------------

// "on success *finalize_ticket is a ticket for wc_is_finalized_through"; nonzero once "a
// wc_finalize call on the cache (through any handle sharing it) has started since the insert
// that gave it, whatever that finalize returned".
TEST(IntegrationApi, ATicketIsThroughOnceAFinalizeStartedAfterItsInsert) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const wc_options o = c_file_options(path);
  CCache a(o), b(o);  // two handles sharing one cache
  ASSERT_NE(a.c, nullptr);
  ASSERT_NE(b.c, nullptr);

  // A finalize that started before the insert does not count.
  ASSERT_EQ(wc_finalize(a.c), WC_OK) << wc_last_error();
  std::uint64_t t1 = 12345;
  const std::size_t off1 = insert_ex(a.c, "w1", "first weights", &t1);
  ASSERT_NE(off1, WC_NOT_FOUND);
  EXPECT_NE(t1, 0u);
  EXPECT_EQ(wc_is_finalized_through(a.c, t1), 0);
  EXPECT_EQ(wc_is_finalized_through(b.c, t1), 0);

  // A finalize on another handle, on another thread, does.
  std::thread([&] { EXPECT_EQ(wc_finalize(b.c), WC_OK) << wc_last_error(); }).join();
  EXPECT_NE(wc_is_finalized_through(a.c, t1), 0);
  EXPECT_NE(wc_is_finalized_through(b.c, t1), 0);

  // A later insert waits for the next finalize; the first stays through ("tickets only grow").
  std::uint64_t t2 = 0;
  ASSERT_NE(insert_ex(b.c, "w2", "second weights", &t2), WC_NOT_FOUND);
  EXPECT_GT(t2, t1);
  EXPECT_EQ(wc_is_finalized_through(a.c, t2), 0);
  EXPECT_NE(wc_is_finalized_through(a.c, t1), 0);

  // The same bytes again: the entry returned has already been through a finalize.
  std::uint64_t again = 99;
  EXPECT_EQ(insert_ex(a.c, "w1", "first weights", &again), off1);
  EXPECT_NE(wc_is_finalized_through(a.c, again), 0) << "ticket " << again;

  ASSERT_EQ(wc_finalize(a.c), WC_OK);
  EXPECT_NE(wc_is_finalized_through(a.c, t2), 0);
}

// "whatever that finalize returned": a read-only cache keeps its inserts in heap memory, and its
// finalize fails (they are not durable) but still ends the packing phase.
TEST(IntegrationApi, AFailedFinalizeStillPassesTheTicket) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  wc_options o = c_file_options(path);
  { CCache make(o); ASSERT_EQ(wc_finalize(make.c), WC_OK) << wc_last_error(); }
  o.read_only = 1;
  CCache c(o);
  ASSERT_NE(c.c, nullptr);
  std::uint64_t t = 0;
  ASSERT_NE(insert_ex(c.c, "k", "bytes", &t), WC_NOT_FOUND);
  ASSERT_EQ(wc_is_finalized_through(c.c, t), 0);
  EXPECT_NE(wc_finalize(c.c), WC_OK);
  EXPECT_NE(wc_is_finalized_through(c.c, t), 0);
}

// "0 when the entry has already been through a finalize, and for a look-up, ptr NULL; on
// failure, 0. finalize_ticket may be NULL." "0 for a NULL cache. Sets no error."
TEST(IntegrationApi, ATicketIsZeroForALookUpAndAFailure) {
  CCache c([] {
    wc_options o;
    wc_options_init(&o);
    return o;
  }());
  ASSERT_NE(c.c, nullptr);
  std::uint64_t t = 7;
  EXPECT_EQ(wc_look_up_or_insert_ex(c.c, "k", 1, nullptr, 0, &t), WC_NOT_FOUND);
  EXPECT_EQ(t, 0u);
  t = 7;
  EXPECT_EQ(wc_look_up_or_insert_ex(nullptr, "k", 1, nullptr, 0, &t), WC_NOT_FOUND);
  EXPECT_EQ(t, 0u);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  t = 7;
  char bytes[4] = {1, 2, 3, 4};
  EXPECT_EQ(wc_look_up_or_insert_ex(c.c, nullptr, 3, bytes, sizeof bytes, &t), WC_NOT_FOUND);
  EXPECT_EQ(t, 0u);
  t = 7;
  EXPECT_EQ(wc_look_up_or_insert_ex(c.c, "", 0, bytes, sizeof bytes, &t), WC_NOT_FOUND);  // the empty key
  EXPECT_EQ(t, 0u);
  // Without a ticket it is wc_look_up_or_insert.
  const std::size_t off = wc_look_up_or_insert_ex(c.c, "k", 1, bytes, sizeof bytes, nullptr);
  ASSERT_NE(off, WC_NOT_FOUND);
  EXPECT_EQ(wc_look_up_or_insert_ex(c.c, "k", 1, nullptr, 0, &t), off);
  EXPECT_EQ(t, 0u);

  EXPECT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);
  const std::string before = wc_last_error();
  EXPECT_NE(wc_is_finalized_through(c.c, 0), 0);
  EXPECT_EQ(wc_is_finalized_through(c.c, ~std::uint64_t{0}), 0);
  EXPECT_EQ(wc_is_finalized_through(nullptr, 0), 0);
  EXPECT_EQ(wc_is_finalized_through(nullptr, 1), 0);
  EXPECT_EQ(wc_last_error(), before);
}

// ---- wc_offset_to_addr_kept ---------------------------------------------------------------------

// "the offset of an entry since replaced under its key ... still gives that entry's bytes";
// "NULL for WC_NOT_FOUND, an offset that never named an entry of this cache"; sets no error.
TEST(IntegrationApi, AKeptOffsetResolvesAfterItsKeyWasReplaced) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const wc_options o = c_file_options(path);
  CCache c(o);
  ASSERT_NE(c.c, nullptr);
  std::uint64_t t = 0;
  const std::size_t old_off = insert_ex(c.c, "w", "old packed bytes", &t);
  const std::size_t new_off = insert_ex(c.c, "w", "new packed bytes", &t);
  ASSERT_NE(old_off, WC_NOT_FOUND);
  ASSERT_NE(new_off, old_off);

  EXPECT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);
  const std::string before = wc_last_error();
  EXPECT_EQ(wc_offset_to_addr(c.c, old_off), nullptr);
  const void* kept = wc_offset_to_addr_kept(c.c, old_off);
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(std::memcmp(kept, "old packed bytes", 16), 0);
  EXPECT_EQ(wc_offset_to_addr_kept(c.c, new_off), wc_offset_to_addr(c.c, new_off));
  EXPECT_EQ(wc_offset_to_addr_kept(c.c, WC_NOT_FOUND), nullptr);
  EXPECT_EQ(wc_offset_to_addr_kept(c.c, new_off + 1), nullptr);
  EXPECT_EQ(wc_offset_to_addr_kept(nullptr, new_off), nullptr);
  EXPECT_EQ(wc_last_error(), before);

  // Still the old bytes after a finalize (valid until close).
  ASSERT_EQ(wc_finalize(c.c), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_offset_to_addr_kept(c.c, old_off), kept);
}

// ---- wc_log_message ---------------------------------------------------------------------------

// "only if `level` ... is at or above the level set, to the log callback ..., taken as it is
// (no formatting, no newline added); bytes that are not UTF-8 are escaped"; "A NULL message
// logs nothing; a level outside WC_LOG_TRACE .. WC_LOG_ERROR ... logs nothing but a warning".
TEST(IntegrationApi, LogMessageGoesThroughTheLibrarysLevelAndCallback) {
  LevelGuard guard;
  LogCapture log;  // level warn
  wc_log_message(WC_LOG_INFO, "below the level");
  EXPECT_EQ(log.at_least(WC_LOG_TRACE).size(), 0u) << log.all();

  wc_log_message(WC_LOG_ERROR, "adapter: {} %s 100%");
  auto seen = log.at_least(WC_LOG_TRACE);
  ASSERT_EQ(seen.size(), 1u) << log.all();
  EXPECT_EQ(seen[0].level, WC_LOG_ERROR);
  EXPECT_EQ(seen[0].text, "adapter: {} %s 100%");

  wc_set_log_level(WC_LOG_TRACE);
  wc_log_message(WC_LOG_TRACE, "trace now passes");
  wc_log_message(WC_LOG_WARN, "not utf-8: \xff\xfe end");
  wc_log_message(WC_LOG_WARN, nullptr);
  seen = log.at_least(WC_LOG_TRACE);
  ASSERT_EQ(seen.size(), 3u) << log.all();
  EXPECT_EQ(seen[1].level, WC_LOG_TRACE);
  EXPECT_EQ(seen[1].text, "trace now passes");
  EXPECT_EQ(seen[2].text, "not utf-8: \\xff\\xfe end");

  wc_log_message(WC_LOG_OFF, "never");
  wc_log_message(static_cast<wc_log_level>(5), "never");
  wc_log_message(static_cast<wc_log_level>(-1), "never");
  EXPECT_EQ(log.count("never"), 0u) << log.all();
  EXPECT_EQ(log.count("wc_log_message: level"), 3u) << log.all();

  wc_set_log_level(WC_LOG_OFF);
  wc_log_message(WC_LOG_ERROR, "off");
  EXPECT_EQ(log.count("off"), 0u) << log.all();
}

// ---- wc_set_last_error ------------------------------------------------------------------------

// "Records `status` and `message` as the calling thread's last error ... Returns `status`";
// "NULL means wc_status_string(status)"; WC_OK or another value is WC_ERR_INVALID_ARGUMENT;
// "other threads' errors are untouched"; escaped as wc_last_error says.
TEST(IntegrationApi, SetLastErrorIsWhatTheHostReads) {
  EXPECT_EQ(wc_set_last_error(WC_ERR_NO_MEMORY, "adapter: too many weights"), WC_ERR_NO_MEMORY);
  EXPECT_STREQ(wc_last_error(), "adapter: too many weights");
  EXPECT_EQ(last_error().code, Errc::no_memory);
  EXPECT_EQ(last_error().message, "adapter: too many weights");

  std::thread([] {
    EXPECT_STREQ(wc_last_error(), "");
    EXPECT_EQ(wc_set_last_error(WC_ERR_IO, "other thread"), WC_ERR_IO);
  }).join();
  EXPECT_STREQ(wc_last_error(), "adapter: too many weights");

  EXPECT_EQ(wc_set_last_error(WC_ERR_CORRUPT, nullptr), WC_ERR_CORRUPT);
  EXPECT_STREQ(wc_last_error(), wc_status_string(WC_ERR_CORRUPT));
  EXPECT_EQ(last_error().code, Errc::corrupt);

  EXPECT_EQ(wc_set_last_error(WC_ERR_IO, "path '\xff'"), WC_ERR_IO);
  EXPECT_STREQ(wc_last_error(), "path '\\xff'");

  for (int bad : {int{WC_OK}, -1, int{WC_ERR_READ_ONLY} + 1}) {
    EXPECT_EQ(wc_set_last_error(static_cast<wc_status>(bad), "x"), WC_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(last_error().code, Errc::invalid_argument) << bad;
    EXPECT_NE(std::string(wc_last_error()).find("wc_set_last_error"), std::string::npos) << wc_last_error();
  }

  const std::string longer(3000, 'a');
  EXPECT_EQ(wc_set_last_error(WC_ERR_IO, longer.c_str()), WC_ERR_IO);
  const std::string cut = wc_last_error();
  EXPECT_LT(cut.size(), 1024u);
  EXPECT_NE(cut.find("[truncated]"), std::string::npos);
}

// ---- the C++ twins -------------------------------------------------------------------------------

// WeightCache::look_up_or_insert with a ticket, is_finalized_through, offset_to_addr_kept and
// log_message are the C calls they name; an empty handle answers harmlessly.
TEST(IntegrationApi, TheCxxTwinsAreTheCCalls) {
  TempDir dir;
  WeightCache c = open_or_fail(file_options(dir.file("cache.wcache")));
  std::string old_bytes = "old bytes", new_bytes = "new bytes";
  std::uint64_t t1 = 0, t2 = 0;
  const std::size_t old_off = c.look_up_or_insert("w", old_bytes.data(), old_bytes.size(), &t1);
  const std::size_t new_off = c.look_up_or_insert("w", new_bytes.data(), new_bytes.size(), &t2);
  ASSERT_NE(old_off, kNotFound);
  ASSERT_NE(new_off, kNotFound);
  EXPECT_NE(t1, 0u);
  EXPECT_FALSE(c.is_finalized_through(t2));
  EXPECT_TRUE(c.is_finalized_through(0));
  EXPECT_EQ(c.offset_to_addr(old_off), nullptr);
  ASSERT_NE(c.offset_to_addr_kept(old_off), nullptr);
  EXPECT_EQ(std::memcmp(c.offset_to_addr_kept(old_off), "old bytes", 9), 0);
  ASSERT_TRUE(c.finalize().ok()) << last_error().message;
  EXPECT_TRUE(c.is_finalized_through(t2));

  WeightCache empty;
  std::uint64_t t = 5;
  EXPECT_EQ(empty.look_up_or_insert("w", old_bytes.data(), old_bytes.size(), &t), kNotFound);
  EXPECT_EQ(t, 0u);
  EXPECT_FALSE(empty.is_finalized_through(0));
  EXPECT_EQ(empty.offset_to_addr_kept(old_off), nullptr);

  LevelGuard guard;
  LogCapture log;
  log_message(LogLevel::error, std::string_view("with a NUL \0 inside", 19));
  log_message(LogLevel::debug, "below the level");
  log_message(LogLevel::off, "never");
  const auto seen = log.at_least(WC_LOG_TRACE);
  ASSERT_EQ(seen.size(), 2u) << log.all();
  EXPECT_EQ(seen[0].level, WC_LOG_ERROR);
  EXPECT_EQ(seen[0].text, std::string("with a NUL \0 inside", 19));
  EXPECT_NE(seen[1].text.find("wc_log_message: level 6"), std::string::npos) << seen[1].text;
}

}  // namespace
}  // namespace weightcache::test
