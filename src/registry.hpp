// The process-wide registry: one Core per (file identity, compatibility key, read-only) so that
// every session of a process shares one set of mappings and entries.
#pragma once

#include "core.hpp"

namespace weightcache::registry {

/// Returns the live Core for this file if one is open in this process, else opens one.
Result<std::shared_ptr<Core>> open(const Options& options);

/// Number of live registered caches (for tests).
std::size_t live_count() noexcept;

/// Around fork() (fork_guard.cpp): holds the registry's mutex; after it, lets go of it and, in
/// the child, forgets the opens in progress, whose gates the parent's threads held.
void lock_for_fork() noexcept;
void unlock_after_fork(bool in_child) noexcept;

}  // namespace weightcache::registry
