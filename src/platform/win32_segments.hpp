// The Windows platform's address space: the ranges reserved for caches and what each part of
// them holds (a view of a file, private memory, a placeholder, a hole the file has not reached
// yet), kept apart from the rest of the Win32 platform (win32.cpp), which uses it for
// reserve_address_space, map_file, commit_memory and flush_mapping.
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
#pragma once

#include "platform/platform.hpp"
#include "platform/win32_calls.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace weightcache::platform::win32 {

// How this system maps files: probed once, on first use, through the call table.
struct Api {
  bool placeholders = false;  // probed: the calls exist and work as documented
  std::size_t page = 4096;
  std::size_t granularity = 65536;
};
const Api& api();

// Our own duplicate of a mapped file's handle: views and holes outlive the core's File, and
// must never follow a recycled handle value to another file.
struct FileRef {
  HANDLE h = nullptr;
  std::uint64_t device = 0, inode = 0;
  std::string path;  // of the File it duplicates, for messages
  ~FileRef();  // closes h
};

// A part of a view of a file, as flush_mapping writes it back.
struct MappedView {
  std::uintptr_t start = 0;
  std::size_t len = 0;
  std::shared_ptr<FileRef> file;
};

// The reservations and what each part of them holds. Thread-safe: one lock over all of it.
class Segments {
 public:
  // Reserves `size` bytes of address space aligned to `align` (both rounded up to the
  // allocation granularity).
  Result<void*> reserve(std::size_t size, std::size_t align);
  // Releases the reservation at `base` and everything mapped or committed inside it.
  void release(void* base) noexcept;
  // Maps [offset, offset+len) of the file `f` at `at`, a part of a reservation nothing uses yet.
  Result<void> map(const File& f, std::uint64_t offset, std::size_t len, void* at, bool writable);
  // Makes [at, at+len), a part of a reservation nothing uses yet, private zeroed memory.
  Result<void> commit(void* at, std::size_t len);
  // The parts of views inside [addr, addr+len), each with its file. Only the core that owns
  // these views can release them, and it is the caller: they stay valid while it flushes them.
  Result<std::vector<MappedView>> views_in(void* addr, std::size_t len);
  // Backs every hole (placeholder mode) or refreshes every tail copy (legacy mode) of the file
  // (device, inode) up to its current size.
  Result<void> fill_holes(std::uint64_t device, std::uint64_t inode);

 private:
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

  Result<bool> add_reservation_if_apart(std::uintptr_t base, std::size_t size);
  Result<void> add_reservation(std::uintptr_t base, std::size_t size);
  Result<void*> reserve_legacy(std::size_t size, std::size_t align);
  // The reservation holding addr. Reservations never overlap (add_reservation_if_apart).
  Reservation* find(std::uintptr_t addr);
  Result<Reservation*> find_free_range(std::uintptr_t start, std::size_t len, const char* what);
  template <class Use>
  Result<void> in_free_range(void* at, std::size_t len, const char* what, const char* out_of_memory, Use use);
  bool reclaim(Reservation& res, SegIt it, std::uintptr_t start, std::uintptr_t end);
  static SegIt containing(Reservation& res, std::uintptr_t addr);
  void free_segment(std::uintptr_t start, const Segment& seg) noexcept;
  Result<SegIt> split(Reservation& res, std::uintptr_t start, std::uintptr_t end);
  Result<void> place_view(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                          std::uintptr_t start, std::uint64_t avail, bool writable);
  Result<void> map_placeholder(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                               std::uintptr_t start, std::size_t len, bool writable, std::uint64_t file_size);
  template <class Use>
  Result<void> carve(Reservation& res, std::uintptr_t start, std::uintptr_t end, Use use);
  Result<void> map_legacy(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
                          std::uintptr_t start, std::size_t len, bool writable, std::uint64_t file_size);
  Result<void> refresh_copy(std::uintptr_t start, const Segment& seg);
  Result<void> commit_locked(Reservation& res, std::uintptr_t start, std::size_t len);
  Result<void> fill_holes_locked(std::uint64_t device, std::uint64_t inode);

  std::mutex mu_;
  std::map<std::uintptr_t, Reservation> reservations_;
};

}  // namespace weightcache::platform::win32
