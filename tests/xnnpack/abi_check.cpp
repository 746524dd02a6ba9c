// Compiled only when CMake found an xnnpack.h that declares struct xnn_weights_cache_provider:
// pins our mirror types to the real ones, member by member.
#include <xnnpack.h>

#include <weightcache/xnnpack.h>

#include <gtest/gtest.h>

#include <cstddef>

namespace {

using Key = xnn_weights_cache_look_up_key;
using Provider = xnn_weights_cache_provider;
using MirrorKey = wc_xnn_weights_cache_look_up_key;
using Mirror = wc_xnn_weights_cache_provider;

static_assert(sizeof(MirrorKey) == sizeof(Key));
static_assert(offsetof(MirrorKey, seed) == offsetof(Key, seed));
static_assert(offsetof(MirrorKey, kernel) == offsetof(Key, kernel));
static_assert(offsetof(MirrorKey, bias) == offsetof(Key, bias));
static_assert(offsetof(MirrorKey, fingerprint_id) == offsetof(Key, fingerprint_id));

#define WC_SAME_SIZE(T, U, field) static_assert(sizeof(T::field) == sizeof(U::field))
WC_SAME_SIZE(MirrorKey, Key, seed);
WC_SAME_SIZE(MirrorKey, Key, kernel);
WC_SAME_SIZE(MirrorKey, Key, bias);
WC_SAME_SIZE(MirrorKey, Key, fingerprint_id);
WC_SAME_SIZE(Mirror, Provider, context);
WC_SAME_SIZE(Mirror, Provider, look_up);
WC_SAME_SIZE(Mirror, Provider, reserve_space);
WC_SAME_SIZE(Mirror, Provider, look_up_or_insert);
WC_SAME_SIZE(Mirror, Provider, is_finalized);
WC_SAME_SIZE(Mirror, Provider, offset_to_addr);
WC_SAME_SIZE(Mirror, Provider, delete_cache);
#undef WC_SAME_SIZE

static_assert(offsetof(Mirror, context) == offsetof(Provider, context));
static_assert(offsetof(Mirror, look_up) == offsetof(Provider, look_up));
static_assert(offsetof(Mirror, reserve_space) == offsetof(Provider, reserve_space));
static_assert(offsetof(Mirror, look_up_or_insert) == offsetof(Provider, look_up_or_insert));
static_assert(offsetof(Mirror, is_finalized) == offsetof(Provider, is_finalized));
static_assert(offsetof(Mirror, offset_to_addr) == offsetof(Provider, offset_to_addr));
static_assert(offsetof(Mirror, delete_cache) == offsetof(Provider, delete_cache));

static_assert(sizeof(wc_xnn_status) == sizeof(enum xnn_status));
static_assert(static_cast<int>(WC_XNN_STATUS_SUCCESS) == static_cast<int>(xnn_status_success));
static_assert(static_cast<int>(WC_XNN_STATUS_INVALID_PARAMETER) == static_cast<int>(xnn_status_invalid_parameter));
static_assert(static_cast<int>(WC_XNN_STATUS_INVALID_STATE) == static_cast<int>(xnn_status_invalid_state));
static_assert(static_cast<int>(WC_XNN_STATUS_OUT_OF_MEMORY) == static_cast<int>(xnn_status_out_of_memory));

template <class P>
constexpr bool has_alias_data() {
  return requires(P p) { p.alias_data; };
}

// Current XNNPACK ends with alias_data, at our offset; an older one ends right before it (and
// never reads our extra member).
template <class P>
constexpr bool tail_matches() {
  if constexpr (has_alias_data<P>())
    return offsetof(P, alias_data) == offsetof(Mirror, alias_data) && sizeof(P) == sizeof(Mirror);
  else
    return sizeof(P) == offsetof(Mirror, alias_data);
}
static_assert(tail_matches<Provider>());

TEST(XnnpackAbi, MirrorMatchesTheInstalledHeader) {
  RecordProperty("xnnpack_has_alias_data", has_alias_data<Provider>() ? "yes" : "no");
  SUCCEED() << "layout checked at compile time against the installed xnnpack.h";
}

}  // namespace
