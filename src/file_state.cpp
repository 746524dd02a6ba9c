#include "file_state.hpp"

#include <chrono>
#include <thread>

#include "index_memory.hpp"
#include "log.hpp"
#include "mobile.hpp"
#include "platform/errors.hpp"

#include <memory>
#include <memory_resource>
#include <new>
#include <utility>

namespace weightcache {
namespace {

constexpr std::uint64_t kStreamCheckIndexBytes = 16u << 20;  // above this, checksum before allocating
constexpr std::size_t kScratchMapBytes = 256u << 10;          // an index read this large is mapped
constexpr std::size_t kStreamCheckChunk = 1u << 20;

// A large index is checked against the slot's checksum in small pieces before anything is
// allocated for it: a hostile sparse file then costs a bounded read, not its size in memory.
Result<bool> index_matches_slot(platform::Platform& pf, const platform::File& fd, const format::CommitSlot& s) {
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

// Why a header does not decode, for a person: a diagnosis says what probably happened.
const char* explanation(format::Problem p) noexcept {
  switch (p) {
    case format::Problem::byte_order: return " (this file was written on a host of the other byte order)";
    case format::Problem::version: return " (written by another version of weightcache)";
    default: return "";
  }
}

Result<format::DecodedHeader> decode_header_at(platform::Platform& pf, const platform::File& fd, Diagnosis* diagnosis) {
  if (kMobileBuild) diagnosis = nullptr;
  std::vector<std::byte> hb(format::kHeaderSize);
  if (auto r = pf.read_at(fd, hb.data(), hb.size(), 0); !r) return r.error();
  format::DecodedHeader h;
  const auto problem = format::decode_header(hb, &h);
  if (problem == format::Problem::none) return h;
  std::string message = std::string("header: ") + format::to_string(problem);
  if (diagnosis) diagnosis->problems.push_back({"header", message + explanation(problem), std::nullopt});
  const bool incompatible = problem == format::Problem::version || problem == format::Problem::byte_order;
  return Error{incompatible ? Errc::incompatible : Errc::corrupt, 0, std::move(message)};
}

const char* slot_state_text(format::SlotState s) noexcept {
  switch (s) {
    case format::SlotState::zero_sequence: return "holds data but sequence 0";
    case format::SlotState::reserved_not_zero: return "its reserved field is not zero";
    case format::SlotState::bad_checksum: return "fails its checksum (a torn or damaged commit)";
    case format::SlotState::empty:
    case format::SlotState::valid: break;
  }
  return "";
}

std::string bounds_problem(const format::CommitSlot& s, std::uint64_t file_size) {
  if (s.committed_size > file_size)
    return "names a commit ending at byte " + std::to_string(s.committed_size) + " but the file has only " +
           std::to_string(file_size) + " bytes (truncated?)";
  return "is inconsistent (index at " + std::to_string(s.index_offset) + ", " + std::to_string(s.index_size) +
         " bytes, " + std::to_string(s.entry_count) + " entries, commit ends at " + std::to_string(s.committed_size) +
         ")";
}

// One verifying commit slot as read_committed tried it.
struct SlotAttempt {
  bool tried = false;       // its checksum verifies, so its bounds and index were looked at
  bool usable = false;      // and they verify too
  bool index_read = false;  // its index was read (and failed, unless usable)
  const char* kind = "";    // what failed: "slot" (its bounds) or "index"
  std::string failure;      // how, for a diagnosis
  std::vector<format::IndexRecord> records;  // the index; when it fails, what parsed
  std::vector<format::Diagnostic> index_problems;
};

constexpr const char* kReplaced = ": the library would replace this file with an empty one";

}  // namespace

Result<format::DecodedHeader> read_header(platform::Platform& pf, const platform::File& fd) {
  try {
    return decode_header_at(pf, fd, nullptr);
  } catch (const std::bad_alloc&) {
    return platform::no_memory_error("out of memory while reading the header of", fd.path());
  }
}

Result<CommittedState> read_committed_current(platform::Platform& pf, const platform::File& fd,
                                              platform::FileInfo* info, std::uint64_t max_bytes,
                                              std::uint64_t newer_than, Diagnosis* diagnosis) {
  // Each retry needs a commit by another process between two fstat()s; a writer committing in a
  // tight loop could in theory outrun a few, so the bound only keeps a reader from spinning.
  constexpr int kAttempts = 16;
  constexpr int kTornAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    if (diagnosis) *diagnosis = Diagnosis{};
    auto st = read_committed(pf, fd, info->size, max_bytes, newer_than, diagnosis, info);
    // What a commit landing meanwhile looks like: a newest slot past the size seen, which is
    // either the only one (corrupt) or one the read fell back from.
    const bool suspect = st ? st->newest_damaged || (diagnosis && !diagnosis->problems.empty())
                            : st.error().code == Errc::corrupt;
    if (suspect && attempt < kAttempts) {
      auto seen = pf.stat_file(fd);
      if (seen && seen->size != info->size) {  // a commit landed: read again
        *info = seen.value();
        continue;
      }
      // A diagnosis also sees the slot a writer is writing at this moment, torn (its checksum
      // fails), without the size moving: the file was grown before. Read again after a pause,
      // a few times; damage stays, a torn slot is finished or gone.
      if (diagnosis && attempt < kTornAttempts) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
    }
    // Damage (nothing moved), or none. Said once, for the read that stands: a read that a
    // commit overtook is not damage.
    if (st && st->newest_damaged) log::warn("'{}': newest commit slot is damaged; using the previous one", fd.path());
    return st;
  }
}

int next_slot_index(const format::DecodedHeader& h) noexcept {
  if (!h.slot_valid[0]) return 0;
  if (!h.slot_valid[1]) return 1;
  return h.slot[0].sequence < h.slot[1].sequence ? 0 : 1;
}

Result<CommittedState> read_committed(platform::Platform& pf, const platform::File& fd, std::uint64_t file_size,
                                      std::uint64_t max_bytes, std::uint64_t newer_than, Diagnosis* diagnosis,
                                      platform::FileInfo* restat) {
  if (kMobileBuild) diagnosis = nullptr;  // no diagnosing reader in a mobile build (mobile.hpp)
  const std::string& path = fd.path();
  try {
    auto report = [diagnosis](const char* kind, std::string message) {
      if (diagnosis) diagnosis->problems.push_back({kind, std::move(message), std::nullopt});
    };
    if (file_size < format::kHeaderSize) {
      std::string message = "the file is shorter than its header (" + std::to_string(file_size) + " of " +
                            std::to_string(format::kHeaderSize) + " bytes)";
      report("header", message);
      return Error{Errc::corrupt, 0, std::move(message)};
    }
    auto hr = decode_header_at(pf, fd, diagnosis);
    if (!hr) return hr.error();
    if (restat != nullptr) {  // the size after the header: it covers every commit the header names
      if (auto now = pf.stat_file(fd)) {
        *restat = now.value();
        file_size = now->size;
      }
    }
    const format::DecodedHeader& h = hr.value();
    if (diagnosis) diagnosis->header = h.fixed;
    for (int i : {0, 1})
      if (h.slot_state[i] != format::SlotState::empty && h.slot_state[i] != format::SlotState::valid)
        report("slot", "commit slot " + std::to_string(i) + " " + slot_state_text(h.slot_state[i]));
    CommittedState out;
    out.fixed = h.fixed;
    // Our writers give every commit the next sequence, into the slot not in use: two valid
    // slots with one sequence, or a sequence that cannot be followed, are a damaged or forged
    // header, and a writer could only overwrite its newest commit from there.
    std::optional<Error> refused;
    if (h.slot_valid[0] && h.slot_valid[1] && h.slot[0].sequence == h.slot[1].sequence)
      refused = Error{Errc::corrupt, 0,
                      "both commit slots hold sequence " + std::to_string(h.slot[0].sequence) + " (a damaged header)"};
    for (int i : {0, 1})
      if (!refused && h.slot_valid[i] && h.slot[i].sequence == UINT64_MAX)
        refused = Error{Errc::corrupt, 0, "the commit sequence is exhausted (a forged header)"};
    if (refused) {
      if (!diagnosis) return *refused;
      report("slot", refused->message + kReplaced);
    }
    // Newest verifying slot first; fall back to the older one (its index is never overwritten).
    // A diagnosis reads both.
    int order[2] = {0, 1};
    if (h.slot[1].sequence > h.slot[0].sequence) std::swap(order[0], order[1]);
    SlotAttempt tried[2];
    int used = -1;
    std::string detail = "no commit slot verifies";
    for (int i : order) {
      if (!h.slot_valid[i]) continue;
      const auto& s = h.slot[i];
      SlotAttempt& a = tried[i];
      a.tried = true;
      if (used < 0) {
        out.newest_damaged = i != order[0];
        if (s.sequence <= newer_than && !refused) {  // nothing newer than what the caller holds
          out.slot = s;
          out.slot_index = i;
          out.unchanged = true;
          return out;
        }
      }
      if (!format::slot_in_bounds(s, file_size)) {
        detail = "commit slot points outside the file";
        a.kind = "slot";
        a.failure = bounds_problem(s, file_size);
        continue;
      }
      // Never allocate for, or read, an index that could not be mapped anyway: a hostile sparse
      // file may claim terabytes. But a commit larger than this process may map is not damage:
      // falling back to the older commit would have a writer commit over it (the same sequence
      // again, and a trim below the newer commit's data). Say the file is too large instead.
      if (used < 0 && s.committed_size > max_bytes) {
        if (refused) return *refused;
        return Error{Errc::no_space, 0,
                     "the newest commit of '" + path + "' spans " + std::to_string(s.committed_size) +
                         " bytes, more than this cache's max_file_bytes (" + std::to_string(max_bytes) +
                         "); raise max_file_bytes (or the address-space limit) to use it"};
      }
      a.kind = "index";
      // A diagnosis reads a small failing index whole, to say what else is wrong with it; a large
      // one is held to the same rule as a cache's open, or a sparse file claiming a 1 GiB index
      // would cost the tool 1 GiB: only its checksum is checked, in pieces.
      if (s.index_size > kStreamCheckIndexBytes) {
        auto same = index_matches_slot(pf, fd, s);
        if (!same) return same.error();
        if (!same.value()) {
          const std::string failure = format::to_string(format::Problem::bad_checksum);
          detail = "index: " + failure;
          if (diagnosis) {
            a.index_read = true;
            a.failure = "points at an index that fails: " + failure;
            a.index_problems.push_back(
                {"index",
                 "index of sequence " + std::to_string(s.sequence) + ": the index (" + std::to_string(s.index_size) +
                     " bytes) does not match the checksum in its commit slot; an index over " +
                     std::to_string(kStreamCheckIndexBytes >> 20) +
                     " MiB that fails its checksum is not read further, so its records are not checked",
                 std::nullopt});
          }
          continue;
        }
      }
      // At most max_bytes (checked above): no memory for it is not damage (std::bad_alloc, below).
      // From a mapping of its own when large (index_memory.hpp): a new process's open otherwise
      // takes a page fault per 4 KiB of it.
      IndexMemory scratch(kScratchMapBytes);
      scratch.populate_next();
      std::pmr::vector<std::byte> t(s.index_size + format::kFooterSize, &scratch);
      if (auto r = pf.read_at(fd, t.data(), t.size(), s.index_offset); !r) return r.error();
      a.index_read = true;
      std::string why;
      const auto p = format::decode_trailer(t, s, h.fixed.alignment, &a.records, &why,
                                            diagnosis ? &a.index_problems : nullptr);
      if (p == format::Problem::none) {
        a.usable = true;
        if (used < 0) used = i;
        if (!diagnosis) break;
        continue;
      }
      const std::string failure = std::string(format::to_string(p)) + (why.empty() ? "" : " (" + why + ")");
      detail = "index: " + failure;
      a.failure = "points at an index that fails: " + failure;
    }
    if (diagnosis) {
      for (int i : order) {
        const SlotAttempt& a = tried[i];
        if (!a.tried || a.usable) continue;
        std::string message = "commit slot " + std::to_string(i) + " (sequence " + std::to_string(h.slot[i].sequence) +
                              ") " + a.failure;
        if (used >= 0 && !refused && h.slot[i].sequence > h.slot[used].sequence)
          message += "; readers fall back to sequence " + std::to_string(h.slot[used].sequence);
        report(a.kind, std::move(message));
      }
      if (used >= 0) {
        if (refused) {
          diagnosis->salvaged = std::move(tried[used].records);
          diagnosis->salvaged_data_end = h.slot[used].index_offset;
        }
      } else if (!tried[0].tried && !tried[1].tried) {
        report("slot", "no commit slot was ever written: the file holds no index");
      } else {
        report("index", std::string("no commit slot points at a valid index") + kReplaced);
        // What is wrong with the newest index that could be read; its records for the data check.
        for (int i : order) {
          SlotAttempt& a = tried[i];
          if (!a.index_read) continue;
          for (auto& d : a.index_problems) diagnosis->problems.push_back(std::move(d));
          diagnosis->salvaged = std::move(a.records);
          diagnosis->salvaged_data_end = h.slot[i].index_offset;
          break;
        }
      }
    }
    if (refused) return *refused;
    if (used < 0) return Error{Errc::corrupt, 0, detail};
    out.slot = h.slot[used];
    out.slot_index = used;
    out.newest_damaged = used != order[0];
    out.records = std::move(tried[used].records);
    return out;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while reading the index of '" + path + "'"};
  }
}

}  // namespace weightcache
