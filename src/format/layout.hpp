// Where a file's entries may lie, for any record type with a `key` (std::string), an `offset` and
// a `size`: the reader's IndexRecord (format.cpp's check_layout), and the inspection library's
// entries of an ExecuTorch XPWC index, checked where they are rather than copied (a hostile index
// may hold millions). Also the problems one decode finds (Findings), shared by both. Internal to
// the library and the inspection library; format.hpp is the interface everyone else uses.
#pragma once

#include "format/format.hpp"
#include "mobile.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::format {

/// XXH3-64 of a key with a seed (process_hash_seed() for tables of keys a file chose).
std::uint64_t hash_key_seeded(std::string_view key, std::uint64_t seed) noexcept;
/// Adds to what duplicate_check_probes() reports.
void count_duplicate_check_probes(std::uint64_t n) noexcept;

// The problems of one decode: the first decides the result; the rest are wanted only by a
// diagnosing caller. found() says whether decoding must stop: at the first problem without
// diagnostics, and never with them (the caller stops where nothing beyond can be read).
class Findings {
 public:
  Findings(std::string* detail, std::vector<Diagnostic>* diagnostics) : detail_(detail), diagnostics_(diagnostics) {}
  // A mobile build has no diagnosing reader (only the CLI's inspect and verify ask for one): the
  // messages below are then never built, and their code is left out.
  bool diagnosing() const noexcept { return !kMobileBuild && diagnostics_ != nullptr; }
  Problem first() const noexcept { return first_; }

  /// A problem that another finding will describe.
  void note(Problem p) noexcept {
    if (first_ == Problem::none) first_ = p;
  }
  /// `message` is built, and `key` copied, only when someone reads them.
  template <class Message>
  bool found(Problem p, const char* detail, const char* kind, Message&& message,
             std::optional<std::string_view> key = std::nullopt) {
    if (first_ == Problem::none) {
      first_ = p;
      if (detail_ != nullptr && detail != nullptr) *detail_ = detail;
    }
    if (!diagnosing()) return true;
    // Described up to a limit per kind, counted beyond it: what a hostile index can make us hold.
    Tally& t = tally(kind);
    if (t.listed < kMaxDiagnosticsPerKind) {
      ++t.listed;
      diagnostics_->push_back({kind, message(), key ? std::optional<std::string>(*key) : std::nullopt});
    } else {
      ++t.unlisted;
    }
    return false;
  }
  /// Appends, for each kind found more often than described, one diagnostic saying how many more.
  void close() {
    if (!diagnosing()) return;
    for (const Tally& t : tallies_)
      if (t.unlisted != 0)
        diagnostics_->push_back({t.kind,
                                 std::to_string(t.unlisted) + " more problems of this kind (" + t.kind +
                                     ") were found, not listed one by one",
                                 std::nullopt, t.unlisted});
  }

 private:
  struct Tally {
    const char* kind;
    std::size_t listed = 0;
    std::uint64_t unlisted = 0;
  };
  Tally& tally(const char* kind) {
    for (Tally& t : tallies_)
      if (std::strcmp(t.kind, kind) == 0) return t;
    return tallies_.emplace_back(Tally{kind});
  }

  std::string* detail_;
  std::vector<Diagnostic>* diagnostics_;
  Problem first_ = Problem::none;
  std::vector<Tally> tallies_;  // a few kinds at most
};

namespace layout_detail {

inline std::string quoted(std::string_view key) { return "'" + display_key(key) + "'"; }

template <class Record>
std::string span_text(const Record& r) {
  return "(offset " + std::to_string(r.offset) + ", " + std::to_string(r.size) + " bytes)";
}

}  // namespace layout_detail

/// check_layout (format.hpp) for any record type with `key`, `offset` and `size`, reporting to
/// `f`. Linear after one sort; a kind of problem met more than kMaxDiagnosticsPerKind times is
/// counted, not described.
template <class Record>
Problem check_layout_of(std::span<const Record> records, std::uint64_t begin, std::uint64_t end,
                        std::uint64_t alignment, Findings& f) {
  using layout_detail::quoted;
  using layout_detail::span_text;
  // Duplicate keys: one open-addressing table of record numbers (one allocation, not a node per
  // key; an open pays this for every entry of the index).
  std::size_t slots = 16;
  while (slots < records.size() * 2) slots *= 2;
  std::vector<std::uint32_t> table(slots, 0);  // record number + 1; 0: empty
  const std::uint64_t seed = process_hash_seed();
  std::uint64_t probes = 0;
  struct CountProbes {
    std::uint64_t& n;
    ~CountProbes() { count_duplicate_check_probes(n); }
  } count_probes{probes};
  auto first_with_key = [&](std::size_t i) -> bool {
    const std::string& key = records[i].key;
    // Seeded per process: a hostile file cannot pile its keys into one probe run.
    for (std::size_t at = hash_key_seeded(key, seed) & (slots - 1);; at = (at + 1) & (slots - 1)) {
      ++probes;
      if (table[at] == 0) {
        table[at] = static_cast<std::uint32_t>(i + 1);
        return true;
      }
      if (records[table[at] - 1].key == key) return false;
    }
  };
  std::vector<const Record*> order;
  order.reserve(records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    if (!lies_within(r.offset, r.size, begin, end)) {
      const std::string detail = "entry " + std::to_string(i) + " lies outside the data area";
      if (f.found(Problem::bad_bounds, detail.c_str(), "entry_bounds", [&] {
            return "entry " + quoted(r.key) + " " + span_text(r) + " lies outside the data area [" +
                   std::to_string(begin) + ", " + std::to_string(end) + ")";
          }, r.key))
        return f.first();
    } else {
      order.push_back(&r);
      if (alignment > 1 && r.offset % alignment != 0) {
        const std::string detail = "entry " + std::to_string(i) + " is misaligned";
        if (f.found(Problem::bad_value, detail.c_str(), "entry_alignment", [&] {
              return "entry " + quoted(r.key) + " (offset " + std::to_string(r.offset) + ") is not aligned to " +
                     std::to_string(alignment);
            }, r.key))
          return f.first();
      }
    }
    if (!first_with_key(i) &&
        f.found(Problem::bad_value, "duplicate key in index", "duplicate_key",
                [&] { return "key " + quoted(r.key) + " appears more than once in the index"; }, r.key))
      return f.first();
  }
  // An append-only file's index is nearly always in file order already: sorted only if not.
  const auto by_place = [](const Record* a, const Record* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
  };
  if (!std::is_sorted(order.begin(), order.end(), by_place)) std::sort(order.begin(), order.end(), by_place);
  // The entry reaching furthest so far: an overlap with any earlier entry implies one with it.
  const Record* reach = nullptr;
  const Record* prev = nullptr;
  for (const Record* r : order) {
    const Record* other = nullptr;
    if (reach != nullptr && r->offset < reach->offset + reach->size) other = reach;
    else if (prev != nullptr && r->offset == prev->offset) other = prev;  // same start, even if empty
    if (other != nullptr &&
        f.found(Problem::bad_bounds, "entries overlap", "entry_overlap", [&] {
          return "entries " + quoted(other->key) + " " + span_text(*other) + " and " + quoted(r->key) + " " +
                 span_text(*r) + " overlap";
        }, r->key))
      return f.first();
    if (reach == nullptr || r->offset + r->size > reach->offset + reach->size) reach = r;
    prev = r;
  }
  return f.first();
}

/// check_layout_of with its own Findings: the first problem, with `detail`; with `diagnostics`,
/// every problem (as check_layout in format.hpp).
template <class Record>
Problem check_layout_of(std::span<const Record> records, std::uint64_t begin, std::uint64_t end,
                        std::uint64_t alignment, std::string* detail, std::vector<Diagnostic>* diagnostics) {
  Findings f(detail, diagnostics);  // std::bad_alloc propagates: no memory is not damage
  const Problem p = check_layout_of(records, begin, end, alignment, f);
  f.close();
  return p;
}

}  // namespace weightcache::format
