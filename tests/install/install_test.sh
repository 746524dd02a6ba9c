#!/usr/bin/env bash
# Installs the build tree into a fresh prefix with `cmake --install --prefix`, then builds the
# consumers the way users do: with pkg-config (C, shared), with pkg-config and the static library
# (C++), and with find_package(weightcache CONFIG) (both targets, also from a C-only project);
# the inspection library with pkg-config and find_package; C++ consumers at C++14 (raised to
# C++17 by the CMake targets; told why by the header when compiled by hand) and at C++17;
# each runs twice on one cache file (a miss that packs, then a hit with the same bytes). The XNNPACK consumer (C, through
# <weightcache/xnnpack.h>) is built against the shared and the static library both ways too.
# The spdlog route (<weightcache/spdlog.hpp>, header-only: nothing of spdlog is in either
# library) is built with find_package(spdlog) against the shared and the static library, when the
# build found an spdlog package (SPDLOG_DIR, its directory; empty: that part is skipped).
# Finally the prefix is moved, and the pkg-config build still works (the .pc file finds its
# prefix from where it lies).
#   install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER CXX_COMPILER [SPDLOG_DIR]
set -euo pipefail
build=$1 src=$2 cc=$3 cxx=$4 spdlog_dir=${5:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/wc-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() { echo "install_test: $*" >&2; exit 1; }
run_twice() {  # name, binary
  local out
  out=$("$2" "$work/$1.wcache") || fail "$1: first run failed: $out"
  [[ $out == "miss same-bytes" ]] || fail "$1: first run printed '$out', wanted 'miss same-bytes'"
  out=$("$2" "$work/$1.wcache") || fail "$1: second run failed: $out"
  [[ $out == "hit same-bytes" ]] || fail "$1: second run printed '$out', wanted 'hit same-bytes'"
  echo "install_test: $1 ok"
}

cmake --install "$build" --prefix "$prefix" >/dev/null
for h in weightcache.h weight_cache.hpp xnnpack.h inspect.hpp spdlog.hpp; do
  [[ -f $prefix/include/weightcache/$h ]] || fail "no installed weightcache/$h"
done
pcdir=$(dirname "$(find "$prefix" -name weightcache.pc | head -1)")
[[ -d $pcdir ]] || fail "no installed weightcache.pc"
libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir weightcache)
# The shared library exports the C ABI, the XNNPACK adapter included (and nothing of it is
# left to the static archive alone).
exports=$(nm -D --defined-only "$libdir/libweightcache.so") || fail "cannot list the exports of libweightcache.so"
for sym in wc_open wc_xnn_adapter_create wc_xnn_adapter_destroy wc_xnn_adapter_name_buffer wc_xnn_adapter_provider \
  wc_look_up_or_insert_ex wc_is_finalized_through wc_offset_to_addr_kept wc_log_message wc_set_last_error; do
  grep -qw "$sym" <<<"$exports" || fail "libweightcache.so does not export $sym"
done
# Nothing else: no instantiation of the standard library (a host's own would bind to it, or it to
# the host's), only the C ABI and the weightcache namespace.
others=$(nm -DC --defined-only "$libdir/libweightcache.so" | cut -d' ' -f3- |
  grep -Ev '^(wc_|weightcache::|typeinfo for weightcache::|typeinfo name for weightcache::|vtable for weightcache::|WEIGHTCACHE_)' || true)
[[ -z $others ]] || fail "libweightcache.so exports symbols beyond its API: $(head -5 <<<"$others")"
# weightcache/spdlog.hpp is compiled in the host only: no symbol of either library names spdlog.
for lib in "$libdir/libweightcache.so" "$libdir/libweightcache.a"; do
  if nm -C "$lib" 2>/dev/null | grep spdlog; then fail "$lib has spdlog's symbols in it"; fi
done

# 1. pkg-config, C, shared library.
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$src/tests/install/consumer.c" -o "$work/c_shared" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs weightcache) -Wl,-rpath,"$libdir"
run_twice c_shared "$work/c_shared"

# 2. pkg-config, C++, static library.
# shellcheck disable=SC2046
"$cxx" -std=c++20 -Wall -Werror "$src/tests/install/consumer.cpp" -o "$work/cxx_static" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags weightcache) "$libdir/libweightcache.a" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --libs-only-other --static weightcache | sed 's/-lweightcache//') -pthread
run_twice cxx_static "$work/cxx_static"

# 3. The XNNPACK adapter through pkg-config, from C: shared, then static (the C++ runtime and
# threads come from Libs.private).
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$src/tests/install/consumer_xnnpack.c" -o "$work/xnn_shared" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs weightcache) -Wl,-rpath,"$libdir"
run_twice xnn_shared "$work/xnn_shared"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror "$src/tests/install/consumer_xnnpack.c" -o "$work/xnn_static" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags weightcache) \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --libs --static weightcache | sed "s|-lweightcache|$libdir/libweightcache.a|")
if readelf -d "$work/xnn_static" | grep >/dev/null 'NEEDED.*libweightcache'; then
  fail "xnn_static was linked against the shared library"
fi
run_twice xnn_static "$work/xnn_static"

# 3b. The inspection library through pkg-config (C++, with the static library it needs).
rm -f "$work/inspect_pc.wcache"
# shellcheck disable=SC2046
"$cxx" -std=c++20 -Wall -Werror "$src/tests/install/consumer_inspect.cpp" -o "$work/inspect_pc" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs weightcache-inspect)
out=$("$work/inspect_pc" "$work/inspect_pc.wcache") || fail "inspect_pc failed: $out"
[[ $out == "entries=1 findings=0 checksummed=5" ]] || fail "inspect_pc printed '$out'"
echo "install_test: inspect_pc ok"

# 4. find_package, both targets.
mkdir -p "$work/consumer"
cat >"$work/consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(weightcache 0.1 CONFIG REQUIRED)
add_executable(c_cmake $src/tests/install/consumer.c)
target_link_libraries(c_cmake PRIVATE weightcache::weightcache)
add_executable(cxx_cmake_static $src/tests/install/consumer.cpp)
target_compile_features(cxx_cmake_static PRIVATE cxx_std_20)
target_link_libraries(cxx_cmake_static PRIVATE weightcache::weightcache_static)
add_executable(xnn_cmake $src/tests/install/consumer_xnnpack.c)
target_link_libraries(xnn_cmake PRIVATE weightcache::weightcache)
add_executable(xnn_cmake_static $src/tests/install/consumer_xnnpack.c)
target_link_libraries(xnn_cmake_static PRIVATE weightcache::weightcache_static)
add_executable(inspect_cmake $src/tests/install/consumer_inspect.cpp)
target_compile_features(inspect_cmake PRIVATE cxx_std_20)
target_link_libraries(inspect_cmake PRIVATE weightcache::weightcache_inspect)
CMAKE
cmake -S "$work/consumer" -B "$work/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$work/consumer/build" >/dev/null
run_twice c_cmake "$work/consumer/build/c_cmake"
run_twice cxx_cmake_static "$work/consumer/build/cxx_cmake_static"
run_twice xnn_cmake "$work/consumer/build/xnn_cmake"
run_twice xnn_cmake_static "$work/consumer/build/xnn_cmake_static"
out=$("$work/consumer/build/inspect_cmake" "$work/inspect_cmake.wcache") || fail "inspect_cmake failed: $out"
[[ $out == "entries=1 findings=0 checksummed=5" ]] || fail "inspect_cmake printed '$out'"
echo "install_test: inspect_cmake ok"

# 4a. The spdlog route, find_package(spdlog) beside find_package(weightcache): a library warning
# reaches the host logger's sink at warn with its whole text, and after the route ends it goes to
# stderr again (once: the reference capture and the routed one must not reach it).
if [[ -n $spdlog_dir ]]; then
  mkdir -p "$work/spdlog_consumer"
  cat >"$work/spdlog_consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(spdlog_consumer CXX)
find_package(weightcache 0.1 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
add_executable(spdlog_shared $src/tests/install/consumer_spdlog.cpp)
target_link_libraries(spdlog_shared PRIVATE weightcache::weightcache spdlog::spdlog)
add_executable(spdlog_static $src/tests/install/consumer_spdlog.cpp)
target_link_libraries(spdlog_static PRIVATE weightcache::weightcache_static spdlog::spdlog)
CMAKE
  cmake -S "$work/spdlog_consumer" -B "$work/spdlog_consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -Dspdlog_DIR="$spdlog_dir" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
  cmake --build "$work/spdlog_consumer/build" >/dev/null || fail "the spdlog consumer does not build against the installed tree"
  for b in spdlog_shared spdlog_static; do
    out=$("$work/spdlog_consumer/build/$b" "$work/$b.wcache" 2>"$work/$b.stderr") ||
      fail "$b failed: $out $(cat "$work/$b.stderr")"
    [[ $out == "routed restored" ]] || fail "$b printed '$out'"
    n=$(grep -c "heap" "$work/$b.stderr" || true)
    [[ $n == 1 ]] || fail "$b: $n heap warnings on stderr, wanted the one after the route ended: $(cat "$work/$b.stderr")"
    echo "install_test: $b ok"
  done
else
  echo "install_test: no spdlog package found at configure: the spdlog consumer is skipped"
fi

# 4b. The ONNX Runtime execution provider, when the build made one: pkg-config's ort_ep and the
# package's WEIGHTCACHE_ORT_EP_LIBRARY name the installed file (the absolute path ONNX Runtime's
# RegisterExecutionProviderLibrary needs), it exports only the provider's entry points (XNNPACK
# and the C++ runtime stay inside), and it finds libweightcache beside it.
ort_ep=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=ort_ep weightcache)
if [[ -e $libdir/libweightcache_ort_ep.so ]]; then
  [[ $ort_ep == "$libdir/libweightcache_ort_ep.so" ]] || fail "pkg-config ort_ep is '$ort_ep', not $libdir/libweightcache_ort_ep.so"
  mkdir -p "$work/ort_pkg"
  cat >"$work/ort_pkg/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(ort_pkg C)
find_package(weightcache 0.1 CONFIG REQUIRED)
file(WRITE "\${CMAKE_BINARY_DIR}/ort_ep.txt" "\${WEIGHTCACHE_ORT_EP_LIBRARY}")
CMAKE
  cmake -S "$work/ort_pkg" -B "$work/ort_pkg/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  from_cmake=$(cat "$work/ort_pkg/build/ort_ep.txt")
  [[ $(realpath "$from_cmake") == $(realpath "$ort_ep") ]] ||
    fail "WEIGHTCACHE_ORT_EP_LIBRARY is '$from_cmake', pkg-config says '$ort_ep'"
  exported=$(nm -D --defined-only "$ort_ep" | awk '$2 == "T" {print $3}' | sort | tr '\n' ' ')
  [[ $exported == "CreateEpFactories ReleaseEpFactory wc_ort_ep_get_stats " ]] ||
    fail "the provider exports functions beyond its entry points: $exported"
  ldd "$ort_ep" | grep >/dev/null "libweightcache.so.* => $libdir/" ||
    fail "the provider does not find the installed libweightcache beside it: $(ldd "$ort_ep" | grep weightcache)"
  echo "install_test: ort_ep $ort_ep (exports: $exported)"
elif [[ -n $ort_ep ]]; then
  fail "pkg-config ort_ep is '$ort_ep' but no provider was installed"
fi

# 4c. The C++ standard. weight_cache.hpp needs C++17: the installed targets raise a CMake consumer
# that asks for C++14 to C++17 (cxx_std_17), through the inspection library too; a consumer at
# C++17 builds and runs. A compiler called by hand at C++14 stops at the header's own message,
# not inside it; at C++17 the headers compile.
mkdir -p "$work/cxx_levels"
cat >"$work/cxx_levels/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(cxx_levels CXX)
set(CMAKE_CXX_STANDARD 14)
set(CMAKE_CXX_EXTENSIONS OFF)
find_package(weightcache 0.1 CONFIG REQUIRED)
add_executable(cxx14 $src/tests/install/consumer.cpp)
target_link_libraries(cxx14 PRIVATE weightcache::weightcache)
add_executable(cxx14_inspect $src/tests/install/consumer_inspect.cpp)
target_link_libraries(cxx14_inspect PRIVATE weightcache::weightcache_inspect)
add_executable(cxx17 $src/tests/install/consumer.cpp)
set_target_properties(cxx17 PROPERTIES CXX_STANDARD 17)
target_link_libraries(cxx17 PRIVATE weightcache::weightcache_static)
CMAKE
cmake -S "$work/cxx_levels" -B "$work/cxx_levels/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
out=$(cmake --build "$work/cxx_levels/build" 2>&1) ||
  fail "a CMake consumer at CMAKE_CXX_STANDARD 14 or 17 does not build against the installed targets: $out"
commands=$work/cxx_levels/build/compile_commands.json
grep -q -- '-std=c++17.*cxx14\.dir' "$commands" && grep -q -- '-std=c++17.*cxx14_inspect\.dir' "$commands" &&
  ! grep -q -- '-std=c++14' "$commands" ||
  fail "the installed targets did not raise a C++14 consumer to C++17: $(grep '"command"' "$commands")"
run_twice cxx14 "$work/cxx_levels/build/cxx14"
run_twice cxx17 "$work/cxx_levels/build/cxx17"
out=$("$work/cxx_levels/build/cxx14_inspect" "$work/cxx14_inspect.wcache") || fail "cxx14_inspect failed: $out"
[[ $out == "entries=1 findings=0 checksummed=5" ]] || fail "cxx14_inspect printed '$out'"
cxx14_message="weightcache/weight_cache.hpp needs C++17 or later"
for h in weight_cache.hpp inspect.hpp ${spdlog_dir:+spdlog.hpp}; do
  printf '#include <weightcache/%s>\nint main() { return 0; }\n' "$h" >"$work/include_$h.cpp"
  if out=$("$cxx" -std=c++14 -fsyntax-only -I"$prefix/include" "$work/include_$h.cpp" 2>&1); then
    fail "<weightcache/$h> compiled at -std=c++14"
  fi
  grep -qF "$cxx14_message" <<<"$out" || fail "<weightcache/$h> at -std=c++14 does not say it needs C++17: $out"
  out=$("$cxx" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" "$work/include_$h.cpp" 2>&1) ||
    fail "<weightcache/$h> does not compile at -std=c++17: $out"
done
echo "install_test: C++14 consumers: raised to C++17 by the CMake targets, told why by the compiler"

# 5. find_package from a project that enables C only: the static target must bring the C++
# runtime itself (the C linker does not add it).
mkdir -p "$work/c_only"
cat >"$work/c_only/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(c_only C)
find_package(weightcache 0.1 CONFIG REQUIRED)
add_executable(c_only_shared $src/tests/install/consumer.c)
target_link_libraries(c_only_shared PRIVATE weightcache::weightcache)
add_executable(c_only_static $src/tests/install/consumer_xnnpack.c)
target_link_libraries(c_only_static PRIVATE weightcache::weightcache_static)
CMAKE
cmake -S "$work/c_only" -B "$work/c_only/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$work/c_only/build" >/dev/null || fail "a C-only project cannot link the installed targets"
run_twice c_only_shared "$work/c_only/build/c_only_shared"
run_twice c_only_static "$work/c_only/build/c_only_static"

# 6. The installed tree, moved elsewhere.
mv "$prefix" "$work/moved"
pcdir=${pcdir/#$prefix/$work/moved}
libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir weightcache)
# shellcheck disable=SC2046
"$cc" -std=c11 "$src/tests/install/consumer.c" -o "$work/c_moved" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs weightcache) -Wl,-rpath,"$libdir"
run_twice c_moved "$work/c_moved"
if [[ -n $ort_ep ]]; then
  moved_ep=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=ort_ep weightcache)
  [[ -e $moved_ep && $moved_ep == "$libdir/libweightcache_ort_ep.so" ]] || fail "after the move, ort_ep is '$moved_ep'"
fi
echo "install_test: all consumers built and ran"
