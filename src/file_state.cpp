#include "file_state.hpp"

#include "log.hpp"

#include <memory>
#include <new>
#include <utility>

namespace weightcache {
namespace {

constexpr std::uint64_t kStreamCheckIndexBytes = 16u << 20;  // above this, checksum before allocating
constexpr std::size_t kStreamCheckChunk = 1u << 20;

// A large index is checked against the slot's checksum in small pieces before anything is
// allocated for it: a hostile sparse file then costs a bounded read, not its size in memory.
Result<bool> index_matches_slot(platform::Platform& pf, platform::Handle fd, const format::CommitSlot& s) {
  format::StreamHash h;
  std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[kStreamCheckChunk]);
  if (!h.ok() || buf == nullptr) return Error{Errc::no_memory, 0, "out of memory while checking the index"};
  for (std::uint64_t done = 0; done < s.index_size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kStreamCheckChunk, s.index_size - done));
    if (auto r = pf.read_at(fd, buf.get(), n, s.index_offset + done); !r) return r.error();
    h.update(buf.get(), n);
    done += n;
  }
  return h.digest() == s.index_checksum;
}

}  // namespace

Result<format::DecodedHeader> read_header(platform::Platform& pf, platform::Handle fd) {
  try {
    std::vector<std::byte> hb(format::kHeaderSize);
    if (auto r = pf.read_at(fd, hb.data(), hb.size(), 0); !r) return r.error();
    format::DecodedHeader h;
    const auto problem = format::decode_header(hb, &h);
    if (problem != format::Problem::none) {
      const bool incompatible = problem == format::Problem::version || problem == format::Problem::byte_order;
      return Error{incompatible ? Errc::incompatible : Errc::corrupt, 0,
                   std::string("header: ") + format::to_string(problem)};
    }
    return h;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while reading the header"};
  }
}

int next_slot_index(const format::DecodedHeader& h) noexcept {
  if (!h.slot_valid[0]) return 0;
  if (!h.slot_valid[1]) return 1;
  return h.slot[0].sequence < h.slot[1].sequence ? 0 : 1;
}

Result<CommittedState> read_committed(platform::Platform& pf, platform::Handle fd, const std::string& path,
                                      std::uint64_t file_size, std::uint64_t max_bytes,
                                      std::uint64_t newer_than) {
  try {
    auto hr = read_header(pf, fd);
    if (!hr) return hr.error();
    const format::DecodedHeader& h = hr.value();
    CommittedState out;
    out.fixed = h.fixed;
    // Our writers give every commit the next sequence, into the slot not in use: two valid
    // slots with one sequence, or a sequence that cannot be followed, are a damaged or forged
    // header, and a writer could only overwrite its newest commit from there.
    if (h.slot_valid[0] && h.slot_valid[1] && h.slot[0].sequence == h.slot[1].sequence)
      return Error{Errc::corrupt, 0,
                   "both commit slots hold sequence " + std::to_string(h.slot[0].sequence) + " (a damaged header)"};
    for (int i : {0, 1})
      if (h.slot_valid[i] && h.slot[i].sequence == UINT64_MAX)
        return Error{Errc::corrupt, 0, "the commit sequence is exhausted (a forged header)"};
    // Newest verifying slot first; fall back to the older one (its index is never overwritten).
    int order[2] = {0, 1};
    if (h.slot[1].sequence > h.slot[0].sequence) std::swap(order[0], order[1]);
    std::string detail = "no commit slot verifies";
    for (int i : order) {
      if (!h.slot_valid[i]) continue;
      const auto& s = h.slot[i];
      out.newest_damaged = i != order[0];
      if (s.sequence <= newer_than) {  // nothing newer than what the caller holds
        out.slot = s;
        out.unchanged = true;
        return out;
      }
      if (!format::slot_in_bounds(s, file_size)) {
        detail = "commit slot points outside the file";
        continue;
      }
      // Never allocate for, or read, an index that could not be mapped anyway: a hostile sparse
      // file may claim terabytes. But a commit larger than this process may map is not damage:
      // falling back to the older commit would have a writer commit over it (the same sequence
      // again, and a trim below the newer commit's data). Say the file is too large instead.
      if (s.committed_size > max_bytes)
        return Error{Errc::no_space, 0,
                     "the newest commit of '" + path + "' spans " + std::to_string(s.committed_size) +
                         " bytes, more than this cache's max_file_bytes (" + std::to_string(max_bytes) +
                         "); raise max_file_bytes (or the address-space limit) to use it"};
      if (s.index_size > kStreamCheckIndexBytes) {
        auto same = index_matches_slot(pf, fd, s);
        if (!same) return same.error();
        if (!same.value()) {
          detail = "index: bad_checksum";
          continue;
        }
      }
      // At most max_bytes (checked above): no memory for it is not damage (std::bad_alloc, below).
      std::vector<std::byte> t(s.index_size + format::kFooterSize);
      if (auto r = pf.read_at(fd, t.data(), t.size(), s.index_offset); !r) return r.error();
      std::string why;
      out.records.clear();
      const auto p = format::decode_trailer(t, s, h.fixed.alignment, &out.records, &why);
      if (p == format::Problem::none) {
        if (out.newest_damaged) log::warn("'{}': newest commit slot is damaged; using the previous one", path);
        out.slot = s;
        return out;
      }
      detail = std::string("index: ") + format::to_string(p) + (why.empty() ? "" : " (" + why + ")");
    }
    return Error{Errc::corrupt, 0, detail};
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while reading the index of '" + path + "'"};
  }
}

}  // namespace weightcache
