// Win32 implementation of the platform seam (Windows 10 1803+ for the preferred mapping mode;
// older systems and Wine without placeholders get the legacy mode below). Plain Win32, no POSIX
// emulation: UTF-8 paths become UTF-16, sizes are 64-bit throughout, errors keep the Windows
// message. docs/PLATFORMS.md says what differs from POSIX and why.
//
// The address space (reservations, and the views, placeholders and holes inside them) is
// managed in win32_segments.{hpp,cpp}; what both halves share is in win32_common.hpp.
#include "log.hpp"
#include "platform/errors.hpp"
#include "platform/platform.hpp"
#include "platform/win32_calls.hpp"
#include "platform/win32_common.hpp"
#include "platform/win32_segments.hpp"

#include "platform/windows_h.hpp"
#include <winioctl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

// Declared by newer SDKs only; the values are part of the Windows ABI.
#ifndef FILE_RENAME_FLAG_REPLACE_IF_EXISTS
#define FILE_RENAME_FLAG_REPLACE_IF_EXISTS 0x00000001
#endif
#ifndef FILE_RENAME_FLAG_POSIX_SEMANTICS
#define FILE_RENAME_FLAG_POSIX_SEMANTICS 0x00000002
#endif
#ifndef ERROR_DISK_QUOTA_EXCEEDED
#define ERROR_DISK_QUOTA_EXCEEDED 1295L
#endif
#ifndef FILE_DISPOSITION_FLAG_DELETE
#define FILE_DISPOSITION_FLAG_DELETE 0x00000001
#endif
#ifndef FILE_DISPOSITION_FLAG_POSIX_SEMANTICS
#define FILE_DISPOSITION_FLAG_POSIX_SEMANTICS 0x00000002
#endif

namespace weightcache::platform {
namespace win32 {
namespace {

// FILE_INFO_BY_HANDLE_CLASS values of Windows 10 RS1+ (mingw declares them only for newer
// _WIN32_WINNT targets).
constexpr auto kFileDispositionInfoEx = static_cast<FILE_INFO_BY_HANDLE_CLASS>(21);
constexpr auto kFileRenameInfoEx = static_cast<FILE_INFO_BY_HANDLE_CLASS>(22);

// The writer lease locks one byte far past any real lock-file content, so reading the lock file
// (Windows locks are mandatory) never trips over it.
constexpr std::uint64_t kLockOffset = std::uint64_t{1} << 40;
// The "in use" lock (shared by every user of a cache file, exclusive to replace it), on another
// byte far past any data.
constexpr std::uint64_t kInUseOffset = std::uint64_t{1} << 41;

// Windows 10 1803+ (kernelbase.dll) and Windows 8+ (kernel32.dll). Looked up at run time:
// mingw's import libraries may lack them, and the library must still load on older systems.
using VirtualAlloc2Fn = decltype(Win32Calls::virtual_alloc2);
using MapViewOfFile3Fn = decltype(Win32Calls::map_view_of_file3);
using PrefetchVirtualMemoryFn = decltype(Win32Calls::prefetch_virtual_memory);
using NtQueryObjectFn = decltype(Win32Calls::nt_query_object);
using NtQueryInformationFileFn = decltype(Win32Calls::nt_query_information_file);

template <class Fn>
Fn proc(HMODULE m, const char* name) {
  if (m == nullptr) return nullptr;
  return reinterpret_cast<Fn>(reinterpret_cast<void*>(::GetProcAddress(m, name)));
}

struct Resolved {
  VirtualAlloc2Fn virtual_alloc2 = nullptr;
  MapViewOfFile3Fn map_view3 = nullptr;
  PrefetchVirtualMemoryFn prefetch = nullptr;
  NtQueryObjectFn query_object = nullptr;
  NtQueryInformationFileFn query_information_file = nullptr;
};

const Resolved& resolved() {
  static const Resolved r = [] {
    Resolved out;
    HMODULE kb = ::GetModuleHandleW(L"kernelbase.dll");
    if (kb == nullptr) kb = ::LoadLibraryW(L"kernelbase.dll");
    out.virtual_alloc2 = proc<VirtualAlloc2Fn>(kb, "VirtualAlloc2");
    out.map_view3 = proc<MapViewOfFile3Fn>(kb, "MapViewOfFile3");
    HMODULE k32 = ::GetModuleHandleW(L"kernel32.dll");
    out.prefetch = proc<PrefetchVirtualMemoryFn>(k32, "PrefetchVirtualMemory");
    out.query_object = proc<NtQueryObjectFn>(::GetModuleHandleW(L"ntdll.dll"), "NtQueryObject");
    out.query_information_file =
        proc<NtQueryInformationFileFn>(::GetModuleHandleW(L"ntdll.dll"), "NtQueryInformationFile");
    return out;
  }();
  return r;
}

// The defaults of the looked-up entries: the OS's function, or "not implemented" without it.
PVOID WINAPI default_virtual_alloc2(HANDLE process, PVOID at, SIZE_T n, ULONG type, ULONG protect, void* params,
                                    ULONG count) {
  if (resolved().virtual_alloc2 == nullptr) {
    ::SetLastError(ERROR_CALL_NOT_IMPLEMENTED);
    return nullptr;
  }
  return resolved().virtual_alloc2(process, at, n, type, protect, params, count);
}

PVOID WINAPI default_map_view_of_file3(HANDLE section, HANDLE process, PVOID at, ULONG64 offset, SIZE_T n, ULONG type,
                                       ULONG protect, void* params, ULONG count) {
  if (resolved().map_view3 == nullptr) {
    ::SetLastError(ERROR_CALL_NOT_IMPLEMENTED);
    return nullptr;
  }
  return resolved().map_view3(section, process, at, offset, n, type, protect, params, count);
}

BOOL WINAPI default_prefetch_virtual_memory(HANDLE process, ULONG_PTR count, Win32MemoryRange* ranges, ULONG flags) {
  if (resolved().prefetch == nullptr) {
    ::SetLastError(ERROR_CALL_NOT_IMPLEMENTED);
    return FALSE;
  }
  return resolved().prefetch(process, count, ranges, flags);
}

constexpr LONG kStatusNotImplemented = static_cast<LONG>(0xC0000002);

LONG WINAPI default_nt_query_object(HANDLE h, int info_class, PVOID info, ULONG size, PULONG returned) {
  if (resolved().query_object == nullptr) return kStatusNotImplemented;
  return resolved().query_object(h, info_class, info, size, returned);
}

LONG WINAPI default_nt_query_information_file(HANDLE h, void* io_status, PVOID info, ULONG size, int info_class) {
  if (resolved().query_information_file == nullptr) return kStatusNotImplemented;
  return resolved().query_information_file(h, io_status, info, size, info_class);
}

Win32Calls make_default_calls() {
  Win32Calls c{};
#define WC_WIN32_CALL_DEFAULT(name, function, result, params) c.name = ::function;
  WC_WIN32_LINKED_CALLS(WC_WIN32_CALL_DEFAULT)
#undef WC_WIN32_CALL_DEFAULT
  c.virtual_alloc2 = default_virtual_alloc2;
  c.map_view_of_file3 = default_map_view_of_file3;
  c.prefetch_virtual_memory = default_prefetch_virtual_memory;
  c.nt_query_object = default_nt_query_object;
  c.nt_query_information_file = default_nt_query_information_file;
  return c;
}

// Function-local statics: initialized on first use, whatever the order of static initializers.
const Win32Calls& defaults() {
  static const Win32Calls c = make_default_calls();
  return c;
}

Win32Calls& calls_in_use() {
  static Win32Calls c = defaults();
  return c;
}

std::string narrow(const wchar_t* s, int len) {
  if (len <= 0) return {};
  const int n = ::WideCharToMultiByte(CP_UTF8, 0, s, len, nullptr, 0, nullptr, nullptr);
  if (n <= 0) return {};
  std::string out(static_cast<std::size_t>(n), '\0');
  ::WideCharToMultiByte(CP_UTF8, 0, s, len, out.data(), n, nullptr, nullptr);
  return out;
}

}  // namespace

// ---- errors ---------------------------------------------------------------------------------

int errno_of(DWORD code) {
  switch (code) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
    case ERROR_BAD_NETPATH:
    case ERROR_BAD_NET_NAME:
    case ERROR_BAD_PATHNAME: return ENOENT;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS: return EEXIST;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_PRIVILEGE_NOT_HELD: return EACCES;
    case ERROR_LOCK_VIOLATION:
    case ERROR_USER_MAPPED_FILE: return EBUSY;
    case ERROR_WRITE_PROTECT: return EROFS;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
    case ERROR_DISK_QUOTA_EXCEEDED: return ENOSPC;
    case ERROR_FILE_TOO_LARGE: return EFBIG;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT: return ENOMEM;
    case ERROR_FILENAME_EXCED_RANGE: return ENAMETOOLONG;
    case ERROR_INVALID_NAME:
    case ERROR_DIRECTORY:
    case ERROR_INVALID_PARAMETER: return EINVAL;
    case ERROR_CANT_RESOLVE_FILENAME: return ELOOP;
    case ERROR_NOT_SUPPORTED:
    case ERROR_CALL_NOT_IMPLEMENTED:
    case ERROR_INVALID_FUNCTION: return ENOTSUP;
    default: return EIO;
  }
}

Errc errc_of_win(DWORD code) {
  switch (code) {
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
    case ERROR_DISK_QUOTA_EXCEEDED:
    case ERROR_FILE_TOO_LARGE: return Errc::no_space;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT: return Errc::no_memory;
    case ERROR_WRITE_PROTECT: return Errc::read_only;
    case ERROR_INVALID_NAME:
    case ERROR_FILENAME_EXCED_RANGE:
    case ERROR_DIRECTORY:
    case ERROR_CANT_RESOLVE_FILENAME: return Errc::invalid_argument;
    case ERROR_NOT_SUPPORTED:
    case ERROR_CALL_NOT_IMPLEMENTED:
    case ERROR_INVALID_FUNCTION: return Errc::unsupported;
    default: return Errc::io;
  }
}

std::string win_message(DWORD code) {
  wchar_t* buf = nullptr;
  const DWORD n = ::FormatMessageW(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                   nullptr, code, 0, reinterpret_cast<wchar_t*>(&buf), 0, nullptr);
  std::string text = n > 0 && buf != nullptr ? narrow(buf, static_cast<int>(n)) : std::string();
  if (buf != nullptr) ::LocalFree(buf);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '.'))
    text.pop_back();
  if (text.empty()) text = "unknown error";
  return text + " (Windows error " + std::to_string(code) + ")";
}

Error win_error(DWORD code, const std::string& what, const std::string& path, const char* hint) {
  std::string msg;
  try {
    msg = error_message(what, path, win_message(code), hint);
  } catch (...) {
  }
  return Error{errc_of_win(code), errno_of(code), std::move(msg)};
}

// ---- paths and files ------------------------------------------------------------------------

namespace {

// UTF-8 to UTF-16. Absolute paths past MAX_PATH get the \\?\ prefix, which lifts the limit
// (and turns off the Win32 path rewriting, so slashes are converted here).
bool widen(const std::string& path, std::wstring* out) {
  out->clear();
  if (path.empty()) return true;
  const int n = ::MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(), static_cast<int>(path.size()), nullptr, 0);
  if (n <= 0) return false;
  std::wstring w(static_cast<std::size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(), static_cast<int>(path.size()), w.data(), n);
  if (w.find(L'\0') != std::wstring::npos) return false;
  if (w.size() >= MAX_PATH - 12 && w.rfind(L"\\\\?\\", 0) != 0) {
    std::replace(w.begin(), w.end(), L'/', L'\\');
    const bool drive = w.size() > 2 && w[1] == L':' && w[2] == L'\\';
    const bool unc = w.rfind(L"\\\\", 0) == 0;
    if (drive) w.insert(0, L"\\\\?\\");
    else if (unc) w.replace(0, 2, L"\\\\?\\UNC\\");
  }
  *out = std::move(w);
  return true;
}

Error bad_path(const std::string& path) {
  return Error{Errc::invalid_argument, EINVAL, "'" + path + "' is not a valid UTF-8 path"};
}

HANDLE as_handle(const File& f) { return reinterpret_cast<HANDLE>(f.handle()); }

bool reparse_is_link(HANDLE h) {
  FILE_ATTRIBUTE_TAG_INFO tag{};
  if (!sys().get_file_information_by_handle_ex(h, FileAttributeTagInfo, &tag, sizeof tag)) return true;
  return (tag.FileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) != 0 &&
         (tag.ReparseTag == IO_REPARSE_TAG_SYMLINK || tag.ReparseTag == IO_REPARSE_TAG_MOUNT_POINT);
}

// A caller's handle as messages name it ("handle 0x1a4").
std::string handle_label(const void* h) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "handle 0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(h)));
  return buf;
}

// The names create_anonymous gives ":memory:" files: "<name>-<process id>-<serial>.tmp", where the
// core passes "weightcache" as the name.
bool is_anonymous_name(std::wstring_view name) {
  constexpr std::wstring_view kPrefix = L"weightcache-", kSuffix = L".tmp";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix)
    return false;
  name = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());  // "<pid>-<serial>"
  const auto dash = name.find(L'-');
  auto digits = [](std::wstring_view d) {
    return !d.empty() && std::all_of(d.begin(), d.end(), [](wchar_t c) { return c >= L'0' && c <= L'9'; });
  };
  return dash != std::wstring_view::npos && digits(name.substr(0, dash)) && digits(name.substr(dash + 1));
}

// The access rights `h` was granted. Asked of the caller's handle because ReOpenFile checks the
// file's ACL, not the handle it starts from: a read-only handle (a host's way of keeping a
// reader from writing) would otherwise come back writable.
Result<ACCESS_MASK> granted_access(HANDLE h, const std::string& label) {
  struct {  // PUBLIC_OBJECT_BASIC_INFORMATION (winternl.h), ObjectBasicInformation = 0
    ULONG attributes;
    ACCESS_MASK granted;
    ULONG handle_count, pointer_count;
    ULONG reserved[10];
  } info{};
  ULONG got = 0;
  const LONG status = sys().nt_query_object(h, 0, &info, sizeof info, &got);
  if (status >= 0) return info.granted;
  constexpr LONG kStatusInvalidHandle = static_cast<LONG>(0xC0000008);
  char text[96];
  std::snprintf(text, sizeof text, "cannot use '%s': NtQueryObject failed with NTSTATUS 0x%08lx", label.c_str(),
                static_cast<unsigned long>(status));
  if (status == kStatusInvalidHandle)
    return Error{Errc::invalid_argument, EBADF, std::string(text) + "; pass an open handle of the cache file"};
  return Error{Errc::io, EIO, text};
}

// What a caller's handle refers to must be a regular disk file: asked first, so that a directory,
// a pipe, a console or an object that is no file at all (an event, a mutex, a section, a thread)
// is refused as such, not as an access or I/O error of a later step.
Result<void> check_file_handle(HANDLE h, const std::string& label) {
  const std::string pass = "; pass the handle of a cache file (a regular file on a local or network disk)";
  ::SetLastError(NO_ERROR);  // GetFileType's FILE_TYPE_UNKNOWN is a failure only with an error
  const DWORD type = sys().get_file_type(h);
  const DWORD err = ::GetLastError();
  if (type == FILE_TYPE_PIPE) return Error{Errc::invalid_argument, EINVAL, "'" + label + "' is a pipe or a socket" + pass};
  if (type == FILE_TYPE_CHAR)
    return Error{Errc::invalid_argument, EINVAL, "'" + label + "' is a character device (a console)" + pass};
  if (type != FILE_TYPE_DISK) {
    // Closed, never opened, or a handle of something else than a file.
    std::string why = "'" + label + "' is not the handle of an open file";
    if (err != NO_ERROR) why += " (GetFileType: " + win_message(err) + ")";
    return Error{Errc::invalid_argument, EBADF, why + pass};
  }
  BY_HANDLE_FILE_INFORMATION bi{};
  if (!sys().get_file_information_by_handle(h, &bi)) return win_error(::GetLastError(), "cannot query", label);
  if ((bi.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) != 0)
    return Error{Errc::invalid_argument, EISDIR, "'" + label + "' is a directory" + pass};
  return {};
}

// The fallback when ReOpenFile is refused (ERROR_ACCESS_DENIED: the file's ACL refuses this
// process's token, as a sandbox's may, although its handle grants access): a duplicate of the
// caller's handle, which shares the caller's file object (docs/DESIGN.md, "The library's own
// description", says what that changes). Only for a synchronous handle: the backend's reads,
// writes and locks are synchronous, and a duplicate keeps the object's mode.
Result<HANDLE> duplicate_caller_handle(HANDLE from, const std::string& label) {
  constexpr int kFileModeInformation = 16;  // FILE_INFORMATION_CLASS
  constexpr ULONG kNoIntermediateBuffering = 0x08, kSynchronousAlert = 0x10,
                  kSynchronousNonAlert = 0x20;  // FILE_MODE_INFORMATION.Mode bits (wdm.h)
  struct {  // IO_STATUS_BLOCK
    union {
      LONG status;
      PVOID pointer;
    };
    ULONG_PTR information;
  } io{};
  ULONG mode = 0;
  const std::string refused = "'" + label + "' cannot be reopened as a file object of the library's own (ReOpenFile: "
                              "access denied, as for a sandboxed process whose token the file's ACL refuses)";
  const LONG status = sys().nt_query_information_file(from, &io, &mode, sizeof mode, kFileModeInformation);
  if (status < 0) {
    char text[64];
    std::snprintf(text, sizeof text, "NTSTATUS 0x%08lx", static_cast<unsigned long>(status));
    return Error{Errc::io, EACCES, refused + ", and its mode cannot be asked (NtQueryInformationFile failed with " + text + ")"};
  }
  if ((mode & (kSynchronousAlert | kSynchronousNonAlert)) == 0)
    return Error{Errc::invalid_argument, EINVAL,
                 refused + ", and it was opened for overlapped I/O, which a duplicate would keep: pass a synchronous "
                           "handle (opened without FILE_FLAG_OVERLAPPED)"};
  if ((mode & kNoIntermediateBuffering) != 0)
    return Error{Errc::invalid_argument, EINVAL,
                 refused + ", and it was opened with FILE_FLAG_NO_BUFFERING, which a duplicate would keep (reads "
                           "and writes must then be sector-aligned): pass a handle opened without it"};
  HANDLE dup = nullptr;
  if (!sys().duplicate_handle(::GetCurrentProcess(), from, ::GetCurrentProcess(), &dup, 0, FALSE, DUPLICATE_SAME_ACCESS))
    return win_error(::GetLastError(), "cannot duplicate", label);
  return dup;
}

// ReadFile and WriteFile take at most this many bytes at once.
constexpr std::size_t kMaxIo = std::size_t{1} << 30;

// Where a read, a write or a byte-range lock starts (the handles are synchronous: nothing else).
OVERLAPPED at_offset(std::uint64_t offset) {
  OVERLAPPED ov{};
  ov.Offset = static_cast<DWORD>(offset);
  ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
  return ov;
}

}  // namespace

bool info_of(HANDLE h, FileInfo* out, DWORD* attributes) {
  BY_HANDLE_FILE_INFORMATION bi{};
  if (!sys().get_file_information_by_handle(h, &bi)) return false;
  ::SetLastError(NO_ERROR);  // GetFileType's FILE_TYPE_UNKNOWN is a failure only with an error
  const DWORD type = sys().get_file_type(h);
  if (type == FILE_TYPE_UNKNOWN && ::GetLastError() != NO_ERROR) return false;
  out->size = (static_cast<std::uint64_t>(bi.nFileSizeHigh) << 32) | bi.nFileSizeLow;
  out->device = bi.dwVolumeSerialNumber;
  out->inode = (static_cast<std::uint64_t>(bi.nFileIndexHigh) << 32) | bi.nFileIndexLow;
  out->regular = (bi.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) == 0 && type == FILE_TYPE_DISK;
  out->symlink = false;
  out->allocated = out->size;  // the allocation size would cost another query per stat
  const auto ticks = static_cast<std::int64_t>((std::uint64_t{bi.ftLastWriteTime.dwHighDateTime} << 32) |
                                               bi.ftLastWriteTime.dwLowDateTime);
  out->mtime_ns = (ticks - 116444736000000000) * 100;  // FILETIME: 100 ns ticks since 1601
  if (attributes != nullptr) *attributes = bi.dwFileAttributes;
  return true;
}

bool file_size_of(HANDLE h, std::uint64_t* size) {
  LARGE_INTEGER li;
  if (!sys().get_file_size_ex(h, &li)) return false;
  *size = static_cast<std::uint64_t>(li.QuadPart);
  return true;
}

Result<void> read_file_at(HANDLE h, const std::string& path, void* buf, std::size_t size, std::uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    const DWORD n = static_cast<DWORD>(std::min<std::size_t>(size, kMaxIo));
    OVERLAPPED ov = at_offset(offset);
    DWORD got = 0;
    if (!sys().read_file(h, p, n, &got, &ov)) {
      const DWORD err = ::GetLastError();
      if (err == ERROR_HANDLE_EOF)
        return Error{Errc::corrupt, 0, "unexpected end of file while reading '" + path + "'"};
      return win_error(err, "read failed on", path);
    }
    if (got == 0) return Error{Errc::corrupt, 0, "unexpected end of file while reading '" + path + "'"};
    p += got;
    size -= got;
    offset += got;
  }
  return {};
}

namespace {

class Win32Platform final : public Platform {
 public:
  // ---- files ----

  Result<File> open_file(const std::string& path, OpenMode mode, unsigned /*perm*/, bool follow_symlink) override {
    // POSIX permission bits have no Windows equivalent; new files inherit the directory's ACL.
    std::wstring w;
    if (!widen(path, &w)) return bad_path(path);
    std::string name = path;  // before the open: nothing may fail once the handle is ours
    DWORD access = GENERIC_READ, disposition = OPEN_EXISTING;
    switch (mode) {
      case OpenMode::read: break;
      case OpenMode::read_write: access |= GENERIC_WRITE; break;
      case OpenMode::create_new: access |= GENERIC_WRITE; disposition = CREATE_NEW; break;
      case OpenMode::lock_file: access |= GENERIC_WRITE; disposition = OPEN_ALWAYS; break;
    }
    DWORD flags = FILE_ATTRIBUTE_NORMAL;
    if (!follow_symlink) flags |= FILE_FLAG_OPEN_REPARSE_POINT;
    // Every sharing mode: other handles and processes may read, write, map, rename and delete
    // while we hold the file, as on POSIX. A narrower mode is what made a second mapper of one
    // cache file fail with "Access is denied" elsewhere.
    HANDLE h = sys().create_file_w(w.c_str(), access, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                                   disposition, flags, nullptr);
    if (h == INVALID_HANDLE_VALUE) {
      DWORD err = ::GetLastError();
      // Windows answers "access denied" for a directory at the path, which the core reads as a
      // read-only place (and maps the cache read-only); POSIX says EISDIR. Say what it is.
      if (err == ERROR_ACCESS_DENIED) {
        const DWORD attrs = sys().get_file_attributes_w(w.c_str());
        if (attrs != INVALID_FILE_ATTRIBUTES && (attrs & FILE_ATTRIBUTE_DIRECTORY) != 0) err = ERROR_DIRECTORY;
      }
      const bool missing = err == ERROR_FILE_NOT_FOUND || err == ERROR_PATH_NOT_FOUND;
      return win_error(err, "cannot open", path, missing ? "Create the directory first, or pick another path." : nullptr);
    }
    File file(*this, reinterpret_cast<Handle>(h), std::move(name));  // closed on the ways out below
    FileInfo info;
    DWORD attrs = 0;
    // A failed query says nothing about what the file is: report the OS error, not "not a
    // regular file; remove it".
    if (!info_of(h, &info, &attrs)) return win_error(::GetLastError(), "cannot query", path);
    if (!follow_symlink && (attrs & FILE_ATTRIBUTE_REPARSE_POINT) != 0 && reparse_is_link(h))
      return Error{Errc::invalid_argument, ELOOP,
                   "refusing to open a symlink at '" + path +
                       "'. Point the cache at a regular file, or set allow_symlink."};
    if (!info.regular) return not_a_regular_file(path);
    return file;
  }

  void close_file(Handle h) noexcept override {
    if (h == kInvalidHandle || h == 0) return;
    sys().close_handle(reinterpret_cast<HANDLE>(h));
  }

  Result<FileInfo> stat_file(const File& f) override {
    FileInfo info;
    if (!info_of(as_handle(f), &info)) return win_error(::GetLastError(), "cannot query", f.path());
    // The core trusts its mapping up to the size it learns here: back any hole the file now
    // covers (another process may have grown it).
    if (auto r = segments_.fill_holes(info.device, info.inode); !r) return r.error();
    return info;
  }

  Result<FileInfo> stat_path(const std::string& path, bool follow) override {
    std::wstring w;
    if (!widen(path, &w)) return bad_path(path);
    DWORD flags = FILE_FLAG_BACKUP_SEMANTICS;  // lets directories open too, to be reported as such
    if (!follow) flags |= FILE_FLAG_OPEN_REPARSE_POINT;
    HANDLE h =
        sys().create_file_w(w.c_str(), FILE_READ_ATTRIBUTES, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                            nullptr, OPEN_EXISTING, flags, nullptr);
    if (h == INVALID_HANDLE_VALUE) return win_error(::GetLastError(), "cannot stat", path);
    FileInfo info;
    DWORD attrs = 0;
    const bool ok = info_of(h, &info, &attrs);
    const DWORD err = ::GetLastError();
    if (ok && !follow && (attrs & FILE_ATTRIBUTE_REPARSE_POINT) != 0 && reparse_is_link(h)) {
      info.symlink = true;
      info.regular = false;
    }
    sys().close_handle(h);
    if (!ok) return win_error(err, "cannot stat", path);
    return info;
  }

  Result<void> read_at(const File& f, void* buf, std::size_t size, std::uint64_t offset) override {
    return read_file_at(as_handle(f), f.path(), buf, size, offset);
  }

  Result<void> write_at(const File& f, const void* buf, std::size_t size, std::uint64_t offset) override {
    auto* p = static_cast<const char*>(buf);
    while (size > 0) {
      const DWORD n = static_cast<DWORD>(std::min<std::size_t>(size, kMaxIo));
      OVERLAPPED ov = at_offset(offset);
      DWORD put = 0;
      if (!sys().write_file(as_handle(f), p, n, &put, &ov))
        return win_error(::GetLastError(), "write failed on", f.path());
      if (put == 0) return Error{Errc::io, 0, "write made no progress on '" + f.path() + "'"};
      p += put;
      size -= put;
      offset += put;
    }
    return {};
  }

  Result<void> allocate(const File& f, std::uint64_t offset, std::uint64_t len) override {
    const std::uint64_t target = offset + len;
    if (target < offset || target > static_cast<std::uint64_t>(INT64_MAX))
      return Error{Errc::no_space, EFBIG, "the cache file would exceed the largest file size Windows supports"};
    std::uint64_t size = 0;
    if (!file_size_of(as_handle(f), &size)) return win_error(::GetLastError(), "cannot query", f.path());
    if (size < target) {
      // Reserve the clusters first (fails at once on a full disk), then move EOF: NTFS backs
      // the whole range, so stores through a mapping can never fail for lack of space. Never
      // shrinks, like posix_fallocate.
      FILE_ALLOCATION_INFO alloc{};
      alloc.AllocationSize.QuadPart = static_cast<LONGLONG>(target);
      if (!sys().set_file_information_by_handle(as_handle(f), FileAllocationInfo, &alloc, sizeof alloc)) {
        const DWORD err = ::GetLastError();
        if (errc_of_win(err) == Errc::no_space)
          return win_error(err, "cannot allocate disk space for", f.path(), "Free disk space.");
        // Some file systems do not take an allocation size: EOF alone still works.
      }
      FILE_END_OF_FILE_INFO eof{};
      eof.EndOfFile.QuadPart = static_cast<LONGLONG>(target);
      if (!sys().set_file_information_by_handle(as_handle(f), FileEndOfFileInfo, &eof, sizeof eof))
        return win_error(::GetLastError(), "cannot allocate disk space for", f.path(), "Free disk space.");
    }
    FileInfo info;
    if (info_of(as_handle(f), &info)) return segments_.fill_holes(info.device, info.inode);
    return {};
  }

  Result<void> truncate(const File& f, std::uint64_t size) override {
    // Fails with ERROR_USER_MAPPED_FILE while any process maps the part being cut: the core
    // tolerates that (the file then keeps its preallocated tail past the footer).
    FILE_END_OF_FILE_INFO eof{};
    eof.EndOfFile.QuadPart = static_cast<LONGLONG>(size);
    if (!sys().set_file_information_by_handle(as_handle(f), FileEndOfFileInfo, &eof, sizeof eof))
      return win_error(::GetLastError(), "cannot resize", f.path());
    return {};
  }

  Result<void> sync(const File& f) override {
    if (!sys().flush_file_buffers(as_handle(f)))
      return win_error(::GetLastError(), "FlushFileBuffers failed on", f.path());
    return {};
  }

  Result<void> rename(const std::string& from, const std::string& to) override {
    std::wstring wf, wt;
    if (!widen(from, &wf)) return bad_path(from);
    if (!widen(to, &wt)) return bad_path(to);
    if (sys().move_file_ex_w(wf.c_str(), wt.c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) return {};
    const DWORD err = ::GetLastError();
    // Classic rename refuses to replace a file that another handle holds open; POSIX-semantics
    // rename (Windows 10 1709+, NTFS) replaces it as rename(2) does, the old file living on for
    // its holders.
    if (err == ERROR_ACCESS_DENIED || err == ERROR_SHARING_VIOLATION) {
      if (posix_rename(wf, wt)) return {};
    }
    return win_error(err, "cannot rename a new cache file onto", to);
  }

  Result<void> sync_parent_dir(const std::string&) override {
    // NTFS journals the rename itself and MoveFileEx was asked to write through: nothing to do.
    return {};
  }

  void touch(const File& f) noexcept override {
    FILE_BASIC_INFO info{};  // zero: leave that time as it is
    FILETIME now;
    ::GetSystemTimeAsFileTime(&now);  // cannot fail
    info.LastWriteTime.LowPart = now.dwLowDateTime;
    info.LastWriteTime.HighPart = static_cast<LONG>(now.dwHighDateTime);
    (void)sys().set_file_information_by_handle(as_handle(f), FileBasicInfo, &info, sizeof info);
  }

  void remove(const std::string& path) noexcept override { (void)remove_file(path); }

  Result<File> reopen(int, bool) override {
    return Error{Errc::unsupported, 0, "wc_options.fd is a POSIX descriptor; on Windows pass a HANDLE (wc_options.handle)"};
  }

  Result<File> reopen_os_handle(void* os_handle, bool writable) override {
    HANDLE from = static_cast<HANDLE>(os_handle);
    const std::string label = handle_label(os_handle);
    if (from == INVALID_HANDLE_VALUE)
      return Error{Errc::invalid_argument, EBADF, "wc_options.handle is INVALID_HANDLE_VALUE; pass an open file handle"};
    if (auto r = check_file_handle(from, label); !r) return r.error();
    auto granted = granted_access(from, label);
    if (!granted) return granted.error();
    if ((granted.value() & FILE_READ_DATA) == 0)
      return Error{Errc::invalid_argument, EACCES, "'" + label + "' was opened without read access; pass a handle opened with GENERIC_READ"};
    if (writable && (granted.value() & FILE_WRITE_DATA) == 0)
      return Error{Errc::read_only, EACCES,
                   "'" + label + "' was opened without write access: pass a handle opened with GENERIC_WRITE to add "
                   "entries, or set read_only"};
    // A file object of our own where the file's ACL allows, not a duplicate: byte-range locks
    // belong to the file object, and a duplicate shares the caller's. Synchronous whatever the
    // caller's handle is.
    HANDLE h = sys().re_open_file(from, GENERIC_READ | (writable ? GENERIC_WRITE : 0),
                                  FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, 0);
    if (h == INVALID_HANDLE_VALUE) {
      const DWORD err = ::GetLastError();
      if (err != ERROR_ACCESS_DENIED)
        return win_error(err, "cannot reopen", label,
                         err == ERROR_SHARING_VIOLATION
                             ? "Open the file with FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, so that "
                               "others may open and map it too."
                             : nullptr);
      // The ACL refuses what the handle grants (a brokered handle in a sandbox): use the handle.
      auto dup = duplicate_caller_handle(from, label);
      if (!dup) return dup.error();
      h = dup.value();
      log::debug("'{}': ReOpenFile was refused (access denied); using a duplicate of the handle, which shares the "
                 "caller's file object",
                 label);
    } else {
      log::debug("'{}': reopened as a file object of the library's own (ReOpenFile)", label);
    }
    File file(*this, reinterpret_cast<Handle>(h), label);  // closed on the ways out below
    FileInfo info;
    if (!info_of(h, &info)) return win_error(::GetLastError(), "cannot query", label);
    if (!info.regular)
      return Error{Errc::invalid_argument, 0, "'" + label + "' is not a regular file; pass a cache file's handle"};
    return file;
  }

  bool vanishes_with_holders(const File& f) noexcept override {
    HANDLE h = as_handle(f);
    FILE_STANDARD_INFO standard{};
    if (sys().get_file_information_by_handle_ex(h, FileStandardInfo, &standard, sizeof standard) &&
        standard.DeletePending)
      return true;  // deleted once its last handle closes, whoever made it
    // A ":memory:" file of this library, by its name (create_anonymous below): the temporary
    // attribute and delete-on-close belong to the creator's file object or are not kept
    // everywhere (Wine keeps neither), the name is the file's own.
    union {
      FILE_NAME_INFO info;
      unsigned char bytes[sizeof(FILE_NAME_INFO) + 2 * MAX_PATH * sizeof(wchar_t)];
    } buf{};
    if (!sys().get_file_information_by_handle_ex(h, FileNameInfo, &buf.info, sizeof buf)) return false;
    std::wstring_view name(buf.info.FileName, buf.info.FileNameLength / sizeof(wchar_t));
    if (const auto slash = name.find_last_of(L"\\/"); slash != std::wstring_view::npos) name.remove_prefix(slash + 1);
    return is_anonymous_name(name);
  }

  Result<File> create_anonymous(const char* name) override {
    // A temporary file that deletes itself when its last handle closes, which the OS keeps in
    // memory while it can, rather than a pagefile-backed section: docs/DESIGN.md says why.
    wchar_t dir[MAX_PATH + 1];
    const DWORD n = sys().get_temp_path_w(MAX_PATH + 1, dir);
    if (n == 0 || n > MAX_PATH)
      return win_error(n == 0 ? ::GetLastError() : ERROR_FILENAME_EXCED_RANGE, "cannot find the temporary directory for",
                       kMemoryPath);
    std::wstring prefix;
    if (!widen(std::string(name) + "-" + std::to_string(process_id()) + "-", &prefix)) return bad_path(name);
    prefix.insert(0, dir, n);
    static std::atomic<unsigned> serial{0};
    for (int attempt = 0; attempt < 64; ++attempt) {
      const std::wstring path = prefix + std::to_wstring(serial.fetch_add(1)) + L".tmp";
      const std::string label = std::string(kMemoryPath) + " (" + narrow(path.c_str(), static_cast<int>(path.size())) + ")";
      // DELETE, which delete-on-close needs; every sharing mode, so that the handles other
      // processes are given can be reopened (ReOpenFile) as theirs.
      HANDLE h = sys().create_file_w(path.c_str(), GENERIC_READ | GENERIC_WRITE | DELETE,
                                     FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, CREATE_NEW,
                                     FILE_ATTRIBUTE_TEMPORARY | FILE_FLAG_DELETE_ON_CLOSE, nullptr);
      if (h != INVALID_HANDLE_VALUE) {
        return File(*this, reinterpret_cast<Handle>(h), label);
      }
      const DWORD err = ::GetLastError();
      if (err != ERROR_FILE_EXISTS && err != ERROR_ALREADY_EXISTS)
        return win_error(err, "cannot create the temporary file of", label, "Point TMP at a writable local directory.");
    }
    return Error{Errc::io, EEXIST, "cannot create a temporary file for ':memory:': every name tried exists"};
  }

  int native_descriptor(const File&) const noexcept override { return -1; }
  void* native_os_handle(const File& f) const noexcept override {
    return f.is_open() ? reinterpret_cast<void*>(f.handle()) : nullptr;
  }
  bool replaces_open_files() const noexcept override { return false; }

  Result<std::vector<std::string>> list_directory(const std::string& dir) override {
    std::wstring w;
    if (!widen(dir, &w)) return Error{Errc::invalid_argument, 0, "'" + dir + "' is not a valid UTF-8 path"};
    if (!w.empty() && w.back() != L'\\' && w.back() != L'/') w += L'\\';
    w += L'*';
    WIN32_FIND_DATAW data;
    HANDLE h = sys().find_first_file_w(w.c_str(), &data);
    if (h == INVALID_HANDLE_VALUE) {
      const DWORD err = ::GetLastError();
      if (err == ERROR_FILE_NOT_FOUND) return std::vector<std::string>{};  // no entry at all
      return win_error(err, "cannot read the directory", dir);
    }
    struct Closer {
      HANDLE h;
      ~Closer() { (void)sys().find_close(h); }
    } closer{h};
    std::vector<std::string> names;
    do {
      const std::wstring_view name(data.cFileName);
      if (name != L"." && name != L"..") names.push_back(narrow(data.cFileName, static_cast<int>(name.size())));
    } while (sys().find_next_file_w(h, &data) != 0);
    if (const DWORD err = ::GetLastError(); err != ERROR_NO_MORE_FILES)
      return win_error(err, "cannot read the directory", dir);
    return names;
  }

  Result<void> remove_file(const std::string& path) override {
    std::wstring w;
    if (!widen(path, &w)) return Error{Errc::invalid_argument, 0, "'" + path + "' is not a valid UTF-8 path"};
    // POSIX-semantics delete frees the name at once even while others hold the file open.
    HANDLE h = sys().create_file_w(w.c_str(), DELETE, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                                   OPEN_EXISTING, FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS, nullptr);
    if (h != INVALID_HANDLE_VALUE) {
      DWORD flags = FILE_DISPOSITION_FLAG_DELETE | FILE_DISPOSITION_FLAG_POSIX_SEMANTICS;
      const bool done = sys().set_file_information_by_handle(h, kFileDispositionInfoEx, &flags, sizeof flags) != 0;
      sys().close_handle(h);
      if (done) return {};
    }
    if (sys().delete_file_w(w.c_str()) == 0) return win_error(::GetLastError(), "cannot delete", path);
    return {};
  }

  // ---- address space ----

  Result<void*> reserve_address_space(std::size_t size, std::size_t align) override {
    return segments_.reserve(size, align);
  }

  void release_address_space(void* base, std::size_t) noexcept override { segments_.release(base); }

  Result<void> map_file(const File& f, std::uint64_t offset, std::size_t len, void* at, bool writable) override {
    return segments_.map(f, offset, len, at, writable);
  }

  Result<void> commit_memory(void* at, std::size_t len) override { return segments_.commit(at, len); }

  Result<void> flush_mapping(void* addr, std::size_t len, bool wait) override {
    auto views = segments_.views_in(addr, len);
    if (!views) return views.error();
    std::map<HANDLE, const std::string*> files;  // the views' files (alive while `views` is), by handle
    for (const auto& p : views.value()) {
      // FlushViewOfFile reports ERROR_LOCK_VIOLATION while the pages are being written by
      // someone else; the documented answer is to try again.
      BOOL ok = FALSE;
      DWORD err = 0;
      for (int attempt = 0; attempt < 100 && !ok; ++attempt) {
        ok = sys().flush_view_of_file(reinterpret_cast<void*>(p.start), p.len);
        err = ok ? 0 : ::GetLastError();
        if (!ok && err != ERROR_LOCK_VIOLATION) break;
        if (!ok) ::SwitchToThread();
      }
      if (!ok) return win_error(err, "FlushViewOfFile failed on", p.file->path);
      if (wait) files.emplace(p.file->h, &p.file->path);
    }
    // FlushViewOfFile hands the pages to the file system; FlushFileBuffers waits until they
    // (and the file's metadata) are on the disk.
    for (const auto& [h, path] : files)
      if (!sys().flush_file_buffers(h)) return win_error(::GetLastError(), "FlushFileBuffers failed on", *path);
    return {};
  }

  void prefetch(void* addr, std::size_t len) noexcept override {
    if (len == 0) return;
    Win32MemoryRange r{addr, len};
    (void)sys().prefetch_virtual_memory(::GetCurrentProcess(), 1, &r, 0);
  }

  Result<std::uint64_t> first_hole(const File& f, std::uint64_t offset, std::uint64_t len) override {
    // The allocated ranges inside [offset, end), in file order. Only a sparse file (NTFS, ReFS)
    // has holes; elsewhere the call answers "all of it" or fails as unsupported, which counts
    // as allocated too.
    const std::uint64_t end = offset + len;
    std::uint64_t at = offset;
    for (int rounds = 0; at < end && rounds < 64; ++rounds) {
      FILE_ALLOCATED_RANGE_BUFFER query{};
      query.FileOffset.QuadPart = static_cast<LONGLONG>(at);
      query.Length.QuadPart = static_cast<LONGLONG>(end - at);
      FILE_ALLOCATED_RANGE_BUFFER ranges[16];
      DWORD got = 0;
      const BOOL ok = sys().device_io_control(as_handle(f), FSCTL_QUERY_ALLOCATED_RANGES, &query, sizeof query,
                                              ranges, sizeof ranges, &got, nullptr);
      const DWORD err = ok ? NO_ERROR : ::GetLastError();
      if (!ok && err != ERROR_MORE_DATA) {
        if (err == ERROR_INVALID_FUNCTION || err == ERROR_NOT_SUPPORTED || err == ERROR_INVALID_PARAMETER ||
            err == ERROR_CALL_NOT_IMPLEMENTED)
          return end;  // cannot tell: not a hole
        return win_error(err, "cannot look for holes in", f.path());
      }
      const DWORD n = got / sizeof ranges[0];
      if (n == 0) return at;  // nothing allocated from `at` on
      for (DWORD i = 0; i < n; ++i) {
        const auto start = static_cast<std::uint64_t>(ranges[i].FileOffset.QuadPart);
        if (start > at) return at;  // a gap before this range
        at = std::max(at, start + static_cast<std::uint64_t>(ranges[i].Length.QuadPart));
        if (at >= end) return end;
      }
      if (ok) return at < end ? at : end;  // every range listed, and they stop short of `end`
    }
    return end;  // a file cut into more pieces than we care to walk: let the checksum decide
  }

  // ---- locks ----

  Result<bool> try_lock(const File& f) override {
    // Byte-range locks belong to the handle (file object) that took them, like flock, and die
    // with it: another handle in the same process is refused as another process is.
    OVERLAPPED ov = at_offset(kLockOffset);
    if (sys().lock_file_ex(as_handle(f), LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov))
      return true;
    const DWORD err = ::GetLastError();
    if (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING) return false;
    return win_error(err, "cannot lock", f.path());
  }

  void unlock(const File& f) noexcept override {
    OVERLAPPED ov = at_offset(kLockOffset);
    (void)sys().unlock_file_ex(as_handle(f), 0, 1, 0, &ov);
  }

  Result<bool> try_lock_in_use(const File& f, bool exclusive) override {
    OVERLAPPED ov = at_offset(kInUseOffset);
    // Windows does not convert a lock, and our own shared lock refuses our exclusive one: when
    // refused, let go of a shared lock we may hold, try again, and take it back if we had it.
    const DWORD flags = LOCKFILE_FAIL_IMMEDIATELY | (exclusive ? LOCKFILE_EXCLUSIVE_LOCK : 0);
    // A shared lock stacks on our own exclusive one instead of replacing it (two unlocks would
    // then be needed, the exclusive one first): a downgrade lets go of what this handle holds
    // first (a no-op when it holds nothing).
    if (!exclusive) (void)sys().unlock_file_ex(as_handle(f), 0, 1, 0, &ov);
    if (sys().lock_file_ex(as_handle(f), flags, 0, 1, 0, &ov)) return true;
    DWORD err = ::GetLastError();
    if (exclusive && (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING)) {
      const bool had_shared = sys().unlock_file_ex(as_handle(f), 0, 1, 0, &ov) != FALSE;
      if (had_shared) {
        if (sys().lock_file_ex(as_handle(f), flags, 0, 1, 0, &ov)) return true;
        err = ::GetLastError();
        (void)sys().lock_file_ex(as_handle(f), LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov);
      }
    }
    if (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING) return false;
    return win_error(err, "cannot lock", f.path());
  }

  Result<bool> in_use_by_others(const File& f) override {
    // An exclusive lock taken and let go at once: LockFileEx needs only read access.
    OVERLAPPED ov = at_offset(kInUseOffset);
    if (sys().lock_file_ex(as_handle(f), LOCKFILE_FAIL_IMMEDIATELY | LOCKFILE_EXCLUSIVE_LOCK, 0, 1, 0, &ov)) {
      (void)sys().unlock_file_ex(as_handle(f), 0, 1, 0, &ov);
      return false;
    }
    const DWORD err = ::GetLastError();
    if (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING) return true;
    return win_error(err, "cannot ask for the in-use lock", f.path());
  }

  void unlock_in_use(const File& f) noexcept override {
    OVERLAPPED ov = at_offset(kInUseOffset);
    (void)sys().unlock_file_ex(as_handle(f), 0, 1, 0, &ov);
  }

  // ---- facts ----

  std::size_t map_granularity() const noexcept override { return api().granularity; }
  int process_id() const noexcept override { return static_cast<int>(sys().get_current_process_id()); }
  std::uint64_t file_size_limit() const noexcept override { return UINT64_MAX; }

 private:
  static bool posix_rename(const std::wstring& from, const std::wstring& to) {
    const DWORD full = sys().get_full_path_name_w(to.c_str(), 0, nullptr, nullptr);
    if (full == 0) return false;
    std::wstring target(full, L'\0');
    const DWORD n = sys().get_full_path_name_w(to.c_str(), full, target.data(), nullptr);
    if (n == 0 || n >= full) return false;
    target.resize(n);
    HANDLE h =
        sys().create_file_w(from.c_str(), DELETE | SYNCHRONIZE, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                            nullptr, OPEN_EXISTING, FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS, nullptr);
    if (h == INVALID_HANDLE_VALUE) return false;
    // FILE_RENAME_INFO with the RS1 Flags field in place of ReplaceIfExists.
    const std::size_t bytes = offsetof(FILE_RENAME_INFO, FileName) + (target.size() + 1) * sizeof(wchar_t);
    std::vector<unsigned char> buf(bytes, 0);
    auto* info = reinterpret_cast<FILE_RENAME_INFO*>(buf.data());
    const DWORD flags = FILE_RENAME_FLAG_REPLACE_IF_EXISTS | FILE_RENAME_FLAG_POSIX_SEMANTICS;
    std::memcpy(buf.data(), &flags, sizeof flags);
    info->RootDirectory = nullptr;
    info->FileNameLength = static_cast<DWORD>(target.size() * sizeof(wchar_t));
    std::memcpy(info->FileName, target.c_str(), (target.size() + 1) * sizeof(wchar_t));
    const bool ok = sys().set_file_information_by_handle(h, kFileRenameInfoEx, info, static_cast<DWORD>(bytes)) != 0;
    if (ok) (void)sys().flush_file_buffers(h);
    sys().close_handle(h);
    return ok;
  }

  Segments segments_;
};

}  // namespace
}  // namespace win32

Platform& os() noexcept {
  // Never destroyed (see posix_platform): a cache may be closed after the library's static
  // destructors have run.
  static win32::Win32Platform& platform = *new win32::Win32Platform;
  return platform;
}

Win32Calls& win32_calls() noexcept { return win32::calls_in_use(); }
const Win32Calls& default_win32_calls() noexcept { return win32::defaults(); }

std::uint64_t fork_generation() noexcept { return 0; }  // no fork on Windows

}  // namespace weightcache::platform
