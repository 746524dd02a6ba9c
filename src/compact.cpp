#include "compact.hpp"

#include "core.hpp"
#include "log.hpp"
#include "mobile.hpp"
#include "platform/errors.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <new>

namespace weightcache {
namespace {

constexpr std::size_t kCopyChunk = 4u << 20;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }
std::uint64_t region_of(std::uint64_t size, std::uint64_t size_alignment) {
  return align_up(std::max<std::uint64_t>(size, 1), size_alignment);
}

}  // namespace

// ---- TempFile ----------------------------------------------------------------------------------

Result<TempFile> TempFile::create(platform::Platform& pf, const std::string& path, unsigned mode) {
  static std::atomic<unsigned> counter{0};
  try {
    std::string tmp = path + ".tmp." + std::to_string(pf.process_id()) + "." + std::to_string(counter.fetch_add(1));
    pf.remove(tmp);  // a leftover of a process that had our pid and died
    auto f = pf.open_file(tmp, platform::OpenMode::create_new, mode, false);
    if (!f) return f.error();
    return TempFile(pf, path, std::move(f).value());
  } catch (const std::bad_alloc&) {
    return platform::no_memory_error("out of memory while naming a temporary file for", path);
  }
}

TempFile::TempFile(TempFile&& o) noexcept
    : pf_(o.pf_), path_(std::move(o.path_)), file_(std::move(o.file_)), committed_(o.committed_) {
  o.committed_ = true;  // the moved-from object owns nothing
}

TempFile::~TempFile() {
  file_.close();
  if (!committed_) pf_->remove(file_.path());
}

Result<void> TempFile::commit(bool durable) {
  if (durable)
    if (auto r = pf_->sync(file_); !r) return r.error();
  file_.close();
  if (auto r = pf_->rename(file_.path(), path_); !r) return r.error();
  committed_ = true;
  if (durable)
    if (auto r = pf_->sync_parent_dir(path_); !r)
      return Error{r.error().code, r.error().sys_errno,
                   "'" + path_ + "' was replaced, but its directory could not be synced: " + r.error().message};
  return {};
}

// ---- writing a whole file ------------------------------------------------------------------------

std::uint64_t planned_file_size(const std::vector<SourceEntry>& entries, std::uint64_t alignment,
                                std::uint64_t size_alignment) noexcept {
  // Same placement as the library's writer: each region starts on the alignment and spans its
  // size rounded up to size_alignment (at least one byte, so no two entries share an offset);
  // the index follows on an 8-byte boundary.
  std::uint64_t cursor = format::kHeaderSize;
  std::uint64_t index_bytes = format::kIndexHeaderSize + format::kFooterSize;
  for (const auto& e : entries) {
    cursor = align_up(cursor, alignment) + region_of(e.size, size_alignment);
    index_bytes += format::kRecordFixedSize + e.key.size();
  }
  return align_up(cursor, 8) + index_bytes;
}

namespace {

// Hashes `size` bytes at `offset` of `fd`, handing each piece to `sink` (may be null).
template <class Sink>
Result<std::uint64_t> hash_range(platform::Platform& pf, const platform::File& fd, std::uint64_t offset,
                                 std::uint64_t size, std::byte* buf, Sink&& sink) {
  format::StreamHash h;
  if (!h.ok()) return Error{Errc::no_memory, 0, "out of memory while hashing"};
  for (std::uint64_t done = 0; done < size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kCopyChunk, size - done));
    if (auto r = pf.read_at(fd, buf, n, offset + done); !r) return r.error();
    h.update(buf, n);
    if (auto r = sink(buf, n, done); !r) return r.error();
    done += n;
  }
  return h.digest();
}

// Reads the new file back before it replaces anything: the header, the one commit slot and the
// index decode to exactly what was written, and every entry hashes to its checksum.
Result<void> read_back(platform::Platform& pf, TempFile& dst, const WrittenFile& w, std::byte* buf,
                       const std::function<void(std::uint64_t)>& progress) {
  auto st = read_committed(pf, dst.file(), w.file_size, UINT64_MAX, 0);
  if (!st)  // out of memory is not a bad file: say which it was
    return Error{st.error().code == Errc::no_memory ? Errc::no_memory : Errc::io, 0,
                 "the new file '" + dst.name() + "' does not read back: " + st.error().message};
  if (st->records.size() != w.records.size())
    return Error{Errc::io, 0, "the new file '" + dst.name() + "' reads back with other entries"};
  for (std::size_t i = 0; i < w.records.size(); ++i) {
    const auto& a = st->records[i];
    const auto& b = w.records[i];
    if (a.key != b.key || a.offset != b.offset || a.size != b.size || a.checksum != b.checksum)
      return Error{Errc::io, 0, "the new file '" + dst.name() + "' reads back with another index"};
    auto h = hash_range(pf, dst.file(), a.offset, a.size, buf,
                        [&](const std::byte*, std::size_t n, std::uint64_t) -> Result<void> {
                          if (progress) progress(n);
                          return {};
                        });
    if (!h) return h.error();
    if (h.value() != a.checksum)
      return Error{Errc::io, 0, "the new file '" + dst.name() + "' reads back with other bytes"};
  }
  return {};
}

}  // namespace

Result<void> write_cache_file(platform::Platform& pf, const platform::File& src, TempFile& dst,
                              const format::HeaderFixed& fixed, std::uint64_t sequence,
                              const std::vector<SourceEntry>& entries, WrittenFile* out,
                              const std::function<void(std::uint64_t)>& progress) {
  try {
    std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[kCopyChunk]);
    if (buf == nullptr) return Error{Errc::no_memory, 0, "out of memory for the copy buffer"};
    const std::uint64_t planned = planned_file_size(entries, fixed.alignment, fixed.size_alignment);
    // Claim the space up front: a full disk fails here, before any copying.
    if (auto r = pf.allocate(dst.file(), 0, planned); !r) return r.error();
    std::uint64_t cursor = format::kHeaderSize;
    out->records.reserve(entries.size());
    for (const auto& e : entries) {
      const std::uint64_t at = align_up(cursor, fixed.alignment);
      auto h = hash_range(pf, src, e.offset, e.size, buf.get(),
                          [&](const std::byte* p, std::size_t n, std::uint64_t done) {
                            if (progress) progress(n);
                            return pf.write_at(dst.file(), p, n, at + done);
                          });
      if (!h)
        return Error{h.error().code, h.error().sys_errno, "copying from '" + src.path() + "': " + h.error().message};
      if (e.checksum && *e.checksum != h.value()) {
        out->corrupt_keys.push_back(e.key);
        continue;  // its region is reused by the next entry
      }
      out->records.push_back({e.key, at, e.size, h.value()});
      cursor = at + region_of(e.size, fixed.size_alignment);
    }
    format::CommitSlot slot;
    slot.sequence = sequence;
    const auto trailer = format::encode_trailer(out->records, align_up(cursor, 8), &slot);
    // The slot a reader of this sequence expects it in when there is only one (docs/FORMAT.md).
    const auto header = sequence % 2 == 0 ? format::encode_header(fixed, slot, {}) : format::encode_header(fixed, {}, slot);
    if (auto r = pf.write_at(dst.file(), trailer.data(), trailer.size(), slot.index_offset); !r) return r.error();
    if (auto r = pf.write_at(dst.file(), header.data(), header.size(), 0); !r) return r.error();
    if (slot.committed_size < planned)  // entries were left out
      if (auto r = pf.truncate(dst.file(), slot.committed_size); !r) return r.error();
    out->file_size = slot.committed_size;
    return read_back(pf, dst, *out, buf.get(), progress);
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while writing '" + dst.name() + "'"};
  }
}

// ---- compaction ----------------------------------------------------------------------------------

std::uint64_t dead_bytes_of(const CommittedState& st, std::uint64_t file_size) noexcept {
  try {
    // The writer's placement of these entries in file order, as planned_file_size, without
    // copying a key: an open pays this for every entry of the index.
    std::vector<const format::IndexRecord*> order;
    order.reserve(st.records.size());
    for (const auto& r : st.records) order.push_back(&r);
    const auto by_offset = [](const format::IndexRecord* a, const format::IndexRecord* b) { return a->offset < b->offset; };
    if (!std::is_sorted(order.begin(), order.end(), by_offset)) std::sort(order.begin(), order.end(), by_offset);
    std::uint64_t cursor = format::kHeaderSize;
    std::uint64_t index_bytes = format::kIndexHeaderSize + format::kFooterSize;
    for (const format::IndexRecord* r : order) {
      cursor = align_up(cursor, st.fixed.alignment) + region_of(r->size, st.fixed.size_alignment);
      index_bytes += format::kRecordFixedSize + r->key.size();
    }
    const std::uint64_t planned = align_up(cursor, 8) + index_bytes;
    return file_size > planned ? file_size - planned : 0;
  } catch (...) {
    return 0;  // out of memory: nothing is reclaimed now
  }
}

Result<void> rewrite_compacted(platform::Platform& pf, const platform::File& fd, const CommittedState& st,
                               std::uint64_t file_size, unsigned file_mode, const CompactSettings& settings,
                               CompactResult* out, const std::function<void()>& let_go) {
  const std::string& path = fd.path();  // stays when let_go closes fd
  try {
    out->bytes_before = file_size;
    out->entries = st.records.size();
    if (st.newest_damaged && !settings.salvage)
      return Error{Errc::corrupt, 0,
                   "the newest commit of '" + path + "' is damaged; compacting would discard what it names "
                   "(see 'weightcache verify')"};
    std::vector<SourceEntry> entries;
    entries.reserve(st.records.size());
    for (const auto& r : st.records) entries.push_back({r.key, r.offset, r.size, r.checksum});
    if (settings.canonical && !kMobileBuild) {  // compact_path refuses it in a mobile build
      std::sort(entries.begin(), entries.end(), [](const SourceEntry& a, const SourceEntry& b) { return a.key < b.key; });
    } else {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const SourceEntry& a, const SourceEntry& b) { return a.offset < b.offset; });
      const std::uint64_t planned = planned_file_size(entries, st.fixed.alignment, st.fixed.size_alignment);
      if (planned >= file_size && !settings.salvage) {
        // Nothing to reclaim, but a damaged entry still makes this a refusal (or, told to drop
        // damaged entries, a rewrite without them), as it would if there were.
        std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[kCopyChunk]);
        if (buf == nullptr) return Error{Errc::no_memory, 0, "out of memory for the read buffer"};
        std::vector<std::string> damaged;
        for (const auto& e : entries) {
          auto h = hash_range(pf, fd, e.offset, e.size, buf.get(),
                              [](const std::byte*, std::size_t, std::uint64_t) -> Result<void> { return {}; });
          if (!h) return h.error();
          if (e.checksum && h.value() != *e.checksum) damaged.push_back(e.key);
        }
        if (damaged.empty()) {
          out->bytes_after = file_size;
          return {};
        }
        if (!settings.drop_corrupt) {
          out->corrupt_keys = std::move(damaged);
          return Error{Errc::corrupt, 0,
                       std::to_string(out->corrupt_keys.size()) + " entries of '" + path +
                           "' fail their checksum; not compacted (drop them to compact anyway)"};
        }
      }
    }
    auto tmp = TempFile::create(pf, path, file_mode);
    if (!tmp) return tmp.error();
    WrittenFile w;
    // The next sequence, so that nothing that remembers the old file's sequence sees it go back.
    const std::uint64_t sequence =
        settings.canonical || st.slot.sequence + 1 == UINT64_MAX ? 1 : st.slot.sequence + 1;
    if (auto r = write_cache_file(pf, fd, tmp.value(), st.fixed, sequence, entries, &w); !r) return r.error();
    out->corrupt_keys = w.corrupt_keys;
    if (!w.corrupt_keys.empty() && !settings.drop_corrupt)
      return Error{Errc::corrupt, 0,
                   std::to_string(w.corrupt_keys.size()) + " entries of '" + path +
                       "' fail their checksum; not compacted (drop them to compact anyway)"};
    if (!pf.replaces_open_files() && let_go) let_go();
    if (auto r = tmp->commit(settings.durability != Durability::none); !r) return r.error();
    out->rewritten = true;
    out->entries = w.records.size();
    out->dropped = w.corrupt_keys.size();
    out->bytes_after = w.file_size;
    return {};
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while compacting '" + path + "'"};
  }
}

Result<CompactResult> compact_path(const Options& options, const CompactSettings& settings) {
  try {
    platform::Platform& pf = platform::os();
    if (options.path.empty()) return Error{Errc::invalid_argument, 0, "compact: no path given"};
    if (kMobileBuild && settings.canonical)
      return left_out_of_mobile_build("canonical compaction (WC_COMPACT_CANONICAL)",
                                      "make the canonical file where the prebuilt cache is built, with the weightcache "
                                      "command-line tool ('weightcache compact --canonical FILE')");
    if (options.path == kMemoryPath)
      return Error{Errc::invalid_argument, 0,
                   "a ':memory:' cache has no file to compact (it lives only while processes hold it open)"};
    const std::string& path = options.path;
    auto opened = pf.open_file(path, platform::OpenMode::read_write, options.file_mode, options.allow_symlink);
    if (!opened) return opened.error();
    platform::File& fd = opened.value();
    auto info = pf.stat_file(fd);
    if (!info) return info.error();
    if (!info->regular) return Error{Errc::invalid_argument, 0, "'" + path + "' is not a regular file"};
    // The writer lease first (the order every writer takes), then the in-use lock: nobody may
    // commit while we copy, and nobody may have the file open when it is replaced.
    auto lk = pf.open_file(path + ".lock", platform::OpenMode::lock_file, info->mode, options.allow_symlink);
    if (!lk) return lk.error();
    auto lease = platform::Lease::try_take(std::move(lk).value());
    if (!lease) return lease.error();
    auto data = lease->held() ? pf.try_lock(fd) : Result<bool>(false);
    if (!data) return data.error();
    if (!data.value())
      return Error{Errc::busy, 0,
                   "'" + path + "' is busy: a writer holds its lease ('" + path +
                       ".lock'). Run again once the process adding entries has finished."};
    auto alone = pf.try_lock_in_use(fd, true);
    if (!alone) return alone.error();
    if (!alone.value())
      return Error{Errc::busy, 0,
                   "'" + path + "' is in use: another process has it open. It is compacted by the next open that "
                   "finds it unused, or run again once no process uses it."};
    // Locked: the path must still name what we locked (not replaced meanwhile).
    auto at_path = pf.stat_path(path, options.allow_symlink);
    if (!at_path || at_path->inode != info->inode || at_path->device != info->device)
      return Error{Errc::busy, 0, "'" + path + "' was replaced while it was being locked; run again"};
    if (info->size < format::kHeaderSize)
      return Error{Errc::corrupt, 0, "'" + path + "' is shorter than a cache file's header"};
    auto st = read_committed(pf, fd, info->size, UINT64_MAX, 0);
    if (!st) return Error{st.error().code, st.error().sys_errno, "'" + path + "': " + st.error().message};
    if (!settings.any_key && st->fixed.compat_hash != format::hash_bytes(options.compat_key))
      return Error{Errc::incompatible, 0, "'" + path + "' was written for another compatibility key"};
    CompactResult out;
    // The data file's locks go with it; the lease is given back when `lease` goes.
    if (auto r = rewrite_compacted(pf, fd, st.value(), info->size, info->mode, settings, &out, [&] { fd.close(); }); !r)
      return r.error();
    if (out.rewritten)
      log::info("compacted '{}': {} -> {} bytes, {} entries", path, out.bytes_before, out.bytes_after, out.entries);
    return out;
  } catch (const std::bad_alloc&) {
    return platform::no_memory_error("out of memory while compacting", options.path);
  }
}

}  // namespace weightcache
