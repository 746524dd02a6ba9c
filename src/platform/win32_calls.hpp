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

#include "platform/call_table.hpp"

#include "platform/windows_h.hpp"

namespace weightcache::platform {

/// WIN32_MEMORY_RANGE_ENTRY (declared by newer SDKs only).
struct Win32MemoryRange {
  PVOID start;
  SIZE_T size;
};

// The table's entries, in order, as X(name, Win32 function, result, parameters): first those
// the library links against, then those looked up at run time. The table, its enumerators, their
// names (the Win32 functions') and the iteration below are all generated from these lists, and
// so are the defaults of the linked entries.
#define WC_WIN32_CALLS(X) WC_WIN32_LINKED_CALLS(X) WC_WIN32_LOOKED_UP_CALLS(X)

#define WC_WIN32_LINKED_CALLS(X)                                                                                     \
  /* ---- files ---- */                                                                                             \
  X(create_file_w, CreateFileW, HANDLE,                                                                              \
    (LPCWSTR path, DWORD access, DWORD share, LPSECURITY_ATTRIBUTES sa, DWORD disposition, DWORD flags,              \
     HANDLE template_file))                                                                                          \
  X(close_handle, CloseHandle, BOOL, (HANDLE h))                                                                     \
  /* a caller's handle (wc_options.handle) reopened as a file object of our own */                                  \
  X(re_open_file, ReOpenFile, HANDLE, (HANDLE h, DWORD access, DWORD share, DWORD flags))                            \
  X(duplicate_handle, DuplicateHandle, BOOL,                                                                         \
    (HANDLE from_process, HANDLE h, HANDLE to_process, LPHANDLE out, DWORD access, BOOL inherit, DWORD options))     \
  X(read_file, ReadFile, BOOL, (HANDLE h, LPVOID buf, DWORD n, LPDWORD got, LPOVERLAPPED ov))                        \
  X(write_file, WriteFile, BOOL, (HANDLE h, LPCVOID buf, DWORD n, LPDWORD put, LPOVERLAPPED ov))                     \
  X(get_file_information_by_handle, GetFileInformationByHandle, BOOL, (HANDLE h, LPBY_HANDLE_FILE_INFORMATION info)) \
  X(get_file_information_by_handle_ex, GetFileInformationByHandleEx, BOOL,                                           \
    (HANDLE h, FILE_INFO_BY_HANDLE_CLASS cls, LPVOID info, DWORD size))                                              \
  X(set_file_information_by_handle, SetFileInformationByHandle, BOOL,                                                \
    (HANDLE h, FILE_INFO_BY_HANDLE_CLASS cls, LPVOID info, DWORD size))                                              \
  X(get_file_type, GetFileType, DWORD, (HANDLE h))                                                                   \
  X(get_file_size_ex, GetFileSizeEx, BOOL, (HANDLE h, PLARGE_INTEGER size))                                          \
  X(get_file_attributes_w, GetFileAttributesW, DWORD, (LPCWSTR path))                                                \
  X(get_full_path_name_w, GetFullPathNameW, DWORD, (LPCWSTR path, DWORD n, LPWSTR buf, LPWSTR* file_part))           \
  X(move_file_ex_w, MoveFileExW, BOOL, (LPCWSTR from, LPCWSTR to, DWORD flags))                                      \
  X(delete_file_w, DeleteFileW, BOOL, (LPCWSTR path))                                                                \
  X(find_first_file_w, FindFirstFileW, HANDLE, (LPCWSTR pattern, LPWIN32_FIND_DATAW data))                           \
  X(find_next_file_w, FindNextFileW, BOOL, (HANDLE find, LPWIN32_FIND_DATAW data))                                   \
  X(find_close, FindClose, BOOL, (HANDLE find))                                                                      \
  X(flush_file_buffers, FlushFileBuffers, BOOL, (HANDLE h))                                                          \
  /* where ":memory:" caches put their delete-on-close file */                                                      \
  X(get_temp_path_w, GetTempPathW, DWORD, (DWORD n, LPWSTR buf))                                                     \
  X(lock_file_ex, LockFileEx, BOOL,                                                                                  \
    (HANDLE h, DWORD flags, DWORD reserved, DWORD len_low, DWORD len_high, LPOVERLAPPED ov))                         \
  X(unlock_file_ex, UnlockFileEx, BOOL, (HANDLE h, DWORD reserved, DWORD len_low, DWORD len_high, LPOVERLAPPED ov))  \
  /* FSCTL_QUERY_ALLOCATED_RANGES only (where a file has holes) */                                                  \
  X(device_io_control, DeviceIoControl, BOOL,                                                                        \
    (HANDLE h, DWORD code, LPVOID in, DWORD in_size, LPVOID out, DWORD out_size, LPDWORD returned, LPOVERLAPPED ov)) \
  /* ---- mappings and address space ---- */                                                                        \
  X(create_file_mapping_w, CreateFileMappingW, HANDLE,                                                               \
    (HANDLE file, LPSECURITY_ATTRIBUTES sa, DWORD protect, DWORD size_high, DWORD size_low, LPCWSTR name))           \
  X(map_view_of_file_ex, MapViewOfFileEx, LPVOID,                                                                    \
    (HANDLE section, DWORD access, DWORD offset_high, DWORD offset_low, SIZE_T n, LPVOID at))                        \
  X(unmap_view_of_file, UnmapViewOfFile, BOOL, (LPCVOID at))                                                         \
  X(virtual_alloc, VirtualAlloc, LPVOID, (LPVOID at, SIZE_T n, DWORD type, DWORD protect))                           \
  X(virtual_free, VirtualFree, BOOL, (LPVOID at, SIZE_T n, DWORD type))                                              \
  X(flush_view_of_file, FlushViewOfFile, BOOL, (LPCVOID at, SIZE_T n))                                               \
  X(get_system_info, GetSystemInfo, void, (LPSYSTEM_INFO info))                                                      \
  X(get_current_process_id, GetCurrentProcessId, DWORD, ())

// Looked up at run time: where the OS lacks one, its default fails with
// ERROR_CALL_NOT_IMPLEMENTED (and the placeholder probe with it; NtQueryObject and
// NtQueryInformationFile with STATUS_NOT_IMPLEMENTED).
#define WC_WIN32_LOOKED_UP_CALLS(X)                                                                                  \
  /* Windows 10 1803+ (kernelbase.dll) */                                                                           \
  X(virtual_alloc2, VirtualAlloc2, PVOID,                                                                            \
    (HANDLE process, PVOID at, SIZE_T n, ULONG type, ULONG protect, void* params, ULONG param_count))                \
  X(map_view_of_file3, MapViewOfFile3, PVOID,                                                                        \
    (HANDLE section, HANDLE process, PVOID at, ULONG64 offset, SIZE_T n, ULONG type, ULONG protect, void* params,    \
     ULONG param_count))                                                                                             \
  /* Windows 8+ (kernel32.dll) */                                                                                   \
  X(prefetch_virtual_memory, PrefetchVirtualMemory, BOOL,                                                            \
    (HANDLE process, ULONG_PTR count, Win32MemoryRange* ranges, ULONG flags))                                       \
  /* ntdll.dll: the access a caller's handle was granted (ObjectBasicInformation); an NTSTATUS */                   \
  X(nt_query_object, NtQueryObject, LONG, (HANDLE h, int info_class, PVOID info, ULONG size, PULONG returned))       \
  /* ntdll.dll: a caller's handle's mode (FileModeInformation: synchronous or overlapped); an NTSTATUS. */           \
  /* io_status is an IO_STATUS_BLOCK (winternl.h) */                                                                \
  X(nt_query_information_file, NtQueryInformationFile, LONG,                                                         \
    (HANDLE h, void* io_status, PVOID info, ULONG size, int info_class))

// Win32Calls (the table), Win32Call (an enumerator per entry: Win32Call::create_file_w),
// kWin32CallCount, call_name(Win32Call) (the Win32 function: "CreateFileW", ...) and
// for_each_win32_call.
#define WC_CALL_TABLE_CONV WINAPI
WC_CALL_TABLE(Win32Calls, Win32Call, kWin32CallCount, for_each_win32_call, WC_WIN32_CALLS, WC_CALL_TABLE_NAME_IS_LABEL)
#undef WC_CALL_TABLE_CONV

/// The table in use (mutable for tests; swap entries only while no cache is open, and after
/// the platform's first use: its one-time probe of placeholder support goes through it too).
Win32Calls& win32_calls() noexcept;
/// The real functions.
const Win32Calls& default_win32_calls() noexcept;

}  // namespace weightcache::platform
