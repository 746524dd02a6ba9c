// Call-level hooks over platform::win32_calls() for fault injection on Windows (the counterpart
// of tests/fault/hooks.hpp). Installed for the life of a Win32Hooks object: every Win32 call the
// library makes to a file, a mapping, the address space or a lock passes here, is counted, and
// can be failed with SetLastError(code) or, for WriteFile, cut short.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "platform/win32_calls.hpp"

namespace wctest {

// Every entry of the call table the hooks count. Not here: GetSystemInfo and
// GetCurrentProcessId, which cannot fail.
enum class WinCall {
  create_file, close_handle, duplicate_handle, read_file, write_file, get_info, get_info_ex, set_info,
  get_file_type, get_file_size, get_attributes, get_full_path, move_file, delete_file, flush_file_buffers,
  lock_file, unlock_file, create_mapping, map_view_ex, map_view3, unmap_view, virtual_alloc, virtual_alloc2,
  virtual_free, flush_view, prefetch, device_io_control
};
inline constexpr int kWinCallCount = static_cast<int>(WinCall::device_io_control) + 1;

inline const char* win_call_name(WinCall c) {
  static const char* names[] = {
      "CreateFileW", "CloseHandle", "DuplicateHandle", "ReadFile", "WriteFile", "GetFileInformationByHandle",
      "GetFileInformationByHandleEx", "SetFileInformationByHandle", "GetFileType", "GetFileSizeEx",
      "GetFileAttributesW", "GetFullPathNameW", "MoveFileExW", "DeleteFileW", "FlushFileBuffers", "LockFileEx",
      "UnlockFileEx", "CreateFileMappingW", "MapViewOfFileEx", "MapViewOfFile3", "UnmapViewOfFile", "VirtualAlloc",
      "VirtualAlloc2", "VirtualFree", "FlushViewOfFile", "PrefetchVirtualMemory", "DeviceIoControl"};
  static_assert(sizeof(names) / sizeof(names[0]) == kWinCallCount);
  return names[static_cast<int>(c)];
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

  explicit Win32Hooks(Policy policy) : policy_(std::move(policy)) {
    instance() = this;
    auto& t = weightcache::platform::win32_calls();
    t.create_file_w = create_file_w;
    t.close_handle = close_handle;
    t.duplicate_handle = duplicate_handle;
    t.read_file = read_file;
    t.write_file = write_file;
    t.get_file_information_by_handle = get_info;
    t.get_file_information_by_handle_ex = get_info_ex;
    t.set_file_information_by_handle = set_info;
    t.get_file_type = get_file_type;
    t.get_file_size_ex = get_file_size;
    t.get_file_attributes_w = get_attributes;
    t.get_full_path_name_w = get_full_path;
    t.move_file_ex_w = move_file;
    t.delete_file_w = delete_file;
    t.flush_file_buffers = flush_file_buffers;
    t.lock_file_ex = lock_file;
    t.unlock_file_ex = unlock_file;
    t.create_file_mapping_w = create_mapping;
    t.map_view_of_file_ex = map_view_ex;
    t.map_view_of_file3 = map_view3;
    t.unmap_view_of_file = unmap_view;
    t.virtual_alloc = virtual_alloc;
    t.virtual_alloc2 = virtual_alloc2;
    t.virtual_free = virtual_free;
    t.flush_view_of_file = flush_view;
    t.prefetch_virtual_memory = prefetch;
    t.device_io_control = device_io_control;
  }
  ~Win32Hooks() {
    weightcache::platform::win32_calls() = weightcache::platform::default_win32_calls();
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
          real().virtual_free(at, 0, MEM_RELEASE))
        ++n;
    }
    unreleased_.clear();
    return n;
  }

 private:
  using Calls = weightcache::platform::Win32Calls;
  static const Calls& real() { return weightcache::platform::default_win32_calls(); }

  static Win32Hooks*& instance() {
    static Win32Hooks* h = nullptr;
    return h;
  }
  static WinDecision decide(WinCall c) {
    Win32Hooks* h = instance();
    const std::uint64_t i = h->counter_.fetch_add(1) + 1;
    return h->policy_ ? h->policy_(c, i) : WinDecision{};
  }
  // Decides; on a failure sets the thread's last error and returns true.
  static bool failed(WinCall c) {
    const WinDecision d = decide(c);
    if (d.kind != WinDecision::fail) return false;
    ::SetLastError(d.err);
    return true;
  }
  // Bookkeeping after a successful call, which must not change the call's last error.
  template <class F>
  static void note(F f) {
    const DWORD err = ::GetLastError();
    {
      std::lock_guard<std::mutex> l(instance()->mu_);
      f(*instance());
    }
    ::SetLastError(err);
  }

  static HANDLE WINAPI create_file_w(LPCWSTR p, DWORD a, DWORD s, LPSECURITY_ATTRIBUTES sa, DWORD d, DWORD f,
                                     HANDLE t) {
    if (failed(WinCall::create_file)) return INVALID_HANDLE_VALUE;
    HANDLE h = real().create_file_w(p, a, s, sa, d, f, t);
    if (h != INVALID_HANDLE_VALUE) note([h](Win32Hooks& self) { self.handles_.insert(h); });
    return h;
  }
  static BOOL WINAPI close_handle(HANDLE h) {
    // Counted, never failed: a close that fails releases nothing worth modelling (a leak).
    (void)decide(WinCall::close_handle);
    note([h](Win32Hooks& self) { self.handles_.erase(h); });
    return real().close_handle(h);
  }
  static BOOL WINAPI duplicate_handle(HANDLE fp, HANDLE h, HANDLE tp, LPHANDLE out, DWORD a, BOOL i, DWORD o) {
    if (failed(WinCall::duplicate_handle)) return FALSE;
    const BOOL ok = real().duplicate_handle(fp, h, tp, out, a, i, o);
    if (ok && out != nullptr) note([out](Win32Hooks& self) { self.handles_.insert(*out); });
    return ok;
  }
  static BOOL WINAPI read_file(HANDLE h, LPVOID b, DWORD n, LPDWORD got, LPOVERLAPPED ov) {
    if (failed(WinCall::read_file)) return FALSE;
    return real().read_file(h, b, n, got, ov);
  }
  static BOOL WINAPI write_file(HANDLE h, LPCVOID b, DWORD n, LPDWORD put, LPOVERLAPPED ov) {
    const WinDecision d = decide(WinCall::write_file);
    if (d.kind == WinDecision::fail) {
      ::SetLastError(d.err);
      return FALSE;
    }
    if (d.kind == WinDecision::short_write && n > 1) n /= 2;
    return real().write_file(h, b, n, put, ov);
  }
  static BOOL WINAPI get_info(HANDLE h, LPBY_HANDLE_FILE_INFORMATION i) {
    if (failed(WinCall::get_info)) return FALSE;
    return real().get_file_information_by_handle(h, i);
  }
  static BOOL WINAPI get_info_ex(HANDLE h, FILE_INFO_BY_HANDLE_CLASS c, LPVOID i, DWORD n) {
    if (failed(WinCall::get_info_ex)) return FALSE;
    return real().get_file_information_by_handle_ex(h, c, i, n);
  }
  static BOOL WINAPI set_info(HANDLE h, FILE_INFO_BY_HANDLE_CLASS c, LPVOID i, DWORD n) {
    if (failed(WinCall::set_info)) return FALSE;
    return real().set_file_information_by_handle(h, c, i, n);
  }
  static DWORD WINAPI get_file_type(HANDLE h) {
    if (failed(WinCall::get_file_type)) return FILE_TYPE_UNKNOWN;
    return real().get_file_type(h);
  }
  static BOOL WINAPI get_file_size(HANDLE h, PLARGE_INTEGER s) {
    if (failed(WinCall::get_file_size)) return FALSE;
    return real().get_file_size_ex(h, s);
  }
  static DWORD WINAPI get_attributes(LPCWSTR p) {
    if (failed(WinCall::get_attributes)) return INVALID_FILE_ATTRIBUTES;
    return real().get_file_attributes_w(p);
  }
  static DWORD WINAPI get_full_path(LPCWSTR p, DWORD n, LPWSTR b, LPWSTR* f) {
    if (failed(WinCall::get_full_path)) return 0;
    return real().get_full_path_name_w(p, n, b, f);
  }
  static BOOL WINAPI move_file(LPCWSTR a, LPCWSTR b, DWORD f) {
    if (failed(WinCall::move_file)) return FALSE;
    return real().move_file_ex_w(a, b, f);
  }
  static BOOL WINAPI delete_file(LPCWSTR p) {
    if (failed(WinCall::delete_file)) return FALSE;
    return real().delete_file_w(p);
  }
  static BOOL WINAPI flush_file_buffers(HANDLE h) {
    if (failed(WinCall::flush_file_buffers)) return FALSE;
    return real().flush_file_buffers(h);
  }
  static BOOL WINAPI device_io_control(HANDLE h, DWORD code, LPVOID in, DWORD in_size, LPVOID out, DWORD out_size,
                                       LPDWORD returned, LPOVERLAPPED ov) {
    if (failed(WinCall::device_io_control)) return FALSE;
    return real().device_io_control(h, code, in, in_size, out, out_size, returned, ov);
  }
  static BOOL WINAPI lock_file(HANDLE h, DWORD f, DWORD r, DWORD lo, DWORD hi, LPOVERLAPPED ov) {
    if (failed(WinCall::lock_file)) return FALSE;
    return real().lock_file_ex(h, f, r, lo, hi, ov);
  }
  static BOOL WINAPI unlock_file(HANDLE h, DWORD r, DWORD lo, DWORD hi, LPOVERLAPPED ov) {
    // Counted, never failed: unlocking a range this handle holds has no failure to model.
    (void)decide(WinCall::unlock_file);
    return real().unlock_file_ex(h, r, lo, hi, ov);
  }
  static HANDLE WINAPI create_mapping(HANDLE f, LPSECURITY_ATTRIBUTES sa, DWORD p, DWORD hi, DWORD lo, LPCWSTR n) {
    if (failed(WinCall::create_mapping)) return nullptr;
    HANDLE h = real().create_file_mapping_w(f, sa, p, hi, lo, n);
    if (h != nullptr) note([h](Win32Hooks& self) { self.handles_.insert(h); });
    return h;
  }
  static LPVOID WINAPI map_view_ex(HANDLE s, DWORD a, DWORD hi, DWORD lo, SIZE_T n, LPVOID at) {
    if (failed(WinCall::map_view_ex)) return nullptr;
    LPVOID v = real().map_view_of_file_ex(s, a, hi, lo, n, at);
    if (v != nullptr) note([v](Win32Hooks& self) { self.views_.insert(v); });
    return v;
  }
  static PVOID WINAPI map_view3(HANDLE s, HANDLE p, PVOID at, ULONG64 o, SIZE_T n, ULONG t, ULONG pr, void* x,
                                ULONG c) {
    if (failed(WinCall::map_view3)) return nullptr;
    PVOID v = real().map_view_of_file3(s, p, at, o, n, t, pr, x, c);
    if (v != nullptr) note([v](Win32Hooks& self) { self.views_.insert(v); });
    return v;
  }
  static BOOL WINAPI unmap_view(LPCVOID at) {
    // Counted, never failed: a failed unmap is a leak, not a fault worth modelling.
    (void)decide(WinCall::unmap_view);
    note([at](Win32Hooks& self) { self.views_.erase(const_cast<LPVOID>(at)); });
    return real().unmap_view_of_file(at);
  }
  static LPVOID WINAPI virtual_alloc(LPVOID at, SIZE_T n, DWORD t, DWORD p) {
    if (failed(WinCall::virtual_alloc)) return nullptr;
    return real().virtual_alloc(at, n, t, p);
  }
  static PVOID WINAPI virtual_alloc2(HANDLE pr, PVOID at, SIZE_T n, ULONG t, ULONG p, void* x, ULONG c) {
    if (failed(WinCall::virtual_alloc2)) return nullptr;
    return real().virtual_alloc2(pr, at, n, t, p, x, c);
  }
  static BOOL WINAPI virtual_free(LPVOID at, SIZE_T n, DWORD t) {
    if (failed(WinCall::virtual_free)) {
      // A whole reservation the library meant to release stays: remember it, so that
      // release_leaked_reservations() can give back what the library then forgets (each one a
      // cache's 256 GiB of address space, which a sweep would soon run out of).
      if ((t & MEM_RELEASE) != 0 && n == 0) {
        const DWORD err = ::GetLastError();
        std::lock_guard<std::mutex> l(instance()->mu_);
        instance()->unreleased_.insert(at);
        ::SetLastError(err);
      }
      return FALSE;
    }
    return real().virtual_free(at, n, t);
  }
  static BOOL WINAPI flush_view(LPCVOID at, SIZE_T n) {
    if (failed(WinCall::flush_view)) return FALSE;
    return real().flush_view_of_file(at, n);
  }
  static BOOL WINAPI prefetch(HANDLE p, ULONG_PTR c, weightcache::platform::Win32MemoryRange* r, ULONG f) {
    if (failed(WinCall::prefetch)) return FALSE;
    return real().prefetch_virtual_memory(p, c, r, f);
  }

 private:
  Policy policy_;
  std::atomic<std::uint64_t> counter_{0};
  std::mutex mu_;
  std::set<HANDLE> handles_;
  std::set<LPVOID> views_;
  std::set<LPVOID> unreleased_;
};

}  // namespace wctest
