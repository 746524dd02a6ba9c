#include "verify_record.hpp"

#include "format/format.hpp"

#include <cstring>

namespace weightcache {

bool StateStamp::operator==(const StateStamp& o) const noexcept {
  return std::memcmp(boot, o.boot, sizeof boot) == 0 && device == o.device && inode == o.inode && size == o.size &&
         mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && sequence == o.sequence &&
         committed_size == o.committed_size && index_checksum == o.index_checksum && entries == o.entries;
}

namespace {

std::size_t record_bytes(std::uint64_t entries) {
  return kRecordFixedBytes + static_cast<std::size_t>((entries + 7) / 8) + 8;
}

}  // namespace

std::vector<std::byte> encode_record(const VerifyRecord& r) {
  const StateStamp& s = r.stamp;
  std::vector<std::byte> out(record_bytes(s.entries));
  std::byte* p = out.data();
  format::put_u32(p, kRecordMagic);
  format::put_u32(p + 4, kRecordVersion);
  std::memcpy(p + 8, s.boot, sizeof s.boot);
  format::put_u64(p + 24, s.device);
  format::put_u64(p + 32, s.inode);
  format::put_u64(p + 40, s.size);
  format::put_u64(p + 48, static_cast<std::uint64_t>(s.mtime_ns));
  format::put_u64(p + 56, static_cast<std::uint64_t>(s.ctime_ns));
  format::put_u64(p + 64, s.sequence);
  format::put_u64(p + 72, s.committed_size);
  format::put_u64(p + 80, s.index_checksum);
  format::put_u64(p + 88, s.entries);
  for (std::uint64_t i = 0; i < s.entries && i < r.verified.size(); ++i)
    if (r.verified[i]) p[kRecordFixedBytes + i / 8] |= std::byte{1} << (i % 8);
  const std::size_t body = out.size() - 8;
  format::put_u64(p + body, format::hash_bytes(p, body));
  return out;
}

std::optional<VerifyRecord> decode_record(const std::byte* p, std::size_t size, std::uint64_t max_entries) {
  if (size < kRecordFixedBytes + 8) return std::nullopt;
  if (format::get_u32(p) != kRecordMagic || format::get_u32(p + 4) != kRecordVersion) return std::nullopt;
  const std::uint64_t entries = format::get_u64(p + 88);
  if (entries > max_entries || record_bytes(entries) > size) return std::nullopt;
  const std::size_t body = record_bytes(entries) - 8;
  if (format::get_u64(p + body) != format::hash_bytes(p, body)) return std::nullopt;
  VerifyRecord r;
  StateStamp& s = r.stamp;
  std::memcpy(s.boot, p + 8, sizeof s.boot);
  s.device = format::get_u64(p + 24);
  s.inode = format::get_u64(p + 32);
  s.size = format::get_u64(p + 40);
  s.mtime_ns = static_cast<std::int64_t>(format::get_u64(p + 48));
  s.ctime_ns = static_cast<std::int64_t>(format::get_u64(p + 56));
  s.sequence = format::get_u64(p + 64);
  s.committed_size = format::get_u64(p + 72);
  s.index_checksum = format::get_u64(p + 80);
  s.entries = entries;
  r.verified.resize(static_cast<std::size_t>(entries));
  for (std::uint64_t i = 0; i < entries; ++i)
    r.verified[static_cast<std::size_t>(i)] = (p[kRecordFixedBytes + i / 8] & (std::byte{1} << (i % 8))) != std::byte{0};
  return r;
}

std::optional<VerifyRecord> read_record(platform::Platform& pf, const platform::File& h, std::uint64_t max_entries) {
  std::byte fixed[kRecordFixedBytes];
  if (!pf.read_at(h, fixed, sizeof fixed, 0)) return std::nullopt;  // empty: no record yet
  const std::uint64_t entries = format::get_u64(fixed + 88);
  if (format::get_u32(fixed) != kRecordMagic || entries > max_entries) return std::nullopt;
  std::vector<std::byte> all(record_bytes(entries));
  if (!pf.read_at(h, all.data(), all.size(), 0)) return std::nullopt;
  return decode_record(all.data(), all.size(), max_entries);
}

std::optional<std::uint64_t> record_size_if_header(const std::byte* head, std::uint64_t file_size) noexcept {
  if (format::get_u32(head) != kRecordMagic || format::get_u32(head + 4) != kRecordVersion) return std::nullopt;
  const std::uint64_t entries = format::get_u64(head + 88);
  if (file_size < kRecordFixedBytes + 8 || entries > (file_size - kRecordFixedBytes - 8) * 8) return std::nullopt;
  const std::uint64_t size = record_bytes(entries);
  if (size > file_size) return std::nullopt;
  return size;
}

bool change_would_show(std::int64_t ctime_ns, std::int64_t clock_ns, std::int64_t window_ns) noexcept {
  if (ctime_ns <= 0 || clock_ns <= 0 || window_ns <= 0) return false;
  // The window is the file system's (Platform::change_window_ns): 10 ms where this file's times
  // are kept to the nanosecond, else the coarsest timestamps kept (FAT's 2 s), which also covers
  // a clock stepped back by less than that. A sub-second part alone says nothing about
  // granularity (exFAT keeps 10 ms, ntfs3 100 ns, UDF 1 us), so only the platform, which knows
  // the file system, may choose the fine window.
  return ctime_ns < clock_ns - window_ns;
}

}  // namespace weightcache
