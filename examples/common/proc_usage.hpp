// What this process holds in memory, from /proc (Linux), for the examples' JSON reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/stat.h>

namespace weightcache::example {

// A field of /proc/self/status in KiB ("RssAnon:", "RssFile:", "VmHWM:"); 0 when absent.
inline std::uint64_t status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0) return std::strtoull(line.c_str() + n + 1, nullptr, 10);
  return 0;
}

// The CPU this process runs on, as a report names it: /proc/cpuinfo's model name and the features
// that decide ggml's and XNNPACK's layouts ("AMD EPYC (AVX2; no AMX)", "Intel Xeon ... (AVX-512, AMX)").
inline std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(f, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (model.empty() && (key == "model name" || key == "CPU part")) model = value;
    if (flags.empty() && (key == "flags" || key == "Features")) flags = " " + value + " ";
  }
  if (model.empty()) model = "an unnamed CPU";
  auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
  std::string features;
  auto add = [&](const char* what) { features += (features.empty() ? "" : ", ") + std::string(what); };
  if (has("avx512f")) add("AVX-512");
  else if (has("avx2")) add("AVX2");
  if (has("avx512_vnni")) add("VNNI");
  if (has("asimddp")) add("dot product");
  if (has("i8mm")) add("i8mm");
  if (has("sme")) add("SME");
  const bool x86 = has("sse2");
  std::string out = model;
  if (!features.empty() || x86) out += " (" + features + (x86 ? std::string(features.empty() ? "" : "; ") + (has("amx_int8") ? "AMX" : "no AMX") : "") + ")";
  return out;
}

// Summed Rss/Pss/Private_Dirty (KiB) of this process's mappings of `path` (by inode).
struct Usage {
  std::uint64_t rss = 0, pss = 0, private_dirty = 0;
};
inline Usage file_usage(const std::string& path) {
  Usage u;
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return u;
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long long a = 0, b = 0, off = 0, ino = 0;
    char perms[8] = {};
    unsigned maj = 0, min = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &a, &b, perms, &off, &maj, &min, &ino) == 7) {
      in = ino == static_cast<unsigned long long>(st.st_ino) && ino != 0;
      continue;
    }
    if (!in) continue;
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "Rss: %llu kB", &kb) == 1) u.rss += kb;
    else if (std::sscanf(line.c_str(), "Pss: %llu kB", &kb) == 1) u.pss += kb;
    else if (std::sscanf(line.c_str(), "Private_Dirty: %llu kB", &kb) == 1) u.private_dirty += kb;
  }
  return u;
}

}  // namespace weightcache::example
