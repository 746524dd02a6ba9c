// The C ABI: handles, struct-size versioning, status codes. No exception crosses it.
#include "boundary.hpp"
#include "c_api_internal.hpp"
#include "cpu_features.hpp"
#include "compact.hpp"
#include "registry.hpp"

#include <weightcache/weightcache.h>

#include <cstring>
#include <string>

using namespace weightcache;

namespace {

wc_status status_of(const Error& e) { return static_cast<wc_status>(e.code); }

// For the checks made before a call's own try block: never throws.
wc_status invalid(const char* what) noexcept { return refuse_argument(what); }
// Inside a try block (options_from).
wc_status invalid(const std::string& what) { return invalid(what.c_str()); }

// Reads a field only if the caller's struct is big enough to have it (older callers).
// Reads an enum field as the int a C caller may have stored in it (any value), so the range
// check itself is defined behaviour.
template <class E>
int raw_enum(const E& field) {
  int v;
  static_assert(sizeof(E) == sizeof(int));
  std::memcpy(&v, &field, sizeof v);
  return v;
}

template <class T>
bool has_field(const wc_options* o, const T wc_options::*field) {
  const auto offset = reinterpret_cast<std::size_t>(&(static_cast<const wc_options*>(nullptr)->*field));
  return o->struct_size >= offset + sizeof(T);
}

// The file a call about `o` is about, for its error message; NULL when there is none.
const char* path_of(const wc_options* o) noexcept {
  return o != nullptr && o->path != nullptr && o->path[0] != '\0' ? o->path : nullptr;
}

}  // namespace

extern "C" {

void wc_options_init(wc_options* o) {
  if (o == nullptr) return;
  const Options d;  // the one set of defaults (weight_cache.hpp)
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(wc_options);
  o->alignment = d.alignment;
  o->size_alignment = d.size_alignment;
  o->backing = static_cast<wc_backing>(d.backing);
  o->durability = static_cast<wc_durability>(d.durability);
  o->read_only = d.read_only ? 1 : 0;
  o->verify = static_cast<wc_verify>(d.verify);
  o->private_cache = d.private_cache ? 1 : 0;
  o->allow_symlink = d.allow_symlink ? 1 : 0;
  o->file_mode = d.file_mode;
  o->lease_timeout_ms = static_cast<uint32_t>(d.lease_timeout.count());
  o->refresh_on_miss = d.refresh_on_miss ? 1 : 0;
  o->max_file_bytes = d.max_file_bytes;  // 0: sized at open to fit the process
  o->verify_ahead = d.verify_ahead ? 1 : 0;
  o->compact_dead_percent = d.compact_dead_percent;
  o->compact_min_dead_bytes = d.compact_min_dead_bytes;
  o->fd = d.fd;
  o->handle = d.handle;
  o->write_back_early = d.write_back_early ? 1 : 0;
}

void wc_stats_init(wc_stats* s) {
  if (s == nullptr) return;
  std::memset(s, 0, sizeof(*s));
  s->struct_size = sizeof(wc_stats);
}

}  // extern "C"

namespace {

// `text` into `out` as snprintf does it: up to out_capacity - 1 bytes and a NUL (nothing with
// out NULL or out_capacity 0); its full length returned.
size_t cut_copy(const std::string& text, char* out, size_t out_capacity) noexcept {
  if (out != nullptr && out_capacity > 0) {
    const size_t n = std::min(text.size(), out_capacity - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return text.size();
}

// The C options as the C++ Options; WC_OK or the status of what is wrong (wc_last_error says it).
wc_status options_from(const wc_options* o, const char* call, Options* out) {
  const std::string who(call);
  if (o->struct_size < offsetof(wc_options, read_only) + sizeof(int) || o->struct_size > (1u << 16))
    return invalid(who + ": options.struct_size is not set; call wc_options_init first");
  Options& opt = *out;
  if (o->path != nullptr) opt.path = o->path;
  if (o->compat_key_size != 0) {
    if (o->compat_key == nullptr) return invalid(who + ": compat_key is NULL but compat_key_size is not 0");
    opt.compat_key.assign(static_cast<const char*>(o->compat_key), o->compat_key_size);
  }
  if (o->alignment != 0) opt.alignment = o->alignment;  // 0: the default
  if (o->size_alignment != 0) opt.size_alignment = o->size_alignment;
  const int backing = raw_enum(o->backing), durability = raw_enum(o->durability);
  if (backing < WC_BACKING_AUTO || backing > WC_BACKING_HEAP) return invalid(who + ": unknown backing");
  if (durability < WC_DURABILITY_NONE || durability > WC_DURABILITY_FULL) return invalid(who + ": unknown durability");
  opt.backing = static_cast<Backing>(backing);
  opt.durability = static_cast<Durability>(durability);
  opt.read_only = o->read_only != 0;
  if (has_field(o, &wc_options::verify)) {
    const int verify = raw_enum(o->verify);
    if (verify < WC_VERIFY_FIRST_USE || verify > WC_VERIFY_SHARED) return invalid(who + ": unknown verify mode");
    opt.verify = static_cast<Verify>(verify);
  }
  if (has_field(o, &wc_options::private_cache)) opt.private_cache = o->private_cache != 0;
  if (has_field(o, &wc_options::allow_symlink)) opt.allow_symlink = o->allow_symlink != 0;
  if (has_field(o, &wc_options::file_mode) && o->file_mode != 0) opt.file_mode = o->file_mode;
  if (has_field(o, &wc_options::lease_timeout_ms)) opt.lease_timeout = std::chrono::milliseconds(o->lease_timeout_ms);
  if (has_field(o, &wc_options::refresh_on_miss)) opt.refresh_on_miss = o->refresh_on_miss != 0;
  if (has_field(o, &wc_options::max_file_bytes) && o->max_file_bytes != 0) opt.max_file_bytes = o->max_file_bytes;
  if (has_field(o, &wc_options::verify_ahead)) opt.verify_ahead = o->verify_ahead != 0;
  if (has_field(o, &wc_options::compact_dead_percent)) {
    if (o->compact_dead_percent > 100) return invalid(who + ": compact_dead_percent is a percentage (0 to 100)");
    opt.compact_dead_percent = o->compact_dead_percent;
  }
  if (has_field(o, &wc_options::compact_min_dead_bytes)) opt.compact_min_dead_bytes = o->compact_min_dead_bytes;
  if (has_field(o, &wc_options::fd)) opt.fd = o->fd;
  if (has_field(o, &wc_options::handle)) opt.handle = o->handle;
  if (has_field(o, &wc_options::write_back_early)) opt.write_back_early = o->write_back_early != 0;
  if (has_field(o, &wc_options::prebuilt_dir) && o->prebuilt_dir != nullptr) opt.prebuilt_dir = o->prebuilt_dir;
  if (has_field(o, &wc_options::record_dir) && o->record_dir != nullptr) opt.record_dir = o->record_dir;
  return WC_OK;
}

}  // namespace

extern "C" {

wc_status wc_open(const wc_options* o, wc_cache** out) {
  if (out != nullptr) *out = nullptr;
  if (o == nullptr || out == nullptr) return invalid("wc_open: options and out must not be NULL");
  try {
    Options opt;
    if (wc_status st = options_from(o, "wc_open", &opt); st != WC_OK) return st;
    auto core = registry::open(opt);
    if (!core) return status_of(core.error());
    *out = new wc_cache{std::move(core.value())};
    return WC_OK;
  } catch (...) {
    return static_cast<wc_status>(absorb_exception("wc_open", path_of(o)));
  }
}

void wc_compact_report_init(wc_compact_report* report) {
  if (report == nullptr) return;
  std::memset(report, 0, sizeof(*report));
  report->struct_size = sizeof(wc_compact_report);
}

wc_status wc_compact_ex(const wc_options* o, unsigned flags, wc_compact_report* report) {
  if (o == nullptr) return invalid("wc_compact: options must not be NULL");
  if (report != nullptr && report->struct_size < sizeof(std::size_t) + sizeof(int))
    return invalid("wc_compact: report.struct_size is not set; call wc_compact_report_init first");
  if ((flags & ~unsigned{WC_COMPACT_DROP_CORRUPT | WC_COMPACT_ANY_KEY | WC_COMPACT_CANONICAL}) != 0)
    return invalid("wc_compact: unknown flags");
  try {
    Options opt;
    if (wc_status st = options_from(o, "wc_compact", &opt); st != WC_OK) return st;
    CompactSettings settings;
    settings.drop_corrupt = (flags & WC_COMPACT_DROP_CORRUPT) != 0;
    settings.any_key = (flags & WC_COMPACT_ANY_KEY) != 0;
    settings.canonical = (flags & WC_COMPACT_CANONICAL) != 0;
    settings.durability = opt.durability;
    auto r = compact_path(opt, settings);
    if (!r) return status_of(fail(r.error()));
    if (report != nullptr) {
      wc_compact_report full{};
      full.struct_size = report->struct_size;
      full.compacted = r->rewritten ? 1 : 0;
      full.entries = r->entries;
      full.dropped_entries = r->dropped;
      full.bytes_before = r->bytes_before;
      full.bytes_after = r->bytes_after;
      std::memcpy(report, &full, std::min(report->struct_size, sizeof(full)));
    }
    return WC_OK;
  } catch (...) {
    return static_cast<wc_status>(absorb_exception("wc_compact", path_of(o)));
  }
}

wc_status wc_compact(const wc_options* options) { return wc_compact_ex(options, 0, nullptr); }

void wc_close(wc_cache* c) {
  guard_void("wc_close", [&] { delete c; });
}

size_t wc_look_up(wc_cache* c, const void* key, size_t key_size) {
  if (c == nullptr || (key == nullptr && key_size != 0)) return (invalid("wc_look_up: NULL cache or key"), WC_NOT_FOUND);
  return guard("wc_look_up", WC_NOT_FOUND,
               [&] { return c->core->look_up(std::string_view(static_cast<const char*>(key), key_size)); });
}

void* wc_reserve_space(wc_cache* c, size_t size) {
  if (c == nullptr) return (invalid("wc_reserve_space: NULL cache"), nullptr);
  return guard("wc_reserve_space", static_cast<void*>(nullptr), [&] { return c->core->reserve(size); });
}

wc_status wc_release_space(wc_cache* c, void* ptr) {
  if (c == nullptr || ptr == nullptr) return invalid("wc_release_space: NULL cache or pointer");
  return guard_status("wc_release_space", [&] {
    auto r = c->core->release(ptr);
    return r ? WC_OK : status_of(r.error());
  });
}

size_t wc_look_up_or_insert(wc_cache* c, const void* key, size_t key_size, void* ptr, size_t size) {
  if (c == nullptr || (key == nullptr && key_size != 0))
    return (invalid("wc_look_up_or_insert: NULL cache or key"), WC_NOT_FOUND);
  return guard("wc_look_up_or_insert", WC_NOT_FOUND, [&] {
    return c->core->look_up_or_insert(std::string_view(static_cast<const char*>(key), key_size), ptr, size);
  });
}

size_t wc_look_up_or_insert_ex(wc_cache* c, const void* key, size_t key_size, void* ptr, size_t size,
                               uint64_t* finalize_ticket) {
  if (finalize_ticket != nullptr) *finalize_ticket = 0;
  if (c == nullptr || (key == nullptr && key_size != 0))
    return (invalid("wc_look_up_or_insert_ex: NULL cache or key"), WC_NOT_FOUND);
  return guard("wc_look_up_or_insert_ex", WC_NOT_FOUND, [&] {
    return c->core->look_up_or_insert(std::string_view(static_cast<const char*>(key), key_size), ptr, size,
                                      finalize_ticket);
  });
}

int wc_is_finalized_through(wc_cache* c, uint64_t ticket) {
  return c != nullptr && (ticket == 0 || c->core->finalizes_started() >= ticket) ? 1 : 0;
}

void* wc_offset_to_addr(wc_cache* c, size_t offset) {
  if (c == nullptr) return nullptr;
  return guard("wc_offset_to_addr", static_cast<void*>(nullptr), [&] { return c->core->offset_to_addr(offset); });
}

void* wc_offset_to_addr_kept(wc_cache* c, size_t offset) {
  if (c == nullptr) return nullptr;
  return guard("wc_offset_to_addr_kept", static_cast<void*>(nullptr),
               [&] { return c->core->offset_to_addr(offset, /*replaced_too=*/true); });
}

wc_status wc_finalize(wc_cache* c) {
  if (c == nullptr) return invalid("wc_finalize: NULL cache");
  return guard_status("wc_finalize", [&] {
    auto r = c->core->finalize();
    return r ? WC_OK : status_of(r.error());
  });
}

int wc_get_fd(wc_cache* c) { return c == nullptr ? -1 : c->core->descriptor(); }

void* wc_get_handle(wc_cache* c) { return c == nullptr ? nullptr : c->core->os_handle(); }

int wc_is_finalized(wc_cache* c) { return c != nullptr && c->core->is_finalized() ? 1 : 0; }

wc_status wc_refresh(wc_cache* c) {
  if (c == nullptr) return invalid("wc_refresh: NULL cache");
  return guard_status("wc_refresh", [&] {
    auto r = c->core->refresh();
    return r ? WC_OK : status_of(r.error());
  });
}

wc_status wc_get_stats(wc_cache* c, wc_stats* out) {
  if (c == nullptr || out == nullptr) return invalid("wc_get_stats: NULL cache or stats");
  if (out->struct_size < offsetof(wc_stats, backing) + sizeof(wc_backing))
    return invalid("wc_get_stats: stats.struct_size is not set; call wc_stats_init first");
  Stats s;
  if (wc_status st = guard_status("wc_get_stats", [&] {
        s = c->core->stats();
        return WC_OK;
      });
      st != WC_OK)
    return st;
  wc_stats full{};
  full.struct_size = out->struct_size;
  full.backing = static_cast<wc_backing>(s.backing);
#define WC_COPY_STAT(field) full.field = s.field;
  WC_COPY_STAT(entries) WC_COPY_STAT(file_bytes) WC_COPY_STAT(mapped_bytes) WC_COPY_STAT(heap_bytes)
  WC_COPY_STAT(mappings) WC_COPY_STAT(hits) WC_COPY_STAT(misses) WC_COPY_STAT(dead_bytes)
  WC_COPY_STAT(verify_failures) WC_COPY_STAT(heap_fallbacks) WC_COPY_STAT(commits) WC_COPY_STAT(alignment)
  WC_COPY_STAT(verified_ahead) WC_COPY_STAT(trusted_entries) WC_COPY_STAT(prebuilt) WC_COPY_STAT(lease_timeouts) WC_COPY_STAT(unpersisted_entries)
  WC_COPY_STAT(unpersisted_bytes) WC_COPY_STAT(compactions)
#undef WC_COPY_STAT
  std::memcpy(out, &full, std::min(out->struct_size, sizeof(full)));
  return WC_OK;
}

size_t wc_get_path(wc_cache* c, char* out, size_t out_capacity) {
  if (c == nullptr) return 0;
  std::string path;
  try {
    path = c->core->path();
  } catch (...) {
    (void)wc_set_last_error(WC_ERR_NO_MEMORY, "wc_get_path: out of memory");
    return 0;
  }
  return cut_copy(path, out, out_capacity);
}

size_t wc_cpu_features(char* out, size_t out_capacity) {
  return cut_copy(weightcache::cpu_features_text(), out, out_capacity);
}

const char* wc_status_string(wc_status s) { return errc_text(static_cast<Errc>(s)); }

const char* wc_last_error(void) { return last_error_message(); }

void wc_set_log_level(wc_log_level level) { set_log_level(static_cast<LogLevel>(raw_enum(level))); }

void wc_set_log_callback(wc_log_callback callback, void* user) { set_log_callback(callback, user); }

void wc_log_message(wc_log_level level, const char* message) {
  const int v = raw_enum(level);
  // A NULL message logs nothing, but a bad level is still said.
  if (message != nullptr || v < WC_LOG_TRACE || v > WC_LOG_ERROR)
    log_message(static_cast<LogLevel>(v), message != nullptr ? message : "");
}

wc_status wc_set_last_error(wc_status status, const char* message) {
  const int v = raw_enum(status);
  if (v <= WC_OK || v > WC_ERR_READ_ONLY)
    return invalid("wc_set_last_error: the status is not one of wc_status's errors (WC_ERR_INVALID_ARGUMENT to "
                   "WC_ERR_READ_ONLY)");
  const auto code = static_cast<Errc>(v);
  set_last_error(code, 0, message != nullptr ? message : errc_text(code));
  return status;
}

const char* wc_version(void) { return WEIGHTCACHE_VERSION_STRING; }

}  // extern "C"
