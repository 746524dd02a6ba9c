// The reading side of inspection (weightcache/inspect.hpp): recognises a weightcache file or an
// ExecuTorch XPWC file, checks every structure it can reach, and lists the entries. A weightcache
// file is read by the library's own reader (read_committed_current, with a Diagnosis); XPWC
// files, which caches never read, are parsed here with the format's byte helpers. All reads go
// through pread (platform read_at), never a mapping, so a file truncated under us yields an
// error instead of SIGBUS.
#include "inspect/file_impl.hpp"

#include "file_state.hpp"
#include "format/format.hpp"
#include "format/layout.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <new>

namespace weightcache::inspect {
namespace {

namespace fmt_ = weightcache::format;
using InputFile = File::Impl;

// Large enough to keep the disk streaming, small enough that the tool never holds much memory.
constexpr std::size_t kChunk = std::size_t{8} << 20;
constexpr std::size_t kReaderBuffer = std::size_t{1} << 20;

std::string quoted(std::string_view key) { return "'" + fmt_::display_key(key) + "'"; }

void add(Inspection* in, std::string kind, std::string message, std::optional<std::string> key = std::nullopt) {
  in->findings.push_back({std::move(kind), std::move(message), std::move(key)});
}

// Reads [begin, end) of a file front to back through a small buffer: the XPWC index has no
// size field we could trust before parsing it.
class SequentialReader {
 public:
  SequentialReader(const InputFile& f, std::uint64_t begin, std::uint64_t end)
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
        if (auto r = platform::os().read_at(file_.file, buf_.data(), buf_len_, buf_start_); !r) {
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
  const InputFile& file_;
  std::uint64_t pos_, end_;
  std::vector<std::byte> buf_;
  std::uint64_t buf_start_ = 0;
  std::size_t buf_len_ = 0;
};

Result<std::vector<std::byte>> read_bytes(const InputFile& f, std::uint64_t offset, std::uint64_t size) {
  std::vector<std::byte> b(static_cast<std::size_t>(size));
  if (auto r = platform::os().read_at(f.file, b.data(), b.size(), offset); !r) return r.error();
  return b;
}

std::string hex64(std::uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "0x0000000000000000";
  for (int i = 0; i < 16; ++i) out[17 - i] = kDigits[(v >> (4 * i)) & 15];
  return out;
}

void append_findings(Inspection* in, std::vector<fmt_::Diagnostic>&& found) {
  for (auto& d : found)
    in->findings.push_back({std::move(d.kind), std::move(d.message), std::move(d.key), d.unlisted});
}

static_assert(kMaxFindingsPerKind == fmt_::kMaxDiagnosticsPerKind, "one limit for the library's reader and this one");

// Findings of one kind that may come once per entry: described up to kMaxFindingsPerKind times,
// then counted, and the count said in one more finding by close().
class CappedFindings {
 public:
  CappedFindings(Inspection* in, const char* kind) : in_(in), kind_(kind) {}
  /// `message` is built, and `key` copied, only for a finding that is listed.
  template <class Message>
  void add(Message&& message, std::string_view key) {
    if (listed_ == kMaxFindingsPerKind) {
      ++unlisted_;
      return;
    }
    ++listed_;
    in_->findings.push_back({kind_, message(), std::string(key)});
  }
  void close() {
    if (unlisted_ != 0)
      in_->findings.push_back({kind_,
                               std::to_string(unlisted_) + " more problems of this kind (" + kind_ +
                                   ") were found, not listed one by one",
                               std::nullopt, unlisted_});
  }

 private:
  Inspection* in_;
  const char* kind_;
  std::size_t listed_ = 0;
  std::uint64_t unlisted_ = 0;
};

// Entries of a weightcache index; those outside [kHeaderSize, data_end) are never read.
void add_entries(Inspection* in, std::vector<fmt_::IndexRecord>& records, std::uint64_t data_end) {
  for (auto& r : records) {
    Entry e;
    e.key = std::move(r.key);
    e.offset = r.offset;
    e.size = r.size;
    e.checksum = r.checksum;
    e.in_bounds = fmt_::lies_within(e.offset, e.size, fmt_::kHeaderSize, data_end);
    in->entries.push_back(std::move(e));
  }
}

// The library reads the file and says what is wrong with it, on the file's current size: a
// commit another process makes meanwhile is read again, as a cache opening the file would.
Result<void> inspect_weightcache(InputFile& f, Inspection* in) {
  Diagnosis d;
  auto st = read_committed_current(platform::os(), f.file, &f.info, UINT64_MAX, 0, &d);
  f.size = f.info.size;
  in->file_size = f.size;
  append_findings(in, std::move(d.problems));
  if (d.header) {
    in->header_ok = true;
    in->header = {d.header->format_version, d.header->alignment, d.header->size_alignment, d.header->compat_hash};
  }
  if (st) {
    const fmt_::CommitSlot& s = st->slot;
    in->slot_index = st->slot_index;
    in->commit = {s.sequence, s.index_offset, s.index_size, s.committed_size, s.entry_count};
    in->newest_commit_damaged = st->newest_damaged;
    in->index_usable = true;
    add_entries(in, st->records, s.index_offset);
    return {};
  }
  // Damage is a finding; anything else (an I/O error) means the file could not be read.
  const Errc code = st.error().code;
  if ((code != Errc::corrupt && code != Errc::incompatible) || in->findings.empty()) return st.error();
  add_entries(in, d.salvaged, d.salvaged_data_end);
  return {};
}

Result<void> inspect_xpwc(const InputFile& f, Inspection* in, std::uint64_t index_start, std::uint32_t count) {
  const std::uint64_t index_end = f.size - fmt_::kFooterSize;
  in->index_start = index_start;
  if (in->xpwc_version < fmt_::kXpwcFirstVersion || in->xpwc_version > fmt_::kXpwcLastVersion) {
    add(in, "footer", "XPWC version " + std::to_string(in->xpwc_version) + " is not supported (1 and 2 are)");
    return {};
  }
  if (index_start > index_end) {
    add(in, "footer", "the footer puts the index at " + std::to_string(index_start) + ", past the end of the file (" +
                          std::to_string(f.size) + " bytes)");
    return {};
  }
  const bool big = in->byte_swapped;
  auto u32 = [big](const std::byte* p) { return big ? fmt_::get_u32_be(p) : fmt_::get_u32(p); };
  auto u64 = [big](const std::byte* p) { return big ? fmt_::get_u64_be(p) : fmt_::get_u64(p); };
  const std::size_t fixed = fmt_::xpwc_record_fixed_size(in->xpwc_version);
  SequentialReader rd(f, index_start, index_end);
  if (count > rd.remaining() / fixed)
    add(in, "index", "the footer counts " + std::to_string(count) + " entries but the index has room for at most " +
                         std::to_string(rd.remaining() / fixed));
  bool complete = true;
  // What the footer claims decides nothing that is allocated: at most what the index can hold.
  in->entries.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(count, rd.remaining() / fixed)));
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint64_t at = rd.position();
    std::array<std::byte, 4> len_bytes;
    auto got = rd.read(len_bytes.data(), 4);
    if (!got) return got.error();
    const std::uint32_t name_len = got.value() ? u32(len_bytes.data()) : 0;
    if (!got.value() || name_len > rd.remaining() || rd.remaining() - name_len < fixed - 4) {
      add(in, "index",
          "index entry " + std::to_string(i) + " (at byte " + std::to_string(at) + ") is cut off by the footer");
      complete = false;
      break;
    }
    Entry e;
    e.key.resize(name_len);
    if (auto r = rd.read(e.key.data(), name_len); !r) return r.error();
    std::array<std::byte, 20> tail;
    if (auto r = rd.read(tail.data(), fixed - 4); !r) return r.error();
    e.offset = u64(tail.data());
    e.size = u64(tail.data() + 8);
    if (in->xpwc_version >= 2) {
      e.seed = u32(tail.data() + 16);
      e.key += "#seed=" + std::to_string(*e.seed);
    }
    e.in_bounds = fmt_::lies_within(e.offset, e.size, 0, index_start);
    in->entries.push_back(std::move(e));
  }
  if (complete && rd.remaining() != 0)
    add(in, "index", std::to_string(rd.remaining()) + " bytes between the last index entry and the footer");
  // The library's rules for where entries may lie (XPWC records no alignment), checked on the
  // entries themselves: an index may hold millions, and a copy would double what they cost.
  std::vector<fmt_::Diagnostic> found;
  fmt_::check_layout_of(std::span<const Entry>(in->entries), 0, index_start, 1, nullptr, &found);
  append_findings(in, std::move(found));
  in->index_usable = complete;
  return {};
}

}  // namespace

File::File(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;
const std::string& File::path() const noexcept { return impl_->file.path(); }
std::uint64_t File::size() const noexcept { return impl_->size; }

Result<File> File::open(const std::string& path) noexcept {
  try {
    auto f = platform::os().open_file(path, platform::OpenMode::read, 0, true);
    if (!f) return f.error();
    auto info = platform::os().stat_file(f.value());
    if (!info) return info.error();
    auto impl = std::make_unique<Impl>(Impl{std::move(f).value(), info.value(), info->size});
    return File(std::move(impl));
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while opening '" + path + "'"};
  }
}

const char* to_string(FileFormat format) noexcept {
  switch (format) {
    case FileFormat::weightcache: return "weightcache";
    case FileFormat::xpwc: return "xpwc";
    case FileFormat::unknown: break;
  }
  return "unknown";
}

std::uint64_t compat_hash(std::string_view compat_key) noexcept { return fmt_::hash_bytes(compat_key); }
std::string display_key(std::string_view key) { return fmt_::display_key(key); }
std::optional<std::string> parse_key(std::string_view text) { return fmt_::parse_key(text); }

void check_compat_key(Inspection* in, std::string_view compat_key) {
  if (in->format != FileFormat::weightcache) {
    add(in, "compat_key", "an XPWC file records no compatibility key: it was not written for --compat-key");
  } else if (in->header.compat_hash != compat_hash(compat_key)) {
    add(in, "compat_key",
        "written for another compatibility key (hash " + hex64(in->header.compat_hash) + ", --compat-key hashes to " +
            hex64(compat_hash(compat_key)) + ")");
  }
}

std::string_view Entry::name() const noexcept {
  std::string_view n = key;
  if (seed) {  // the key ends in "#seed=<n>"
    std::size_t suffix = 7;
    for (std::uint32_t v = *seed; v >= 10; v /= 10) ++suffix;
    n.remove_suffix(std::min(n.size(), suffix));
  }
  return n;
}

std::uint64_t Inspection::problem_count() const noexcept {
  std::uint64_t n = 0;
  for (const auto& f : findings) n += f.unlisted != 0 ? f.unlisted : 1;
  return n;
}

std::uint64_t Inspection::payload_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& e : entries) n += e.size;
  return n;
}

std::uint64_t Inspection::dead_bytes() const {  // allocates: may throw std::bad_alloc
  // Union of what is in use, so that overlapping entries of a damaged file are not counted twice.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> used;
  if (format == FileFormat::weightcache) {
    used.emplace_back(0, fmt_::kHeaderSize);
    if (slot_index >= 0) used.emplace_back(commit.index_offset, commit.committed_size);
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

Result<Inspection> inspect(File& file) noexcept {
  const InputFile& f = file.impl();
  Inspection in;
  in.file_size = f.size;
  try {
    if (f.size >= fmt_::kHeaderMagic.size()) {
      auto m = read_bytes(f, 0, fmt_::kHeaderMagic.size());
      if (!m) return m.error();
      if (std::memcmp(m->data(), fmt_::kHeaderMagic.data(), fmt_::kHeaderMagic.size()) == 0) {
        in.format = FileFormat::weightcache;
        if (auto r = inspect_weightcache(file.impl(), &in); !r) return r.error();
        return in;
      }
    }
    if (f.size >= fmt_::kFooterSize) {
      auto fb = read_bytes(f, f.size - fmt_::kFooterSize, fmt_::kFooterSize);
      if (!fb) return fb.error();
      const std::byte* raw = fb->data();
      const fmt_::Footer foot = fmt_::decode_footer(raw);
      if (foot.magic == fmt_::kFooterMagic && foot.version == fmt_::kFooterVersion) {
        in.format = FileFormat::weightcache;
        add(&in, "header", "the footer is a weightcache footer but the header has no 'WGTCACHE' magic: the header is "
                           "damaged");
        return in;
      }
      const bool big = foot.magic != fmt_::kFooterMagic && fmt_::get_u32_be(raw + 12) == fmt_::kFooterMagic;
      if (foot.magic == fmt_::kFooterMagic || big) {
        in.format = FileFormat::xpwc;
        in.byte_swapped = big;
        in.xpwc_version = big ? fmt_::get_u32_be(raw + 16) : foot.version;
        const std::uint64_t start = big ? fmt_::get_u64_be(raw) : foot.index_start;
        const std::uint32_t count = big ? fmt_::get_u32_be(raw + 8) : foot.entry_count;
        if (auto r = inspect_xpwc(f, &in, start, count); !r) return r.error();
        return in;
      }
    }
    add(&in, "format",
        f.size == 0 ? std::string("the file is empty")
                      : "not a weightcache or ExecuTorch XPWC file (no 'WGTCACHE' header, no XPWC footer at the end)");
    return in;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while reading the file"};
  }
}

Result<std::uint64_t> hash_range(const File& file, std::uint64_t offset, std::uint64_t size, const Progress& progress,
                                 const Sink& sink, std::vector<std::byte>* scratch) noexcept {
  const InputFile& f = file.impl();
  try {
    // No thread_local buffer: its destructor would be registered at first use, an allocation
    // glibc aborts on when it fails. A caller hashing many entries passes one buffer instead.
    std::vector<std::byte> own;
    std::vector<std::byte>& buf = scratch != nullptr ? *scratch : own;
    const auto need = static_cast<std::size_t>(std::min<std::uint64_t>(std::max<std::uint64_t>(size, 1), kChunk));
    if (buf.size() < need) buf.resize(need);
    if (size <= kChunk) {
      // The common case: exactly the library's own checksum call.
      const auto n = static_cast<std::size_t>(size);
      if (auto r = platform::os().read_at(f.file, buf.data(), n, offset); !r) return r.error();
      if (progress) progress(size);
      if (sink)
        if (auto r = sink(buf.data(), n); !r) return r.error();
      return fmt_::hash_bytes(buf.data(), n);
    }
    // Entries bigger than a chunk: the library's streaming hash gives the same value.
    fmt_::StreamHash hash;
    for (std::uint64_t done = 0; done < size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - done));
      if (auto r = platform::os().read_at(f.file, buf.data(), n, offset + done); !r) return r.error();
      hash.update(buf.data(), n);
      if (sink)
        if (auto r = sink(buf.data(), n); !r) return r.error();
      if (progress) progress(n);
      done += n;
    }
    return hash.digest();
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
}

Result<std::uint64_t> check_checksums(const File& file, Inspection* in, const Progress& progress) noexcept {
  try {
    std::uint64_t hashed = 0;
    std::vector<std::byte> buf;  // one read buffer for every entry
    CappedFindings damaged(in, "entry_checksum");
    for (const auto& e : in->entries) {
      if (!e.checksum || !e.in_bounds) continue;
      auto h = hash_range(file, e.offset, e.size, progress, {}, &buf);
      if (!h) return h.error();
      hashed += e.size;
      if (h.value() != *e.checksum)
        damaged.add(
            [&] {
              return "entry " + quoted(e.key) + " (offset " + std::to_string(e.offset) + ", " +
                     std::to_string(e.size) + " bytes) fails its checksum: the index says " + hex64(*e.checksum) +
                     ", the data hashes to " + hex64(h.value());
            },
            e.key);
    }
    damaged.close();
    return hashed;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
}

}  // namespace weightcache::inspect
