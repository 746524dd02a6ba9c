// The process-wide registry: one Core per (file identity, compatibility key, read-only) so that
// every session of a process shares one set of mappings and entries.
#pragma once

#include "core.hpp"

namespace weightcache::registry {

/// Returns the live Core for this file if one is open in this process, else opens one.
Result<std::shared_ptr<Core>> open(const Options& options);

/// Number of live registered caches (for tests).
std::size_t live_count() noexcept;

}  // namespace weightcache::registry
