// Memory accounting of one file's mappings, from /proc/<pid>/smaps (Linux). Tells whether the
// pages a cache serves are shared page-cache pages (Shared_Clean, Pss < Rss across processes)
// or private copies (Private_Dirty).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include <sys/stat.h>
#include <sys/sysmacros.h>

namespace weightcache::test {

/// Sums over every mapping of the file; all sizes in bytes.
struct SmapsUsage {
  std::size_t mappings = 0;  // VMAs that map the file
  std::uint64_t size = 0;    // virtual size of those VMAs
  std::uint64_t rss = 0;
  std::uint64_t pss = 0;
  std::uint64_t shared_clean = 0;
  std::uint64_t shared_dirty = 0;
  std::uint64_t private_clean = 0;
  std::uint64_t private_dirty = 0;
};

namespace detail {

inline bool is_smaps_header(const std::string& line) {
  // "start-end perms offset dev inode [path]"; field lines start with "Name:".
  const auto space = line.find(' ');
  if (space == std::string::npos) return false;
  const auto dash = line.find('-');
  return dash != std::string::npos && dash < space && line[space - 1] != ':';
}

}  // namespace detail

/// Usage of `file`'s mappings in the process whose smaps is `smaps_path` (default: this one).
/// A file that is not mapped gives all zeros. Matches by device and inode (the path shown by
/// the kernel may differ from the one the test used), falling back to the canonical path.
inline SmapsUsage smaps_usage(const std::string& file, const std::string& smaps_path = "/proc/self/smaps") {
  SmapsUsage u;
  struct stat st {};
  const bool have_stat = ::stat(file.c_str(), &st) == 0;
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(file, ec).string();

  std::ifstream in(smaps_path);
  std::string line;
  bool in_match = false;
  while (std::getline(in, line)) {
    if (detail::is_smaps_header(line)) {
      std::istringstream hs(line);
      std::string range, perms, offset, dev, inode_str, path;
      hs >> range >> perms >> offset >> dev >> inode_str;
      std::getline(hs >> std::ws, path);
      const std::string deleted = " (deleted)";
      if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
        path.resize(path.size() - deleted.size());
      bool match = !canonical.empty() && path == canonical;
      if (!match && have_stat && !inode_str.empty() && inode_str != "0") {
        unsigned maj = 0, min = 0;
        char colon = 0;
        std::istringstream ds(dev);
        ds >> std::hex >> maj >> colon >> min;
        match = std::stoull(inode_str) == static_cast<unsigned long long>(st.st_ino) && maj == major(st.st_dev) &&
                min == minor(st.st_dev);
      }
      in_match = match;
      if (in_match) ++u.mappings;
      continue;
    }
    if (!in_match) continue;
    std::istringstream fs(line);
    std::string name;
    std::uint64_t kib = 0;
    if (!(fs >> name >> kib)) continue;
    const std::uint64_t bytes = kib * 1024;
    if (name == "Size:") u.size += bytes;
    else if (name == "Rss:") u.rss += bytes;
    else if (name == "Pss:") u.pss += bytes;
    else if (name == "Shared_Clean:") u.shared_clean += bytes;
    else if (name == "Shared_Dirty:") u.shared_dirty += bytes;
    else if (name == "Private_Clean:") u.private_clean += bytes;
    else if (name == "Private_Dirty:") u.private_dirty += bytes;
  }
  return u;
}

}  // namespace weightcache::test
