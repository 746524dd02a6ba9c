// Win32 implementation of the platform seam (Windows 10 1803+ for the preferred mapping mode;
// older systems and Wine without placeholders get the legacy mode below). Plain Win32, no POSIX
// emulation: UTF-8 paths become UTF-16, sizes are 64-bit throughout, errors keep the Windows
// message. docs/PLATFORMS.md says what differs from POSIX and why.
//
// Mapping. The core reserves one address range per cache and expects file offset `o` at
// base + o, growing the mapped part chunk by chunk, and a private heap arena after it. Windows
// cannot map a file into address space that is already reserved, so:
//  - placeholder mode: the range is a placeholder (VirtualAlloc2 MEM_RESERVE_PLACEHOLDER);
//    each chunk splits it (VirtualFree MEM_PRESERVE_PLACEHOLDER) and replaces its part with a
//    view (MapViewOfFile3) or committed memory (VirtualAlloc2). At no moment is any part of the
//    range free for another allocation to land in.
//  - legacy mode: the range is plain reservations; carving a chunk releases the reservation
//    that holds it and reserves the rest again at once. Another thread's allocation can win
//    the race for the released range: the call then fails cleanly and the core packs to heap.
// A file mapping object can never be larger than the file without growing it (and a read-only
// one cannot grow at all), while the core maps whole 64 KiB chunks that may end past EOF. The
// part of a chunk past EOF stays reserved and is remembered as a "hole"; when the file grows
// (allocate, or another process's growth seen by stat_file or map_file) holes are filled with
// views at page-granular offsets, which placeholders allow. Legacy mode cannot map at page
// offsets: there a writable mapping grows the file to the chunk's end (what CreateFileMapping
// does), and a read-only one copies the last partial chunk into private memory and re-reads it
// when the file is stat'ed again (committed bytes never change, so re-reading is harmless).
#include "platform/errors.hpp"
#include "platform/handle_paths.hpp"
#include "platform/platform.hpp"
#include "platform/win32_calls.hpp"

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#include <winioctl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <vector>

// Declared by newer SDKs only; the values are part of the Windows ABI.
#ifndef MEM_RESERVE_PLACEHOLDER
#define MEM_RESERVE_PLACEHOLDER 0x00040000
#endif
#ifndef MEM_REPLACE_PLACEHOLDER
#define MEM_REPLACE_PLACEHOLDER 0x00004000
#endif
#ifndef MEM_PRESERVE_PLACEHOLDER
#define MEM_PRESERVE_PLACEHOLDER 0x00000002
#endif
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

template <class Fn>
Fn proc(HMODULE m, const char* name) {
  if (m == nullptr) return nullptr;
  return reinterpret_cast<Fn>(reinterpret_cast<void*>(::GetProcAddress(m, name)));
}

struct Resolved {
  VirtualAlloc2Fn virtual_alloc2 = nullptr;
  MapViewOfFile3Fn map_view3 = nullptr;
  PrefetchVirtualMemoryFn prefetch = nullptr;
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

Win32Calls make_default_calls() {
  Win32Calls c{};
#define WC_WIN32_CALL_DEFAULT(name, function, result, params) c.name = ::function;
  WC_WIN32_LINKED_CALLS(WC_WIN32_CALL_DEFAULT)
#undef WC_WIN32_CALL_DEFAULT
  c.virtual_alloc2 = default_virtual_alloc2;
  c.map_view_of_file3 = default_map_view_of_file3;
  c.prefetch_virtual_memory = default_prefetch_virtual_memory;
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

Win32Calls& sys() { return calls_in_use(); }

struct Api {
  bool placeholders = false;  // probed: the calls exist and work as documented
  std::size_t page = 4096;
  std::size_t granularity = 65536;
};

// Tries every placeholder operation the mapping code relies on, on a scratch range. Wine before
// 9.x and Windows before 10 1803 fail here; then legacy mode is used.
bool probe_placeholders(const Api& api) {
  const std::size_t g = api.granularity;
  auto* base = static_cast<char*>(sys().virtual_alloc2(
      ::GetCurrentProcess(), nullptr, 2 * g, MEM_RESERVE | MEM_RESERVE_PLACEHOLDER, PAGE_NOACCESS, nullptr, 0));
  if (base == nullptr) return false;
  const bool ok = sys().virtual_free(base, g, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER) != 0;
  bool view = false, committed = false, second = false;
  HANDLE section =
      ok ? sys().create_file_mapping_w(INVALID_HANDLE_VALUE, nullptr, PAGE_READWRITE, 0, static_cast<DWORD>(g), nullptr)
         : nullptr;
  if (section != nullptr) {
    // A view at a page (not 64 KiB) offset of the section: what hole filling needs.
    second = sys().virtual_free(base, api.page, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER) != 0;
    view = second && sys().map_view_of_file3(section, ::GetCurrentProcess(), base + api.page, api.page, g - api.page,
                                             MEM_REPLACE_PLACEHOLDER, PAGE_READWRITE, nullptr, 0) != nullptr;
    sys().close_handle(section);
  }
  if (ok) {
    committed =
        sys().virtual_alloc2(::GetCurrentProcess(), base + g, g, MEM_RESERVE | MEM_COMMIT | MEM_REPLACE_PLACEHOLDER,
                             PAGE_READWRITE, nullptr, 0) != nullptr;
    if (second) {
      if (view) sys().unmap_view_of_file(base + api.page);
      else sys().virtual_free(base + api.page, 0, MEM_RELEASE);
    }
    sys().virtual_free(base, 0, MEM_RELEASE);
    sys().virtual_free(base + g, 0, MEM_RELEASE);  // committed memory or a placeholder
  } else {
    sys().virtual_free(base, 0, MEM_RELEASE);
  }
  return ok && view && committed;
}

const Api& api() {
  static const Api a = [] {
    Api r;
    SYSTEM_INFO si;
    sys().get_system_info(&si);
    r.page = si.dwPageSize;
    r.granularity = si.dwAllocationGranularity;
    // WEIGHTCACHE_WIN32_MAPPING=legacy forces the fallback, so it can be tested where
    // placeholders exist.
    const char* force = std::getenv("WEIGHTCACHE_WIN32_MAPPING");
    const bool legacy = force != nullptr && std::strcmp(force, "legacy") == 0;
    r.placeholders = !legacy && probe_placeholders(r);
    return r;
  }();
  return a;
}

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

std::string narrow(const wchar_t* s, int len) {
  if (len <= 0) return {};
  const int n = ::WideCharToMultiByte(CP_UTF8, 0, s, len, nullptr, 0, nullptr, nullptr);
  if (n <= 0) return {};
  std::string out(static_cast<std::size_t>(n), '\0');
  ::WideCharToMultiByte(CP_UTF8, 0, s, len, out.data(), n, nullptr, nullptr);
  return out;
}

// The system's text for `code`, in UTF-8, without the trailing period and line break.
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

// "<what> '<path>': <Windows message> (Windows error N). <hint>", with sys_errno the closest
// errno (the core tests it against ENOENT, as on POSIX).
Error win_error(DWORD code, const std::string& what, const std::string& path, const char* hint = nullptr) {
  std::string msg;
  try {
    msg = error_message(what, path, win_message(code), hint);
  } catch (...) {
  }
  return Error{errc_of_win(code), errno_of(code), std::move(msg)};
}

// ---- paths ----------------------------------------------------------------------------------

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

HANDLE as_handle(Handle h) { return reinterpret_cast<HANDLE>(h); }

bool reparse_is_link(HANDLE h) {
  FILE_ATTRIBUTE_TAG_INFO tag{};
  if (!sys().get_file_information_by_handle_ex(h, FileAttributeTagInfo, &tag, sizeof tag)) return true;
  return (tag.FileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) != 0 &&
         (tag.ReparseTag == IO_REPARSE_TAG_SYMLINK || tag.ReparseTag == IO_REPARSE_TAG_MOUNT_POINT);
}

// Fails (with the thread's last error set) when either query fails: a file whose type cannot
// be read is not thereby "not a regular file". `attributes` gets the FILE_ATTRIBUTE_* bits.
bool info_of(HANDLE h, FileInfo* out, DWORD* attributes = nullptr) {
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

std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v & ~(a - 1); }
std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

// ---- address space bookkeeping --------------------------------------------------------------

// Our own duplicate of a mapped file's handle: views and holes outlive the core's handle
// bookkeeping, and must never follow a recycled handle value to another file.
struct FileRef {
  HANDLE h = nullptr;
  std::uint64_t device = 0, inode = 0;
  std::string path;  // of the handle it duplicates, for messages
  ~FileRef() {
    if (h != nullptr) {
      handle_paths().remove(reinterpret_cast<Handle>(h));
      sys().close_handle(h);
    }
  }
};

std::string path_of(Handle h) { return handle_paths().of(h); }

// An address in a message about the address space itself (no file is involved).
std::string address_text(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

enum class Kind : std::uint8_t {
  reserved,   // placeholder (or, in legacy mode, one plain reservation); a hole if `file` is set
  view,       // a view of `file` at `file_offset`
  committed,  // private memory: the heap arena, or (legacy, read-only) a copy of a file's tail
  lost,       // legacy mode only: another allocation took this part while we re-reserved it
};

struct Segment {
  std::uintptr_t end = 0;
  Kind kind = Kind::reserved;
  std::shared_ptr<FileRef> file;  // views, holes and tail copies
  std::uint64_t file_offset = 0;  // file offset of the segment's start
  bool writable = false;
};

struct Reservation {
  std::uintptr_t end = 0;
  std::map<std::uintptr_t, Segment> segs;  // by start; covers [base, end) exactly
};

using SegIt = std::map<std::uintptr_t, Segment>::iterator;

class Win32Platform final : public Platform {
 public:
  // ---- files ----

  Result<Handle> open_file(const std::string& path, OpenMode mode, unsigned /*perm*/, bool follow_symlink) override {
    // POSIX permission bits have no Windows equivalent; new files inherit the directory's ACL.
    std::wstring w;
    if (!widen(path, &w)) return bad_path(path);
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
    FileInfo info;
    DWORD attrs = 0;
    if (!info_of(h, &info, &attrs)) {
      // A failed query says nothing about what the file is: report the OS error, not "not a
      // regular file; remove it".
      const DWORD err = ::GetLastError();
      sys().close_handle(h);
      return win_error(err, "cannot query", path);
    }
    if (!follow_symlink && (attrs & FILE_ATTRIBUTE_REPARSE_POINT) != 0 && reparse_is_link(h)) {
      sys().close_handle(h);
      return Error{Errc::invalid_argument, ELOOP,
                   "refusing to open a symlink at '" + path +
                       "'. Point the cache at a regular file, or set allow_symlink."};
    }
    if (!info.regular) {
      sys().close_handle(h);
      return not_a_regular_file(path);
    }
    handle_paths().add(reinterpret_cast<Handle>(h), path);
    return reinterpret_cast<Handle>(h);
  }

  void close_file(Handle h) noexcept override {
    if (h == kInvalidHandle || h == 0) return;
    handle_paths().remove(h);  // before the handle value can be reused
    sys().close_handle(as_handle(h));
  }

  Result<FileInfo> stat_file(Handle h) override {
    FileInfo info;
    if (!info_of(as_handle(h), &info)) return win_error(::GetLastError(), "cannot query", path_of(h));
    // The core trusts its mapping up to the size it learns here: back any hole the file now
    // covers (another process may have grown it).
    if (auto r = fill_holes(info.device, info.inode); !r) return r.error();
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

  Result<void> read_at(Handle h, void* buf, std::size_t size, std::uint64_t offset) override {
    auto* p = static_cast<char*>(buf);
    while (size > 0) {
      const DWORD n = static_cast<DWORD>(std::min<std::size_t>(size, kMaxIo));
      OVERLAPPED ov{};
      ov.Offset = static_cast<DWORD>(offset);
      ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
      DWORD got = 0;
      if (!sys().read_file(as_handle(h), p, n, &got, &ov)) {
        const DWORD err = ::GetLastError();
        if (err == ERROR_HANDLE_EOF) return Error{Errc::corrupt, 0, "unexpected end of file while reading the cache"};
        return win_error(err, "read failed on", path_of(h));
      }
      if (got == 0) return Error{Errc::corrupt, 0, "unexpected end of file while reading the cache"};
      p += got;
      size -= got;
      offset += got;
    }
    return {};
  }

  Result<void> write_at(Handle h, const void* buf, std::size_t size, std::uint64_t offset) override {
    auto* p = static_cast<const char*>(buf);
    while (size > 0) {
      const DWORD n = static_cast<DWORD>(std::min<std::size_t>(size, kMaxIo));
      OVERLAPPED ov{};
      ov.Offset = static_cast<DWORD>(offset);
      ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
      DWORD put = 0;
      if (!sys().write_file(as_handle(h), p, n, &put, &ov))
        return win_error(::GetLastError(), "write failed on", path_of(h));
      if (put == 0) return Error{Errc::io, 0, "write made no progress on the cache file"};
      p += put;
      size -= put;
      offset += put;
    }
    return {};
  }

  Result<void> allocate(Handle h, std::uint64_t offset, std::uint64_t len) override {
    const std::uint64_t target = offset + len;
    if (target < offset || target > static_cast<std::uint64_t>(INT64_MAX))
      return Error{Errc::no_space, EFBIG, "the cache file would exceed the largest file size Windows supports"};
    std::uint64_t size = 0;
    if (!file_size_of(as_handle(h), &size)) return win_error(::GetLastError(), "cannot query", path_of(h));
    if (size < target) {
      // Reserve the clusters first (fails at once on a full disk), then move EOF: NTFS backs
      // the whole range, so stores through a mapping can never fail for lack of space. Never
      // shrinks, like posix_fallocate.
      FILE_ALLOCATION_INFO alloc{};
      alloc.AllocationSize.QuadPart = static_cast<LONGLONG>(target);
      if (!sys().set_file_information_by_handle(as_handle(h), FileAllocationInfo, &alloc, sizeof alloc)) {
        const DWORD err = ::GetLastError();
        if (errc_of_win(err) == Errc::no_space)
          return win_error(err, "cannot allocate disk space for", path_of(h), "Free disk space.");
        // Some file systems do not take an allocation size: EOF alone still works.
      }
      FILE_END_OF_FILE_INFO eof{};
      eof.EndOfFile.QuadPart = static_cast<LONGLONG>(target);
      if (!sys().set_file_information_by_handle(as_handle(h), FileEndOfFileInfo, &eof, sizeof eof))
        return win_error(::GetLastError(), "cannot allocate disk space for", path_of(h), "Free disk space.");
    }
    FileInfo info;
    if (info_of(as_handle(h), &info)) return fill_holes(info.device, info.inode);
    return {};
  }

  Result<void> truncate(Handle h, std::uint64_t size) override {
    // Fails with ERROR_USER_MAPPED_FILE while any process maps the part being cut: the core
    // tolerates that (the file then keeps its preallocated tail past the footer).
    FILE_END_OF_FILE_INFO eof{};
    eof.EndOfFile.QuadPart = static_cast<LONGLONG>(size);
    if (!sys().set_file_information_by_handle(as_handle(h), FileEndOfFileInfo, &eof, sizeof eof))
      return win_error(::GetLastError(), "cannot resize", path_of(h));
    return {};
  }

  Result<void> sync(Handle h) override {
    if (!sys().flush_file_buffers(as_handle(h)))
      return win_error(::GetLastError(), "FlushFileBuffers failed on", path_of(h));
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

  void touch(Handle h) noexcept override {
    FILE_BASIC_INFO info{};  // zero: leave that time as it is
    FILETIME now;
    ::GetSystemTimeAsFileTime(&now);  // cannot fail
    info.LastWriteTime.LowPart = now.dwLowDateTime;
    info.LastWriteTime.HighPart = static_cast<LONG>(now.dwHighDateTime);
    (void)sys().set_file_information_by_handle(as_handle(h), FileBasicInfo, &info, sizeof info);
  }

  void remove(const std::string& path) noexcept override { (void)remove_file(path); }

  Result<Handle> reopen(int, bool) override {
    return Error{Errc::unsupported, 0, "opening a cache from a descriptor is not supported on Windows yet"};
  }
  Result<Handle> create_anonymous(const char*) override {
    return Error{Errc::unsupported, 0, "':memory:' caches are not supported on Windows yet"};
  }
  int native_descriptor(Handle) const noexcept override { return -1; }
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
    const Api& a = api();
    align = std::max<std::size_t>(align, a.granularity);
    size = static_cast<std::size_t>(align_up(size, a.granularity));
    std::uintptr_t base = 0;
    if (a.placeholders) {
      // Reserve more than asked, then split off and free the unaligned head and the tail:
      // never releases what it keeps, so nothing can race into it.
      auto* p =
          static_cast<char*>(sys().virtual_alloc2(::GetCurrentProcess(), nullptr, size + align,
                                                  MEM_RESERVE | MEM_RESERVE_PLACEHOLDER, PAGE_NOACCESS, nullptr, 0));
      if (p == nullptr) return no_address_space(size, ::GetLastError());
      const auto start = reinterpret_cast<std::uintptr_t>(p);
      base = static_cast<std::uintptr_t>(align_up(start, align));
      const std::uintptr_t tail = start + size + align - (base + size);
      std::uintptr_t held = start;  // where the placeholder we still hold begins
      bool ok = true;
      if (base > start) {
        ok = sys().virtual_free(p, base - start, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER) != 0;
        if (ok) {
          sys().virtual_free(p, 0, MEM_RELEASE);
          held = base;
        }
      }
      if (ok && tail > 0) {
        ok = sys().virtual_free(reinterpret_cast<void*>(base), size, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER) != 0;
        if (ok) sys().virtual_free(reinterpret_cast<void*>(base + size), 0, MEM_RELEASE);
      }
      if (!ok) {
        const DWORD err = ::GetLastError();
        sys().virtual_free(reinterpret_cast<void*>(held), 0, MEM_RELEASE);
        return no_address_space(size, err);
      }
    } else {
      // Find an aligned range, then reserve exactly it; another thread may take it in between.
      DWORD err = ERROR_NOT_ENOUGH_MEMORY;
      for (int attempt = 0; attempt < 16 && base == 0; ++attempt) {
        void* p = sys().virtual_alloc(nullptr, size + align, MEM_RESERVE, PAGE_NOACCESS);
        if (p == nullptr) {
          err = ::GetLastError();
          break;
        }
        const std::uintptr_t want = static_cast<std::uintptr_t>(align_up(reinterpret_cast<std::uintptr_t>(p), align));
        if (!sys().virtual_free(p, 0, MEM_RELEASE)) {
          // The aligned range lies inside the one we could not let go: trying again would only
          // hold more address space.
          err = ::GetLastError();
          break;
        }
        if (sys().virtual_alloc(reinterpret_cast<void*>(want), size, MEM_RESERVE, PAGE_NOACCESS) ==
            reinterpret_cast<void*>(want))
          base = want;
      }
      if (base == 0) return no_address_space(size, err);
    }
    try {
      std::lock_guard<std::mutex> lock(mu_);
      Reservation r;
      r.end = base + size;
      r.segs[base] = Segment{base + size, Kind::reserved, nullptr, 0, false};
      reservations_[base] = std::move(r);
    } catch (...) {
      sys().virtual_free(reinterpret_cast<void*>(base), 0, MEM_RELEASE);
      return Error{Errc::no_memory, ENOMEM, "out of memory while reserving address space"};
    }
    return reinterpret_cast<void*>(base);
  }

  void release_address_space(void* base, std::size_t) noexcept override {
    if (base == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == reservations_.end()) return;
    for (auto& [start, seg] : it->second.segs) free_segment(start, seg);
    reservations_.erase(it);
  }

  Result<void> map_file(Handle h, std::uint64_t offset, std::size_t len, void* at, bool writable) override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      const auto start = reinterpret_cast<std::uintptr_t>(at);
      auto found = find_free_range(start, len, "map_file");
      if (!found) return found.error();
      Reservation* res = found.value();
      auto file = std::make_shared<FileRef>();
      file->path = path_of(h);
      if (!sys().duplicate_handle(::GetCurrentProcess(), as_handle(h), ::GetCurrentProcess(), &file->h, 0, FALSE,
                                  DUPLICATE_SAME_ACCESS)) {
        file->h = nullptr;
        return win_error(::GetLastError(), "cannot duplicate the handle of", file->path);
      }
      handle_paths().add(reinterpret_cast<Handle>(file->h), file->path);  // read_at of a tail copy
      FileInfo info;
      if (!info_of(file->h, &info)) return win_error(::GetLastError(), "cannot query", file->path);
      file->device = info.device;
      file->inode = info.inode;
      auto r = api().placeholders ? map_placeholder(*res, file, offset, start, len, writable, info.size)
                                  : map_legacy(*res, file, offset, start, len, writable, info.size);
      if (!r) return r;
      return fill_holes_locked(info.device, info.inode);
    } catch (...) {
      return Error{Errc::no_memory, ENOMEM, "out of memory while mapping the cache"};
    }
  }

  Result<void> commit_memory(void* at, std::size_t len) override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      const auto start = reinterpret_cast<std::uintptr_t>(at);
      auto found = find_free_range(start, len, "commit_memory");
      if (!found) return found.error();
      Reservation* res = found.value();
      if (auto r = commit_locked(*res, start, len); !r) return r;
      return {};
    } catch (...) {
      return Error{Errc::no_memory, ENOMEM, "out of memory while committing heap memory"};
    }
  }

  Result<void> flush_mapping(void* addr, std::size_t len, bool wait) override {
    struct Part {
      std::uintptr_t start;
      std::size_t len;
      std::shared_ptr<FileRef> file;
    };
    std::vector<Part> parts;
    try {
      // Collected under the lock, flushed outside it: only the core that owns these views can
      // release them, and it is the caller.
      std::lock_guard<std::mutex> lock(mu_);
      const auto lo = reinterpret_cast<std::uintptr_t>(addr);
      const std::uintptr_t hi = lo + len;
      Reservation* res = find(lo);
      if (res != nullptr) {
        auto it = res->segs.upper_bound(lo);
        if (it != res->segs.begin()) --it;
        for (; it != res->segs.end() && it->first < hi; ++it) {
          if (it->second.kind != Kind::view) continue;
          const std::uintptr_t s = std::max(lo, it->first), e = std::min(hi, it->second.end);
          if (s < e) parts.push_back({s, e - s, it->second.file});
        }
      }
    } catch (...) {
      return Error{Errc::no_memory, ENOMEM, "out of memory while flushing the cache"};
    }
    std::set<HANDLE> files;
    for (const auto& p : parts) {
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
      if (wait) files.insert(p.file->h);
    }
    // FlushViewOfFile hands the pages to the file system; FlushFileBuffers waits until they
    // (and the file's metadata) are on the disk.
    for (HANDLE f : files)
      if (!sys().flush_file_buffers(f))
        return win_error(::GetLastError(), "FlushFileBuffers failed on", path_of(reinterpret_cast<Handle>(f)));
    return {};
  }

  void prefetch(void* addr, std::size_t len) noexcept override {
    if (len == 0) return;
    Win32MemoryRange r{addr, len};
    (void)sys().prefetch_virtual_memory(::GetCurrentProcess(), 1, &r, 0);
  }

  Result<std::uint64_t> first_hole(Handle h, std::uint64_t offset, std::uint64_t len) override {
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
      const BOOL ok = sys().device_io_control(as_handle(h), FSCTL_QUERY_ALLOCATED_RANGES, &query, sizeof query,
                                              ranges, sizeof ranges, &got, nullptr);
      const DWORD err = ok ? NO_ERROR : ::GetLastError();
      if (!ok && err != ERROR_MORE_DATA) {
        if (err == ERROR_INVALID_FUNCTION || err == ERROR_NOT_SUPPORTED || err == ERROR_INVALID_PARAMETER ||
            err == ERROR_CALL_NOT_IMPLEMENTED)
          return end;  // cannot tell: not a hole
        return win_error(err, "cannot look for holes in", path_of(h));
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

  Result<bool> try_lock(Handle h) override {
    // Byte-range locks belong to the handle (file object) that took them, like flock, and die
    // with it: another handle in the same process is refused as another process is.
    OVERLAPPED ov{};
    ov.Offset = static_cast<DWORD>(kLockOffset);
    ov.OffsetHigh = static_cast<DWORD>(kLockOffset >> 32);
    if (sys().lock_file_ex(as_handle(h), LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov))
      return true;
    const DWORD err = ::GetLastError();
    if (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING) return false;
    return win_error(err, "cannot lock", path_of(h));
  }

  void unlock(Handle h) noexcept override {
    OVERLAPPED ov{};
    ov.Offset = static_cast<DWORD>(kLockOffset);
    ov.OffsetHigh = static_cast<DWORD>(kLockOffset >> 32);
    (void)sys().unlock_file_ex(as_handle(h), 0, 1, 0, &ov);
  }

  Result<bool> try_lock_in_use(Handle h, bool exclusive) override {
    OVERLAPPED ov{};
    ov.Offset = static_cast<DWORD>(kInUseOffset);
    ov.OffsetHigh = static_cast<DWORD>(kInUseOffset >> 32);
    // Windows does not convert a lock, and our own shared lock refuses our exclusive one: when
    // refused, let go of a shared lock we may hold, try again, and take it back if we had it.
    const DWORD flags = LOCKFILE_FAIL_IMMEDIATELY | (exclusive ? LOCKFILE_EXCLUSIVE_LOCK : 0);
    // A shared lock stacks on our own exclusive one instead of replacing it (two unlocks would
    // then be needed, the exclusive one first): a downgrade lets go of what this handle holds
    // first (a no-op when it holds nothing).
    if (!exclusive) (void)sys().unlock_file_ex(as_handle(h), 0, 1, 0, &ov);
    if (sys().lock_file_ex(as_handle(h), flags, 0, 1, 0, &ov)) return true;
    DWORD err = ::GetLastError();
    if (exclusive && (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING)) {
      const bool had_shared = sys().unlock_file_ex(as_handle(h), 0, 1, 0, &ov) != FALSE;
      if (had_shared) {
        if (sys().lock_file_ex(as_handle(h), flags, 0, 1, 0, &ov)) return true;
        err = ::GetLastError();
        (void)sys().lock_file_ex(as_handle(h), LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ov);
      }
    }
    if (err == ERROR_LOCK_VIOLATION || err == ERROR_IO_PENDING) return false;
    return win_error(err, "cannot lock", "<cache file>");
  }

  void unlock_in_use(Handle h) noexcept override {
    OVERLAPPED ov{};
    ov.Offset = static_cast<DWORD>(kInUseOffset);
    ov.OffsetHigh = static_cast<DWORD>(kInUseOffset >> 32);
    (void)sys().unlock_file_ex(as_handle(h), 0, 1, 0, &ov);
  }

  // ---- facts ----

  std::size_t map_granularity() const noexcept override { return api().granularity; }
  int process_id() const noexcept override { return static_cast<int>(sys().get_current_process_id()); }
  std::uint64_t file_size_limit() const noexcept override { return UINT64_MAX; }

 private:
  static constexpr std::size_t kMaxIo = std::size_t{1} << 30;

  static Error no_address_space(std::size_t size, DWORD err) {
    return Error{Errc::no_memory, errno_of(err),
                 "cannot reserve " + std::to_string(size >> 20) + " MiB of address space (" + win_message(err) +
                     "); lower max_file_bytes"};
  }

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

  Reservation* find(std::uintptr_t addr) {
    auto it = reservations_.upper_bound(addr);
    if (it == reservations_.begin()) return nullptr;
    --it;
    return addr < it->second.end ? &it->second : nullptr;
  }

  // The reservation holding [start, start+len) if that range is one plain reserved segment's
  // part (the core never maps or commits a range twice). Where the range lies in a lost
  // segment (legacy mode), it is reserved again first if it is free by now: the allocation
  // that took part of the segment may hold none of this range, may be gone, or the reservation
  // may only have failed for a moment.
  Result<Reservation*> find_free_range(std::uintptr_t start, std::size_t len, const char* what) {
    Reservation* res = find(start);
    if (res == nullptr || len == 0 || start + len > res->end || start + len < start)
      return Error{Errc::invalid_argument, EINVAL, std::string(what) + " outside a reservation"};
    auto it = containing(*res, start);
    if (it->second.kind == Kind::lost && it->second.end >= start + len) {
      if (!reclaim(*res, it, start, start + len))
        return Error{Errc::no_memory, ENOMEM,
                     "another allocation took part of the cache's address range (Windows without placeholder "
                     "support maps a file by releasing that range and reserving the rest again)"};
      it = containing(*res, start);
    }
    const Segment& seg = it->second;
    if (seg.kind != Kind::reserved || seg.file != nullptr || seg.end < start + len)
      return Error{Errc::invalid_argument, EINVAL, std::string(what) + " over a used range"};
    return res;
  }

  // Reserves [start, end), a part of the lost segment `it`, again: the whole segment if it is
  // all free, else just that part (the rest stays lost). False if the part is taken.
  bool reclaim(Reservation& res, SegIt it, std::uintptr_t start, std::uintptr_t end) {
    const std::uintptr_t s = it->first, e = it->second.end;
    if (sys().virtual_alloc(reinterpret_cast<void*>(s), e - s, MEM_RESERVE, PAGE_NOACCESS) ==
        reinterpret_cast<void*>(s)) {
      it->second.kind = Kind::reserved;
      return true;
    }
    if (sys().virtual_alloc(reinterpret_cast<void*>(start), end - start, MEM_RESERVE, PAGE_NOACCESS) !=
        reinterpret_cast<void*>(start))
      return false;
    // The new segments are built apart and spliced in, so that running out of memory on the
    // way leaves the bookkeeping as it was.
    std::map<std::uintptr_t, Segment> parts;
    Segment part = it->second;
    part.end = end;
    part.kind = Kind::reserved;
    try {
      if (s < start) parts.emplace(start, part);
      if (end < e) parts.emplace(end, it->second);  // the rest stays lost (its end is e)
    } catch (...) {
      sys().virtual_free(reinterpret_cast<void*>(start), 0, MEM_RELEASE);
      throw;
    }
    if (s < start) it->second.end = start;
    else it->second = part;
    res.segs.merge(parts);
    return true;
  }

  static SegIt containing(Reservation& res, std::uintptr_t addr) {
    auto it = res.segs.upper_bound(addr);
    return std::prev(it);
  }

  void free_segment(std::uintptr_t start, const Segment& seg) noexcept {
    switch (seg.kind) {
      case Kind::view: sys().unmap_view_of_file(reinterpret_cast<void*>(start)); break;
      case Kind::reserved:
      case Kind::committed: sys().virtual_free(reinterpret_cast<void*>(start), 0, MEM_RELEASE); break;
      case Kind::lost: break;
    }
  }

  // ---- placeholder mode ----

  // Splits placeholders so that [start, end) is exactly one segment. The range lies inside one
  // reserved segment; holes keep their file and get the matching offsets.
  Result<SegIt> split(Reservation& res, std::uintptr_t start, std::uintptr_t end) {
    auto it = containing(res, start);
    if (it->first < start) {
      const std::uintptr_t s = it->first;
      if (!sys().virtual_free(reinterpret_cast<void*>(s), start - s, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER))
        return win_error(::GetLastError(), "cannot split the reserved address range at", address_text(start));
      Segment tail = it->second;
      tail.file_offset += start - s;
      it->second.end = start;
      it = res.segs.emplace(start, std::move(tail)).first;
    }
    if (it->second.end > end) {
      if (!sys().virtual_free(reinterpret_cast<void*>(start), end - start, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER))
        return win_error(::GetLastError(), "cannot split the reserved address range at", address_text(start));
      Segment tail = it->second;
      tail.file_offset += end - start;
      it->second.end = end;
      res.segs.emplace(end, std::move(tail));
    }
    return it;
  }

  // Maps [offset, offset + avail) of the file at `start` replacing a placeholder. The caller
  // keeps `avail` within the file, so the view never extends past its end (rounded up to a page:
  // the rest of that page reads as zeros).
  Result<void> place_view(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                          std::uintptr_t start, std::uint64_t avail, bool writable) {
    const std::uint64_t vlen = align_up(avail, api().page);
    const std::uint64_t section_size = offset + avail;
    HANDLE section =
        sys().create_file_mapping_w(file->h, nullptr, writable ? PAGE_READWRITE : PAGE_READONLY,
                                    static_cast<DWORD>(section_size >> 32), static_cast<DWORD>(section_size), nullptr);
    if (section == nullptr) return win_error(::GetLastError(), "cannot create a file mapping for", file->path);
    auto it = split(res, start, start + vlen);
    if (!it) {
      sys().close_handle(section);
      return it.error();
    }
    // The documented view size is a page multiple, but a data section's size is checked byte
    // for byte: when the file ends inside the last page, try its exact size, then "the rest of
    // the section" (0). A failed attempt leaves the placeholder as it was.
    void* v = nullptr;
    DWORD err = 0;
    const std::uint64_t sizes[3] = {vlen, avail, 0};
    for (int i = 0; i < (vlen == avail ? 1 : 3) && v == nullptr; ++i) {
      v = sys().map_view_of_file3(section, ::GetCurrentProcess(), reinterpret_cast<void*>(start), offset,
                                  static_cast<SIZE_T>(sizes[i]), MEM_REPLACE_PLACEHOLDER,
                                  writable ? PAGE_READWRITE : PAGE_READONLY, nullptr, 0);
      if (v == nullptr) err = ::GetLastError();
    }
    sys().close_handle(section);  // the view keeps the mapping object alive
    if (v == nullptr) return win_error(err, "cannot map", file->path);
    Segment& seg = it.value()->second;
    seg.kind = Kind::view;
    seg.file = file;
    seg.file_offset = offset;
    seg.writable = writable;
    return {};
  }

  Result<void> map_placeholder(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                               std::uintptr_t start, std::size_t len, bool writable, std::uint64_t file_size) {
    const std::uint64_t avail = file_size > offset ? std::min<std::uint64_t>(len, file_size - offset) : 0;
    const std::uint64_t vlen = align_up(avail, api().page);
    if (avail > 0)
      if (auto r = place_view(res, file, offset, start, avail, writable); !r) return r;
    if (vlen < len) {
      auto it = split(res, start + vlen, start + len);
      if (!it) return it.error();
      Segment& hole = it.value()->second;
      hole.file = file;
      hole.file_offset = offset + vlen;
      hole.writable = writable;
    }
    return {};
  }

  // ---- legacy mode ----

  // Releases the plain reservation holding [start, end), runs `use` on the freed range (which
  // must claim exactly it), then reserves the rest again. Parts that another thread's
  // allocation took meanwhile are marked lost. Returns use's result; on failure the range is
  // reserved again.
  template <class Use>
  Result<void> carve(Reservation& res, std::uintptr_t start, std::uintptr_t end, Use use) {
    auto it = containing(res, start);
    const std::uintptr_t s = it->first, e = it->second.end;
    Segment proto = it->second;
    if (!sys().virtual_free(reinterpret_cast<void*>(s), 0, MEM_RELEASE))
      return win_error(::GetLastError(), "cannot release the reserved address range at", address_text(s));
    Result<void> r = use();
    res.segs.erase(it);
    auto reserve_again = [&](std::uintptr_t a, std::uintptr_t b) {
      if (a >= b) return;
      Segment seg = proto;
      seg.file_offset += a - s;
      seg.end = b;
      if (sys().virtual_alloc(reinterpret_cast<void*>(a), b - a, MEM_RESERVE, PAGE_NOACCESS) !=
          reinterpret_cast<void*>(a)) {
        seg.kind = Kind::lost;
        seg.file = nullptr;
      }
      res.segs[a] = std::move(seg);
    };
    reserve_again(s, start);
    if (!r) reserve_again(start, end);
    reserve_again(end, e);
    return r;
  }

  Result<void> map_legacy(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                          std::uintptr_t start, std::size_t len, bool writable, std::uint64_t file_size) {
    const std::uint64_t g = api().granularity;
    std::uint64_t avail = file_size > offset ? std::min<std::uint64_t>(len, file_size - offset) : 0;
    // A writable mapping object sized to the chunk grows the file to cover it (what
    // CreateFileMapping does): the bytes past the committed size are free space for the
    // format. A read-only one cannot: its whole 64 KiB granules are mapped and the partial last
    // one, which no view can end inside, becomes a private copy of the file's bytes.
    if (writable) avail = len;
    const std::uint64_t whole = writable ? len : align_down(avail, g);
    if (whole > 0) {
      const std::uint64_t section_size = offset + whole;
      HANDLE section = sys().create_file_mapping_w(file->h, nullptr, writable ? PAGE_READWRITE : PAGE_READONLY,
                                                   static_cast<DWORD>(section_size >> 32),
                                                   static_cast<DWORD>(section_size), nullptr);
      if (section == nullptr) return win_error(::GetLastError(), "cannot create a file mapping for", file->path);
      DWORD err = 0;
      auto r = carve(res, start, start + whole, [&]() -> Result<void> {
        void* v = sys().map_view_of_file_ex(section, writable ? FILE_MAP_READ | FILE_MAP_WRITE : FILE_MAP_READ,
                                            static_cast<DWORD>(offset >> 32), static_cast<DWORD>(offset),
                                            static_cast<SIZE_T>(whole), reinterpret_cast<void*>(start));
        if (v == reinterpret_cast<void*>(start)) return {};
        err = ::GetLastError();
        if (v != nullptr) sys().unmap_view_of_file(v);
        return win_error(err != 0 ? err : ERROR_INVALID_ADDRESS, "cannot map", file->path);
      });
      sys().close_handle(section);
      if (!r) return r;
      Segment& seg = res.segs[start];
      seg.end = start + whole;
      seg.kind = Kind::view;
      seg.file = file;
      seg.file_offset = offset;
      seg.writable = writable;
    }
    if (whole < len) {
      // The tail: committed memory holding a copy of the file's bytes, refreshed by fill_holes.
      const std::uintptr_t t = start + whole;
      auto r = commit_locked(res, t, len - whole);
      if (!r) return r;
      Segment& seg = res.segs[t];
      seg.file = file;
      seg.file_offset = offset + whole;
      return refresh_copy(t, seg);
    }
    return {};
  }

  // Re-reads a legacy tail copy from its file, up to the file's current size.
  Result<void> refresh_copy(std::uintptr_t start, const Segment& seg) {
    std::uint64_t size = 0;
    if (!file_size_of(seg.file->h, &size)) return win_error(::GetLastError(), "cannot query", seg.file->path);
    if (size <= seg.file_offset) return {};
    const std::uint64_t n = std::min<std::uint64_t>(size - seg.file_offset, seg.end - start);
    return read_at(reinterpret_cast<Handle>(seg.file->h), reinterpret_cast<void*>(start), static_cast<std::size_t>(n),
                   seg.file_offset);
  }

  Result<void> commit_locked(Reservation& res, std::uintptr_t start, std::size_t len) {
    const Api& a = api();
    if (a.placeholders) {
      auto it = split(res, start, start + len);
      if (!it) return it.error();
      if (sys().virtual_alloc2(::GetCurrentProcess(), reinterpret_cast<void*>(start), len,
                               MEM_RESERVE | MEM_COMMIT | MEM_REPLACE_PLACEHOLDER, PAGE_READWRITE, nullptr,
                               0) == nullptr) {
        const DWORD err = ::GetLastError();
        return Error{Errc::no_memory, errno_of(err),
                     "cannot commit " + std::to_string(len) + " bytes of heap memory: " + win_message(err)};
      }
      it.value()->second.kind = Kind::committed;
      return {};
    }
    DWORD err = 0;
    auto r = carve(res, start, start + len, [&]() -> Result<void> {
      void* p = sys().virtual_alloc(reinterpret_cast<void*>(start), len, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
      if (p == reinterpret_cast<void*>(start)) return {};
      err = ::GetLastError();
      if (p != nullptr) sys().virtual_free(p, 0, MEM_RELEASE);
      return Error{Errc::no_memory, errno_of(err), "cannot commit " + std::to_string(len) + " bytes of heap memory"};
    });
    if (!r) return r;
    Segment& seg = res.segs[start];
    seg.end = start + len;
    seg.kind = Kind::committed;
    seg.file = nullptr;
    seg.file_offset = 0;
    return {};
  }

  // ---- holes ----

  Result<void> fill_holes(std::uint64_t device, std::uint64_t inode) {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return fill_holes_locked(device, inode);
    } catch (...) {
      return Error{Errc::no_memory, ENOMEM, "out of memory while mapping the cache"};
    }
  }

  // Backs every hole (placeholder mode) or refreshes every tail copy (legacy mode) of the file
  // (device, inode) up to its current size.
  Result<void> fill_holes_locked(std::uint64_t device, std::uint64_t inode) {
    for (auto& [base, res] : reservations_) {
      for (auto it = res.segs.begin(); it != res.segs.end(); ++it) {
        Segment& seg = it->second;
        if (seg.file == nullptr || seg.file->device != device || seg.file->inode != inode) continue;
        if (seg.kind == Kind::committed) {
          if (auto r = refresh_copy(it->first, seg); !r) return r;
          continue;
        }
        if (seg.kind != Kind::reserved) continue;
        std::uint64_t size = 0;
        if (!file_size_of(seg.file->h, &size)) return win_error(::GetLastError(), "cannot query", seg.file->path);
        if (size <= seg.file_offset) continue;
        const std::uint64_t avail = std::min<std::uint64_t>(size - seg.file_offset, seg.end - it->first);
        const std::uintptr_t start = it->first;
        auto file = seg.file;
        const bool writable = seg.writable;
        const std::uint64_t offset = seg.file_offset;
        if (auto r = place_view(res, file, offset, start, avail, writable); !r) return r;
        it = res.segs.find(start);  // place_view split the segment: continue after the new view
      }
    }
    return {};
  }

  std::mutex mu_;
  std::map<std::uintptr_t, Reservation> reservations_;
};

}  // namespace

Platform& os() noexcept {
  static Win32Platform platform;
  return platform;
}

Win32Calls& win32_calls() noexcept { return calls_in_use(); }
const Win32Calls& default_win32_calls() noexcept { return defaults(); }

std::uint64_t fork_generation() noexcept { return 0; }  // no fork on Windows

}  // namespace weightcache::platform
