// What the POSIX and Win32 call tables (posix_calls.hpp, win32_calls.hpp) have in common: each
// is generated from one list of its entries, which also names them, so that code wrapping every
// entry (the tests' fault injection) iterates the list instead of repeating it by hand, as
// SQLite's aSyscall[] table of {name, current, default} does.
#pragma once

namespace weightcache::platform {

/// One entry of a call table at compile time: `id` is its enumerator (the entry's place in the
/// list), `member` the table's function pointer for it.
template <auto Id, auto Member>
struct CallEntry {
  static constexpr auto id = Id;
  static constexpr auto member = Member;
};

}  // namespace weightcache::platform

// What every call table is, generated from its list LIST(X) of X(name, label, result, params)
// (label: what call_name says of the entry, and the table's own business otherwise):
//   struct TABLE { result (CONV* name) params; ... };  (CONV: a calling convention, or nothing)
//   enum class ID { name, ... };   inline constexpr int COUNT;
//   const char* call_name(ID);     (LABEL_X(name, label, result, params) gives the string)
//   template <class F> void FOR_EACH(F&& f): f(CallEntry<ID::name, &TABLE::name>{}) in list order.
#define WC_CALL_TABLE_MEMBER(name, label, result, params) result(WC_CALL_TABLE_CONV * name) params;
#define WC_CALL_TABLE_ID(name, label, result, params) name,
#define WC_CALL_TABLE_ONE(name, label, result, params) +1
#define WC_CALL_TABLE_VISIT(name, label, result, params) f(CallEntry<CallId::name, &CallTable::name>{});
#define WC_CALL_TABLE_NAME_IS_ENTRY(name, label, result, params) #name,
#define WC_CALL_TABLE_NAME_IS_LABEL(name, label, result, params) #label,
#define WC_CALL_TABLE(TABLE, ID, COUNT, FOR_EACH, LIST, LABEL_X) \
  struct TABLE {                                                \
    LIST(WC_CALL_TABLE_MEMBER)                                  \
  };                                                            \
  enum class ID { LIST(WC_CALL_TABLE_ID) };                     \
  inline constexpr int COUNT = 0 LIST(WC_CALL_TABLE_ONE);       \
  constexpr const char* call_name(ID c) noexcept {              \
    constexpr const char* kNames[] = {LIST(LABEL_X)};           \
    return kNames[static_cast<int>(c)];                         \
  }                                                             \
  template <class F>                                            \
  constexpr void FOR_EACH(F&& f) {                              \
    using CallTable = TABLE;                                    \
    using CallId = ID;                                          \
    LIST(WC_CALL_TABLE_VISIT)                                   \
  }
