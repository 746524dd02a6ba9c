// What a WEIGHTCACHE_MOBILE build leaves out of the library (CMakeLists.txt; docs/INTEGRATION.md,
// "Mobile builds"), and what a call into the part left out says instead.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <string>

namespace weightcache {

#if defined(WEIGHTCACHE_MOBILE) && WEIGHTCACHE_MOBILE
inline constexpr bool kMobileBuild = true;
#else
inline constexpr bool kMobileBuild = false;
#endif

/// Errc::unsupported, saying that `what` is not in this build and what to do instead.
inline Error left_out_of_mobile_build(const char* what, const char* instead) {
  return Error{Errc::unsupported, 0,
               std::string(what) + " is not in this build of weightcache (built with WEIGHTCACHE_MOBILE=ON): " + instead +
                   ", or use a build without WEIGHTCACHE_MOBILE"};
}

}  // namespace weightcache
