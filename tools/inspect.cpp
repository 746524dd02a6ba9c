#include "inspect.hpp"

#include "output.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>
#include <unordered_map>

namespace weightcache::cli {
namespace {

namespace fmt_ = weightcache::format;

// Large enough to keep the disk streaming, small enough that the tool never holds much memory.
constexpr std::size_t kChunk = std::size_t{8} << 20;
constexpr std::size_t kReaderBuffer = std::size_t{1} << 20;

std::uint32_t bswap32(std::uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xFF00u) | ((v << 8) & 0xFF0000u) | (v << 24);
}
std::uint64_t bswap64(std::uint64_t v) {
  return (static_cast<std::uint64_t>(bswap32(static_cast<std::uint32_t>(v))) << 32) |
         bswap32(static_cast<std::uint32_t>(v >> 32));
}

std::string quoted(std::string_view key) { return "'" + display_key(key) + "'"; }

void add(Inspection* in, std::string kind, std::string message, std::optional<std::string> key = std::nullopt) {
  in->findings.push_back({std::move(kind), std::move(message), std::move(key)});
}

// Reads [begin, end) of a file front to back through a small buffer: the XPWC index has no
// size field we could trust before parsing it.
class SequentialReader {
 public:
  SequentialReader(const File& f, std::uint64_t begin, std::uint64_t end)
      : file_(f), pos_(begin), end_(end), buf_(kReaderBuffer) {}

  std::uint64_t position() const noexcept { return pos_; }
  std::uint64_t remaining() const noexcept { return end_ - pos_; }

  /// false (nothing consumed) when fewer than n bytes remain.
  Result<bool> read(void* out, std::size_t n) {
    if (n > remaining()) return false;
    auto* dst = static_cast<std::byte*>(out);
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_len_) {
        buf_start_ = pos_;
        buf_len_ = static_cast<std::size_t>(std::min<std::uint64_t>(buf_.size(), end_ - pos_));
        if (auto r = platform::os().read_at(file_.handle(), buf_.data(), buf_len_, buf_start_); !r) {
          buf_len_ = 0;
          return r.error();
        }
      }
      const std::size_t at = static_cast<std::size_t>(pos_ - buf_start_);
      const std::size_t take = std::min(n, buf_len_ - at);
      std::memcpy(dst, buf_.data() + at, take);
      dst += take;
      n -= take;
      pos_ += take;
    }
    return true;
  }

 private:
  const File& file_;
  std::uint64_t pos_, end_;
  std::vector<std::byte> buf_;
  std::uint64_t buf_start_ = 0;
  std::size_t buf_len_ = 0;
};

Result<std::vector<std::byte>> read_bytes(const File& f, std::uint64_t offset, std::uint64_t size) {
  std::vector<std::byte> b(static_cast<std::size_t>(size));
  if (auto r = platform::os().read_at(f.handle(), b.data(), b.size(), offset); !r) return r.error();
  return b;
}

// Bounds, alignment, duplicate keys and overlaps: the rules decode_trailer applies, but every
// violation is reported (decode_trailer stops at the first), with the keys involved.
void check_layout(Inspection* in, std::uint64_t begin, std::uint64_t end, std::uint64_t alignment) {
  auto& es = in->entries;
  std::unordered_map<std::string_view, std::size_t> seen;
  for (auto& e : es) {
    if (e.offset < begin || e.offset > end || e.size > end - e.offset) {
      e.in_bounds = false;
      add(in, "entry_bounds",
          "entry " + quoted(e.key) + " (offset " + std::to_string(e.offset) + ", " + std::to_string(e.size) +
              " bytes) lies outside the data area [" + std::to_string(begin) + ", " + std::to_string(end) + ")",
          e.key);
    } else if (alignment > 1 && e.offset % alignment != 0) {
      add(in, "entry_alignment",
          "entry " + quoted(e.key) + " (offset " + std::to_string(e.offset) + ") is not aligned to " +
              std::to_string(alignment),
          e.key);
    }
    if (!seen.emplace(e.key, 0).second)
      add(in, "duplicate_key", "key " + quoted(e.key) + " appears more than once in the index", e.key);
  }
  std::vector<const Entry*> order;
  for (const auto& e : es)
    if (e.in_bounds) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
  });
  // The entry reaching furthest so far: an overlap with any earlier entry implies one with it.
  const Entry* reach = nullptr;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    const Entry* other = nullptr;
    if (reach != nullptr && e->offset < reach->offset + reach->size) other = reach;
    else if (prev != nullptr && e->offset == prev->offset) other = prev;  // same start, even if empty
    if (other != nullptr)
      add(in, "entry_overlap",
          "entries " + quoted(other->key) + " (offset " + std::to_string(other->offset) + ", " +
              std::to_string(other->size) + " bytes) and " + quoted(e->key) + " (offset " +
              std::to_string(e->offset) + ", " + std::to_string(e->size) + " bytes) overlap",
          e->key);
    if (reach == nullptr || e->offset + e->size > reach->offset + reach->size) reach = e;
    prev = e;
  }
}

// Detailed walk of an index block that decode_trailer rejected: says everything that is wrong
// with it, and recovers whatever records can be parsed so their data can still be checked.
void diagnose_index(Inspection* in, std::span<const std::byte> t, const fmt_::CommitSlot& s,
                    const std::string& where) {
  const std::byte* b = t.data();
  const std::uint64_t n = s.index_size;
  if (fmt_::hash_bytes(b, n) != s.index_checksum)
    add(in, "index", where + ": the index does not match the checksum in its commit slot");
  if (fmt_::get_u32(b) != fmt_::kIndexMagic) {
    add(in, "index", where + ": no index magic ('WCIX') at offset " + std::to_string(s.index_offset));
    return;
  }
  if (fmt_::get_u32(b + 4) != fmt_::kIndexVersion) {
    add(in, "index", where + ": unsupported index version " + std::to_string(fmt_::get_u32(b + 4)));
    return;
  }
  const std::uint64_t count = fmt_::get_u64(b + 8);
  const std::uint64_t body = fmt_::get_u64(b + 16);
  if (count != s.entry_count)
    add(in, "index", where + ": the index counts " + std::to_string(count) + " entries, its commit slot " +
                         std::to_string(s.entry_count));
  if (body != n - fmt_::kIndexHeaderSize)
    add(in, "index", where + ": the index body size " + std::to_string(body) + " disagrees with its commit slot (" +
                         std::to_string(n - fmt_::kIndexHeaderSize) + ")");
  if (fmt_::hash_bytes(b + fmt_::kIndexHeaderSize, n - fmt_::kIndexHeaderSize) != fmt_::get_u64(b + 24))
    add(in, "index", where + ": index records fail their checksum");
  const fmt_::Footer f = fmt_::decode_footer(b + n);
  if (f.magic != fmt_::kFooterMagic || f.version != fmt_::kFooterVersion)
    add(in, "footer", where + ": no XPWC footer after the index");
  else if (f.index_start != s.index_offset || f.entry_count != std::min<std::uint64_t>(count, UINT32_MAX))
    add(in, "footer", where + ": the footer disagrees with the index (index_start " + std::to_string(f.index_start) +
                          ", " + std::to_string(f.entry_count) + " entries)");

  const std::byte* p = b + fmt_::kIndexHeaderSize;
  const std::byte* end = b + n;
  bool complete = true;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string rec = where + ": index record " + std::to_string(i);
    if (static_cast<std::size_t>(end - p) < fmt_::kRecordFixedSize) {
      add(in, "index", rec + " is cut off by the end of the index");
      complete = false;
      break;
    }
    const std::uint32_t key_size = fmt_::get_u32(p);
    if (fmt_::get_u32(p + 4) != 0) add(in, "index", rec + " has unknown flags " + std::to_string(fmt_::get_u32(p + 4)));
    if (key_size == 0 || key_size > fmt_::kMaxKeySize) {
      add(in, "index", rec + " has an invalid key size " + std::to_string(key_size));
      complete = false;
      break;
    }
    if (static_cast<std::size_t>(end - p) - fmt_::kRecordFixedSize < key_size) {
      add(in, "index", rec + " is cut off by the end of the index");
      complete = false;
      break;
    }
    Entry e;
    e.key.assign(reinterpret_cast<const char*>(p + fmt_::kRecordFixedSize), key_size);
    e.offset = fmt_::get_u64(p + 8);
    e.size = fmt_::get_u64(p + 16);
    e.checksum = fmt_::get_u64(p + 24);
    in->entries.push_back(std::move(e));
    p += fmt_::kRecordFixedSize + key_size;
  }
  if (complete && p != end)
    add(in, "index", where + ": " + std::to_string(end - p) + " bytes follow the last index record");
  check_layout(in, fmt_::kHeaderSize, s.index_offset, in->header.alignment);
}

std::string slot_problem(const std::byte* raw, const fmt_::CommitSlot& s) {
  if (s.sequence == 0) return "holds data but sequence 0";
  if (fmt_::get_u64(raw + 48) != 0) return "its reserved field is not zero";
  return "fails its checksum (a torn or damaged commit)";
}

std::string bounds_problem(const fmt_::CommitSlot& s, std::uint64_t file_size) {
  if (s.committed_size > file_size)
    return "names a commit ending at byte " + std::to_string(s.committed_size) + " but the file has only " +
           std::to_string(file_size) + " bytes (truncated?)";
  return "is inconsistent (index at " + std::to_string(s.index_offset) + ", " + std::to_string(s.index_size) +
         " bytes, " + std::to_string(s.entry_count) + " entries, commit ends at " + std::to_string(s.committed_size) +
         ")";
}

Result<void> inspect_weightcache(const File& f, Inspection* in) {
  if (f.size() < fmt_::kHeaderSize) {
    add(in, "header", "the file is shorter than its header (" + std::to_string(f.size()) + " of " +
                          std::to_string(fmt_::kHeaderSize) + " bytes)");
    return {};
  }
  auto hb = read_bytes(f, 0, fmt_::kHeaderSize);
  if (!hb) return hb.error();
  fmt_::DecodedHeader h;
  if (const auto p = fmt_::decode_header(hb.value(), &h); p != fmt_::Problem::none) {
    std::string msg = std::string("header: ") + fmt_::to_string(p);
    if (p == fmt_::Problem::byte_order) msg += " (this file was written on a host of the other byte order)";
    if (p == fmt_::Problem::version) msg += " (written by another version of weightcache)";
    add(in, "header", msg);
    return {};
  }
  in->header_ok = true;
  in->header = h.fixed;

  struct SlotState {
    bool present = false;  // checksum verifies
    bool usable = false;   // and bounds and index verify
    std::string failure;   // why not, if present
    std::string kind;
    std::vector<std::byte> trailer;
    std::vector<fmt_::IndexRecord> records;
  };
  SlotState st[2];
  for (int i = 0; i < 2; ++i) {
    const std::byte* raw = hb->data() + fmt_::kSlotOffset[i];
    const bool empty = std::all_of(raw, raw + fmt_::kSlotSize, [](std::byte b) { return b == std::byte{0}; });
    if (empty) continue;
    const auto& s = h.slot[i];
    if (!h.slot_valid[i]) {
      add(in, "slot", "commit slot " + std::to_string(i) + " " + slot_problem(raw, s));
      continue;
    }
    st[i].present = true;
    if (!fmt_::slot_in_bounds(s, f.size())) {
      st[i].kind = "slot";
      st[i].failure = bounds_problem(s, f.size());
      continue;
    }
    auto t = read_bytes(f, s.index_offset, s.index_size + fmt_::kFooterSize);
    if (!t) return t.error();
    std::string why;
    const auto p = fmt_::decode_trailer(t.value(), s, h.fixed.alignment, &st[i].records, &why);
    if (p != fmt_::Problem::none) {
      st[i].kind = "index";
      st[i].failure = std::string("points at an index that fails: ") + fmt_::to_string(p) +
                      (why.empty() ? "" : " (" + why + ")");
      st[i].trailer = std::move(t.value());
      continue;
    }
    st[i].usable = true;
  }
  if (st[0].present && st[1].present && h.slot[0].sequence == h.slot[1].sequence)
    add(in, "slot", "both commit slots carry sequence " + std::to_string(h.slot[0].sequence));

  // The library's choice: the highest sequence whose slot, bounds and index all verify.
  int order[2] = {0, 1};
  if (h.slot[1].sequence > h.slot[0].sequence) std::swap(order[0], order[1]);
  int newest = -1;
  for (int i : order)
    if (st[i].present) {
      newest = i;
      break;
    }
  for (int i : order)
    if (st[i].usable) {
      in->slot_index = i;
      break;
    }
  for (int i : order) {
    if (!st[i].present || st[i].usable) continue;
    std::string msg = "commit slot " + std::to_string(i) + " (sequence " + std::to_string(h.slot[i].sequence) + ") " +
                      st[i].failure;
    if (in->slot_index >= 0 && h.slot[i].sequence > h.slot[in->slot_index].sequence)
      msg += "; readers fall back to sequence " + std::to_string(h.slot[in->slot_index].sequence);
    add(in, st[i].kind, msg);
  }

  if (in->slot_index >= 0) {
    const int i = in->slot_index;
    in->slot = h.slot[i];
    in->newest_commit_damaged = i != newest;
    in->index_usable = true;
    for (auto& r : st[i].records) {
      Entry e;
      e.key = std::move(r.key);
      e.offset = r.offset;
      e.size = r.size;
      e.checksum = r.checksum;
      in->entries.push_back(std::move(e));
    }
    // decode_trailer accepted this index; the same rules again, so a disagreement shows.
    check_layout(in, fmt_::kHeaderSize, in->slot.index_offset, in->header.alignment);
    return {};
  }
  if (newest < 0) {
    add(in, "slot", "no commit slot was ever written: the file holds no index");
    return {};
  }
  add(in, "index", "no commit slot points at a valid index: the library would replace this file with an empty one");
  // Show what is wrong in the newest index we could read, and keep its records for the data check.
  for (int i : order) {
    if (!st[i].trailer.empty()) {
      diagnose_index(in, st[i].trailer, h.slot[i], "index of sequence " + std::to_string(h.slot[i].sequence));
      break;
    }
  }
  return {};
}

Result<void> inspect_xpwc(const File& f, Inspection* in, std::uint64_t index_start, std::uint32_t count) {
  const std::uint64_t index_end = f.size() - fmt_::kFooterSize;
  in->index_start = index_start;
  if (in->xpwc_version != 1 && in->xpwc_version != 2) {
    add(in, "footer", "XPWC version " + std::to_string(in->xpwc_version) + " is not supported (1 and 2 are)");
    return {};
  }
  if (index_start > index_end) {
    add(in, "footer", "the footer puts the index at " + std::to_string(index_start) + ", past the end of the file (" +
                          std::to_string(f.size()) + " bytes)");
    return {};
  }
  auto u32 = [in](const std::byte* p) { return in->byte_swapped ? bswap32(fmt_::get_u32(p)) : fmt_::get_u32(p); };
  auto u64 = [in](const std::byte* p) { return in->byte_swapped ? bswap64(fmt_::get_u64(p)) : fmt_::get_u64(p); };
  const std::size_t fixed = in->xpwc_version == 2 ? 24 : 20;  // name_len + offset + size (+ seed)
  SequentialReader rd(f, index_start, index_end);
  if (count > rd.remaining() / fixed)
    add(in, "index", "the footer counts " + std::to_string(count) + " entries but the index has room for at most " +
                         std::to_string(rd.remaining() / fixed));
  bool complete = true;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::string rec = "index entry " + std::to_string(i) + " (at byte " + std::to_string(rd.position()) + ")";
    std::array<std::byte, 4> len_bytes;
    auto got = rd.read(len_bytes.data(), 4);
    if (!got) return got.error();
    const std::uint32_t name_len = got.value() ? u32(len_bytes.data()) : 0;
    if (!got.value() || name_len > rd.remaining() || rd.remaining() - name_len < fixed - 4) {
      add(in, "index", rec + " is cut off by the footer");
      complete = false;
      break;
    }
    Entry e;
    e.name.resize(name_len);
    if (auto r = rd.read(e.name.data(), name_len); !r) return r.error();
    std::array<std::byte, 20> tail;
    if (auto r = rd.read(tail.data(), fixed - 4); !r) return r.error();
    e.offset = u64(tail.data());
    e.size = u64(tail.data() + 8);
    e.key = e.name;
    if (in->xpwc_version == 2) {
      e.seed = u32(tail.data() + 16);
      e.key += "#seed=" + std::to_string(*e.seed);
    }
    in->entries.push_back(std::move(e));
  }
  if (complete && rd.remaining() != 0)
    add(in, "index", std::to_string(rd.remaining()) + " bytes between the last index entry and the footer");
  check_layout(in, 0, index_start, 0);
  in->index_usable = complete;
  return {};
}

}  // namespace

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    close();
    handle_ = o.handle_;
    size_ = o.size_;
    o.handle_ = platform::kInvalidHandle;
  }
  return *this;
}

void File::close() noexcept {
  if (handle_ != platform::kInvalidHandle) platform::os().close_file(handle_);
  handle_ = platform::kInvalidHandle;
}

Result<File> open_for_reading(const std::string& path) {
  auto h = platform::os().open_file(path, platform::OpenMode::read, 0, true);
  if (!h) return h.error();
  auto info = platform::os().stat_file(h.value());
  if (!info) {
    platform::os().close_file(h.value());
    return info.error();
  }
  return File(h.value(), info->size);
}

std::uint64_t Inspection::payload_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& e : entries) n += e.size;
  return n;
}

std::uint64_t Inspection::dead_bytes() const noexcept {
  // Union of what is in use, so that overlapping entries of a damaged file are not counted twice.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> used;
  if (format == FileFormat::weightcache) {
    used.emplace_back(0, fmt_::kHeaderSize);
    if (slot_index >= 0) used.emplace_back(slot.index_offset, slot.committed_size);
  } else if (format == FileFormat::xpwc) {
    used.emplace_back(index_start, file_size);
  }
  for (const auto& e : entries)
    if (e.in_bounds) used.emplace_back(e.offset, e.offset + e.size);
  std::sort(used.begin(), used.end());
  std::uint64_t covered = 0, end = 0;
  for (auto [b, e] : used) {
    b = std::max(b, end);
    e = std::min(e, file_size);
    if (e > b) {
      covered += e - b;
      end = e;
    }
  }
  return file_size > covered ? file_size - covered : 0;
}

std::uint64_t Inspection::offset_alignment() const noexcept {
  if (entries.empty()) return 0;
  std::uint64_t a = std::uint64_t{1} << 24;
  for (const auto& e : entries)
    while (a > 1 && e.offset % a != 0) a >>= 1;
  return a;
}

Result<Inspection> inspect(const File& f) {
  Inspection in;
  in.file_size = f.size();
  try {
    if (f.size() >= fmt_::kHeaderMagic.size()) {
      auto m = read_bytes(f, 0, fmt_::kHeaderMagic.size());
      if (!m) return m.error();
      if (std::memcmp(m->data(), fmt_::kHeaderMagic.data(), fmt_::kHeaderMagic.size()) == 0) {
        in.format = FileFormat::weightcache;
        if (auto r = inspect_weightcache(f, &in); !r) return r.error();
        return in;
      }
    }
    if (f.size() >= fmt_::kFooterSize) {
      auto fb = read_bytes(f, f.size() - fmt_::kFooterSize, fmt_::kFooterSize);
      if (!fb) return fb.error();
      const fmt_::Footer foot = fmt_::decode_footer(fb->data());
      if (foot.magic == fmt_::kFooterMagic && foot.version == fmt_::kFooterVersion) {
        in.format = FileFormat::weightcache;
        add(&in, "header", "the footer is a weightcache footer but the header has no 'WGTCACHE' magic: the header is "
                           "damaged");
        return in;
      }
      if (foot.magic == fmt_::kFooterMagic || foot.magic == bswap32(fmt_::kFooterMagic)) {
        in.format = FileFormat::xpwc;
        in.byte_swapped = foot.magic != fmt_::kFooterMagic;
        in.xpwc_version = in.byte_swapped ? bswap32(foot.version) : foot.version;
        const std::uint64_t start = in.byte_swapped ? bswap64(foot.index_start) : foot.index_start;
        const std::uint32_t count = in.byte_swapped ? bswap32(foot.entry_count) : foot.entry_count;
        if (auto r = inspect_xpwc(f, &in, start, count); !r) return r.error();
        return in;
      }
    }
    add(&in, "format",
        f.size() == 0 ? std::string("the file is empty")
                      : "not a weightcache or ExecuTorch XPWC file (no 'WGTCACHE' header, no XPWC footer at the end)");
    return in;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while reading the file"};
  }
}

Result<std::uint64_t> hash_range(const File& f, std::uint64_t offset, std::uint64_t size, Progress* progress,
                                 const std::function<Result<void>(const std::byte*, std::size_t)>& sink) {
  try {
    // One buffer for the whole run: a cache holds thousands of entries.
    static thread_local std::vector<std::byte> buf;
    const auto need = static_cast<std::size_t>(std::min<std::uint64_t>(std::max<std::uint64_t>(size, 1), kChunk));
    if (buf.size() < need) buf.resize(need);
    if (size <= kChunk) {
      // The common case: exactly the library's own checksum call.
      if (auto r = platform::os().read_at(f.handle(), buf.data(), static_cast<std::size_t>(size), offset); !r)
        return r.error();
      if (progress) progress->add(size);
      if (sink)
        if (auto r = sink(buf.data(), static_cast<std::size_t>(size)); !r) return r.error();
      return fmt_::hash_bytes(buf.data(), static_cast<std::size_t>(size));
    }
    // Entries bigger than a chunk: streaming XXH3 gives the same value as the one-shot hash.
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
    if (!state) return Error{Errc::no_memory, 0, "out of memory"};
    XXH3_64bits_reset(state.get());
    for (std::uint64_t done = 0; done < size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - done));
      if (auto r = platform::os().read_at(f.handle(), buf.data(), n, offset + done); !r) return r.error();
      XXH3_64bits_update(state.get(), buf.data(), n);
      if (sink)
        if (auto r = sink(buf.data(), n); !r) return r.error();
      if (progress) progress->add(n);
      done += n;
    }
    return static_cast<std::uint64_t>(XXH3_64bits_digest(state.get()));
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
}

Result<std::uint64_t> check_checksums(const File& f, Inspection* in, Progress* progress) {
  std::uint64_t hashed = 0;
  for (const auto& e : in->entries) {
    if (!e.checksum || !e.in_bounds) continue;
    auto h = hash_range(f, e.offset, e.size, progress);
    if (!h) return h.error();
    hashed += e.size;
    if (h.value() != *e.checksum)
      add(in, "entry_checksum",
          "entry " + quoted(e.key) + " (offset " + std::to_string(e.offset) + ", " + std::to_string(e.size) +
              " bytes) fails its checksum: the index says " + hex64(*e.checksum) + ", the data hashes to " +
              hex64(h.value()),
          e.key);
  }
  return hashed;
}

const char* format_name(const Inspection& in) {
  switch (in.format) {
    case FileFormat::weightcache: return "weightcache";
    case FileFormat::xpwc: return "xpwc";
    case FileFormat::unknown: break;
  }
  return "unknown";
}

}  // namespace weightcache::cli
