// The text of wc_cpu_features (c_api.cpp): the instruction-set features of this process's CPU,
// as a compatibility-key part (weightcache.h). Packed layouts follow the kernels a packer picks for the CPU, so a cache
// built on one CPU profile and used on another must be told apart by them.
#include "cpu_features.hpp"

#include <cstdio>
#include <string>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace weightcache {
namespace {

std::string features() {
#if defined(__x86_64__) || defined(__i386__)
  std::string s =
#if defined(__x86_64__)
      "x86_64:";
#else
      "i386:";
#endif
  __builtin_cpu_init();
  struct Feature {
    const char* name;
    int on;
  };
  const Feature list[] = {
      {"sse4.1", __builtin_cpu_supports("sse4.1")},   {"avx", __builtin_cpu_supports("avx")},
      {"avx2", __builtin_cpu_supports("avx2")},       {"fma", __builtin_cpu_supports("fma")},
#if defined(__clang__) && __clang_major__ < 16
      {"f16c", 0},  // older clang does not know the name (the library is built with GCC; only this text differs)
#else
      {"f16c", __builtin_cpu_supports("f16c")},
#endif
      {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")}, {"avx512vl", __builtin_cpu_supports("avx512vl")},
      {"avx512dq", __builtin_cpu_supports("avx512dq")}, {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
  };
  bool first = true;
  for (const Feature& f : list) {
    if (!f.on) continue;
    s += (first ? "" : ",");
    s += f.name;
    first = false;
  }
  return s;
#elif defined(__aarch64__) && defined(__linux__)
  char buf[64];
  std::snprintf(buf, sizeof buf, "aarch64:hwcap=%lx,%lx", ::getauxval(AT_HWCAP), ::getauxval(AT_HWCAP2));
  return buf;
#else
  return "other";
#endif
}

}  // namespace

const std::string& cpu_features_text() noexcept {
  static const std::string* text = [] {
    try {
      return new std::string(features());  // never destroyed: callable from exit handlers
    } catch (...) {
      return static_cast<std::string*>(nullptr);
    }
  }();
  static const std::string none;
  return text != nullptr ? *text : none;
}

}  // namespace weightcache
