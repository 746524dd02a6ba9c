// The instruction-set features of this process's CPU that packed layouts follow: the text
// wc_cpu_features returns (weightcache.h says its form).
#pragma once

#include <string>

namespace weightcache {

/// Computed once; "" if that ran out of memory.
const std::string& cpu_features_text() noexcept;

}  // namespace weightcache
