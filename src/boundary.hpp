// The exception policy (docs/DESIGN.md, "Exceptions"). Inside the library, std::bad_alloc and
// what the standard library throws (std::system_error from a thread or a file-system call,
// std::length_error) may travel; no internal function is noexcept unless it cannot allocate.
// Every way in from outside catches them here: the C ABI, the C++ API's members, the verify-ahead
// thread, the log sink, destructors. (The XNNPACK adapter, built on the public API, has its own.) An allocation
// failure becomes WC_ERR_NO_MEMORY (or a miss / NULL where the call has no status), anything
// else WC_ERR_IO, with wc_last_error saying which call it was.
#pragma once

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include "utf8.hpp"

#include <type_traits>
#include <utility>

namespace weightcache {

/// Call only inside a catch block: records the exception in flight as this thread's last error
/// ("<call>: out of memory", followed by " ('<path>')" when the call is about a file), logs it,
/// and returns its code. Never throws, and allocates nothing for the message.
Errc absorb_exception(const char* call, const char* path = nullptr) noexcept;

/// Records a caller error ("wc_open: options must not be NULL") as this thread's last error and
/// returns WC_ERR_INVALID_ARGUMENT; for the checks a call makes before its own guard. Never
/// throws (without memory for the message, the code and a short text are kept).
wc_status refuse_argument(const char* what) noexcept;

/// f(), or `on_error` when it throws.
template <class T, class F>
T guard(const char* call, T on_error, F&& f) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (...) {
    absorb_exception(call);
    return on_error;
  }
}

/// f() for a call that returns a wc_status.
template <class F>
wc_status guard_status(const char* call, F&& f) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (...) {
    return static_cast<wc_status>(absorb_exception(call));
  }
}

/// f() for a call that returns a Result, whose error message is UTF-8 as last_error()'s is (bytes
/// outside it escaped). On an exception the error carries no message of its own (building one may
/// be what failed): last_error() has it.
template <class F>
auto guard_result(const char* call, F&& f) noexcept -> decltype(std::forward<F>(f)()) {
  try {
    auto r = std::forward<F>(f)();
    if (!r.ok() && utf8::valid_prefix(r.error().message) != r.error().message.size()) {
      Error e = r.error();
      e.message = utf8::escaped(std::move(e.message));
      return e;
    }
    return r;
  } catch (...) {
    const Errc code = absorb_exception(call);
    return Error{code, 0, {}};
  }
}

/// f() where nothing can be reported (a destructor, a thread's body): the failure is logged.
template <class F>
void guard_void(const char* call, F&& f) noexcept {
  try {
    std::forward<F>(f)();
  } catch (...) {
    absorb_exception(call);
  }
}

}  // namespace weightcache
