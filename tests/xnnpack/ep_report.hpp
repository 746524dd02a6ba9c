// The reference EP's --report file: one line of key=value pairs per session, and per process a
// line with "summary". Read by the EP's tests with and without a real XNNPACK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace weightcache::test {

using ReportLine = std::map<std::string, std::string>;

/// Reads the lines of `path` after the first `*consumed`, sorting them into session and summary
/// lines, and moves *consumed past them (runs append to one report file).
inline void read_ep_report(const std::string& path, std::size_t* consumed, std::vector<ReportLine>* sessions,
                           std::vector<ReportLine>* summaries) {
  std::ifstream in(path);
  std::string text;
  std::size_t n = 0;
  while (std::getline(in, text)) {
    if (n++ < *consumed) continue;
    ReportLine kv;
    std::istringstream ss(text);
    std::string tok;
    while (ss >> tok)
      if (const auto eq = tok.find('='); eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    if (kv.count("summary") != 0) {
      if (summaries != nullptr) summaries->push_back(kv);
    } else {
      sessions->push_back(kv);
    }
  }
  *consumed = n;
}

/// A number of a report line; UINT64_MAX when the key is missing.
inline std::uint64_t report_number(const ReportLine& l, const std::string& k) {
  auto it = l.find(k);
  return it == l.end() ? UINT64_MAX : std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace weightcache::test
