// Call-level hooks over platform::win32_calls() for fault injection on Windows (the counterpart
// of tests/fault/hooks.hpp). Installed for the life of a Win32Hooks object over every entry of the
// call table but the few that hooked() leaves out: every Win32 call the library makes to a file, a
// mapping, the address space or a lock passes here, is counted, and can be failed with
// SetLastError(code) or, for WriteFile, cut short. The table's own list (WC_WIN32_CALLS) says
// which entries there are, so a new entry is hooked with nothing to add here: it fails as its
// result type says (FALSE, a null pointer or 0) unless failure() says otherwise (an invalid
// handle, an NTSTATUS).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "platform/win32_calls.hpp"

namespace wctest {

using WinCall = weightcache::platform::Win32Call;
inline constexpr int kWinCallCount = weightcache::platform::kWin32CallCount;
inline const char* win_call_name(WinCall c) { return weightcache::platform::call_name(c); }

// The entries the hooks leave alone: GetSystemInfo and GetCurrentProcessId, which cannot fail;
// and the directory listing (FindFirstFileW, FindNextFileW, FindClose: stale temporaries at
// open, gc), which the sweep, numbered by call, was calibrated without.
constexpr bool hooked(WinCall c) {
  return c != WinCall::get_system_info && c != WinCall::get_current_process_id && c != WinCall::find_first_file_w &&
         c != WinCall::find_next_file_w && c != WinCall::find_close;
}

// What to do with one call: run it, fail it with a Windows error code, or (WriteFile only)
// write half and report that.
struct WinDecision {
  enum Kind { pass, fail, short_write } kind = pass;
  DWORD err = 0;
};

// The interposer: a single global instance, since the call table is global. Besides deciding,
// it keeps the handles and views the library holds, so a test can check that none outlives the
// caches that made them.
class Win32Hooks {
 public:
  using Policy = std::function<WinDecision(WinCall, std::uint64_t index)>;

  explicit Win32Hooks(Policy policy) : below_(weightcache::platform::win32_calls()), policy_(std::move(policy)) {
    instance() = this;
    auto& t = weightcache::platform::win32_calls();
    weightcache::platform::for_each_win32_call([&t](auto entry) { install(t, entry, entry.member); });
    // The entries whose hook does more than fail or forward and record.
    t.close_handle = close_handle;
    t.unmap_view_of_file = unmap_view_of_file;
    t.unlock_file_ex = unlock_file_ex;
    t.write_file = write_file;
    t.virtual_free = virtual_free;
  }
  ~Win32Hooks() {
    weightcache::platform::win32_calls() = below_;
    instance() = nullptr;
  }
  Win32Hooks(const Win32Hooks&) = delete;
  Win32Hooks& operator=(const Win32Hooks&) = delete;

  std::uint64_t calls() const { return counter_.load(); }
  /// Handles (files, duplicates, mapping objects) opened through the hooks and not closed.
  std::size_t open_handles() {
    std::lock_guard<std::mutex> l(mu_);
    return handles_.size();
  }
  /// Views mapped through the hooks and not unmapped.
  std::size_t mapped_views() {
    std::lock_guard<std::mutex> l(mu_);
    return views_.size();
  }
  /// Releases every reservation whose release was failed and that is still a whole reservation
  /// nobody uses (the library let it go or released it again since, which this checks). Returns
  /// how many it released: address space the library leaked after a failed VirtualFree.
  std::size_t release_leaked_reservations() {
    std::lock_guard<std::mutex> l(mu_);
    std::size_t n = 0;
    for (LPVOID at : unreleased_) {
      MEMORY_BASIC_INFORMATION mbi{};
      if (::VirtualQuery(at, &mbi, sizeof mbi) == sizeof mbi && mbi.AllocationBase == at && mbi.State == MEM_RESERVE &&
          below().virtual_free(at, 0, MEM_RELEASE))
        ++n;
    }
    unreleased_.clear();
    return n;
  }

 private:
  using Calls = weightcache::platform::Win32Calls;
  // The table the hooks replaced: what a call that goes through is made with, and what comes
  // back after.
  static const Calls& below() { return instance()->below_; }

  static Win32Hooks*& instance() {
    static Win32Hooks* h = nullptr;
    return h;
  }
  static WinDecision decide(WinCall c) {
    Win32Hooks* h = instance();
    const std::uint64_t i = h->counter_.fetch_add(1) + 1;
    return h->policy_ ? h->policy_(c, i) : WinDecision{};
  }
  // Bookkeeping around a call, which must not change the call's last error.
  template <class F>
  static void note(F f) {
    const DWORD err = ::GetLastError();
    {
      std::lock_guard<std::mutex> l(instance()->mu_);
      f(*instance());
    }
    ::SetLastError(err);
  }

  // ---- every hooked entry ----

  // Puts the generic hook in the entry's place, unless hooked() leaves the entry alone.
  template <class Entry, class R, class... A>
  static void install(Calls& t, Entry, R(WINAPI* Calls::*)(A...)) {
    if constexpr (hooked(Entry::id)) t.*Entry::member = &hook<Entry::id, Entry::member, R, A...>;
  }

  // Fails the call as the policy says, or makes it and records it.
  template <WinCall C, auto Member, class R, class... A>
  static R WINAPI hook(A... a) {
    if (const WinDecision d = decide(C); d.kind == WinDecision::fail) {
      ::SetLastError(d.err);
      return failure<C, R>();
    }
    const R r = (below().*Member)(a...);
    record<C>(r, a...);
    return r;
  }

  // What the entry returns when it fails.
  template <WinCall C, class R>
  static R failure() {
    if constexpr (C == WinCall::create_file_w || C == WinCall::re_open_file || C == WinCall::find_first_file_w)
      return INVALID_HANDLE_VALUE;
    else if constexpr (C == WinCall::nt_query_object || C == WinCall::nt_query_information_file)
      return static_cast<LONG>(0xC0000001);  // STATUS_UNSUCCESSFUL
    else if constexpr (C == WinCall::get_file_attributes_w) return INVALID_FILE_ATTRIBUTES;
    else return R{};  // FALSE, a null pointer, 0 (GetFileType's FILE_TYPE_UNKNOWN, GetFullPathNameW's)
  }

  // Handles, mapping objects and views the library now holds.
  template <WinCall C, class R, class... A>
  static void record(R r, [[maybe_unused]] A... a) {
    if constexpr (C == WinCall::create_file_w || C == WinCall::re_open_file) {
      if (r != INVALID_HANDLE_VALUE) held(r);
    } else if constexpr (C == WinCall::create_file_mapping_w) {
      if (r != nullptr) held(r);
    } else if constexpr (C == WinCall::duplicate_handle) {
      duplicated(r, a...);
    } else if constexpr (C == WinCall::map_view_of_file_ex || C == WinCall::map_view_of_file3) {
      if (r != nullptr) note([r](Win32Hooks& self) { self.views_.insert(r); });
    }
  }

  static void held(HANDLE h) {
    note([h](Win32Hooks& self) { self.handles_.insert(h); });
  }
  static void duplicated(BOOL ok, HANDLE, HANDLE, HANDLE, LPHANDLE out, DWORD, BOOL, DWORD) {
    if (ok && out != nullptr) held(*out);
  }

  // ---- the entries whose hook does more ----

  static BOOL WINAPI close_handle(HANDLE h) {
    // Counted, never failed: a close that fails releases nothing worth modelling (a leak).
    (void)decide(WinCall::close_handle);
    note([h](Win32Hooks& self) { self.handles_.erase(h); });
    return below().close_handle(h);
  }
  static BOOL WINAPI unmap_view_of_file(LPCVOID at) {
    // Counted, never failed: a failed unmap is a leak, not a fault worth modelling.
    (void)decide(WinCall::unmap_view_of_file);
    note([at](Win32Hooks& self) { self.views_.erase(const_cast<LPVOID>(at)); });
    return below().unmap_view_of_file(at);
  }
  static BOOL WINAPI unlock_file_ex(HANDLE h, DWORD r, DWORD lo, DWORD hi, LPOVERLAPPED ov) {
    // Counted, never failed: unlocking a range this handle holds has no failure to model.
    (void)decide(WinCall::unlock_file_ex);
    return below().unlock_file_ex(h, r, lo, hi, ov);
  }
  static BOOL WINAPI write_file(HANDLE h, LPCVOID b, DWORD n, LPDWORD put, LPOVERLAPPED ov) {
    const WinDecision d = decide(WinCall::write_file);
    if (d.kind == WinDecision::fail) {
      ::SetLastError(d.err);
      return FALSE;
    }
    if (d.kind == WinDecision::short_write && n > 1) n /= 2;
    return below().write_file(h, b, n, put, ov);
  }
  static BOOL WINAPI virtual_free(LPVOID at, SIZE_T n, DWORD t) {
    const WinDecision d = decide(WinCall::virtual_free);
    if (d.kind == WinDecision::fail) {
      ::SetLastError(d.err);
      // A whole reservation the library meant to release stays: remember it, so that
      // release_leaked_reservations() can give back what the library then forgets (each one a
      // cache's 256 GiB of address space, which a sweep would soon run out of).
      if ((t & MEM_RELEASE) != 0 && n == 0) note([at](Win32Hooks& self) { self.unreleased_.insert(at); });
      return FALSE;
    }
    return below().virtual_free(at, n, t);
  }

 private:
  const Calls below_;
  Policy policy_;
  std::atomic<std::uint64_t> counter_{0};
  std::mutex mu_;
  std::set<HANDLE> handles_;
  std::set<LPVOID> views_;
  std::set<LPVOID> unreleased_;
};

}  // namespace wctest
