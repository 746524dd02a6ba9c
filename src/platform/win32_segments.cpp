#include "platform/win32_segments.hpp"

#include "platform/win32_common.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

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

namespace weightcache::platform::win32 {
namespace {

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

// An address in a message about the address space itself (no file is involved).
std::string address_text(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

Error no_address_space(std::size_t size, DWORD err) {
  return Error{Errc::no_memory, errno_of(err),
               "cannot reserve " + std::to_string(size >> 20) + " MiB of address space (" + win_message(err) +
                   "); lower max_file_bytes"};
}

}  // namespace

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

FileRef::~FileRef() {
  if (h != nullptr) sys().close_handle(h);
}

Result<void*> Segments::reserve(std::size_t size, std::size_t align) {
  const Api& a = api();
  align = std::max<std::size_t>(align, a.granularity);
  size = static_cast<std::size_t>(align_up(size, a.granularity));
  if (!a.placeholders) return reserve_legacy(size, align);
  std::uintptr_t base = 0;
  {
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
  }
  if (auto r = add_reservation(base, size); !r) {
    sys().virtual_free(reinterpret_cast<void*>(base), 0, MEM_RELEASE);
    return r.error();
  }
  return reinterpret_cast<void*>(base);
}

// Records [base, base+size) as a reservation of ours, unless it overlaps one (under the same
// lock as every carve, so the answer cannot change before the record is made).
Result<bool> Segments::add_reservation_if_apart(std::uintptr_t base, std::size_t size) {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = reservations_.lower_bound(base);
    if (next != reservations_.end() && next->first < base + size) return false;
    if (next != reservations_.begin() && std::prev(next)->second.end > base) return false;
    Reservation r;
    r.end = base + size;
    r.segs[base] = Segment{base + size, Kind::reserved, nullptr, 0, false};
    reservations_[base] = std::move(r);
    return true;
  } catch (...) {
    return Error{Errc::no_memory, ENOMEM, "out of memory while reserving address space"};
  }
}

Result<void> Segments::add_reservation(std::uintptr_t base, std::size_t size) {
  auto r = add_reservation_if_apart(base, size);
  if (!r) return r.error();
  if (!r.value())
    return Error{Errc::invalid_argument, EINVAL,
                 "the system reserved address space at " + address_text(base) + " twice"};
  return {};
}

// Legacy mode: find an aligned range, then reserve exactly it; another thread may take it in
// between. A range may also come back that lies in a part of one of our reservations that a
// carve lost to another allocation and that is free again: taking it would put two
// reservations over one address, and the owner of the lost part would carve into the new one
// (find() cannot tell them apart). Such ranges are held until a range apart from all of ours is
// found, so the search does not get them again, and then given back; the owner of the lost part
// may reclaim it then.
Result<void*> Segments::reserve_legacy(std::size_t size, std::size_t align) {
  DWORD err = ERROR_NOT_ENOUGH_MEMORY;
  std::vector<std::uintptr_t> held;
  struct GiveBack {
    std::vector<std::uintptr_t>& held;
    ~GiveBack() {
      for (std::uintptr_t h : held) sys().virtual_free(reinterpret_cast<void*>(h), 0, MEM_RELEASE);
    }
  } give_back{held};
  for (int attempt = 0; attempt < 16; ++attempt) {
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
    if (sys().virtual_alloc(reinterpret_cast<void*>(want), size, MEM_RESERVE, PAGE_NOACCESS) !=
        reinterpret_cast<void*>(want))
      continue;
    auto added = add_reservation_if_apart(want, size);
    if (added && added.value()) return reinterpret_cast<void*>(want);
    if (added) {
      try {
        held.push_back(want);
        continue;
      } catch (...) {
        added = Error{Errc::no_memory, ENOMEM, "out of memory while reserving address space"};
      }
    }
    sys().virtual_free(reinterpret_cast<void*>(want), 0, MEM_RELEASE);
    return added.error();
  }
  return no_address_space(size, err);
}

void Segments::release(void* base) noexcept {
  if (base == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == reservations_.end()) return;
  for (auto& [start, seg] : it->second.segs) free_segment(start, seg);
  reservations_.erase(it);
}

// Runs use(reservation, start) under the lock, where [at, at+len) is a free part of that
// reservation (find_free_range; `what` names the call in its errors). Running out of memory on
// the way is the error `out_of_memory`.
template <class Use>
Result<void> Segments::in_free_range(void* at, std::size_t len, const char* what, const char* out_of_memory,
                                     Use use) {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    const auto start = reinterpret_cast<std::uintptr_t>(at);
    auto found = find_free_range(start, len, what);
    if (!found) return found.error();
    return use(*found.value(), start);
  } catch (...) {
    return Error{Errc::no_memory, ENOMEM, out_of_memory};
  }
}

Result<void> Segments::map(const File& f, std::uint64_t offset, std::size_t len, void* at, bool writable) {
  return in_free_range(at, len, "map_file", "out of memory while mapping the cache",
                       [&](Reservation& res, std::uintptr_t start) -> Result<void> {
    auto file = std::make_shared<FileRef>();
    file->path = f.path();
    if (!sys().duplicate_handle(::GetCurrentProcess(), reinterpret_cast<HANDLE>(f.handle()), ::GetCurrentProcess(),
                                &file->h, 0, FALSE, DUPLICATE_SAME_ACCESS)) {
      file->h = nullptr;
      return win_error(::GetLastError(), "cannot duplicate the handle of", file->path);
    }
    FileInfo info;
    if (!info_of(file->h, &info)) return win_error(::GetLastError(), "cannot query", file->path);
    file->device = info.device;
    file->inode = info.inode;
    auto r = api().placeholders ? map_placeholder(res, file, offset, start, len, writable, info.size)
                                : map_legacy(res, file, offset, start, len, writable, info.size);
    if (!r) return r;
    return fill_holes_locked(info.device, info.inode);
  });
}

Result<void> Segments::commit(void* at, std::size_t len) {
  return in_free_range(at, len, "commit_memory", "out of memory while committing heap memory",
                       [&](Reservation& res, std::uintptr_t start) { return commit_locked(res, start, len); });
}

Result<std::vector<MappedView>> Segments::views_in(void* addr, std::size_t len) {
  std::vector<MappedView> parts;
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
  return parts;
}

Segments::Reservation* Segments::find(std::uintptr_t addr) {
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
Result<Segments::Reservation*> Segments::find_free_range(std::uintptr_t start, std::size_t len, const char* what) {
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
bool Segments::reclaim(Reservation& res, SegIt it, std::uintptr_t start, std::uintptr_t end) {
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

Segments::SegIt Segments::containing(Reservation& res, std::uintptr_t addr) {
  auto it = res.segs.upper_bound(addr);
  return std::prev(it);
}

void Segments::free_segment(std::uintptr_t start, const Segment& seg) noexcept {
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
Result<Segments::SegIt> Segments::split(Reservation& res, std::uintptr_t start, std::uintptr_t end) {
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
Result<void> Segments::place_view(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
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

Result<void> Segments::map_placeholder(Reservation& res, const std::shared_ptr<FileRef>& file,
                                       std::uint64_t offset, std::uintptr_t start, std::size_t len, bool writable,
                                       std::uint64_t file_size) {
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
Result<void> Segments::carve(Reservation& res, std::uintptr_t start, std::uintptr_t end, Use use) {
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

Result<void> Segments::map_legacy(Reservation& res, const std::shared_ptr<FileRef>& file, std::uint64_t offset,
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
Result<void> Segments::refresh_copy(std::uintptr_t start, const Segment& seg) {
  std::uint64_t size = 0;
  if (!file_size_of(seg.file->h, &size)) return win_error(::GetLastError(), "cannot query", seg.file->path);
  if (size <= seg.file_offset) return {};
  const std::uint64_t n = std::min<std::uint64_t>(size - seg.file_offset, seg.end - start);
  return read_file_at(seg.file->h, seg.file->path, reinterpret_cast<void*>(start), static_cast<std::size_t>(n),
                      seg.file_offset);
}

Result<void> Segments::commit_locked(Reservation& res, std::uintptr_t start, std::size_t len) {
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

Result<void> Segments::fill_holes(std::uint64_t device, std::uint64_t inode) {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    return fill_holes_locked(device, inode);
  } catch (...) {
    return Error{Errc::no_memory, ENOMEM, "out of memory while mapping the cache"};
  }
}

// Backs every hole (placeholder mode) or refreshes every tail copy (legacy mode) of the file
// (device, inode) up to its current size.
Result<void> Segments::fill_holes_locked(std::uint64_t device, std::uint64_t inode) {
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

}  // namespace weightcache::platform::win32
