// Every Win32 call the Windows platform makes to the OS, as a table of function pointers (the
// counterpart of posix_calls.hpp). The product path uses the real functions; fault-injection
// tests swap entries to fail the Nth call with SetLastError(ERROR_DISK_FULL, ERROR_IO_DEVICE,
// ...), short writes, failed views or flushes, below the retry loops that handle them.
// win32.cpp calls the OS only through this table, except for calls that touch no file, memory
// or lock: GetLastError/SetLastError, GetCurrentProcess (a constant pseudo-handle), the
// UTF-8/UTF-16 conversions and FormatMessageW/LocalFree (error text), SwitchToThread (a yield),
// and the module look-up (GetModuleHandleW, LoadLibraryW, GetProcAddress) that finds the
// entries below which only newer Windows versions have.
#pragma once

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

namespace weightcache::platform {

/// WIN32_MEMORY_RANGE_ENTRY (declared by newer SDKs only).
struct Win32MemoryRange {
  PVOID start;
  SIZE_T size;
};

struct Win32Calls {
  // ---- files ----
  HANDLE(WINAPI* create_file_w)(LPCWSTR path, DWORD access, DWORD share, LPSECURITY_ATTRIBUTES sa, DWORD disposition,
                                DWORD flags, HANDLE template_file);
  BOOL(WINAPI* close_handle)(HANDLE h);
  BOOL(WINAPI* duplicate_handle)(HANDLE from_process, HANDLE h, HANDLE to_process, LPHANDLE out, DWORD access,
                                 BOOL inherit, DWORD options);
  BOOL(WINAPI* read_file)(HANDLE h, LPVOID buf, DWORD n, LPDWORD got, LPOVERLAPPED ov);
  BOOL(WINAPI* write_file)(HANDLE h, LPCVOID buf, DWORD n, LPDWORD put, LPOVERLAPPED ov);
  BOOL(WINAPI* get_file_information_by_handle)(HANDLE h, LPBY_HANDLE_FILE_INFORMATION info);
  BOOL(WINAPI* get_file_information_by_handle_ex)(HANDLE h, FILE_INFO_BY_HANDLE_CLASS cls, LPVOID info, DWORD size);
  BOOL(WINAPI* set_file_information_by_handle)(HANDLE h, FILE_INFO_BY_HANDLE_CLASS cls, LPVOID info, DWORD size);
  DWORD(WINAPI* get_file_type)(HANDLE h);
  BOOL(WINAPI* get_file_size_ex)(HANDLE h, PLARGE_INTEGER size);
  DWORD(WINAPI* get_file_attributes_w)(LPCWSTR path);
  DWORD(WINAPI* get_full_path_name_w)(LPCWSTR path, DWORD n, LPWSTR buf, LPWSTR* file_part);
  BOOL(WINAPI* move_file_ex_w)(LPCWSTR from, LPCWSTR to, DWORD flags);
  BOOL(WINAPI* delete_file_w)(LPCWSTR path);
  HANDLE(WINAPI* find_first_file_w)(LPCWSTR pattern, LPWIN32_FIND_DATAW data);
  BOOL(WINAPI* find_next_file_w)(HANDLE find, LPWIN32_FIND_DATAW data);
  BOOL(WINAPI* find_close)(HANDLE find);
  BOOL(WINAPI* flush_file_buffers)(HANDLE h);
  BOOL(WINAPI* lock_file_ex)(HANDLE h, DWORD flags, DWORD reserved, DWORD len_low, DWORD len_high, LPOVERLAPPED ov);
  BOOL(WINAPI* unlock_file_ex)(HANDLE h, DWORD reserved, DWORD len_low, DWORD len_high, LPOVERLAPPED ov);
  // FSCTL_QUERY_ALLOCATED_RANGES only (where a file has holes).
  BOOL(WINAPI* device_io_control)(HANDLE h, DWORD code, LPVOID in, DWORD in_size, LPVOID out, DWORD out_size,
                                  LPDWORD returned, LPOVERLAPPED ov);

  // ---- mappings and address space ----
  HANDLE(WINAPI* create_file_mapping_w)(HANDLE file, LPSECURITY_ATTRIBUTES sa, DWORD protect, DWORD size_high,
                                        DWORD size_low, LPCWSTR name);
  LPVOID(WINAPI* map_view_of_file_ex)(HANDLE section, DWORD access, DWORD offset_high, DWORD offset_low, SIZE_T n,
                                      LPVOID at);
  BOOL(WINAPI* unmap_view_of_file)(LPCVOID at);
  LPVOID(WINAPI* virtual_alloc)(LPVOID at, SIZE_T n, DWORD type, DWORD protect);
  BOOL(WINAPI* virtual_free)(LPVOID at, SIZE_T n, DWORD type);
  BOOL(WINAPI* flush_view_of_file)(LPCVOID at, SIZE_T n);
  void(WINAPI* get_system_info)(LPSYSTEM_INFO info);
  DWORD(WINAPI* get_current_process_id)();
  // Windows 10 1803+ (kernelbase.dll), looked up at run time: where the OS lacks one, its
  // default fails with ERROR_CALL_NOT_IMPLEMENTED (and the placeholder probe with it).
  PVOID(WINAPI* virtual_alloc2)(HANDLE process, PVOID at, SIZE_T n, ULONG type, ULONG protect, void* params,
                                ULONG param_count);
  PVOID(WINAPI* map_view_of_file3)(HANDLE section, HANDLE process, PVOID at, ULONG64 offset, SIZE_T n, ULONG type,
                                   ULONG protect, void* params, ULONG param_count);
  // Windows 8+ (kernel32.dll), looked up at run time too.
  BOOL(WINAPI* prefetch_virtual_memory)(HANDLE process, ULONG_PTR count, Win32MemoryRange* ranges, ULONG flags);
};

/// The table in use (mutable for tests; swap entries only while no cache is open, and after
/// the platform's first use: its one-time probe of placeholder support goes through it too).
Win32Calls& win32_calls() noexcept;
/// The real functions.
const Win32Calls& default_win32_calls() noexcept;

}  // namespace weightcache::platform
