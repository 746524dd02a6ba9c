// Compiled only when CMake found an xnnpack.h that declares struct xnn_weights_cache_provider:
// pins our mirror types to the real ones, member by member: offset and size (the layout XNNPACK
// reads) and type (what a call through each function pointer means: a provider whose
// is_finalized returned int would have the same layout and be wrong).
// Point it at an XNNPACK checkout with -DWEIGHTCACHE_XNNPACK_INCLUDE=<XNNPACK>/include (and
// -DWEIGHTCACHE_PTHREADPOOL_INCLUDE=... when pthreadpool.h is elsewhere); see docs/INTEGRATION.md.
// With -DWEIGHTCACHE_XNNPACK_SOURCE_DIR the xnnpack_real suite also compiles it, against the
// headers of the XNNPACK it builds and runs.
#include <xnnpack.h>

#include <weightcache/xnnpack.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

using Key = xnn_weights_cache_look_up_key;
using Provider = xnn_weights_cache_provider;
using MirrorKey = wc_xnn_weights_cache_look_up_key;
using Mirror = wc_xnn_weights_cache_provider;

static_assert(sizeof(MirrorKey) == sizeof(Key));
static_assert(sizeof(wc_xnn_status) == sizeof(enum xnn_status));
static_assert(static_cast<int>(WC_XNN_STATUS_SUCCESS) == static_cast<int>(xnn_status_success));
static_assert(static_cast<int>(WC_XNN_STATUS_INVALID_PARAMETER) == static_cast<int>(xnn_status_invalid_parameter));
static_assert(static_cast<int>(WC_XNN_STATUS_INVALID_STATE) == static_cast<int>(xnn_status_invalid_state));
static_assert(static_cast<int>(WC_XNN_STATUS_OUT_OF_MEMORY) == static_cast<int>(xnn_status_out_of_memory));

// ---- member types ----------------------------------------------------------------------------

// A mirror type spelled with XNNPACK's names: our key and status become theirs, pointers,
// const and function-pointer signatures are translated member by member, anything else stays.
template <class T>
struct Real {
  using type = T;
};
template <class T>
using real_t = typename Real<T>::type;
template <>
struct Real<MirrorKey> {
  using type = Key;
};
template <>
struct Real<wc_xnn_status> {
  using type = enum xnn_status;
};
template <class T>
struct Real<const T> {
  using type = const real_t<T>;
};
template <class T>
struct Real<T*> {
  using type = real_t<T>*;
};
template <class R, class... A>
struct Real<R (*)(A...)> {
  using type = real_t<R> (*)(real_t<A>...);
};

// The key: XNNPACK's member types, spelled out, and ours.
static_assert(std::is_same_v<decltype(Key::seed), std::uint32_t>, "key.seed is not uint32_t in xnnpack.h");
static_assert(std::is_same_v<decltype(Key::kernel), const void*>, "key.kernel is not const void* in xnnpack.h");
static_assert(std::is_same_v<decltype(Key::bias), const void*>, "key.bias is not const void* in xnnpack.h");
static_assert(std::is_same_v<decltype(Key::fingerprint_id), std::uint32_t>,
              "key.fingerprint_id is not uint32_t in xnnpack.h");
// A member of our mirror at XNNPACK's offset, of its size, and of its type once translated.
#define WC_SAME_MEMBER(T, U, field)                                                                  \
  static_assert(offsetof(T, field) == offsetof(U, field), #field ": offset differs from xnnpack.h"); \
  static_assert(sizeof(T::field) == sizeof(U::field), #field ": size differs from xnnpack.h");       \
  static_assert(std::is_same_v<real_t<decltype(T::field)>, decltype(U::field)>, #field ": type differs from xnnpack.h")
WC_SAME_MEMBER(MirrorKey, Key, seed);
WC_SAME_MEMBER(MirrorKey, Key, kernel);
WC_SAME_MEMBER(MirrorKey, Key, bias);
WC_SAME_MEMBER(MirrorKey, Key, fingerprint_id);

// The provider: every function pointer's return and parameter types, as current XNNPACK
// declares them (a change in XNNPACK names the member here), then ours translated.
static_assert(std::is_same_v<decltype(Provider::context), void*>, "context is not void* in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::look_up), std::size_t (*)(void*, const struct xnn_weights_cache_look_up_key*)>,
              "look_up is not size_t(void*, const struct xnn_weights_cache_look_up_key*) in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::reserve_space), void* (*)(void*, std::size_t)>,
              "reserve_space is not void*(void*, size_t) in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::look_up_or_insert),
                             std::size_t (*)(void*, const struct xnn_weights_cache_look_up_key*, void*, std::size_t)>,
              "look_up_or_insert is not size_t(void*, const key*, void*, size_t) in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::is_finalized), bool (*)(void*)>,
              "is_finalized is not bool(void*) in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::offset_to_addr), void* (*)(void*, std::size_t)>,
              "offset_to_addr is not void*(void*, size_t) in xnnpack.h");
static_assert(std::is_same_v<decltype(Provider::delete_cache), enum xnn_status (*)(void*)>,
              "delete_cache is not enum xnn_status(void*) in xnnpack.h");
WC_SAME_MEMBER(Mirror, Provider, context);
WC_SAME_MEMBER(Mirror, Provider, look_up);
WC_SAME_MEMBER(Mirror, Provider, reserve_space);
WC_SAME_MEMBER(Mirror, Provider, look_up_or_insert);
WC_SAME_MEMBER(Mirror, Provider, is_finalized);
WC_SAME_MEMBER(Mirror, Provider, offset_to_addr);
WC_SAME_MEMBER(Mirror, Provider, delete_cache);
#undef WC_SAME_MEMBER

// The translation itself must not make unequal types equal: spot checks.
static_assert(std::is_same_v<real_t<decltype(Mirror::look_up)>, std::size_t (*)(void*, const Key*)>);
static_assert(!std::is_same_v<real_t<int (*)(void*)>, bool (*)(void*)>);
static_assert(!std::is_same_v<real_t<std::size_t (*)(void*, MirrorKey*)>, std::size_t (*)(void*, const Key*)>);

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
static_assert(tail_matches<Provider>(), "the provider struct does not end where ours does");

template <class P>
constexpr bool alias_data_type_matches() {
  if constexpr (has_alias_data<P>())
    return std::is_same_v<decltype(P::alias_data), enum xnn_status (*)(void*, void*, void*)> &&
           std::is_same_v<real_t<decltype(Mirror::alias_data)>, decltype(P::alias_data)>;
  else
    return true;
}
static_assert(alias_data_type_matches<Provider>(), "alias_data is not enum xnn_status(void*, void*, void*)");

TEST(XnnpackAbi, MirrorMatchesTheInstalledHeader) {
  RecordProperty("xnnpack_has_alias_data", has_alias_data<Provider>() ? "yes" : "no");
  SUCCEED() << "layout and member types checked at compile time against the installed xnnpack.h";
}

}  // namespace
