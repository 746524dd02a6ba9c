// The promises of the public headers (weightcache.h, weight_cache.hpp) that no other suite holds
// the library to: wc_last_error's lifetime, the log callback's lock, what the option and stats
// structs promise, which opens share a cache and how long its memory lives, what offsets mean
// in and out of the process, and what a write through an entry's pointer does.
#include "lease_probe.hpp"
#include "unit_test_util.hpp"

#include "format/format.hpp"

#include <weightcache/weightcache.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <type_traits>
#include <vector>

#ifndef _WIN32
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

extern "C" void wc_test_set_log_level_raw(int level);  // raw_level_caller.c

namespace weightcache::test {
namespace {

// ---- shared by the tests below ----------------------------------------------------------------

static_assert(std::is_same_v<std::underlying_type_t<Errc>, int>);
static_assert(int{WC_OK} == static_cast<int>(Errc::ok) &&
              int{WC_ERR_INVALID_ARGUMENT} == static_cast<int>(Errc::invalid_argument) &&
              int{WC_ERR_IO} == static_cast<int>(Errc::io) && int{WC_ERR_NO_SPACE} == static_cast<int>(Errc::no_space) &&
              int{WC_ERR_CORRUPT} == static_cast<int>(Errc::corrupt) &&
              int{WC_ERR_INCOMPATIBLE} == static_cast<int>(Errc::incompatible) &&
              int{WC_ERR_BUSY} == static_cast<int>(Errc::busy) &&
              int{WC_ERR_UNSUPPORTED} == static_cast<int>(Errc::unsupported) &&
              int{WC_ERR_NO_MEMORY} == static_cast<int>(Errc::no_memory) &&
              int{WC_ERR_READ_ONLY} == static_cast<int>(Errc::read_only),
              "weightcache.h: wc_status and Errc have the same values");

// `path` must outlive the returned struct, which points into it.
wc_options c_file_options(const std::string& path) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = "unit-test";  // what file_options uses, so C and C++ handles share a cache
  o.compat_key_size = 9;
  o.durability = WC_DURABILITY_NONE;
  return o;
}

/// Makes this thread's last error a known one (an invalid finalize) and returns its text.
std::string fail_once() {
  EXPECT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);
  return wc_last_error();
}

std::string read_bytes_at(const std::string& path, std::uint64_t offset, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  return in ? s : std::string();
}

void flip_byte_at(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  ASSERT_TRUE(f) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f) << path;
}

/// A file cache at `path` holding `key` -> `bytes`, finalized and closed; returns the offset.
std::size_t make_file_with(const std::string& path, const std::string& key, const std::string& bytes) {
  WeightCache c = open_or_fail(file_options(path));
  const std::size_t off = c.insert(key, bytes);
  EXPECT_NE(off, kNotFound) << last_error().message;
  EXPECT_TRUE(c.finalize().ok()) << last_error().message;
  return off;
}

/// Makes the library log one debug message ("replacing a stale entry") on this thread.
void log_a_debug_message(WeightCache& heap, int i) {
  const std::string key = "k";
  ASSERT_NE(heap.insert(key, "bytes " + std::to_string(i)), kNotFound) << last_error().message;
}

/// Makes the library log one warning: an open whose file cannot be created falls back to heap.
void log_a_warning(const TempDir& dir) {
  Options o;
  o.path = dir.file("missing-directory/cache.wcache");
  auto c = WeightCache::open(o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->stats().backing, Backing::heap);
}

struct LevelGuard {  // leaves the process's logging as the other tests expect it
  ~LevelGuard() {
    wc_set_log_callback(nullptr, nullptr);
    wc_set_log_level(WC_LOG_WARN);
  }
};

// ---- wc_last_error ----------------------------------------------------------------------------

// "The pointer and the text stay valid and unchanged until the next call of this library that
// fails on the same thread (calls that succeed, and failures on other threads, leave it alone)";
// "" before any failure; C++ last_error() is a copy of the same Error.
TEST(Contract, LastErrorStaysUntilTheNextFailureOnTheSameThread) {
  std::thread([] {
    EXPECT_STREQ(wc_last_error(), "");
    EXPECT_EQ(last_error().code, Errc::ok);
    EXPECT_EQ(last_error().message, "");
  }).join();

  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string text = fail_once();
  ASSERT_NE(text, "");
  const char* p = wc_last_error();
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(last_error().message, text);

  // Successes of every kind, on file, heap and C handles.
  {
    const wc_options o = c_file_options(path);
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK);
    EXPECT_EQ(wc_look_up(c, "missing", 7), WC_NOT_FOUND);
    EXPECT_EQ(wc_look_up(c, nullptr, 0), WC_NOT_FOUND);
    void* r = wc_reserve_space(c, 100);
    ASSERT_NE(r, nullptr);
    void* r2 = wc_reserve_space(c, 100);
    ASSERT_NE(r2, nullptr);
    EXPECT_EQ(wc_release_space(c, r2), WC_OK);
    const std::size_t off = wc_look_up_or_insert(c, "k", 1, r, 100);
    ASSERT_NE(off, WC_NOT_FOUND);
    EXPECT_NE(wc_offset_to_addr(c, off), nullptr);
    EXPECT_EQ(wc_offset_to_addr(c, WC_NOT_FOUND), nullptr);
    EXPECT_EQ(wc_finalize(c), WC_OK);
    EXPECT_EQ(wc_refresh(c), WC_OK);
    wc_stats s;
    wc_stats_init(&s);
    EXPECT_EQ(wc_get_stats(c, &s), WC_OK);
    (void)wc_is_finalized(c);
    (void)wc_get_fd(c);
    (void)wc_get_handle(c);
    wc_close(c);
    WeightCache heap = open_or_fail(Options{});
    EXPECT_NE(heap.insert("k", "v"), kNotFound);
    EXPECT_TRUE(heap.finalize().ok());
    wc_gc_report g;
    wc_gc_report_init(&g);
    EXPECT_EQ(wc_gc(dir.path().string().c_str(), 1ull << 40, &g), WC_OK);
    wc_compact_report cr;
    wc_compact_report_init(&cr);
    EXPECT_EQ(wc_compact_ex(&o, 0, &cr), WC_OK) << wc_last_error();
    (void)wc_status_string(WC_ERR_IO);
    (void)wc_version();
  }
  EXPECT_EQ(wc_last_error(), p) << "a call that succeeded replaced the message";
  EXPECT_EQ(std::string(p), text);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(last_error().message, text);

  // A failure on another thread is that thread's.
  std::thread([] { EXPECT_EQ(wc_refresh(nullptr), WC_ERR_INVALID_ARGUMENT); }).join();
  EXPECT_EQ(wc_last_error(), p);
  EXPECT_EQ(std::string(p), text);

  // The next failure here replaces it.
  wc_options bad;
  wc_options_init(&bad);
  bad.alignment = 3;
  wc_cache* c = nullptr;
  EXPECT_EQ(wc_open(&bad, &c), WC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(wc_last_error()), text);
  EXPECT_NE(std::string(wc_last_error()).find("alignment"), std::string::npos) << wc_last_error();
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(last_error().message, wc_last_error()) << "last_error() holds wc_last_error's text";
}

// ---- the log callback and level ---------------------------------------------------------------

// wc_set_log_callback: "When this returns, no call of the previous callback is still running (it
// waits for one in progress) and none will start, so the previous `user` may be freed."
struct Swap {
  std::atomic<bool> entered{false}, release{false}, swap_returned{false};
  std::atomic<bool> ran_after_swap{false};
  std::atomic<int> old_calls{0}, new_calls{0};
};

void old_callback(void* user, wc_log_level, const char*, size_t) {
  auto* s = static_cast<Swap*>(user);
  if (s->swap_returned) s->ran_after_swap = true;
  s->old_calls++;
  s->entered = true;
  while (!s->release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (s->swap_returned) s->ran_after_swap = true;
}

void new_callback(void* user, wc_log_level, const char*, size_t) { static_cast<Swap*>(user)->new_calls++; }

TEST(Contract, TheOldLogCallbackIsNotRunningOnceTheSwapReturns) {
  LevelGuard guard;
  Swap s;
  wc_set_log_level(WC_LOG_DEBUG);
  wc_set_log_callback(&old_callback, &s);
  WeightCache heap = open_or_fail(Options{});
  ASSERT_NE(heap.insert("k", "first"), kNotFound);

  std::thread logger([&] { log_a_debug_message(heap, 1); });  // blocks inside old_callback
  while (!s.entered) std::this_thread::yield();
  std::thread swapper([&] {
    wc_set_log_callback(&new_callback, &s);
    s.swap_returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(s.swap_returned) << "wc_set_log_callback returned while the old callback was running";
  s.release = true;
  logger.join();
  swapper.join();
  EXPECT_TRUE(s.swap_returned);
  EXPECT_FALSE(s.ran_after_swap) << "the old callback ran after wc_set_log_callback returned";

  const int old_calls = s.old_calls;
  log_a_debug_message(heap, 2);
  EXPECT_EQ(s.old_calls, old_calls) << "the old callback was called after the swap";
  EXPECT_GE(s.new_calls, 1);
}

// wc_log_callback: "under the library's log lock: one call at a time, process-wide", with
// "`level` one of WC_LOG_TRACE .. WC_LOG_ERROR and `user` as given".
struct Overlap {
  std::atomic<int> in_flight{0}, calls{0};
  std::atomic<bool> overlapped{false}, bad_level{false};
};

void counting_callback(void* user, wc_log_level level, const char* message, size_t size) {
  auto* o = static_cast<Overlap*>(user);
  if (o->in_flight.fetch_add(1) != 0) o->overlapped = true;
  if (level < WC_LOG_TRACE || level > WC_LOG_ERROR || message == nullptr || size == 0) o->bad_level = true;
  o->calls++;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (std::chrono::steady_clock::now() < until) {
  }
  o->in_flight.fetch_sub(1);
}

TEST(Contract, LogCallbackCallsNeverOverlap) {
  LevelGuard guard;
  Overlap o;
  wc_set_log_level(WC_LOG_TRACE);
  wc_set_log_callback(&counting_callback, &o);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      WeightCache heap = open_or_fail(Options{});
      for (int i = 0; i < 100; ++i) log_a_debug_message(heap, i);
    });
  for (auto& t : threads) t.join();
  wc_set_log_callback(nullptr, nullptr);
  EXPECT_GE(o.calls, 4 * 99);
  EXPECT_FALSE(o.overlapped) << "two calls of the log callback ran at once";
  EXPECT_FALSE(o.bad_level);
}

// wc_set_log_level: "for every message logged after it returns".
TEST(Contract, TheLogLevelAppliesToTheNextMessage) {
  LevelGuard guard;
  TempDir dir;
  LogCapture log;  // sets warn
  auto seen = [&] { return log.at_least(WC_LOG_TRACE).size(); };
  WeightCache heap = open_or_fail(Options{});
  ASSERT_NE(heap.insert("k", "first"), kNotFound);
  log_a_debug_message(heap, 1);
  EXPECT_EQ(seen(), 0u) << "a debug message got through at level warn:\n" << log.all();
  log_a_warning(dir);
  const std::size_t warnings = seen();
  EXPECT_GE(log.at_least(WC_LOG_WARN).size(), 1u) << log.all();

  wc_set_log_level(WC_LOG_ERROR);
  log_a_warning(dir);
  EXPECT_EQ(seen(), warnings) << "a warning got through at level error:\n" << log.all();

  wc_set_log_level(WC_LOG_DEBUG);
  log_a_debug_message(heap, 2);
  ASSERT_EQ(seen(), warnings + 1) << log.all();
  EXPECT_EQ(log.at_least(WC_LOG_TRACE).back().level, WC_LOG_DEBUG);

  wc_set_log_level(WC_LOG_OFF);
  log_a_warning(dir);
  log_a_debug_message(heap, 3);
  EXPECT_EQ(seen(), warnings + 1) << log.all();
}

// wc_set_log_level: "The default is WC_LOG_WARN, or the level named by the environment variable
// WEIGHTCACHE_LOG_LEVEL (trace, debug, info, warn, error, critical or off; any other value keeps
// the default and says so once), read once per process". The child process (cache_child log-levels) provokes a debug
// message and a warning without setting a level and exits with 40 plus what arrived (bit 0
// debug, bit 1 warn).
TEST(Contract, TheDefaultLogLevelIsWarnOrTheEnvironments) {
  TempDir dir;
  struct Case {
    const char* env;  // nullptr: unset
    int seen;
  };
  // A typo keeps warnings on (spdlog alone would read it as "off"), and so does an empty value
  // (set by a script that meant to set something), which is named too. (On Windows an empty value
  // unsets the variable.)
  // A value that is not a level is said once, through the callback the host set before the
  // library read the level (bit 4), never on stderr: the host's first call was wc_set_log_callback.
  // Quoted in that line, a newline is escaped (it would forge a line of its own on stderr) and a
  // long value is cut at a character's start.
  const std::string forged = "x\n[2026-01-01 00:00:00.000] [weightcache] [error] forged";
  const std::string long_value = std::string(63, 'a') + "\xc3\xa9" + std::string(10, 'b');  // é at bytes 63-64
  const Case cases[] = {{nullptr, 2},    {"debug", 3},          {"warn", 2},   {"error", 0},
                        {"off", 0},      {"loud", 6},           {"warnings", 6}, {"", 6},
                        {forged.c_str(), 6}, {long_value.c_str(), 6}};
  const char* saved = std::getenv("WEIGHTCACHE_LOG_LEVEL");
  const std::string saved_value = saved != nullptr ? saved : "";
  for (const Case& c : cases) {
#ifdef _WIN32
    ::_putenv_s("WEIGHTCACHE_LOG_LEVEL", c.env != nullptr ? c.env : "");
#else
    if (c.env != nullptr) ::setenv("WEIGHTCACHE_LOG_LEVEL", c.env, 1);
    else ::unsetenv("WEIGHTCACHE_LOG_LEVEL");
#endif
#ifndef _WIN32
    // The child's stderr: nothing of the library's there, the complaint included.
    const std::string out = dir.file("levels.out"), err = dir.file("levels.err");
    const ExitStatus st = wait_process(spawn_to_files(kChildExe, {"log-levels", dir.path().string()}, out, err));
    std::ifstream in(err);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find("is not a level"), std::string::npos)
        << "WEIGHTCACHE_LOG_LEVEL=" << (c.env != nullptr ? c.env : "(unset)") << ": said on stderr\n" << text;
#else
    const ExitStatus st = run_process(kChildExe, {"log-levels", dir.path().string()});
#endif
    const std::string what = std::string("WEIGHTCACHE_LOG_LEVEL=") + (c.env != nullptr ? c.env : "(unset)");
    EXPECT_TRUE(st.exited) << st.describe();
    int seen = c.seen;
#ifdef _WIN32
    if (c.env != nullptr && *c.env == '\0') seen = 2;  // unset there
#endif
    EXPECT_EQ(st.code, 40 + seen) << what << " (bit 4: the complaint reached the callback, 8: more than once, 16: after the first message)";
    if ((seen & 4) == 0) continue;
    std::ifstream said(dir.file("complaint.txt"), std::ios::binary);
    const std::string complaint((std::istreambuf_iterator<char>(said)), std::istreambuf_iterator<char>());
    EXPECT_NE(complaint.find("(trace, debug, info, warn, error, critical or off)"), std::string::npos) << complaint;
    EXPECT_EQ(complaint.find('\n'), std::string::npos) << what << ": a raw newline in " << complaint;
    if (c.env == forged) {
      EXPECT_NE(complaint.find("'x\\x0a[2026-01-01"), std::string::npos) << complaint;
    }
    if (c.env == long_value) {  // cut before the two-byte character that straddles byte 64
      EXPECT_NE(complaint.find("='" + std::string(63, 'a') + "...'"), std::string::npos) << complaint;
    }
  }
#ifdef _WIN32
  ::_putenv_s("WEIGHTCACHE_LOG_LEVEL", saved_value.c_str());
#else
  if (saved != nullptr) ::setenv("WEIGHTCACHE_LOG_LEVEL", saved_value.c_str(), 1);
  else ::unsetenv("WEIGHTCACHE_LOG_LEVEL");
#endif
}

// wc_set_log_level: "A value that is not one of wc_log_level's is refused: the level stays as it
// was". 5 (spdlog's "critical", not in the enum) and -1 used to act as warn and trace, 7 and up
// as off.
TEST(Contract, ALogLevelOutsideTheEnumLeavesTheLevelAsItWas) {
  LevelGuard guard;
  TempDir dir;
  LogCapture log;  // sets warn
  WeightCache heap = open_or_fail(Options{});
  ASSERT_NE(heap.insert("k", "first"), kNotFound);
  const int not_levels[] = {5, -1, 7, 100, -100, INT32_MIN, INT32_MAX};
  // Through C (raw_level_caller.c), as a C caller's int arrives.
  auto set_raw = [](int v) { wc_test_set_log_level_raw(v); };

  // At error: no value lets warnings or debug messages through.
  for (int v : not_levels) {
    wc_set_log_level(WC_LOG_ERROR);
    set_raw(v);
    const std::size_t before = log.at_least(WC_LOG_TRACE).size();
    log_a_warning(dir);
    log_a_debug_message(heap, v);
    EXPECT_EQ(log.at_least(WC_LOG_TRACE).size(), before)
        << "wc_set_log_level(" << v << ") changed the level from error:\n" << log.all();
  }
  // At warn: no value silences warnings, nor lets debug messages through.
  for (int v : not_levels) {
    wc_set_log_level(WC_LOG_WARN);
    set_raw(v);
    const std::size_t warnings = log.count("falling back to a heap cache");
    log_a_warning(dir);
    EXPECT_EQ(log.count("falling back to a heap cache"), warnings + 1)
        << "wc_set_log_level(" << v << ") silenced warnings:\n" << log.all();
    const std::size_t before = log.at_least(WC_LOG_TRACE).size();
    log_a_debug_message(heap, v);
    EXPECT_EQ(log.at_least(WC_LOG_TRACE).size(), before)
        << "wc_set_log_level(" << v << ") let a debug message through:\n" << log.all();
  }
  // The C++ call refuses them alike.
  set_log_level(LogLevel::warn);
  set_log_level(static_cast<LogLevel>(7));
  const std::size_t warnings = log.count("falling back to a heap cache");
  log_a_warning(dir);
  EXPECT_EQ(log.count("falling back to a heap cache"), warnings + 1) << log.all();
}

// wc_last_error: "UTF-8 ... bytes of a path that are not UTF-8 appear as \xHH". A path is bytes
// on POSIX; the message, the C++ Error and the log line must still be UTF-8, and a path that is
// UTF-8 (here with an accented letter) passes unchanged.
bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || (n == 2 && c < 0xC2) || (n == 4 && c > 0xF4) || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    const auto c1 = static_cast<unsigned char>(s[i + 1 < s.size() ? i + 1 : i]);
    if ((n == 3 && c == 0xE0 && c1 < 0xA0) || (n == 3 && c == 0xED && c1 >= 0xA0) ||
        (n == 4 && c == 0xF0 && c1 < 0x90) || (n == 4 && c == 0xF4 && c1 >= 0x90))
      return false;  // overlong, a surrogate, past U+10FFFF
    i += n;
  }
  return true;
}

#ifndef _WIN32
TEST(Contract, AnErrorNamingAPathThatIsNotUtf8IsStillUtf8) {
  LevelGuard guard;
  TempDir dir;
  LogCapture log;
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate: all escaped.
  const std::string raw = "bad-\x80-\xe2\x82-\xc0\xaf-\xed\xa0\x80-";
  const std::string path = dir.file("missing-" + raw + "caf\xc3\xa9/cache.wcache");
  Options o;
  o.path = path;
  o.backing = Backing::file;
  auto c = WeightCache::open(o);
  ASSERT_FALSE(c.ok());
  const std::string message = wc_last_error();
  EXPECT_TRUE(valid_utf8(message)) << message;
  EXPECT_NE(message.find("bad-\\x80-\\xe2\\x82-\\xc0\\xaf-\\xed\\xa0\\x80-caf\xc3\xa9"), std::string::npos) << message;
  EXPECT_TRUE(valid_utf8(c.error().message)) << c.error().message;
  EXPECT_EQ(c.error().message, message);
  EXPECT_EQ(last_error().message, message);

  // The same open with automatic backing falls back to the heap and says why on the log.
  o.backing = Backing::automatic;
  auto fallback = WeightCache::open(o);
  ASSERT_TRUE(fallback.ok()) << fallback.error().message;
  const auto lines = log.at_least(WC_LOG_WARN);
  ASSERT_FALSE(lines.empty());
  for (const auto& m : lines) {
    EXPECT_TRUE(valid_utf8(m.text)) << m.text;
    EXPECT_NE(m.text.find("bad-\\x80-"), std::string::npos) << m.text;
  }
}

// Truncation keeps an escape whole and the text UTF-8: a long path of bytes that are not UTF-8.
TEST(Contract, ATruncatedErrorOfEscapedBytesIsStillUtf8) {
  TempDir dir;
  for (std::size_t pad = 0; pad < 4; ++pad) {
    const std::string path = dir.file(std::string(pad, 'p') + std::string(400, '\xff') + "/cache.wcache");
    Options o;
    o.path = path;
    o.backing = Backing::file;
    auto c = WeightCache::open(o);
    ASSERT_FALSE(c.ok());
    const std::string message = wc_last_error();
    EXPECT_TRUE(valid_utf8(message)) << message;
    EXPECT_LT(message.size(), 1024u);  // the per-thread buffer
    const auto cut = message.find("... [truncated]");
    ASSERT_NE(cut, std::string::npos) << message;
    // Whole escapes before the mark: "\xff" repeated, never a piece of one.
    const std::size_t start = message.find("\\xff");
    ASSERT_NE(start, std::string::npos) << message;
    EXPECT_EQ((cut - start) % 4, 0u) << message.substr(cut - 8);
  }
}
#endif

#ifndef _WIN32
// wc_set_log_callback: "NULL restores the default: formatted lines on stderr". In a forked child
// whose stderr is a pipe.
void ignore_message(void*, wc_log_level, const char*, size_t) {}

TEST(Contract, ANullLogCallbackRestoresStderr) {
  TempDir dir;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    wc_set_log_callback(&ignore_message, nullptr);
    wc_set_log_callback(nullptr, nullptr);
    wc_set_log_level(WC_LOG_WARN);
    Options o;
    o.path = dir.file("missing-directory/cache.wcache");
    auto c = WeightCache::open(o);
    std::fflush(stderr);
    ::_exit(c.ok() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(out.find("[weightcache] [warning]"), std::string::npos) << "stderr was: " << out;
  EXPECT_NE(out.find("falling back to a heap cache"), std::string::npos) << "stderr was: " << out;
}
#endif

// ---- the option and stats structs -------------------------------------------------------------

// wc_options_init: "Fills *options with the defaults the field comments name (zero for the
// fields without one ...)". The C++ Options has the same defaults.
TEST(Contract, OptionsInitSetsTheDocumentedDefaults) {
  wc_options o;
  std::memset(&o, 0xAB, sizeof o);
  wc_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(wc_options));
  EXPECT_EQ(o.path, nullptr);
  EXPECT_EQ(o.compat_key, nullptr);
  EXPECT_EQ(o.compat_key_size, 0u);
  EXPECT_EQ(o.alignment, 64u);
  EXPECT_EQ(o.size_alignment, 1u);
  EXPECT_EQ(o.backing, WC_BACKING_AUTO);
  EXPECT_EQ(o.durability, WC_DURABILITY_FULL);
  EXPECT_EQ(o.read_only, 0);
  EXPECT_EQ(o.verify, WC_VERIFY_SHARED);
  EXPECT_EQ(o.private_cache, 0);
  EXPECT_EQ(o.allow_symlink, 0);
  EXPECT_EQ(o.file_mode, 0644u);
  EXPECT_EQ(o.lease_timeout_ms, 120000u);
  EXPECT_EQ(o.refresh_on_miss, 0);
  EXPECT_EQ(o.max_file_bytes, 0u);
  EXPECT_EQ(o.verify_ahead, 1);
  EXPECT_EQ(o.compact_dead_percent, 50u);
  EXPECT_EQ(o.compact_min_dead_bytes, std::uint64_t{16} << 20);
  EXPECT_EQ(o.fd, -1);
  EXPECT_EQ(o.handle, nullptr);

  const Options cxx;
  EXPECT_EQ(cxx.alignment, o.alignment);
  EXPECT_EQ(cxx.size_alignment, o.size_alignment);
  EXPECT_EQ(static_cast<int>(cxx.backing), static_cast<int>(o.backing));
  EXPECT_EQ(static_cast<int>(cxx.durability), static_cast<int>(o.durability));
  EXPECT_EQ(static_cast<int>(cxx.verify), static_cast<int>(o.verify));
  EXPECT_EQ(cxx.file_mode, o.file_mode);
  EXPECT_EQ(cxx.lease_timeout.count(), o.lease_timeout_ms);
  EXPECT_EQ(cxx.max_file_bytes, o.max_file_bytes);
  EXPECT_EQ(cxx.verify_ahead, o.verify_ahead != 0);
  EXPECT_EQ(cxx.compact_dead_percent, o.compact_dead_percent);
  EXPECT_EQ(cxx.compact_min_dead_bytes, o.compact_min_dead_bytes);
  EXPECT_EQ(cxx.fd, o.fd);
  EXPECT_EQ(cxx.handle, o.handle);
  EXPECT_FALSE(cxx.read_only || cxx.private_cache || cxx.allow_symlink || cxx.refresh_on_miss);

  wc_options_init(nullptr);  // "NULL is ignored"
}

// wc_options: "wc_open copies what it keeps (path, compat_key), so all of it may be freed or
// reused once the call returns"; struct_size "must cover at least the fields up to read_only".
TEST(Contract, OpenCopiesItsOptionsAndNeedsThemUpToReadOnly) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  std::string path_buf = path;
  std::string key_buf = "unit-test";
  auto* o = new wc_options;
  wc_options_init(o);
  o->path = path_buf.c_str();
  o->compat_key = key_buf.data();
  o->compat_key_size = key_buf.size();
  o->durability = WC_DURABILITY_NONE;
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(o, &c), WC_OK) << wc_last_error();
  std::fill(path_buf.begin(), path_buf.end(), 'x');
  std::fill(key_buf.begin(), key_buf.end(), 'y');
  std::memset(o, 0xCD, sizeof *o);
  delete o;
  const std::size_t off = wc_look_up_or_insert(c, "k", 1, const_cast<char*>("value"), 5);
  ASSERT_NE(off, WC_NOT_FOUND) << wc_last_error();
  ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
  wc_close(c);
  WeightCache again = open_or_fail(file_options(path));  // the same path and key
  EXPECT_EQ(verify_entry(again, "k", "value", "k"), "");

  wc_options short_struct = c_file_options(path);
  short_struct.struct_size = offsetof(wc_options, read_only);
  EXPECT_EQ(wc_open(&short_struct, &c), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  short_struct.struct_size = offsetof(wc_options, read_only) + sizeof(int);
  ASSERT_EQ(wc_open(&short_struct, &c), WC_OK) << wc_last_error();
  wc_close(c);

  // weight_cache.hpp: "Options of a cache; open() copies them."
  auto* cxx = new Options(file_options(path));
  auto opened = WeightCache::open(*cxx);
  delete cxx;
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(verify_entry(opened.value(), "k", "value", "k"), "");
}

// wc_open: "WC_ERR_INVALID_ARGUMENT options or out NULL; struct_size not set; compat_key NULL
// with a nonzero size; an enum field out of range; alignment or size_alignment not a power of two
// up to WC_MAX_ALIGNMENT; max_file_bytes below 1 MiB (but not 0); file_mode over 0777;
// compact_dead_percent over 100; WC_BACKING_FILE without path, fd or handle; both fd and handle
// set", whatever the backing, and
// *out is NULL. (NULL arguments, struct_size and enums: CApi.NullArgumentsAreErrors,
// CApi.LastErrorExplainsFailedOpen, CApi.OutOfRangeEnumFieldsAreRejected.)
TEST(Contract, OpenRefusesEachInvalidOption) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  struct Case {
    const char* what;
    void (*spoil)(wc_options*);
  };
  const Case cases[] = {
      {"compat_key NULL with a size", [](wc_options* o) { o->compat_key = nullptr; }},
      {"alignment 3", [](wc_options* o) { o->alignment = 3; }},
      {"alignment over the maximum", [](wc_options* o) { o->alignment = WC_MAX_ALIGNMENT * 2; }},
      {"size_alignment 48", [](wc_options* o) { o->size_alignment = 48; }},
      {"size_alignment over the maximum", [](wc_options* o) { o->size_alignment = WC_MAX_ALIGNMENT * 2; }},
      {"max_file_bytes 1 MiB - 1", [](wc_options* o) { o->max_file_bytes = (1u << 20) - 1; }},
      {"file_mode 01644", [](wc_options* o) { o->file_mode = 01644; }},
      {"compact_dead_percent 101", [](wc_options* o) { o->compact_dead_percent = 101; }},
      {"backing file without a path", [](wc_options* o) {
         o->path = nullptr;
         o->backing = WC_BACKING_FILE;
       }},
      {"both fd and handle", [](wc_options* o) {
         o->fd = 0;  // refused before anything is opened or read
         o->handle = reinterpret_cast<void*>(std::uintptr_t{4});
       }},
  };
  for (const Case& c : cases) {
    for (wc_backing backing : {WC_BACKING_AUTO, WC_BACKING_FILE}) {
      wc_options o = c_file_options(path);
      o.backing = backing;
      c.spoil(&o);
      wc_cache* out = reinterpret_cast<wc_cache*>(0x1);
      EXPECT_EQ(wc_open(&o, &out), WC_ERR_INVALID_ARGUMENT) << c.what;
      EXPECT_EQ(out, nullptr) << c.what;
      EXPECT_EQ(last_error().code, Errc::invalid_argument) << c.what;
    }
  }
}

// wc_stats_init: "Zeroes *stats"; wc_get_stats on failure: "*out is left untouched"; the report
// structs: "nothing at all [is written] when the call fails".
TEST(Contract, StatsAndReportsAreUntouchedByAFailure) {
  wc_stats s;
  std::memset(&s, 0xAB, sizeof s);
  wc_stats_init(&s);
  wc_stats zero{};
  zero.struct_size = sizeof(wc_stats);
  EXPECT_EQ(std::memcmp(&s, &zero, sizeof s), 0);
  wc_stats_init(nullptr);

  wc_stats untouched;
  std::memset(&untouched, 0x5A, sizeof untouched);
  untouched.struct_size = sizeof untouched;
  wc_stats copy = untouched;
  EXPECT_EQ(wc_get_stats(nullptr, &untouched), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::memcmp(&untouched, &copy, sizeof copy), 0);

  TempDir dir;
  wc_gc_report g;
  wc_gc_report_init(&g);
  std::memset(reinterpret_cast<char*>(&g) + sizeof(std::size_t), 0x5A, sizeof g - sizeof(std::size_t));
  const wc_gc_report g_copy = g;
  EXPECT_EQ(wc_gc(dir.file("no-such-directory").c_str(), 0, &g), WC_ERR_IO);
  EXPECT_EQ(std::memcmp(&g, &g_copy, sizeof g), 0);

  const std::string path = dir.file("missing.wcache");
  const wc_options o = c_file_options(path);
  wc_compact_report r;
  wc_compact_report_init(&r);
  std::memset(reinterpret_cast<char*>(&r) + sizeof(std::size_t), 0x5A, sizeof r - sizeof(std::size_t));
  const wc_compact_report r_copy = r;
  EXPECT_EQ(wc_compact_ex(&o, 0, &r), WC_ERR_IO) << "wc_compact: \"no file at the path\"";
  EXPECT_EQ(std::memcmp(&r, &r_copy, sizeof r), 0);
  const std::string directory = dir.path().string();
  const wc_options d = c_file_options(directory);
  EXPECT_EQ(wc_compact_ex(&d, 0, &r), WC_ERR_INVALID_ARGUMENT) << "wc_compact: \"a path that is not a regular file\"";
  EXPECT_EQ(wc_compact_ex(&o, 1u << 7, &r), WC_ERR_INVALID_ARGUMENT) << "wc_compact_ex: an unknown flag";
  wc_compact_report uninitialised{};
  EXPECT_EQ(wc_compact_ex(&o, 0, &uninitialised), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::memcmp(&r, &r_copy, sizeof r), 0);
}

// ---- handles and caches -----------------------------------------------------------------------

// "Handles opened on the same file ... with the same compat_key and the same read_only share one
// cache: the same entries, offsets and addresses, counters, finalize state and descriptor. Any
// other open gets a cache of its own: a heap cache (empty path, WC_BACKING_HEAP, private_cache),
// ... a file cache that fell back to heap memory at open".
TEST(Contract, WhichOpensShareACache) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  make_file_with(path, "committed", "committed bytes");

  WeightCache a = open_or_fail(file_options(path));
  WeightCache b = open_or_fail(file_options(path));
  const std::size_t off = a.look_up("committed");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(b.offset_to_addr(off), a.offset_to_addr(off));
  EXPECT_EQ(a.stats().hits, b.stats().hits) << "counters are the cache's, not the handle's";
  EXPECT_EQ(a.descriptor(), b.descriptor());
  ASSERT_NE(b.insert("new", "new bytes"), kNotFound);
  EXPECT_FALSE(a.is_finalized());

  Options ro = file_options(path);
  ro.read_only = true;
  WeightCache r1 = open_or_fail(ro);
  WeightCache r2 = open_or_fail(ro);
  EXPECT_EQ(r1.offset_to_addr(off), r2.offset_to_addr(off)) << "two read-only handles share one cache";
  EXPECT_NE(r1.offset_to_addr(off), a.offset_to_addr(off)) << "a read-only open shared a writable cache";
  EXPECT_EQ(r1.look_up("new"), kNotFound);

  // "A second opener of a shared cache gets the first opener's options" (here the alignment,
  // which honours the second opener's).
  Options strict = file_options(dir.file("strict.wcache"));
  strict.alignment = 4096;
  WeightCache s1 = open_or_fail(strict);
  strict.alignment = 64;
  WeightCache s2 = open_or_fail(strict);
  EXPECT_EQ(s2.alignment(), 4096u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s2.reserve(10)) % 4096, 0u);

  Options other_key = file_options(dir.file("other.wcache"));
  WeightCache k1 = open_or_fail(other_key);
  other_key.compat_key = "another key";
  other_key.backing = Backing::automatic;
  WeightCache k2 = open_or_fail(other_key);
  EXPECT_EQ(k2.stats().backing, Backing::heap) << "another compatibility key on an open file gets its own heap cache";

  for (const Options& own : [&] {
         Options heap;  // empty path
         Options forced = file_options(path);
         forced.backing = Backing::heap;
         Options priv = file_options(path);
         priv.private_cache = true;
         Options fallback;
         fallback.path = dir.file("missing-directory/cache.wcache");
         Options early = file_options(dir.file("not-yet.wcache"));  // read-only, before the file exists
         early.read_only = true;
         early.backing = Backing::automatic;
         return std::vector<Options>{heap, forced, priv, fallback, early};
       }()) {
    WeightCache x = open_or_fail(own);
    WeightCache y = open_or_fail(own);
    ASSERT_EQ(x.stats().backing, Backing::heap);
    const std::size_t in_x = x.insert("only-in-x", "bytes");
    ASSERT_NE(in_x, kNotFound);
    EXPECT_EQ(y.look_up("only-in-x"), kNotFound) << "two opens of '" << own.path << "' shared a heap cache";
    EXPECT_EQ(a.look_up("only-in-x"), kNotFound);
  }

#ifdef __linux__
  // "a cache on a descriptor (fd, handle) or \":memory:\"" gets a cache of its own (a handle:
  // tests/windows/handle_test.cpp).
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Options on_fd = file_options(path);
  on_fd.path.clear();
  on_fd.fd = fd;
  on_fd.lease_timeout = std::chrono::milliseconds(100);
  Options memory = file_options(kMemoryPath);
  {
    WeightCache x = open_or_fail(on_fd);
    WeightCache y = open_or_fail(on_fd);
    ASSERT_EQ(x.stats().backing, Backing::file);
    EXPECT_NE(x.descriptor(), y.descriptor());
    ASSERT_NE(x.offset_to_addr(off), nullptr);
    ASSERT_NE(y.offset_to_addr(off), nullptr);
    EXPECT_NE(x.offset_to_addr(off), y.offset_to_addr(off)) << "two opens of one descriptor shared a cache";
  }
  {
    WeightCache x = open_or_fail(memory);
    WeightCache y = open_or_fail(memory);
    ASSERT_EQ(x.stats().backing, Backing::file);
    ASSERT_NE(x.insert("only-in-x", "bytes"), kNotFound) << last_error().message;
    EXPECT_EQ(y.look_up("only-in-x"), kNotFound) << "two :memory: opens shared a cache";
  }
  ::close(fd);
#endif
}

#ifndef _WIN32
// wc_options.handle: "On POSIX the open fails as for a file it cannot use (WC_ERR_UNSUPPORTED,
// or a heap cache with WC_BACKING_AUTO)"; wc_get_handle: "NULL ... on POSIX".
TEST(Contract, AHandleIsForWindowsOnly) {
  TempDir dir;
  const std::string none, path = dir.file("cache.wcache");
  wc_options o = c_file_options(none);
  o.handle = reinterpret_cast<void*>(std::uintptr_t{4});
  o.backing = WC_BACKING_FILE;
  wc_cache* c = reinterpret_cast<wc_cache*>(0x1);
  EXPECT_EQ(wc_open(&o, &c), WC_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  o.backing = WC_BACKING_AUTO;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  wc_stats s;
  wc_stats_init(&s);
  ASSERT_EQ(wc_get_stats(c, &s), WC_OK);
  EXPECT_EQ(s.backing, WC_BACKING_HEAP);
  EXPECT_EQ(wc_get_handle(c), nullptr);
  wc_close(c);
  const wc_options file = c_file_options(path);
  ASSERT_EQ(wc_open(&file, &c), WC_OK) << wc_last_error();
  EXPECT_GE(wc_get_fd(c), 0);
  EXPECT_EQ(wc_get_handle(c), nullptr);
  wc_close(c);
}
#endif

// "A cache lives until the last handle sharing it is closed ...; closing any other handle
// changes nothing for the rest"; memory "stays valid at the same address until the cache is
// closed (the last wc_close of the handles sharing it, whichever handle it came from)"; wc_get_fd:
// "valid until the cache is closed".
TEST(Contract, MemoryOutlivesTheHandleItCameFromWhileTheCacheLives) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const wc_options o = c_file_options(path);
  wc_cache* first = nullptr;
  wc_cache* second = nullptr;
  ASSERT_EQ(wc_open(&o, &first), WC_OK) << wc_last_error();
  ASSERT_EQ(wc_open(&o, &second), WC_OK) << wc_last_error();
  const std::string bytes = random_bytes(5, 10000);
  void* reserved = wc_reserve_space(first, bytes.size());
  ASSERT_NE(reserved, nullptr);
  std::memcpy(reserved, bytes.data(), bytes.size());
  const std::size_t off = wc_look_up_or_insert(first, "k", 1, reserved, bytes.size());
  ASSERT_NE(off, WC_NOT_FOUND);
  const void* entry = wc_offset_to_addr(first, off);
  void* pending = wc_reserve_space(first, 4096);  // a reservation outstanding when its handle closes
  ASSERT_NE(pending, nullptr);
  const int fd = wc_get_fd(first);
  void* handle = wc_get_handle(first);
  wc_close(first);

  EXPECT_EQ(std::memcmp(entry, bytes.data(), bytes.size()), 0);
  std::memset(pending, 0x77, 4096);  // still the cache's, still writable
  const std::size_t pending_off = wc_look_up_or_insert(second, "pending", 7, pending, 4096);
  ASSERT_NE(pending_off, WC_NOT_FOUND) << wc_last_error();
  EXPECT_EQ(wc_offset_to_addr(second, pending_off), pending) << "the reservation was not committed in place";
  EXPECT_EQ(wc_offset_to_addr(second, off), entry);
  EXPECT_EQ(wc_get_fd(second), fd);
  EXPECT_EQ(wc_get_handle(second), handle);
#ifndef _WIN32
  EXPECT_NE(::fcntl(fd, F_GETFD), -1) << "the descriptor was closed with the first handle";
#endif
  EXPECT_EQ(wc_finalize(second), WC_OK) << wc_last_error();
  wc_close(second);
}

// weight_cache.hpp: on an empty handle "look_up, reserve, release, look_up_or_insert, insert,
// finalize and refresh fail with invalid_argument ...; offset_to_addr gives nullptr, is_finalized
// false, stats all zero (backing heap), alignment 0 and descriptor -1, without an error".
TEST(Contract, AnEmptyHandleFailsOrAnswersHarmlessly) {
  WeightCache empty;
  EXPECT_FALSE(empty);
  char buf[8] = {};
  auto invalid_now = [] { return last_error().code == Errc::invalid_argument; };
  (void)fail_once();
  const std::string before = last_error().message;
  EXPECT_EQ(empty.offset_to_addr(0), nullptr);
  EXPECT_FALSE(empty.is_finalized());
  const Stats s = empty.stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.file_bytes, 0u);
  EXPECT_EQ(s.hits + s.misses + s.commits + s.alignment, 0u);
  EXPECT_EQ(s.backing, Backing::heap);
  EXPECT_EQ(empty.alignment(), 0u);
  EXPECT_EQ(empty.descriptor(), -1);
  EXPECT_EQ(last_error().message, before) << "an answer without an error set one";

  EXPECT_EQ(empty.look_up("k"), kNotFound);
  EXPECT_TRUE(invalid_now());
  EXPECT_EQ(empty.reserve(8), nullptr);
  EXPECT_TRUE(invalid_now());
  EXPECT_EQ(empty.release(buf).error().code, Errc::invalid_argument);
  EXPECT_EQ(empty.look_up_or_insert("k", buf, 8), kNotFound);
  EXPECT_TRUE(invalid_now());
  EXPECT_EQ(empty.insert("k", "v"), kNotFound);
  EXPECT_TRUE(invalid_now());
  EXPECT_EQ(empty.finalize().error().code, Errc::invalid_argument);
  EXPECT_EQ(empty.refresh().error().code, Errc::invalid_argument);

  // Result<void>: "error() of a success is an Error with code ok and an empty message".
  WeightCache heap = open_or_fail(Options{});
  const Result<void> fine = heap.finalize();
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(fine.error().code, Errc::ok);
  EXPECT_EQ(fine.error().message, "");
}

// ---- look-ups, inserts, releases, refresh -----------------------------------------------------

// Errors: "A look-up miss is not a failure"; wc_look_up: "A miss, the empty key included, is
// not an error: wc_last_error is left alone.
// Fails ... only for a NULL cache, a NULL key with a nonzero key_size, or a key over
// WC_MAX_KEY_SIZE"; wc_look_up_or_insert: "The key is copied."
TEST(Contract, AMissIsNotAnErrorAndKeysAreCopied) {
  WeightCache heap = open_or_fail(Options{});
  wc_options o;
  wc_options_init(&o);
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK);
  const std::string text = fail_once();
  EXPECT_EQ(wc_look_up(c, nullptr, 0), WC_NOT_FOUND);
  EXPECT_EQ(wc_look_up(c, "", 0), WC_NOT_FOUND);
  EXPECT_EQ(wc_look_up(c, "absent", 6), WC_NOT_FOUND);
  EXPECT_EQ(heap.look_up(""), kNotFound);
  EXPECT_EQ(heap.look_up("absent"), kNotFound);
  EXPECT_EQ(std::string(wc_last_error()), text) << "a miss set an error";
  // "nor are the NULL, -1 and 0 that wc_offset_to_addr, wc_get_fd, wc_get_handle and
  // wc_is_finalized answer: they set no error"
  EXPECT_EQ(wc_offset_to_addr(nullptr, 0), nullptr);
  EXPECT_EQ(wc_offset_to_addr(c, 12345), nullptr);
  EXPECT_EQ(wc_get_fd(nullptr), -1);
  EXPECT_EQ(wc_get_fd(c), -1);
  EXPECT_EQ(wc_get_handle(nullptr), nullptr);
  EXPECT_EQ(wc_get_handle(c), nullptr);
  EXPECT_EQ(wc_is_finalized(nullptr), 0);
  EXPECT_EQ(std::string(wc_last_error()), text) << "an answer of NULL, -1 or 0 set an error";

  const std::string too_long(WC_MAX_KEY_SIZE + 1, 'k');
  EXPECT_EQ(wc_look_up(c, too_long.data(), too_long.size()), WC_NOT_FOUND);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  (void)fail_once();
  EXPECT_EQ(wc_look_up(c, nullptr, 3), WC_NOT_FOUND);
  EXPECT_NE(std::string(wc_last_error()), text);

  char key[] = "layer0/weights";
  const std::size_t off = wc_look_up_or_insert(c, key, sizeof key - 1, const_cast<char*>("value"), 5);
  ASSERT_NE(off, WC_NOT_FOUND);
  std::memset(key, '?', sizeof key - 1);
  EXPECT_EQ(wc_look_up(c, "layer0/weights", 14), off);
  wc_close(c);
}

// wc_look_up_or_insert: "Nothing is inserted then; a reservation passed in stays outstanding
// after INVALID_ARGUMENT"; wc_release_space: "WC_ERR_INVALID_ARGUMENT (NULL cache or ptr, or any
// other pointer: nothing happens)".
TEST(Contract, AnInvalidInsertLeavesItsReservationOutstanding) {
  TempDir dir;
  WeightCache c = open_or_fail(file_options(dir.file("cache.wcache")));
  void* p = c.reserve(64);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 64);
  EXPECT_EQ(c.look_up_or_insert("k", p, 65), kNotFound);
  EXPECT_EQ(last_error().code, Errc::invalid_argument);
  EXPECT_EQ(c.look_up_or_insert("", p, 64), kNotFound);
  EXPECT_EQ(c.look_up("k"), kNotFound);
  EXPECT_EQ(c.stats().entries, 0u);
  EXPECT_EQ(c.release(static_cast<char*>(p) + 1).error().code, Errc::invalid_argument);
  EXPECT_TRUE(c.release(p).ok()) << "the reservation was not outstanding any more: " << last_error().message;
  EXPECT_EQ(c.release(p).error().code, Errc::invalid_argument) << "released twice";
}

// wc_refresh: "With nothing new, and for a heap cache, it returns WC_OK without changing
// anything."
TEST(Contract, RefreshOfAHeapCacheOrWithNothingNewChangesNothing) {
  TempDir dir;
  for (const std::string& path : {std::string(), dir.file("cache.wcache")}) {
    WeightCache c = open_or_fail(path.empty() ? Options{} : file_options(path));
    const std::size_t off = c.insert("k", "value");
    ASSERT_NE(off, kNotFound);
    ASSERT_TRUE(c.finalize().ok());
    const Stats before = c.stats();
    EXPECT_TRUE(c.refresh().ok()) << last_error().message;
    const Stats after = c.stats();
    EXPECT_EQ(after.entries, before.entries);
    EXPECT_EQ(after.mappings, before.mappings);
    EXPECT_EQ(after.file_bytes, before.file_bytes);
    EXPECT_EQ(c.look_up("k"), off);
  }
}

// wc_refresh: "On failure the cache goes on serving what it had. Statuses: ... WC_ERR_CORRUPT
// (the newest commit fails its checks), WC_ERR_INCOMPATIBLE (the file was rewritten under
// another compatibility key, alignment, version or byte order), WC_ERR_NO_SPACE (the file grew
// past max_file_bytes)". Another process grows the file; another program damages or rewrites
// its header in place.
TEST(Contract, RefreshSaysWhatIsWrongAndKeepsServing) {
  enum class Change { grown, damaged, other_version };
  for (Change change : {Change::grown, Change::damaged, Change::other_version}) {
    SCOPED_TRACE(static_cast<int>(change));
    TempDir dir;
    const std::string path = dir.file("cache.wcache");
    Options o = file_options(path);
    o.max_file_bytes = 1u << 20;
    WeightCache c = open_or_fail(o);
    const std::string mine = random_bytes(3, 3000);
    ASSERT_NE(c.insert("mine", mine), kNotFound);
    ASSERT_TRUE(c.finalize().ok()) << last_error().message;
    Errc expected = Errc::ok;
    switch (change) {
      case Change::grown:  // a writer with room packs several MiB
        ASSERT_TRUE(child_succeeds({"write", path, "21", "10", std::to_string(1u << 20)}));
        expected = Errc::no_space;
        break;
      case Change::damaged:  // a reserved byte of the header, not resealed: its checksum fails
        flip_byte_at(path, 100);
        expected = Errc::corrupt;
        break;
      case Change::other_version: {  // format version 2, resealed: a sound header of another version
        std::string header = read_bytes_at(path, 0, format::kHeaderSize);
        ASSERT_EQ(header.size(), format::kHeaderSize);
        auto* b = reinterpret_cast<std::byte*>(header.data());
        b[12] = std::byte{2};
        format::put_u64(b + format::kFixedChecksumOffset, format::hash_bytes(b, format::kFixedChecksumOffset));
        std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
        f.write(header.data(), static_cast<std::streamsize>(header.size()));
        ASSERT_TRUE(f);
        expected = Errc::incompatible;
        break;
      }
    }
    const Result<void> r = c.refresh();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, expected) << r.error().message;
    EXPECT_EQ(last_error().code, expected);
    EXPECT_EQ(verify_entry(c, "mine", mine, "mine"), "") << "the cache stopped serving what it had";
  }
}

// weight_cache.hpp, insert: "an empty `bytes` inserts an entry of 0 bytes".
TEST(Contract, InsertingNoBytesMakesAnEmptyEntry) {
  WeightCache c = open_or_fail(Options{});
  const std::size_t off = c.insert("empty", "");
  ASSERT_NE(off, kNotFound) << last_error().message;
  EXPECT_EQ(c.look_up("empty"), off);
  EXPECT_NE(c.offset_to_addr(off), nullptr);
  EXPECT_EQ(c.stats().entries, 1u);
}

// wc_reserve_space: heap memory "in a heap cache, in a read-only cache (new entries go to the
// heap) ... (counted in wc_stats.heap_fallbacks, but for a heap cache)".
TEST(Contract, HeapReservationsAreCountedButInAHeapCache) {
  WeightCache heap = open_or_fail(Options{});
  ASSERT_NE(heap.reserve(100), nullptr);
  EXPECT_EQ(heap.stats().heap_fallbacks, 0u);

  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  make_file_with(path, "k", "v");
  Options ro = file_options(path);
  ro.read_only = true;
  WeightCache c = open_or_fail(ro);
  ASSERT_EQ(c.stats().backing, Backing::file);
  void* p = c.reserve(100);
  ASSERT_NE(p, nullptr) << last_error().message;
  EXPECT_EQ(c.stats().heap_fallbacks, 1u);
  ASSERT_NE(c.look_up_or_insert("new", p, 100), kNotFound);
  EXPECT_EQ(c.stats().heap_bytes, 100u);
}

// wc_offset_to_addr: "It does not checksum the entry: look its key up first (wc_look_up does)
// before trusting an offset learned elsewhere"; an entry whose checksum failed gives NULL;
// "Sets no error."
TEST(Contract, OffsetToAddrDoesNotChecksumAndSetsNoError) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::size_t off = make_file_with(path, "k", std::string(3000, 'a'));
  flip_byte_at(path, off + 10);
  WeightCache c = open_or_fail(file_options(path));
  const std::string text = fail_once();
  const auto* p = static_cast<const char*>(c.offset_to_addr(off));
  ASSERT_NE(p, nullptr) << "offset_to_addr checksummed the entry (or refused it without a look-up)";
  EXPECT_NE(p[10], 'a') << "the damaged byte is served: offset_to_addr does not check";
  EXPECT_EQ(c.look_up("k"), kNotFound) << "the damaged entry hit";
  EXPECT_EQ(c.offset_to_addr(off), nullptr) << "an entry whose checksum failed resolved";
  EXPECT_EQ(c.offset_to_addr(off + 1), nullptr);
  EXPECT_EQ(c.stats().verify_failures, 1u);
  EXPECT_EQ(std::string(wc_last_error()), text) << "offset_to_addr or a checksum miss set an error";
}

// ---- offsets ----------------------------------------------------------------------------------

// "An entry in the file has its byte offset in the file as its offset: the same in every process
// that opens the file and in every later launch"; an entry in heap memory has an offset of its
// own, and "a finalize that moves such an entry into the file gives it a file offset (what
// look-ups return from then on); its heap offset still resolves to the same bytes in this
// process." The entry goes to heap memory because the lease is held elsewhere.
TEST(Contract, FileOffsetsAreTheFilesAndHeapOffsetsAreThisProcesss) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string file_bytes = random_bytes(11, 5000);
  const std::size_t file_off = make_file_with(path, "in-file", file_bytes);
  EXPECT_EQ(read_bytes_at(path, file_off, file_bytes.size()), file_bytes) << "the offset is not the file's";
  EXPECT_TRUE(child_succeeds({"offset", path, "in-file", std::to_string(file_off)}));

  Options o = file_options(path);
  o.backing = Backing::automatic;
  o.lease_timeout = std::chrono::milliseconds(50);
  WeightCache c = open_or_fail(o);
  EXPECT_EQ(c.look_up("in-file"), file_off) << "another launch";
  LeaseProbe lease(path);
  ASSERT_TRUE(lease.valid());
  ASSERT_TRUE(lease.try_take());
  const std::string heap_bytes = random_bytes(12, 7000);
  const std::size_t heap_off = c.insert("in-heap", heap_bytes);
  ASSERT_NE(heap_off, kNotFound) << last_error().message;
  ASSERT_EQ(c.stats().heap_bytes, heap_bytes.size()) << "the entry did not go to heap memory";
  lease.release();

  ASSERT_TRUE(c.finalize().ok()) << last_error().message;
  const std::size_t moved = c.look_up("in-heap");
  ASSERT_NE(moved, kNotFound);
  EXPECT_NE(moved, heap_off) << "the entry kept its heap offset in the file";
  EXPECT_EQ(read_bytes_at(path, moved, heap_bytes.size()), heap_bytes) << "look-ups do not return the file offset";
  const void* old_addr = c.offset_to_addr(heap_off);
  ASSERT_NE(old_addr, nullptr) << "the heap offset no longer resolves in this process";
  EXPECT_EQ(std::memcmp(old_addr, heap_bytes.data(), heap_bytes.size()), 0);
  EXPECT_TRUE(child_succeeds({"offset", path, "in-heap", std::to_string(moved)}));
}

// ---- writing through an entry's pointer (Linux: forked children and their signals) ------------

#ifdef __linux__
/// Forks; the child writes one byte at `p` with the default actions for SIGSEGV and SIGBUS (a
/// sanitizer's handler would turn the fault into an exit) and exits 0. Returns the wait status.
int write_in_child(void* p) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGSEGV, &dfl, nullptr);
    ::sigaction(SIGBUS, &dfl, nullptr);
    auto* b = static_cast<volatile unsigned char*>(p);
    *b = static_cast<unsigned char>(~*b);
    // Not _exit: ThreadSanitizer's _exit finalizes, and in a child forked right after a finalize
    // it reports the parent's write-back thread (finished, joined only by the parent's next
    // finalize or close) as leaked and exits 66. On a fast machine that thread has finished by the
    // fork; the child has only this thread and nothing to flush.
    ::syscall(SYS_exit_group, 0);
  }
  int status = -1;
  if (pid > 0) ::waitpid(pid, &status, 0);
  return status;
}

// "a read-only cache (read_only, ...) maps the file read-only, and a write there faults
// (SIGSEGV ...)".
TEST(Contract, WritingAnEntryOfAReadOnlyCacheFaults) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string bytes(5000, 'r');
  const std::size_t off = make_file_with(path, "k", bytes);
  Options ro = file_options(path);
  ro.read_only = true;
  WeightCache c = open_or_fail(ro);
  ASSERT_EQ(c.look_up("k"), off);
  void* p = c.offset_to_addr(off);
  ASSERT_NE(p, nullptr);
  const int status = write_in_child(p);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "wait status " << status;
  EXPECT_EQ(read_bytes_at(path, off, bytes.size()), bytes);
  EXPECT_EQ(c.look_up("k"), off);
}

// "A writable cache maps the file read-write and shared (MAP_SHARED), so a write changes the file
// under every process that maps it: the entry then fails its checksum (a miss) in any process
// that checks it later, while a process that checked it before (the writer itself, which checked
// it at insert) goes on serving the changed bytes."
TEST(Contract, WritingAnEntryOfAWritableCacheChangesTheFile) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const std::string bytes(5000, 'w');
  WeightCache c = open_or_fail(file_options(path));
  const std::size_t off = c.insert("k", bytes);
  ASSERT_NE(off, kNotFound);
  ASSERT_TRUE(c.finalize().ok()) << last_error().message;
  auto* p = static_cast<unsigned char*>(c.offset_to_addr(off));
  ASSERT_NE(p, nullptr);

  const int status = write_in_child(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the write faulted: wait status " << status;
  EXPECT_NE(read_bytes_at(path, off, 1), "w") << "the write did not reach the file";
  EXPECT_NE(p[0], 'w') << "this process does not see the write (not a shared mapping)";
  EXPECT_EQ(c.look_up("k"), off) << "the writer, which checked the entry at insert, stopped serving it";

  EXPECT_TRUE(child_succeeds({"miss", path, "k"})) << "another process served the changed entry";
  Options ro = file_options(path);
  ro.read_only = true;  // a cache of its own, which checks the entry afresh
  WeightCache fresh = open_or_fail(ro);
  EXPECT_EQ(fresh.look_up("k"), kNotFound);
  EXPECT_EQ(fresh.stats().verify_failures, 1u);
}
#endif

// "An entry in heap memory is private to this process, and a write changes what this process
// serves."
TEST(Contract, WritingAHeapEntryChangesWhatThisProcessServes) {
  WeightCache c = open_or_fail(Options{});
  const std::size_t off = c.insert("k", std::string(100, 'h'));
  ASSERT_NE(off, kNotFound);
  static_cast<char*>(c.offset_to_addr(off))[0] = 'X';
  ASSERT_EQ(c.look_up("k"), off);
  EXPECT_EQ(static_cast<const char*>(c.offset_to_addr(off))[0], 'X');
}

// ---- wc_open statuses -------------------------------------------------------------------------

#ifndef _WIN32
// wc_open with WC_BACKING_FILE: "WC_ERR_INVALID_ARGUMENT the path names a directory, a FIFO or
// another file that is not a regular one, or a symlink (without allow_symlink)"; with
// WC_BACKING_AUTO the open falls back to a heap cache instead.
TEST(Contract, WhatIsNotARegularFileIsAnInvalidArgument) {
  TempDir dir;
  const std::string directory = dir.file("a-directory");
  const std::string fifo = dir.file("a-fifo");
  const std::string link = dir.file("a-link");
  ASSERT_EQ(::mkdir(directory.c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  make_file_with(dir.file("target.wcache"), "k", "v");
  ASSERT_EQ(::symlink("target.wcache", link.c_str()), 0);
  for (const std::string& path : {directory, fifo, link}) {
    Options o = file_options(path);
    auto c = WeightCache::open(o);
    ASSERT_FALSE(c.ok()) << path;
    EXPECT_EQ(c.error().code, Errc::invalid_argument) << path << ": " << c.error().message;
    o.backing = Backing::automatic;
    auto fallback = WeightCache::open(o);
    ASSERT_TRUE(fallback.ok()) << path << ": " << fallback.error().message;
    EXPECT_EQ(fallback->stats().backing, Backing::heap);
  }
}
#endif

}  // namespace
}  // namespace weightcache::test
