// fork() beside threads (weightcache.h, "Caveats"): the library's process-wide locks held across
// fork, so that a child finds none of them taken by a thread it does not have.
#pragma once

namespace weightcache::fork_guard {

/// Registers, once per process, the pthread_atfork handlers that hold every process-wide lock of
/// the library across fork() and let go of them on both sides (a no-op where there is no fork).
/// Called before the first use of any of those locks: the first open, the logger's set-up.
void install() noexcept;

}  // namespace weightcache::fork_guard
