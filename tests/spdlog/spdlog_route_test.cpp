// weightcache/spdlog.hpp against a real spdlog: the library's messages reach a logger's sinks
// with their levels mapped and their exact text, a route keeps its logger alive, routes stack and
// end in any order, the library's level follows the logger's when asked, and nothing a sink
// throws reaches the library.
#include "bounded_child.hpp"
#include "temp_dir.hpp"

#include <weightcache/spdlog.hpp>
#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weightcache::test {
namespace {

struct Line {
  spdlog::level::level_enum level;
  std::string logger;
  std::string text;
};

// Keeps every message a logger hands it, as spdlog passed it (level, logger name, payload).
class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<Line> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }
  std::size_t count() const { return count_.load(); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.push_back({msg.level, std::string(msg.logger_name.data(), msg.logger_name.size()),
                      std::string(msg.payload.data(), msg.payload.size())});
    ++count_;
  }
  void flush_() override {}

 private:
  std::vector<Line> lines_;
  std::atomic<std::size_t> count_{0};
};

struct Captured {
  std::shared_ptr<CaptureSink> sink = std::make_shared<CaptureSink>();
  std::shared_ptr<spdlog::logger> logger;
  explicit Captured(const std::string& name, spdlog::level::level_enum level = spdlog::level::trace)
      : logger(std::make_shared<spdlog::logger>(name, sink)) {
    logger->set_level(level);
  }
  std::vector<Line> lines() const { return sink->lines(); }
};

// What the library hands a plain callback: the reference the routed lines are compared with.
struct Raw {
  wc_log_level level;
  std::string text;
};
void keep_raw(void* user, wc_log_level level, const char* message, size_t size) {
  static_cast<std::vector<Raw>*>(user)->push_back({level, std::string(message, size)});
}

// A documented warning of the library's (wc_set_log_level refuses a value outside the enum and
// says so at warn), with the level left as it was.
void library_warns() { wc_set_log_level(static_cast<wc_log_level>(5)); }

// What library_warns() writes on stderr (where its warning goes with no route in force).
std::string stderr_of_library_warns() {
  ::testing::internal::CaptureStderr();
  library_warns();
  return ::testing::internal::GetCapturedStderr();
}

// The text of library_warns()'s warning, as a plain callback receives it.
std::string the_warning() {
  std::vector<Raw> raw;
  set_log_callback(&keep_raw, &raw);
  library_warns();
  set_log_callback(nullptr, nullptr);
  return raw.size() == 1 ? raw[0].text : std::string();
}

// Opens a new cache file, closes it and opens it again: the library logs at info (created) and
// at debug (opened) on the way.
void open_twice(const TempDir& dir, const std::string& name) {
  Options o;
  o.path = dir.file(name);
  o.compat_key = "spdlog-test";
  for (int i = 0; i < 2; ++i) {
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
  }
}

// Every test starts from the library's defaults: warn, stderr. No route outlives its test.
class SpdlogRoute : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_callback(nullptr, nullptr);
    set_log_level(LogLevel::warn);
    warning_ = the_warning();
    ASSERT_FALSE(warning_.empty()) << "the library did not warn about level 5";
  }
  void TearDown() override {
    set_log_callback(nullptr, nullptr);
    set_log_level(LogLevel::warn);
  }
  std::string warning_;
};

// ---- levels and text ----------------------------------------------------------------------------

TEST_F(SpdlogRoute, ALibraryWarningReachesTheSinkAtWarnWithItsWholeText) {
  Captured host("host");
  auto route = route_log_to(host.logger);
  ASSERT_TRUE(route.active());
  library_warns();
  const auto lines = host.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].level, spdlog::level::warn);
  EXPECT_EQ(lines[0].logger, "host");
  EXPECT_EQ(lines[0].text, warning_);  // every byte, not one more
}

TEST_F(SpdlogRoute, LevelsMapToTheirNamesakes) {
  EXPECT_EQ(to_spdlog_level(LogLevel::trace), spdlog::level::trace);
  EXPECT_EQ(to_spdlog_level(LogLevel::debug), spdlog::level::debug);
  EXPECT_EQ(to_spdlog_level(LogLevel::info), spdlog::level::info);
  EXPECT_EQ(to_spdlog_level(LogLevel::warn), spdlog::level::warn);
  EXPECT_EQ(to_spdlog_level(LogLevel::error), spdlog::level::err);
  EXPECT_EQ(to_spdlog_level(LogLevel::off), spdlog::level::off);
  EXPECT_EQ(to_log_level(spdlog::level::trace), LogLevel::trace);
  EXPECT_EQ(to_log_level(spdlog::level::debug), LogLevel::debug);
  EXPECT_EQ(to_log_level(spdlog::level::info), LogLevel::info);
  EXPECT_EQ(to_log_level(spdlog::level::warn), LogLevel::warn);
  EXPECT_EQ(to_log_level(spdlog::level::err), LogLevel::error);
  // The library logs nothing above error: a logger at critical keeps none of it.
  EXPECT_EQ(to_log_level(spdlog::level::critical), LogLevel::off);
  EXPECT_EQ(to_log_level(spdlog::level::off), LogLevel::off);
}

// The callback a route installs, at each level the library can pass it (trace and error included,
// which the library has no message to send on demand).
TEST_F(SpdlogRoute, TheCallbackPassesEachLevelMapped) {
  Captured host("host");
  spdlog_detail::Route route;
  route.logger = host.logger;
  const wc_log_level levels[] = {WC_LOG_TRACE, WC_LOG_DEBUG, WC_LOG_INFO, WC_LOG_WARN, WC_LOG_ERROR};
  for (wc_log_level l : levels) spdlog_detail::forward(&route, l, "m", 1);
  const auto lines = host.lines();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].level, spdlog::level::trace);
  EXPECT_EQ(lines[1].level, spdlog::level::debug);
  EXPECT_EQ(lines[2].level, spdlog::level::info);
  EXPECT_EQ(lines[3].level, spdlog::level::warn);
  EXPECT_EQ(lines[4].level, spdlog::level::err);
}

// The message is `size` bytes, not a C string: nothing past them (the library's buffer is not
// NUL-terminated), everything up to them (a NUL inside included), and no formatting (braces).
TEST_F(SpdlogRoute, TheCallbackPassesExactlyTheGivenBytesUnformatted) {
  Captured host("host");
  spdlog_detail::Route route;
  route.logger = host.logger;
  const char buffer[] = {'a', '{', '}', 'b', '{', '0', '}', 'c', 'X', 'Y', 'Z', '!'};  // no NUL anywhere
  spdlog_detail::forward(&route, WC_LOG_WARN, buffer, 8);
  const char with_nul[] = {'p', '\0', 'q'};
  spdlog_detail::forward(&route, WC_LOG_WARN, with_nul, sizeof with_nul);
  spdlog_detail::forward(&route, WC_LOG_WARN, buffer, 0);
  const auto lines = host.lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].text, "a{}b{0}c");
  EXPECT_EQ(lines[1].text, std::string(with_nul, sizeof with_nul));
  EXPECT_EQ(lines[2].text, "");
}

// What the library logs while a cache file is created and opened again (info and debug lines),
// routed: the same messages in the same order, each at its mapped level.
TEST_F(SpdlogRoute, TheLibrarysInfoAndDebugLinesArriveAsAPlainCallbackGetsThem) {
  TempDir dir;
  set_log_level(LogLevel::trace);
  std::vector<Raw> raw;
  set_log_callback(&keep_raw, &raw);
  open_twice(dir, "raw.wcache");
  set_log_callback(nullptr, nullptr);
  // The scenario must log at both levels, or this test would check nothing of them.
  bool info = false, debug = false;
  for (const auto& r : raw) {
    info |= r.level == WC_LOG_INFO;
    debug |= r.level == WC_LOG_DEBUG;
  }
  ASSERT_TRUE(info && debug) << raw.size() << " messages, none at info or none at debug";

  Captured host("host", spdlog::level::trace);
  {
    auto route = route_log_to(host.logger);
    open_twice(dir, "routed.wcache");
  }
  const auto lines = host.lines();
  ASSERT_EQ(lines.size(), raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    EXPECT_EQ(lines[i].level, to_spdlog_level(static_cast<LogLevel>(raw[i].level))) << raw[i].text;
    std::string want = raw[i].text;
    for (auto at = want.find("raw.wcache"); at != std::string::npos; at = want.find("raw.wcache"))
      want.replace(at, 10, "routed.wcache");
    EXPECT_EQ(lines[i].text, want);
  }
}

// ---- the library's level ------------------------------------------------------------------------

TEST_F(SpdlogRoute, FromLoggerLetsThroughWhatTheLoggerKeeps) {
  TempDir dir;
  Captured host("host", spdlog::level::info);
  auto route = route_log_to(host.logger);  // LogRouteLevel::from_logger: the library at info
  open_twice(dir, "c.wcache");
  bool info = false;
  for (const auto& l : host.lines()) {
    EXPECT_GE(l.level, spdlog::level::info) << l.text;
    info |= l.level == spdlog::level::info;
  }
  EXPECT_TRUE(info) << "no info line: the library's level was not set from the logger's";
}

TEST_F(SpdlogRoute, UnchangedLeavesTheLibrarysLevel) {
  TempDir dir;
  Captured host("host", spdlog::level::trace);
  auto route = route_log_to(host.logger, LogRouteLevel::unchanged);  // the library stays at warn
  open_twice(dir, "c.wcache");
  library_warns();
  const auto lines = host.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].text, warning_);
}

// A logger that keeps only errors sets the library to error: a later route that leaves the level
// alone then gets no warning, though its logger would keep one.
TEST_F(SpdlogRoute, FromLoggerRaisesTheLibrarysLevelToo) {
  Captured strict("strict", spdlog::level::err);
  auto first = route_log_to(strict.logger);
  Captured open("open", spdlog::level::trace);
  auto second = route_log_to(open.logger, LogRouteLevel::unchanged);
  library_warns();
  EXPECT_TRUE(open.lines().empty());
  EXPECT_TRUE(strict.lines().empty());
}

// When a later route ends, the earlier one's rule applies again: its logger's level, not the
// level the later route had set.
TEST_F(SpdlogRoute, AnEarlierRouteBringsItsLevelBack) {
  TempDir dir;
  Captured chatty("chatty", spdlog::level::info);
  auto first = route_log_to(chatty.logger);
  {
    Captured strict("strict", spdlog::level::err);
    auto second = route_log_to(strict.logger);
  }
  open_twice(dir, "c.wcache");
  bool info = false;
  for (const auto& l : chatty.lines()) info |= l.level == spdlog::level::info;
  EXPECT_TRUE(info) << "the library stayed at the ended route's level (error)";
}

// ---- lifetime and the stack of routes -----------------------------------------------------------

TEST_F(SpdlogRoute, TheRouteKeepsTheLoggerAliveAndLetsGoWhenItEnds) {
  auto sink = std::make_shared<CaptureSink>();
  auto logger = std::make_shared<spdlog::logger>("host", sink);
  std::weak_ptr<spdlog::logger> watch = logger;
  auto route = route_log_to(std::move(logger));
  ASSERT_FALSE(watch.expired());
  library_warns();
  EXPECT_EQ(sink->lines().size(), 1u);
  route.end();
  EXPECT_TRUE(watch.expired());
  EXPECT_FALSE(route.active());
  library_warns();
  EXPECT_EQ(sink->lines().size(), 1u);
}

TEST_F(SpdlogRoute, EndingTheLastRouteRestoresStderr) {
  Captured host("host");
  auto route = route_log_to(host.logger);
  route.end();
  const std::string err = stderr_of_library_warns();
  EXPECT_NE(err.find(warning_), std::string::npos) << "stderr was: " << err;
  EXPECT_TRUE(host.lines().empty());
}

TEST_F(SpdlogRoute, EndingARouteRestoresTheOneBefore) {
  Captured a("a"), b("b");
  auto ra = route_log_to(a.logger);
  auto rb = route_log_to(b.logger);
  library_warns();
  EXPECT_EQ(a.lines().size(), 0u);
  EXPECT_EQ(b.lines().size(), 1u);
  rb.end();
  library_warns();
  EXPECT_EQ(a.lines().size(), 1u);
  EXPECT_EQ(b.lines().size(), 1u);
  ra.end();
  const std::string err = stderr_of_library_warns();
  EXPECT_NE(err.find(warning_), std::string::npos) << "stderr was: " << err;
  EXPECT_EQ(a.lines().size(), 1u);
  EXPECT_EQ(b.lines().size(), 1u);
}

// A route that ends while a later one is in force changes nothing now, and is skipped when the
// later one ends.
TEST_F(SpdlogRoute, RoutesEndInAnyOrder) {
  Captured a("a"), b("b"), c("c");
  std::weak_ptr<spdlog::logger> watch_b = b.logger;
  auto ra = route_log_to(a.logger);
  auto rb = route_log_to(b.logger);
  auto rc = route_log_to(c.logger);
  rb.end();
  b.logger.reset();
  EXPECT_TRUE(watch_b.expired()) << "an ended route that was not in force kept its logger";
  library_warns();
  EXPECT_EQ(c.lines().size(), 1u);
  rc.end();
  library_warns();
  EXPECT_EQ(a.lines().size(), 1u);
  EXPECT_EQ(b.sink->lines().size(), 0u);
  EXPECT_EQ(c.lines().size(), 1u);
}

// `route = route_log_to(...)` makes the new route before the old one ends, so the old one ends
// while a later one is in force: it must not stay linked behind it. Counted on the header's own
// stack: one route in force, nothing behind it, however often the route was reassigned.
TEST_F(SpdlogRoute, AReassignedRouteLeavesNoEndedRoutesBehind) {
  Captured a("a");
  LogRoute route = route_log_to(a.logger);
  for (int i = 0; i < 1000; ++i) route = route_log_to(a.logger);
  std::size_t linked = 0;
  {
    auto& routes = spdlog_detail::routes();
    std::lock_guard<std::mutex> lock(routes.mu);
    for (auto* r = routes.current.get(); r != nullptr; r = r->previous.get()) ++linked;
  }
  EXPECT_EQ(linked, 1u) << "ended routes stay linked behind the one in force";
  EXPECT_EQ(a.logger.use_count(), 2) << "the ended routes still hold the logger";  // a's and the route's
  library_warns();
  EXPECT_EQ(a.lines().size(), 1u);
  route.end();
  std::lock_guard<std::mutex> lock(spdlog_detail::routes().mu);
  EXPECT_EQ(spdlog_detail::routes().current, nullptr);
}

TEST_F(SpdlogRoute, MovingARouteMovesWhatEndsIt) {
  Captured a("a"), b("b");
  auto ra = route_log_to(a.logger);
  LogRoute moved = std::move(ra);
  EXPECT_FALSE(ra.active());  // NOLINT(bugprone-use-after-move): moved-from is documented empty
  ra.end();                   // ends nothing
  library_warns();
  EXPECT_EQ(a.lines().size(), 1u);
  moved = route_log_to(b.logger);  // ends a's route, then holds b's
  library_warns();
  EXPECT_EQ(a.lines().size(), 1u);
  EXPECT_EQ(b.lines().size(), 1u);
  moved = LogRoute();  // ends b's: nothing is left, stderr
  const std::string err = stderr_of_library_warns();
  EXPECT_NE(err.find(warning_), std::string::npos) << "stderr was: " << err;
  EXPECT_EQ(a.lines().size(), 1u);
  EXPECT_EQ(b.lines().size(), 1u);
}

TEST_F(SpdlogRoute, ANullLoggerMakesNoRoute) {
  Captured a("a");
  auto ra = route_log_to(a.logger);
  auto none = route_log_to(nullptr);
  EXPECT_FALSE(none.active());
  library_warns();
  none.end();
  library_warns();
  EXPECT_EQ(a.lines().size(), 2u);
}

// A detached route stays for the process, so this runs in a child process of its own.
TEST_F(SpdlogRoute, ADetachedRouteStaysWithItsLogger) {
  const std::string warning = warning_;
  EXPECT_EXIT(
      {
        auto sink = std::make_shared<CaptureSink>();
        {
          auto route = route_log_to(std::make_shared<spdlog::logger>("kept", sink));
          route.detach();
          if (route.active()) std::_Exit(2);
        }  // neither the route object nor anyone else holds the logger now
        library_warns();
        bool ok = sink->lines().size() == 1 && sink->lines()[0].text == warning;
        Captured later("later");
        route_log_to(later.logger).end();  // in force, then ended: the detached one is back
        library_warns();
        ok = ok && sink->lines().size() == 2 && later.lines().empty();
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- what a sink throws, and threads ------------------------------------------------------------

// spdlog rethrows what is not a std::exception (after its error handler): the route's callback
// must not let it into the library (a noexcept callback would terminate the process).
TEST_F(SpdlogRoute, WhatASinkThrowsStaysOutOfTheLibrary) {
  class ThrowingSink final : public spdlog::sinks::base_sink<std::mutex> {
   protected:
    void sink_it_(const spdlog::details::log_msg&) override { throw 42; }
    void flush_() override {}
  };
  auto logger = std::make_shared<spdlog::logger>("throws", std::make_shared<ThrowingSink>());
  std::atomic<int> handled{0};
  logger->set_error_handler([&handled](const std::string&) { ++handled; });
  auto route = route_log_to(logger);
  library_warns();
  EXPECT_EQ(handled.load(), 1);
  Captured after("after");
  auto next = route_log_to(after.logger);
  library_warns();
  EXPECT_EQ(after.lines().size(), 1u);
}

// Threads log through one route while another thread makes and ends routes over it: each route
// in force until a message reached it, then the base route until one reached that. Every message
// reaches one of the two loggers, whole, and none goes to stderr. (The threads stop after a cap,
// so a broken route makes the router stop waiting instead of hanging.)
TEST_F(SpdlogRoute, ThreadsLogWhileRoutesComeAndGo) {
  Captured base("base"), churn("churn");
  auto route = route_log_to(base.logger);
  constexpr int kThreads = 3, kRoutes = 100, kCap = 20000;
  std::atomic<bool> first_route{false}, routed{false};
  std::atomic<int> logging{kThreads};
  std::atomic<std::size_t> logged{0};
  const auto wait_for_one = [&logging](const CaptureSink& sink, std::size_t seen) {
    while (sink.count() == seen && logging.load() > 0) std::this_thread::yield();
  };
  ::testing::internal::CaptureStderr();
  std::thread router([&] {
    for (int i = 0; i < kRoutes; ++i) {
      auto r = route_log_to(churn.logger);
      first_route = true;
      wait_for_one(*churn.sink, churn.sink->count());
      const std::size_t seen = base.sink->count();
      r.end();
      wait_for_one(*base.sink, seen);
    }
    routed = true;
  });
  std::vector<std::thread> loggers;
  for (int t = 0; t < kThreads; ++t)
    loggers.emplace_back([&] {
      while (!first_route.load()) std::this_thread::yield();
      for (int i = 0; i < kCap && !routed.load(); ++i) {
        library_warns();
        ++logged;
      }
      --logging;
    });
  for (auto& t : loggers) t.join();
  router.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  const auto b = base.lines(), c = churn.lines();
  EXPECT_EQ(b.size() + c.size(), logged.load());
  EXPECT_GE(c.size(), 1u);  // the first route was in force before any thread logged
  for (const auto* lines : {&b, &c})
    for (const auto& l : *lines) {
      EXPECT_EQ(l.level, spdlog::level::warn);
      EXPECT_EQ(l.text, warning_);
    }
}

}  // namespace
}  // namespace weightcache::test

#if defined(__linux__) || defined(__APPLE__)
namespace weightcache::test {
namespace {

// spdlog.hpp, "fork()": a child makes and ends a route whatever a parent thread was doing with
// routes at the fork. Without the atfork handlers, a fork while the looping thread held the
// routes' lock left it locked in the child, whose route_log_to then never returned (about half
// of the children hung).
TEST_F(SpdlogRoute, AChildForkedBesideAThreadMakingRoutesMakesItsOwn) {
  if (kUnderAsan)
    GTEST_SKIP() << "under ASan a child forked beside an allocating thread may wait in ASan's own allocator lock";
  Captured churn("churn");
  std::atomic<bool> stop{false};
  std::atomic<long> rounds{0};
  std::thread router([&] {
    while (!stop.load()) {
      auto r = route_log_to(churn.logger);
      r.end();
      ++rounds;
    }
  });
  while (rounds.load() < 100) std::this_thread::yield();
  for (int i = 0; i < 30; ++i) {
    const std::string why = run_child_bounded([] {
      Captured mine("child");
      auto r = route_log_to(mine.logger);
      library_warns();
      r.end();
      return mine.lines().size() == 1 && mine.lines()[0].logger == "child" ? kChildOk : kChildMismatch;
    });
    EXPECT_EQ(why, "") << "fork " << i;
    const long seen = rounds.load();
    while (rounds.load() < seen + 10) std::this_thread::yield();  // the thread is back in its loop
  }
  stop = true;
  router.join();
}

}  // namespace
}  // namespace weightcache::test
#endif
