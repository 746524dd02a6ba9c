// What a wc_cache handle is, for the library's own C-ABI layers (c_api.cpp, the XNNPACK adapter)
// that need more of the core than the public C calls give.
#pragma once

#include "core.hpp"

#include <weightcache/weightcache.h>

#include <memory>

struct wc_cache {
  std::shared_ptr<weightcache::Core> core;
};
