// Garbage collection of a cache directory (wc_gc): removes the least recently used cache files
// that no process has open until the directory is within a byte budget.
#pragma once

#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <string>

namespace weightcache {

/// gc() through a given platform (tests pass one that observes or fails calls).
Result<GcReport> collect_garbage(platform::Platform& pf, const std::string& dir, std::uint64_t max_bytes);

/// True when `name` is what a writer names the file it builds before renaming it over
/// `<base>`: "<base>.tmp.<digits>.<anything>" (the library's TempFile, the CLI's compact and
/// convert). Sets *base. Such a file is never taken for a cache, whatever it holds.
bool temporary_name(const std::string& name, std::string* base);

}  // namespace weightcache
