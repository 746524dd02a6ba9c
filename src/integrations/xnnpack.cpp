// The XNNPACK weights-cache provider over a wc_cache (include/weightcache/xnnpack.h).
//
// Layout source: google/XNNPACK include/xnnpack.h (read at commit 0011854617d9c930e475f0a896aa
// ad014b5aea0e): `enum xnn_status` has success = 0, invalid_parameter = 2, invalid_state = 3,
// out_of_memory = 6; `struct xnn_weights_cache_look_up_key` is {uint32_t seed; const void*
// kernel; const void* bias; uint32_t fingerprint_id;}; `struct xnn_weights_cache_provider` is
// {context, look_up, reserve_space, look_up_or_insert, is_finalized, offset_to_addr,
// delete_cache}. Current XNNPACK appends `alias_data(context, alias, original)` after
// delete_cache (seen in a 2026 build's trace); the mirror carries it, and an older XNNPACK never
// reads past delete_cache. tests/xnnpack checks the layout against a real xnnpack.h when found.
//
// Built on the public API only (include/weightcache/), as an integration outside this repository
// would be: CMake compiles it without src/ on the include path, and a unit test
// (tests/unit/public_includes.cmake) checks that no integration includes an internal header.
#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

// ---- layout pins ------------------------------------------------------------------------------

constexpr std::size_t kPtr = sizeof(void*);
constexpr std::size_t kKernelOffset = (sizeof(std::uint32_t) + alignof(const void*) - 1) / alignof(const void*) *
                                      alignof(const void*);
static_assert(sizeof(wc_xnn_status) == sizeof(int), "xnn_status is an int-sized enum");
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, seed) == 0);
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, kernel) == kKernelOffset);
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, bias) == kKernelOffset + kPtr);
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, fingerprint_id) == kKernelOffset + 2 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, context) == 0 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, look_up) == 1 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, reserve_space) == 2 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, look_up_or_insert) == 3 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, is_finalized) == 4 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, offset_to_addr) == 5 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, delete_cache) == 6 * kPtr);
static_assert(offsetof(wc_xnn_weights_cache_provider, alias_data) == 7 * kPtr);
static_assert(sizeof(wc_xnn_weights_cache_provider) == 8 * kPtr);

// ---- keys -------------------------------------------------------------------------------------

constexpr std::size_t kMaxNameSize = 2000;  // two names + framing stay under WC_MAX_KEY_SIZE
constexpr int kMaxAliasHops = 16;           // alias chains longer than this are cycles
constexpr char kKeyMagic[4] = {'x', 'n', 'n', 'w'};
constexpr std::uint8_t kKeyVersion = 1;
// A reference to a kernel or bias buffer inside a key.
constexpr std::uint8_t kRefNone = 0;     // bias == NULL
constexpr std::uint8_t kRefName = 1;     // u32 length + name bytes: persistable
constexpr std::uint8_t kRefAddress = 2;  // u64 address: this process only
constexpr std::uint8_t kRefUnique = 3;   // u64 counter: never shared (NULL kernel)

// Offsets of entries in the adapter's private heap are handed to XNNPACK as "handles" counted
// down from SIZE_MAX - 1. The library maps its address-space reservation at a nonzero, 2 MiB-aligned
// base and an entry's address is base + offset, so no cache offset comes within 2 MiB of
// SIZE_MAX; handles stay above that. A cache offset in the handle range is still rejected.
constexpr std::size_t kMaxLocal = std::size_t{1} << 20;
constexpr std::size_t handle_of(std::size_t index) { return SIZE_MAX - 1 - index; }
constexpr bool is_handle(std::size_t off) { return off != SIZE_MAX && SIZE_MAX - 1 - off < kMaxLocal; }
// Below them, the handles of weights no table could take (out of memory between reserve_space and
// look_up_or_insert): served in place from their reservation, never cached. The first kFixedInPlace
// have slots from the adapter's creation; the rest have room set aside by the reserve_space that
// made their reservation, so keeping one never allocates. Both ranges together stay within the
// 2 MiB below SIZE_MAX that no cache offset reaches.
constexpr std::size_t kFixedInPlace = 256;
constexpr std::size_t kMaxInPlace = std::size_t{1} << 16;
constexpr std::size_t in_place_handle(std::size_t slot) { return SIZE_MAX - 1 - kMaxLocal - slot; }
constexpr bool is_in_place(std::size_t off) {
  return off != SIZE_MAX && SIZE_MAX - 1 - off >= kMaxLocal && SIZE_MAX - 1 - off < kMaxLocal + kMaxInPlace;
}

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct Binding {
  std::string name;                // non-empty: a named buffer
  const void* original = nullptr;  // name empty: an alias of `original`
};

struct Key {
  std::string bytes;
  bool persistable = true;
  const void* addresses[2] = {nullptr, nullptr};  // buffers referenced by address
};

// Which adapter's look_up ran last on this thread, and whether its key was process-local.
// XNNPACK calls look_up, reserve_space and look_up_or_insert for one weight in that order on one
// thread, so reserve_space can place an unnamed weight's bytes in the private heap directly: a
// cache-file reservation that is never inserted would stay behind as dead bytes in the file.
struct Hint {
  std::uint64_t adapter = 0;
  bool local = false;
};
thread_local Hint t_hint;
std::atomic<std::uint64_t> g_next_adapter_id{1};
// The unnamed-buffer warning is logged once per process, however many adapters (one per model,
// per session) a runtime creates: the stats count every occurrence.
std::atomic<bool> g_warned_unnamed{false};

// ---- logging and errors, through the public calls -----------------------------------------------

// One line on the library's logger (wc_log_message), formatted here: the library formats only its
// own lines. A line longer than the buffer is cut.
#if defined(__GNUC__) && !defined(_WIN32)
__attribute__((format(printf, 2, 3)))
#endif
void log_line(wc_log_level level, const char* format, ...) noexcept {
  char line[2048];
  std::va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (n >= 0) wc_log_message(level, line);
}

// The boundary of every entry point (XNNPACK is C, and so is the ABI: nothing may escape). Call only
// inside a catch block: records the exception in flight as this thread's last error ("<call>: out
// of memory"), logs it, and returns its status; allocates nothing, as building a message may be
// what failed.
wc_status absorb_exception(const char* call) noexcept {
  wc_status code = WC_ERR_IO;
  const char* what = "unexpected failure";
  try {
    throw;
  } catch (const std::bad_alloc&) {
    code = WC_ERR_NO_MEMORY;
    what = "out of memory";
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  char text[512];
  std::snprintf(text, sizeof text, "%s: %s", call, what);
  wc_set_last_error(code, text);
  wc_log_message(WC_LOG_WARN, wc_last_error());
  return code;
}

/// f(), or `on_error` when it throws.
template <class T, class F>
T guard(const char* call, T on_error, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    absorb_exception(call);
    return on_error;
  }
}

template <class F>
wc_status guard_status(const char* call, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return absorb_exception(call);
  }
}

wc_status invalid(const char* what) noexcept { return wc_set_last_error(WC_ERR_INVALID_ARGUMENT, what); }

}  // namespace

struct wc_xnn_adapter {
  wc_xnn_weights_cache_provider provider{};
  wc_cache* cache = nullptr;
  std::uint64_t id = 0;

  // Names and aliases by address.
  mutable std::shared_mutex bind_mu;
  std::unordered_map<const void*, Binding> bindings;
  std::uint64_t named = 0, aliased = 0;

  // The private heap: unnamed weights, and the rare entry the cache could not commit.
  mutable std::shared_mutex local_mu;
  wc_cache* heap = nullptr;  // opened on first use
  std::unordered_map<std::string, std::size_t> local_by_key;  // key bytes -> handle index
  std::vector<std::size_t> local_offsets;                     // handle index -> heap offset
  std::unordered_map<std::size_t, std::size_t> local_by_offset;
  std::unordered_multimap<const void*, std::string> local_keys_by_address;
  std::atomic<std::uint64_t> local_fallbacks{0};  // named keys kept in the heap
  std::atomic<std::uint64_t> unique_counter{0};

  // What look_up_or_insert hands XNNPACK when memory ran out after reserve_space succeeded: the
  // reservation itself, kept (never released, so never reused) until the caches close. Filled
  // without allocating: the fixed slots exist from the adapter's creation, and every
  // reserve_space that succeeds first makes sure `in_place_more` has room for every reservation
  // not yet through look_up_or_insert (`pending`) beyond what it holds.
  std::array<std::atomic<void*>, kFixedInPlace> in_place{};
  mutable std::mutex in_place_mu;
  std::vector<void*> in_place_more;  // slot kFixedInPlace + i
  std::size_t pending = 0;           // reservations handed out, not yet through look_up_or_insert

  // Per-adapter finalization (the provider's is_finalized): the largest finalize ticket
  // (wc_look_up_or_insert_ex) of the cache entries this adapter's inserts returned (0: none
  // waits). The adapter is finalized once the cache is through it: every such entry has been
  // through a finalize that started after its insert, whoever called it. The private heap does
  // not count.
  std::atomic<std::uint64_t> awaits_finalize{0};

  std::atomic<bool> warned_fallback{false};
  std::atomic<std::uint64_t> look_ups{0}, hits{0}, reservations{0}, reserve_failures{0}, inserts{0}, reserved_bytes{0},
      unnamed_inserts{0};

  ~wc_xnn_adapter() { wc_close(heap); }

  // ---- keys ----

  // Appends the reference to `p` after following aliases; returns false when it has no name.
  bool append_ref(std::string& out, const void* p, const void** address) const {
    if (p == nullptr) {
      out.push_back(static_cast<char>(kRefNone));
      return true;
    }
    const void* cur = p;
    for (int hop = 0; hop < kMaxAliasHops; ++hop) {
      auto it = bindings.find(cur);
      if (it == bindings.end()) break;
      if (!it->second.name.empty()) {
        out.push_back(static_cast<char>(kRefName));
        put_u32(out, static_cast<std::uint32_t>(it->second.name.size()));
        out.append(it->second.name);
        return true;
      }
      cur = it->second.original;
    }
    // Keyed by the buffer XNNPACK passed: re-binding that address drops the entry.
    out.push_back(static_cast<char>(kRefAddress));
    put_u64(out, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)));
    *address = p;
    return false;
  }

  Key make_key(const wc_xnn_weights_cache_look_up_key& k) {
    Key key;
    key.bytes.reserve(64);
    key.bytes.append(kKeyMagic, sizeof kKeyMagic);
    key.bytes.push_back(static_cast<char>(kKeyVersion));
    put_u32(key.bytes, k.seed);
    put_u32(key.bytes, k.fingerprint_id);
    if (k.kernel == nullptr) {
      key.persistable = false;
      key.bytes.push_back(static_cast<char>(kRefUnique));
      put_u64(key.bytes, unique_counter.fetch_add(1, std::memory_order_relaxed));
      return key;
    }
    std::shared_lock<std::shared_mutex> lock(bind_mu);
    const bool kernel_named = append_ref(key.bytes, k.kernel, &key.addresses[0]);
    const bool bias_named = append_ref(key.bytes, k.bias, &key.addresses[1]);
    key.persistable = kernel_named && bias_named;
    return key;
  }

  void note_unnamed(const wc_xnn_weights_cache_look_up_key& k, const Key& key) {
    if (key.persistable || k.kernel == nullptr || g_warned_unnamed.exchange(true)) return;
    const void* which = key.addresses[0] != nullptr ? key.addresses[0] : key.addresses[1];
    log_line(WC_LOG_WARN,
             "XNNPACK weights cache: weight buffer %p (seed %#x) has no name; its packed weights stay in this "
             "process's heap and are not persisted. Name every weight and bias buffer with "
             "wc_xnn_adapter_name_buffer (logged once per process; see wc_xnn_adapter_stats.unnamed_inserts)",
             which != nullptr ? which : k.kernel, static_cast<unsigned>(k.seed));
  }

  // ---- the private heap ----

  bool ensure_heap_locked() {
    if (heap != nullptr) return true;  // else try again: a failure to create it may have been passing
    wc_options o;
    wc_options_init(&o);
    o.private_cache = 1;
    o.backing = WC_BACKING_HEAP;
    o.alignment = 128;  // the largest XNN_ALLOCATION_ALIGNMENT (Hexagon)
    o.max_file_bytes = sizeof(void*) >= 8 ? std::uint64_t{64} << 30 : std::uint64_t{1} << 30;
    if (wc_open(&o, &heap) != WC_OK) {
      heap = nullptr;
      log_line(WC_LOG_ERROR, "XNNPACK weights cache: cannot create the private heap: %s", wc_last_error());
      return false;
    }
    return true;
  }

  wc_cache* heap_for_reserve() {
    {
      std::shared_lock<std::shared_mutex> lock(local_mu);
      if (heap != nullptr) return heap;
    }
    std::unique_lock<std::shared_mutex> lock(local_mu);
    return ensure_heap_locked() ? heap : nullptr;
  }

  bool local_table_full() const {
    std::shared_lock<std::shared_mutex> lock(local_mu);
    return local_offsets.size() >= kMaxLocal;
  }

  std::size_t look_up_local(const std::string& key) const {
    std::shared_lock<std::shared_mutex> lock(local_mu);
    auto it = local_by_key.find(key);
    return it == local_by_key.end() ? SIZE_MAX : handle_of(it->second);
  }

  std::size_t insert_local(const Key& key, void* ptr, std::size_t size) {
    std::unique_lock<std::shared_mutex> lock(local_mu);
    if (!ensure_heap_locked()) return SIZE_MAX;
    const std::size_t off = wc_look_up_or_insert(heap, key.bytes.data(), key.bytes.size(), ptr, size);
    if (off == SIZE_MAX) {
      log_line(WC_LOG_ERROR, "XNNPACK weights cache: cannot keep %llu packed bytes in the private heap: %s",
               static_cast<unsigned long long>(size), wc_last_error());
      return SIZE_MAX;
    }
    // The tables change all together or not at all: a key left in local_by_key without its
    // address in local_keys_by_address would outlive a re-binding of that address and serve
    // the old bytes to new weights there.
    std::size_t index;
    bool new_index = false;
    if (auto it = local_by_offset.find(off); it != local_by_offset.end()) {
      index = it->second;
    } else {
      if (local_offsets.size() >= kMaxLocal) {
        wc_set_last_error(WC_ERR_NO_MEMORY, "too many unnamed XNNPACK weights");
        log_line(WC_LOG_ERROR, "XNNPACK weights cache: more than %llu unnamed weights; name the weight buffers",
                 static_cast<unsigned long long>(kMaxLocal));
        return SIZE_MAX;
      }
      index = local_offsets.size();
      local_offsets.push_back(off);
      try {
        local_by_offset.emplace(off, index);
      } catch (...) {
        local_offsets.pop_back();
        throw;
      }
      new_index = true;
    }
    auto undo_index = [&]() noexcept {
      if (!new_index) return;
      local_by_offset.erase(off);
      local_offsets.pop_back();
    };
    auto found = local_by_key.find(key.bytes);
    if (found != local_by_key.end()) {
      found->second = index;  // its addresses are in the key, so already in local_keys_by_address
    } else {
      std::unordered_map<std::string, std::size_t>::iterator it;
      try {
        it = local_by_key.emplace(key.bytes, index).first;
      } catch (...) {
        undo_index();
        throw;
      }
      std::size_t added = 0;
      try {
        for (const void* a : key.addresses) {
          if (a == nullptr) continue;
          local_keys_by_address.emplace(a, it->first);
          ++added;
        }
      } catch (...) {
        for (const void* a : key.addresses) {
          if (a == nullptr || added == 0) continue;
          auto [first, last] = local_keys_by_address.equal_range(a);
          for (auto e = first; e != last; ++e) {
            if (e->second == it->first) {
              local_keys_by_address.erase(e);
              --added;
              break;
            }
          }
        }
        local_by_key.erase(it);
        undo_index();
        throw;
      }
    }
    unnamed_inserts.fetch_add(1, std::memory_order_relaxed);
    return handle_of(index);
  }

  // The address now holds other weights (or is gone): forget what was packed from it.
  void drop_local_for(const void* address) {
    std::unique_lock<std::shared_mutex> lock(local_mu);
    auto [first, last] = local_keys_by_address.equal_range(address);
    for (auto it = first; it != last; ++it) local_by_key.erase(it->second);
    local_keys_by_address.erase(first, last);
  }

  // ---- the provider ----

  std::size_t look_up(const wc_xnn_weights_cache_look_up_key* k) {
    look_ups.fetch_add(1, std::memory_order_relaxed);
    if (k == nullptr) return SIZE_MAX;
    if (k->kernel == nullptr) {  // nothing to name the weights by: never shared (see make_key)
      t_hint = Hint{id, true};
      return SIZE_MAX;
    }
    const Key key = make_key(*k);
    t_hint = Hint{id, !key.persistable};
    note_unnamed(*k, key);
    std::size_t off = SIZE_MAX;
    if (key.persistable) {
      off = wc_look_up(cache, key.bytes.data(), key.bytes.size());
      if (is_handle(off)) off = SIZE_MAX;
      if (off == SIZE_MAX && local_fallbacks.load(std::memory_order_relaxed) != 0) off = look_up_local(key.bytes);
    } else {
      off = look_up_local(key.bytes);
    }
    if (off != SIZE_MAX) hits.fetch_add(1, std::memory_order_relaxed);
    return off;
  }

  void* reserve_space(std::size_t n) {
    const bool local = t_hint.adapter == id && t_hint.local;
    t_hint = Hint{};
    if (local && local_table_full()) {
      // insert_local could not hand out a handle for these bytes: refuse now, which XNNPACK
      // checks, rather than return SIZE_MAX from look_up_or_insert, which it does not.
      wc_set_last_error(WC_ERR_NO_MEMORY, "too many unnamed XNNPACK weights");
      reserve_failures.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    wc_cache* target = local ? heap_for_reserve() : cache;
    void* p = target != nullptr ? wc_reserve_space(target, n) : nullptr;
    if (p != nullptr && !room_in_place_for_one_more()) {
      (void)wc_release_space(target, p);
      wc_set_last_error(WC_ERR_NO_MEMORY,
                        "no memory to keep packed weights in place should the cache be unable to take them (out of "
                        "memory, or 65536 such weights kept already)");
      p = nullptr;
    }
    (p != nullptr ? reservations : reserve_failures).fetch_add(1, std::memory_order_relaxed);
    if (p != nullptr) reserved_bytes.fetch_add(n, std::memory_order_relaxed);
    return p;
  }

  // Counts one more reservation that may end in place, once there is room for it: a look_up_or_insert
  // after a successful reserve_space then never fails for want of a slot.
  bool room_in_place_for_one_more() noexcept {
    std::lock_guard<std::mutex> lock(in_place_mu);
    const std::size_t need = in_place_more.size() + pending + 1;
    if (need > kMaxInPlace - kFixedInPlace) return false;
    if (in_place_more.capacity() < need) {
      try {
        in_place_more.reserve(std::min(kMaxInPlace - kFixedInPlace, std::max<std::size_t>(need, 2 * need)));
      } catch (...) {
        return false;
      }
    }
    ++pending;
    return true;
  }

  // A reservation came back through look_up_or_insert (kept in place or not).
  void done_with_reservation() noexcept {
    std::lock_guard<std::mutex> lock(in_place_mu);
    if (pending > 0) --pending;
  }

  std::size_t look_up_or_insert(const wc_xnn_weights_cache_look_up_key* k, void* ptr, std::size_t size) {
    if (ptr == nullptr) return look_up(k);
    struct Done {
      wc_xnn_adapter* a;
      ~Done() { a->done_with_reservation(); }
    } done{this};
    std::size_t off = SIZE_MAX;
    try {
      off = insert_reserved(k, ptr, size);
    } catch (const std::bad_alloc&) {
      off = SIZE_MAX;
    }
    if (off != SIZE_MAX || k == nullptr) return off;
    // No table could take the bytes. XNNPACK does not check this result (it would dereference
    // offset_to_addr(SIZE_MAX) == NULL), and xnnpack.h promises a successful reserve_space is
    // never followed by a failure here: serve the packed bytes where they are, uncached.
    if (const std::size_t h = keep_in_place(ptr); h != SIZE_MAX) return h;
    // No slot: `ptr` was not a reservation of this adapter's reserve_space (whose room is set
    // aside). Give it back to whichever cache made it (the other refuses it harmlessly), or it
    // stays outstanding as dead space.
    (void)wc_release_space(cache, ptr);
    if (wc_cache* heap_cache = heap_if_open()) (void)wc_release_space(heap_cache, ptr);
    log_line(WC_LOG_ERROR,
             "XNNPACK weights cache: out of memory for packed weights (%llu bytes) and no slot left to serve them in "
             "place (not memory from reserve_space?); returning SIZE_MAX, which XNNPACK does not check",
             static_cast<unsigned long long>(size));
    return SIZE_MAX;
  }

  std::size_t keep_in_place(void* ptr) noexcept {
    std::size_t slot = SIZE_MAX;
    for (std::size_t i = 0; i < kFixedInPlace && slot == SIZE_MAX; ++i) {
      void* empty = nullptr;
      if (in_place[i].compare_exchange_strong(empty, ptr, std::memory_order_acq_rel)) slot = i;
    }
    if (slot == SIZE_MAX) {
      std::lock_guard<std::mutex> lock(in_place_mu);
      // Room was set aside by reserve_space: push_back does not allocate.
      if (in_place_more.size() >= in_place_more.capacity()) return SIZE_MAX;
      in_place_more.push_back(ptr);
      slot = kFixedInPlace + in_place_more.size() - 1;
    }
    log_line(WC_LOG_ERROR,
             "XNNPACK weights cache: out of memory while recording packed weights; serving them from their "
             "reservation, uncached (%s)",
             wc_last_error());
    return in_place_handle(slot);
  }

  wc_cache* heap_if_open() const {
    std::shared_lock<std::shared_mutex> lock(local_mu);
    return heap;
  }

  std::size_t insert_reserved(const wc_xnn_weights_cache_look_up_key* k, void* ptr, std::size_t size) {
    inserts.fetch_add(1, std::memory_order_relaxed);
    if (k == nullptr) {
      wc_set_last_error(WC_ERR_INVALID_ARGUMENT, "look_up_or_insert: NULL key");
      return SIZE_MAX;
    }
    const Key key = make_key(*k);
    note_unnamed(*k, key);
    std::size_t off = SIZE_MAX;
    if (key.persistable) {
      // The _ex call: it says which finalize the entry waits for (the provider's is_finalized).
      std::uint64_t ticket = 0;
      off = wc_look_up_or_insert_ex(cache, key.bytes.data(), key.bytes.size(), ptr, size, &ticket);
      if (off != SIZE_MAX) note_awaits(ticket);
      if (off != SIZE_MAX && !is_handle(off)) return off;
      // XNNPACK does not check this result (it would feed SIZE_MAX to offset_to_addr later):
      // keep the bytes for this process instead of failing.
      if (!warned_fallback.exchange(true))
        log_line(WC_LOG_WARN,
                 "XNNPACK weights cache: cannot commit packed weights to the cache (%s); keeping them in this "
                 "process's heap",
                 wc_last_error());
      local_fallbacks.fetch_add(1, std::memory_order_relaxed);
      off = insert_local(key, ptr, size);
      // insert_local copied the bytes (or failed): either way the cache's reservation at `ptr`
      // will never be committed. Give it back, or it stays outstanding as dead space. A pointer
      // that is no longer an outstanding reservation is refused harmlessly; keep the error that
      // explains the fallback for wc_last_error.
      // (Only once the heap has them: otherwise they are served from `ptr`, see look_up_or_insert.)
      if (off != SIZE_MAX) {
        const weightcache::Error why = weightcache::last_error();
        if (wc_release_space(cache, ptr) != WC_OK && why.code != weightcache::Errc::ok)
          (void)wc_set_last_error(static_cast<wc_status>(why.code),
                                  why.message.empty() ? nullptr : why.message.c_str());
      }
    } else {
      off = insert_local(key, ptr, size);
    }
    return off;  // SIZE_MAX: look_up_or_insert serves the bytes in place
  }

  void note_awaits(std::uint64_t awaits) noexcept {
    std::uint64_t cur = awaits_finalize.load(std::memory_order_relaxed);
    while (cur < awaits && !awaits_finalize.compare_exchange_weak(cur, awaits, std::memory_order_acq_rel,
                                                                  std::memory_order_relaxed)) {
    }
  }

  bool is_finalized() const noexcept {
    const std::uint64_t awaits = awaits_finalize.load(std::memory_order_acquire);
    return wc_is_finalized_through(cache, awaits) != 0;
  }

  void* offset_to_addr(std::size_t offset) const {
    if (offset == SIZE_MAX) return nullptr;
    if (is_in_place(offset)) {
      const std::size_t slot = SIZE_MAX - 1 - kMaxLocal - offset;
      if (slot < kFixedInPlace) return in_place[slot].load(std::memory_order_acquire);
      std::lock_guard<std::mutex> lock(in_place_mu);
      return slot - kFixedInPlace < in_place_more.size() ? in_place_more[slot - kFixedInPlace] : nullptr;
    }
    // An offset XNNPACK holds stays usable even if its key was replaced since (two threads that
    // both missed and packed different bytes): XNNPACK would dereference a null. The bytes are
    // the ones it was given for that operator, and stay mapped until close.
    if (!is_handle(offset)) return wc_offset_to_addr_kept(cache, offset);
    const std::size_t index = SIZE_MAX - 1 - offset;
    std::shared_lock<std::shared_mutex> lock(local_mu);
    return index < local_offsets.size() ? wc_offset_to_addr(heap, local_offsets[index]) : nullptr;
  }

  wc_xnn_status alias_data(const void* alias, const void* original) {
    if (alias == nullptr || original == nullptr) return WC_XNN_STATUS_INVALID_PARAMETER;
    if (alias == original) return WC_XNN_STATUS_SUCCESS;
    {
      std::unique_lock<std::shared_mutex> lock(bind_mu);
      auto [it, fresh] = bindings.try_emplace(alias);
      if (!fresh && !it->second.name.empty()) {
        --named;
        ++aliased;
      } else if (fresh) {
        ++aliased;
      }
      it->second.name.clear();
      it->second.original = original;
    }
    drop_local_for(alias);
    return WC_XNN_STATUS_SUCCESS;
  }

  void bind_name(const void* data, const char* name) {
    {
      std::unique_lock<std::shared_mutex> lock(bind_mu);
      auto it = bindings.find(data);
      if (it != bindings.end()) {
        (it->second.name.empty() ? aliased : named) -= 1;
        if (name == nullptr) bindings.erase(it);
      }
      if (name != nullptr) {
        bindings.insert_or_assign(data, Binding{name, nullptr});
        ++named;
      }
    }
    drop_local_for(data);
  }
};

namespace {

wc_xnn_adapter* adapter_of(void* context) { return static_cast<wc_xnn_adapter*>(context); }

// The provider's entry points. XNNPACK is C: nothing may escape them. (Not declared noexcept:
// their types must equal the mirror's function-pointer types exactly, or UBSan's
// -fsanitize=function flags C++ callers.)
std::size_t provider_look_up(void* context, const wc_xnn_weights_cache_look_up_key* key) {
  return guard("xnn provider look_up", std::size_t{SIZE_MAX},
                            [&] { return adapter_of(context)->look_up(key); });
}

void* provider_reserve_space(void* context, std::size_t n) {
  return guard("xnn provider reserve_space", static_cast<void*>(nullptr),
                            [&] { return adapter_of(context)->reserve_space(n); });
}

std::size_t provider_look_up_or_insert(void* context, const wc_xnn_weights_cache_look_up_key* key, void* ptr,
                                       std::size_t size) {
  return guard("xnn provider look_up_or_insert", std::size_t{SIZE_MAX},
                            [&] { return adapter_of(context)->look_up_or_insert(key, ptr, size); });
}

// This adapter's own inserts only (see wc_xnn_adapter::awaits_finalize), not the whole cache's:
// another runtime's model loading into a shared cache must not stop this one's setup.
bool provider_is_finalized(void* context) { return adapter_of(context)->is_finalized(); }

void* provider_offset_to_addr(void* context, std::size_t offset) {
  return guard("xnn provider offset_to_addr", static_cast<void*>(nullptr),
                            [&] { return adapter_of(context)->offset_to_addr(offset); });
}

wc_xnn_status provider_delete_cache(void*) { return WC_XNN_STATUS_SUCCESS; }

wc_xnn_status provider_alias_data(void* context, void* alias, void* original) {
  return guard("xnn provider alias_data", WC_XNN_STATUS_OUT_OF_MEMORY,
                            [&] { return adapter_of(context)->alias_data(alias, original); });
}

// Every adapter's provider: these entry points, with the adapter as the context.
constexpr wc_xnn_weights_cache_provider kProviderEntryPoints = {
    .context = nullptr,
    .look_up = provider_look_up,
    .reserve_space = provider_reserve_space,
    .look_up_or_insert = provider_look_up_or_insert,
    .is_finalized = provider_is_finalized,
    .offset_to_addr = provider_offset_to_addr,
    .delete_cache = provider_delete_cache,
    .alias_data = provider_alias_data,
};

}  // namespace

extern "C" {

wc_status wc_xnn_adapter_create(wc_cache* cache, wc_xnn_adapter** out) {
  if (out != nullptr) *out = nullptr;
  if (cache == nullptr || out == nullptr) return invalid("wc_xnn_adapter_create: cache and out must not be NULL");
  auto* a = new (std::nothrow) wc_xnn_adapter();
  if (a == nullptr) {
    wc_set_last_error(WC_ERR_NO_MEMORY, "wc_xnn_adapter_create: out of memory");
    return WC_ERR_NO_MEMORY;
  }
  a->cache = cache;
  a->id = g_next_adapter_id.fetch_add(1, std::memory_order_relaxed);
  a->provider = kProviderEntryPoints;
  a->provider.context = a;
  *out = a;
  return WC_OK;
}

void wc_xnn_adapter_destroy(wc_xnn_adapter* adapter) {
  try {
    delete adapter;
  } catch (...) {
    absorb_exception("wc_xnn_adapter_destroy");
  }
}

wc_status wc_xnn_adapter_name_buffer(wc_xnn_adapter* adapter, const void* data, const char* name) {
  if (adapter == nullptr || data == nullptr) return invalid("wc_xnn_adapter_name_buffer: NULL adapter or data");
  if (name != nullptr) {
    const std::size_t n = std::strlen(name);
    if (n == 0 || n > kMaxNameSize)
      return invalid("wc_xnn_adapter_name_buffer: a name is 1 to 2000 bytes (NULL unbinds the buffer)");
  }
  try {
    adapter->bind_name(data, name);
    return WC_OK;
  } catch (...) {
    return absorb_exception("wc_xnn_adapter_name_buffer");
  }
}

void* wc_xnn_adapter_provider(wc_xnn_adapter* adapter) {
  return adapter == nullptr ? nullptr : &adapter->provider;
}

void wc_xnn_adapter_stats_init(wc_xnn_adapter_stats* stats) {
  if (stats == nullptr) return;
  std::memset(stats, 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

wc_status wc_xnn_adapter_get_stats(wc_xnn_adapter* adapter, wc_xnn_adapter_stats* out) {
  if (adapter == nullptr || out == nullptr) return invalid("wc_xnn_adapter_get_stats: NULL adapter or stats");
  if (out->struct_size < sizeof(std::size_t) || out->struct_size > (1u << 16))
    return invalid("wc_xnn_adapter_get_stats: stats.struct_size is not set; call wc_xnn_adapter_stats_init first");
  return guard_status("wc_xnn_adapter_get_stats", [&] {
  wc_xnn_adapter_stats s{};
  s.struct_size = out->struct_size;
  s.look_ups = adapter->look_ups.load();
  s.hits = adapter->hits.load();
  s.reservations = adapter->reservations.load();
  s.reserve_failures = adapter->reserve_failures.load();
  s.inserts = adapter->inserts.load();
  s.unnamed_inserts = adapter->unnamed_inserts.load();
  s.reserved_bytes = adapter->reserved_bytes.load();
  {
    std::shared_lock<std::shared_mutex> lock(adapter->bind_mu);
    s.named_buffers = adapter->named;
    s.aliases = adapter->aliased;
  }
  {
    std::shared_lock<std::shared_mutex> lock(adapter->local_mu);
    s.unnamed_entries = adapter->local_by_key.size();
    if (adapter->heap != nullptr) {
      wc_stats hs;
      wc_stats_init(&hs);
      if (wc_get_stats(adapter->heap, &hs) == WC_OK) s.unnamed_bytes = hs.heap_bytes;
    }
  }
  std::memcpy(out, &s, std::min(out->struct_size, sizeof(s)));
  return WC_OK;
  });
}

wc_status wc_xnn_compat_key(const void* build_id, size_t build_id_size, const void* model_digest,
                            size_t model_digest_size, const void* options, size_t options_size, void* out,
                            size_t out_capacity, size_t* out_size) {
  if (out_size == nullptr) return invalid("wc_xnn_compat_key: out_size must not be NULL");
  *out_size = 0;
  if (build_id == nullptr || build_id_size == 0)
    return invalid("wc_xnn_compat_key: the XNNPACK build identifier is missing (pass the bytes of "
                   "xnn_experimental_get_build_identifier_data, xnn_experimental_get_build_identifier_size long)");
  if (model_digest == nullptr || model_digest_size == 0)
    return invalid("wc_xnn_compat_key: the model digest is missing (pass a digest of the model's weights)");
  if (options == nullptr && options_size != 0)
    return invalid("wc_xnn_compat_key: options is NULL with a nonzero options_size");
  if (build_id_size > WC_XNN_COMPAT_PART_MAX_SIZE || model_digest_size > WC_XNN_COMPAT_PART_MAX_SIZE ||
      options_size > WC_XNN_COMPAT_PART_MAX_SIZE)
    return invalid("wc_xnn_compat_key: a part is longer than WC_XNN_COMPAT_PART_MAX_SIZE (4096 bytes); pass a "
                   "digest of it instead");
  const std::size_t size = WC_XNN_COMPAT_KEY_SIZE(build_id_size, model_digest_size, options_size);
  if (out == nullptr && out_capacity == 0) {
    *out_size = size;
    return WC_OK;
  }
  if (out == nullptr || out_capacity < size) {
    *out_size = size;
    return guard_status("wc_xnn_compat_key", [&] {
      return invalid(("wc_xnn_compat_key: the output buffer holds " + std::to_string(out_capacity) +
                      " bytes; the key needs " + std::to_string(size) + " (see *out_size)")
                         .c_str());
    });
  }
  // Header: magic "xnck" and a format version; then each part as u32 LE length + bytes.
  auto* p = static_cast<unsigned char*>(out);
  const unsigned char header[5] = {'x', 'n', 'c', 'k', 1};
  std::memcpy(p, header, sizeof header);
  p += sizeof header;
  const auto put = [&p](const void* data, std::size_t n) {
    for (int i = 0; i < 4; ++i) *p++ = static_cast<unsigned char>((static_cast<std::uint32_t>(n) >> (8 * i)) & 0xff);
    if (n != 0) std::memcpy(p, data, n);
    p += n;
  };
  put(build_id, build_id_size);
  put(model_digest, model_digest_size);
  put(options, options_size);
  *out_size = size;
  return WC_OK;
}

}  // extern "C"
