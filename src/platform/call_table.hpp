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
