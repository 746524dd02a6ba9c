// Where a cache file's pages live, from the kernel's account in /proc/<pid>/smaps (Linux only):
// shared page-cache pages (Shared_Clean; Pss < Rss once several processes map them) or private
// copies (Private_Dirty). Shared by the examples, the benchmarks and the tests, which are built
// without one another: common/ belongs to none of them (CMake target weightcache_smaps). Never
// part of the library; not installed.
#pragma once

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace weightcache::smaps {

/// Sums over the mappings an smaps file lists; sizes in bytes.
struct MappingUsage {
  bool readable = false;     // the smaps file could be read
  std::size_t mappings = 0;  // VMAs counted
  std::uint64_t size = 0;    // their virtual size
  std::uint64_t rss = 0;
  std::uint64_t pss = 0;
  std::uint64_t shared_clean = 0;
  std::uint64_t shared_dirty = 0;
  std::uint64_t private_clean = 0;
  std::uint64_t private_dirty = 0;
};

/// A mapping's header line: "start-end perms offset major:minor inode [path]".
struct MappingHeader {
  std::uintptr_t start = 0;  // the mapping's addresses: [start, end)
  std::uintptr_t end = 0;
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  unsigned long long inode = 0;  // 0 for anonymous memory
  std::string path;              // as the kernel shows it, without a " (deleted)" mark
};

/// Parses `line` as a mapping header; false for a counter line ("Name:   value kB").
inline bool parse_mapping_header(const std::string& line, MappingHeader* h) {
  const auto space = line.find(' ');
  if (space == std::string::npos || line.find('-') > space || line[space - 1] == ':') return false;
  *h = MappingHeader{};  // an anonymous mapping has no path: nothing may stay from the last header
  std::istringstream in(line);
  std::string range, perms, offset, dev;
  in >> range >> perms >> offset >> dev >> h->inode;
  unsigned long long start = 0, end = 0;
  if (std::sscanf(range.c_str(), "%llx-%llx", &start, &end) == 2) {
    h->start = static_cast<std::uintptr_t>(start);
    h->end = static_cast<std::uintptr_t>(end);
  }
  std::sscanf(dev.c_str(), "%x:%x", &h->dev_major, &h->dev_minor);
  std::getline(in >> std::ws, h->path);
  const std::string deleted = " (deleted)";
  if (h->path.size() > deleted.size() && h->path.compare(h->path.size() - deleted.size(), deleted.size(), deleted) == 0)
    h->path.resize(h->path.size() - deleted.size());
  return true;
}

/// Whether the mapping maps the file `st` describes (same device and inode, whatever its path).
inline bool maps_file(const MappingHeader& h, const struct stat& st) {
  return h.inode != 0 && h.inode == st.st_ino && h.dev_major == major(st.st_dev) && h.dev_minor == minor(st.st_dev);
}

/// Adds one counter line ("Pss:   1234 kB") to `u`; other counters are ignored.
inline void add_counter(const std::string& line, MappingUsage* u) {
  std::istringstream in(line);
  std::string name;
  std::uint64_t kib = 0;
  if (!(in >> name >> kib)) return;
  const std::uint64_t bytes = kib * 1024;
  if (name == "Size:") u->size += bytes;
  else if (name == "Rss:") u->rss += bytes;
  else if (name == "Pss:") u->pss += bytes;
  else if (name == "Shared_Clean:") u->shared_clean += bytes;
  else if (name == "Shared_Dirty:") u->shared_dirty += bytes;
  else if (name == "Private_Clean:") u->private_clean += bytes;
  else if (name == "Private_Dirty:") u->private_dirty += bytes;
}

/// Sums the counters of the mappings in `smaps_path` for which `counts(const MappingHeader&)` is
/// true. Also reads /proc/<pid>/smaps_rollup, whose single header stands for the whole process.
template <class Counts>
MappingUsage sum_mappings(const std::string& smaps_path, Counts counts) {
  MappingUsage u;
  std::ifstream in(smaps_path);
  if (!in) return u;
  u.readable = true;
  std::string line;
  MappingHeader header;
  bool counted = false;
  while (std::getline(in, line)) {
    if (parse_mapping_header(line, &header)) {
      counted = counts(header);
      if (counted) ++u.mappings;
    } else if (counted) {
      add_counter(line, &u);
    }
  }
  return u;
}

/// The mappings of the file at `file` (matched by device and inode, so a relative or symlinked
/// path still matches). Not readable when the file or the smaps file is missing.
inline MappingUsage file_mapping_usage(const std::string& file, const std::string& smaps_path = "/proc/self/smaps") {
  struct stat st {};
  if (file.empty() || ::stat(file.c_str(), &st) != 0) return {};
  return sum_mappings(smaps_path, [&](const MappingHeader& h) { return maps_file(h, st); });
}

/// A range of this process's memory: [start, start + size).
struct AddressRange {
  std::uintptr_t start = 0;
  std::size_t size = 0;
};

/// The anonymous (private, not file-backed) mappings that hold any byte of `ranges`: where a
/// runtime's heap-packed weights live. Counts whole mappings, so memory is best kept in mappings
/// of its own (a large allocation is one; guard pages keep the kernel from merging neighbours).
template <class Ranges>
MappingUsage anonymous_usage_of(const Ranges& ranges, const std::string& smaps_path = "/proc/self/smaps") {
  return sum_mappings(smaps_path, [&](const MappingHeader& h) {
    if (h.inode != 0) return false;
    for (const AddressRange& r : ranges)
      if (r.size != 0 && r.start < h.end && h.start < r.start + r.size) return true;
    return false;
  });
}

}  // namespace weightcache::smaps
