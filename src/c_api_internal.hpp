// What a wc_cache handle is, for the C ABI's implementation (c_api.cpp). The integrations in
// src/integrations use the public calls only (docs/DESIGN.md, "Integrations on the public API").
#pragma once

#include "core.hpp"

#include <weightcache/weightcache.h>

#include <memory>

struct wc_cache {
  std::shared_ptr<weightcache::Core> core;
};
