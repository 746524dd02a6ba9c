// A child of fork() has only the thread that forked. A lock that another thread held at that
// moment stays held in the child forever, and the child's first open or log line would wait for
// it (weightcache.h promises that a child may open a cache of its own). So the prepare handler
// takes every process-wide lock of the library, in the order the code nests them, before the
// fork: no other thread is inside one when the address space is copied, and what they guard is
// consistent. Both sides then let go; the child also forgets the opens in progress, which were
// the parent's threads' (registry.cpp).
//
// Per-cache locks are not here: a child uses only caches it opened itself (the registry never
// hands it one opened before the fork), and closing an inherited one takes none of its locks
// (Core::~Core). The cost: fork waits for a thread inside one of these locks, at worst for a
// slow log callback to return (weightcache.h says so).
#include "fork_guard.hpp"

#if !defined(_WIN32)
#include "core.hpp"
#include "format/format.hpp"
#include "log.hpp"
#include "platform/platform.hpp"
#include "registry.hpp"

#include <pthread.h>
#endif

namespace weightcache::fork_guard {

#if defined(_WIN32)
void install() noexcept {}
#else
namespace {

// The registry's mutex is held around the others (an open refused under it logs, and a cache
// whose last handle is dropped under it closes: lease holders, mappings, log); the others are
// leaves, holding nothing while they wait. The log's lock comes last: a callback under it may
// be slow, and taking it last keeps the others free meanwhile.
void prepare() {
  registry::lock_for_fork();
  Core::lock_lease_holders_for_fork();
  platform::lock_for_fork();
  log::lock_for_fork();
}

void after_fork(bool in_child) {
  log::unlock_after_fork();
  platform::unlock_after_fork();
  Core::unlock_lease_holders_after_fork();
  registry::unlock_after_fork(in_child);
}

void in_parent() { after_fork(false); }
void in_child() { after_fork(true); }

}  // namespace

void install() noexcept {
  // Once per process. If registration fails (out of memory), fork stays as unsafe for a child
  // beside busy threads as it was without it; nothing else changes.
  static const bool registered = ::pthread_atfork(&prepare, &in_parent, &in_child) == 0;
  (void)registered;
}

namespace {
// At load (the program's start, or dlopen), before any thread can be in the library: the
// handlers above, and every function-local static a child's open or log line reads but no
// handler serializes. Made lazily, at a parent thread's first open or log line, each could be
// half-made at a fork: pthread_atfork itself waits while a fork is in progress, so a thread
// registering then held the static's guard across the fork, and the child's own open waited on
// that guard forever (fork_generation, process_hash_seed; the registration above too).
struct AtLoad {
  AtLoad() noexcept {
    install();
    (void)platform::fork_generation();
    (void)format::process_hash_seed();
    (void)platform::os().map_granularity();
  }
};
const AtLoad g_at_load;
}  // namespace
#endif

}  // namespace weightcache::fork_guard
