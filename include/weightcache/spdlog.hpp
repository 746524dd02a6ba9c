// weightcache's log into a host's spdlog logger. Part of weightcache 0.1 (not yet stable: see
// weightcache.h).
//
// The library logs through its own small logger (docs/DESIGN.md, "Logging and errors"): one
// line on stderr per message, or a host callback (wc_set_log_callback). A host that logs with
// spdlog makes one call here and gets weightcache's messages in its own sinks, files and
// patterns, at the matching spdlog level:
//
//   #include <spdlog/spdlog.h>
//   #include <weightcache/spdlog.hpp>
//   auto route = weightcache::route_log_to(spdlog::default_logger());  // for as long as `route` lives
//
// Header-only, compiled in the host and never into libweightcache, which has no spdlog in it and
// needs none. Link spdlog as the host already does (CMake: find_package(spdlog) and
// spdlog::spdlog, or its header-only target). Needs C++17, as weight_cache.hpp does, and spdlog
// 1.x: of spdlog it uses only logger::log(level, string_view_t), logger::level() and the level
// enum (tested with 1.10, compiled and header-only).
//
// What a route does, and what it cannot do:
// - **Levels.** weightcache's trace, debug, info, warn and error become spdlog's trace, debug,
//   info, warn and err (to_spdlog_level). The library has no critical and logs nothing above
//   error. Which messages the library formats at all is its own level, process-wide; by default
//   a route sets it from the logger's level when it is made (LogRouteLevel::from_logger), so the
//   library formats exactly what the logger keeps. It is set once, not followed: after
//   changing the logger's level, call weightcache::set_log_level(to_log_level(logger->level()))
//   (or make the route again).
// - **Text.** Each message is handed to spdlog::logger::log as it is (UTF-8, its exact length,
//   never formatted again: braces stay braces), and the logger's pattern adds the time, the
//   logger's name and the level. For "[weightcache]" in the lines, route to a logger of that
//   name that shares the host's sinks: host_logger->clone("weightcache").
// - **Lifetime.** The route holds the logger (a shared_ptr) while it is in force: the host may
//   drop its own references, and the library never reaches a destroyed logger. When a route
//   ends, the logger is let go after the library has stopped calling it.
// - **Routes stack.** A route made while another is in force replaces it; when the newer one
//   ends, the most recent earlier route that has not ended is in force again (its level rule
//   applied again), and when none is left, the library's default: lines on stderr. Routes may end
//   in any order.
// - **Other callbacks.** The library has no call that says which callback is set, so a route
//   knows only the routes made with this header. A callback set directly (wc_set_log_callback,
//   set_log_callback, or by a component such as the ONNX Runtime execution provider when it is
//   loaded) is not brought back when routes end: messages go to stderr instead; and one set
//   while a route is in force is replaced when that route ends, while a route stays unaware of
//   it (the ONNX Runtime provider sets stderr back when it is released, over any route). Make
//   routes after such a component has set its own, and make them again after it let go.
// - **Threads.** route_log_to, LogRoute::end, detach and the destructor may be called from any
//   thread, concurrently with each other and with the library logging on other threads; one
//   LogRoute object, like any object, from one thread at a time. The library calls the logger on
//   whichever thread logs, one message at a time, under its log lock (wc_log_callback): the
//   logger's sinks must return promptly and must not call into weightcache, and none of these
//   functions may be called from inside such a sink (they would wait for themselves). Sinks
//   the host also logs to from other threads should be spdlog's thread-safe (_mt) ones, as
//   usual. An async logger copies the message, as it must (the text is valid only during the
//   call).
// - **One stack per copy.** The routes' state is a static of an inline function here: a host that
//   compiles it into several shared libraries that each keep their inline symbols to themselves
//   gets one stack per library, all setting the one library callback. Route from one place. A
//   shared library that made a route must end it before it is unloaded.
// - **fork().** A child may make and end routes, and its routes' destructors return, whatever the
//   parent's other threads were doing with routes at the fork: from the first route on, its lock
//   is held across fork() (pthread_atfork), as the library holds its own (weightcache.h,
//   "Caveats"). A route the child inherited is the parent's logger's, copied: ending it in the
//   child is safe; the logger's sinks are spdlog's business across fork().
// - **Exceptions.** route_log_to throws std::bad_alloc (and std::system_error, which a mutex may)
//   when it cannot make the route; nothing has changed then. Everything else is noexcept: what a
//   logger or sink throws while the library calls it is caught and dropped (spdlog already hands
//   a std::exception to the logger's error handler).
#pragma once

#include <weightcache/weight_cache.hpp>

#include <spdlog/logger.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace weightcache {

/// spdlog's level for one of the library's: trace, debug, info, warn and error map to spdlog's
/// trace, debug, info, warn and err; off to off.
constexpr spdlog::level::level_enum to_spdlog_level(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::warn;  // not a LogLevel value: the library logs none such
}

/// The library's level that lets through what a logger at spdlog's `level` keeps: trace, debug,
/// info, warn and err map to trace, debug, info, warn and error. critical and off map to off:
/// the library logs nothing above error, so a logger at critical would drop all of it.
constexpr LogLevel to_log_level(spdlog::level::level_enum level) noexcept {
  switch (level) {
    case spdlog::level::trace: return LogLevel::trace;
    case spdlog::level::debug: return LogLevel::debug;
    case spdlog::level::info: return LogLevel::info;
    case spdlog::level::warn: return LogLevel::warn;
    case spdlog::level::err: return LogLevel::error;
    default: return LogLevel::off;  // critical, off
  }
}

/// What a route does to the library's process-wide level (set_log_level).
enum class LogRouteLevel {
  /// Sets it from the logger's level (to_log_level) when the route is made, and again whenever
  /// the route is in force again after a later one ended. The default.
  from_logger,
  /// Leaves it as it is (warn, unless the host or WEIGHTCACHE_LOG_LEVEL set another): spdlog then
  /// filters what reaches it, and the library formats only what its own level lets through.
  unchanged,
};

namespace spdlog_detail {

// One route made by route_log_to. The library's callback gets its address as `user`: it lives
// as long as it is installed, because the stack (Routes::current, or a later route's
// `previous`) holds it until it is replaced and the library has stopped calling it.
struct Route {
  std::shared_ptr<spdlog::logger> logger;  // let go of when the route ends
  std::shared_ptr<Route> previous;         // the route in force before this one; null: stderr
  bool level_from_logger = true;
  bool ended = false;
};

// The stack of routes. Allocated once and never destroyed: a route kept for the process
// (LogRoute::detach) must still hold its logger while static destructors run, for a cache that
// a static object closes logs then. Never locked inside the library's callback (which runs under
// the library's log lock, while wc_set_log_callback is called under this mutex).
struct Routes {
  std::mutex mu;
  std::shared_ptr<Route> current;  // the route installed, or null
};

inline Routes& routes() {
  static Routes* const all = new Routes();
  return *all;
}

#if defined(__unix__) || defined(__APPLE__)
// fork() while another thread makes or ends a route would leave `mu` locked forever in the child,
// where that thread does not exist: the child's first route_log_to or LogRoute::end (a
// destructor at exit) would never return. So `mu` is held across fork, as the library holds its
// own locks. Registered at the first route, after the library's handlers (which it registers
// when it is loaded): prepare handlers run in reverse order of registration, so this one takes
// `mu` before the library's takes its log lock, the order a route takes them. Registered with
// no lock or static guard held: pthread_atfork waits while a fork is in progress, and whatever
// the registering thread held then would stay held in the child.
inline void lock_for_fork() noexcept { routes().mu.lock(); }
inline void unlock_after_fork() noexcept { routes().mu.unlock(); }
inline void hold_across_fork() noexcept {
  static std::atomic<int> state{0};  // constant-initialized: no guard. 1: registering, 2: done
  int expected = 0;
  if (state.load(std::memory_order_acquire) != 0 || !state.compare_exchange_strong(expected, 1)) return;
  (void)routes();  // made before a prepare handler needs it
  (void)::pthread_atfork(&lock_for_fork, &unlock_after_fork, &unlock_after_fork);
  state.store(2, std::memory_order_release);
}
#else
inline void hold_across_fork() noexcept {}  // no fork() here
#endif

// The library's callback: the message, its exact bytes, at the mapped level. Never throws into
// the library: spdlog hands a std::exception to the logger's error handler, but rethrows anything
// else, and an error handler may throw.
inline void forward(void* user, wc_log_level level, const char* message, std::size_t size) noexcept {
  try {
    const auto& logger = static_cast<Route*>(user)->logger;
    if (logger) logger->log(to_spdlog_level(static_cast<LogLevel>(level)), spdlog::string_view_t(message, size));
  } catch (...) {
  }
}

// Makes `route` the one the library calls (null: stderr). Under Routes::mu.
inline void install(const std::shared_ptr<Route>& route) noexcept {
  if (!route) {
    set_log_callback(nullptr, nullptr);
    return;
  }
  // The callback first: a level lowered before it would send the previous sink more than it asked for.
  set_log_callback(&forward, route.get());
  if (route->level_from_logger) set_log_level(to_log_level(route->logger->level()));
}

}  // namespace spdlog_detail

class LogRoute;

/// Routes the library's log messages into `logger`, at the mapped levels (to_spdlog_level), until
/// the returned route ends; see the top of this header for what a route does. With
/// LogRouteLevel::from_logger (the default) it also sets the library's level from the logger's.
/// A route made while another is in force replaces it until it ends.
///
/// A null `logger` makes no route: nothing changes, and the returned route is empty.
/// Throws std::bad_alloc (or std::system_error from a mutex) when it cannot make the route, and
/// nothing changes then. Must not be called from inside a sink the library's message reached.
[[nodiscard]] inline LogRoute route_log_to(std::shared_ptr<spdlog::logger> logger,
                                           LogRouteLevel level = LogRouteLevel::from_logger);

/// A route of the library's log into an spdlog logger (route_log_to), in force until end() or
/// destruction. Move-only; an empty one (default-constructed, moved from, ended or detached)
/// holds nothing, and its end() and destruction do nothing.
class LogRoute {
 public:
  LogRoute() noexcept = default;
  LogRoute(LogRoute&& other) noexcept : route_(std::move(other.route_)) {}
  /// Ends the route this one held, then takes `other`'s.
  LogRoute& operator=(LogRoute&& other) noexcept {
    if (this != &other) {
      end();
      route_ = std::move(other.route_);
    }
    return *this;
  }
  LogRoute(const LogRoute&) = delete;
  LogRoute& operator=(const LogRoute&) = delete;
  /// end().
  ~LogRoute() { end(); }

  /// Whether this holds a route that is in force or waits under a later one (made, and neither
  /// ended nor detached).
  bool active() const noexcept { return route_ != nullptr; }
  explicit operator bool() const noexcept { return active(); }

  /// Ends the route. If it is the one in force, the most recent earlier route that has not ended
  /// is in force again (with the library's level set from its logger when it was made with
  /// LogRouteLevel::from_logger), or, with none left, the library's lines go to stderr; either
  /// way, when this returns the library is no longer calling this route's logger, and the
  /// route has let go of it. The library's level stays as it is. If a later route is in force,
  /// that one stays, and this one will be skipped when it ends. The route is then empty. Must not
  /// be called from inside a sink the library's message reached.
  void end() noexcept {
    if (!route_) return;
    std::shared_ptr<spdlog::logger> logger;  // let go of after the lock: its destructor flushes sinks
    {
      spdlog_detail::Routes& routes = spdlog_detail::routes();
      std::lock_guard<std::mutex> lock(routes.mu);
      route_->ended = true;
      if (routes.current == route_) {
        // No ended route stays linked (below), so the one before is in force again.
        spdlog_detail::install(route_->previous);  // returns once no call into this route is running
        routes.current = route_->previous;
      }
      // Unlink this route from the later one that points to it, so that a route reassigned over
      // and over (route = route_log_to(...)) leaves no chain of ended routes behind.
      for (spdlog_detail::Route* r = routes.current.get(); r != nullptr; r = r->previous.get())
        while (r->previous && r->previous->ended) r->previous = r->previous->previous;
      logger = std::move(route_->logger);
    }
    route_.reset();
  }

  /// Keeps the route for the rest of the process, and this object lets go of it without ending
  /// it: the route, and its logger, stay until the process ends (static destructors included),
  /// replaced meanwhile only by later routes while they are in force. The route is then empty.
  void detach() noexcept { route_.reset(); }

 private:
  explicit LogRoute(std::shared_ptr<spdlog_detail::Route> route) noexcept : route_(std::move(route)) {}
  friend LogRoute route_log_to(std::shared_ptr<spdlog::logger>, LogRouteLevel);

  std::shared_ptr<spdlog_detail::Route> route_;
};

inline LogRoute route_log_to(std::shared_ptr<spdlog::logger> logger, LogRouteLevel level) {
  if (!logger) return LogRoute();
  auto route = std::make_shared<spdlog_detail::Route>();
  route->logger = std::move(logger);
  route->level_from_logger = level == LogRouteLevel::from_logger;
  spdlog_detail::hold_across_fork();
  spdlog_detail::Routes& routes = spdlog_detail::routes();
  std::lock_guard<std::mutex> lock(routes.mu);
  route->previous = routes.current;
  spdlog_detail::install(route);
  routes.current = route;
  return LogRoute(std::move(route));
}

}  // namespace weightcache
