# Shared part of the Linux cross toolchains (aarch64-linux-gnu.cmake, i686-linux-gnu.cmake): the
# including file sets _wc_triplet and CMAKE_SYSTEM_PROCESSOR first. Debian's cross compilers
# (g++-<triplet>) with their sysroot in /usr/<triplet>.
set(CMAKE_SYSTEM_NAME Linux)

find_program(_wc_cross_cxx NAMES ${_wc_triplet}-g++ REQUIRED)
find_program(_wc_cross_cc NAMES ${_wc_triplet}-gcc REQUIRED)
set(CMAKE_C_COMPILER ${_wc_cross_cc})
set(CMAKE_CXX_COMPILER ${_wc_cross_cxx})

set(CMAKE_FIND_ROOT_PATH /usr/${_wc_triplet})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Executables are linked statically: they then start without the target's dynamic loader and
# libraries installed on the build machine (i386 ones run natively, aarch64 ones under
# qemu-user without -L), and a test that starts a helper process starts it the same way. The
# project adds -static per executable (CMakeLists.txt), so that one that must be dynamic (a
# host that dlopens the shared library) can say so.
set(WEIGHTCACHE_STATIC_EXECUTABLES ON)

# fmt and xxHash are used header-only (and nlohmann/json by the CLI): Debian ships them for
# the build machine only, under /usr/include, where glibc's own
# headers for x86-64 would shadow the target's. A directory of the build tree holds symlinks to
# just these packages' headers (as in mingw-w64.cmake). try_compile projects need none.
if(NOT CMAKE_BINARY_DIR MATCHES "CMakeFiles/CMakeScratch|CMakeFiles/CMakeTmp")
  set(_wc_host_headers ${CMAKE_BINARY_DIR}/host-headers)
  file(MAKE_DIRECTORY ${_wc_host_headers})
  foreach(_wc_entry xxhash.h fmt nlohmann)
    if(EXISTS /usr/include/${_wc_entry} AND NOT EXISTS ${_wc_host_headers}/${_wc_entry})
      file(CREATE_LINK /usr/include/${_wc_entry} ${_wc_host_headers}/${_wc_entry} SYMBOLIC)
    endif()
  endforeach()
  set(WEIGHTCACHE_XXHASH_INCLUDE ${_wc_host_headers} CACHE PATH "xxhash.h for the cross build")
  set(WEIGHTCACHE_FMT_INCLUDE ${_wc_host_headers} CACHE PATH "fmt headers for the cross build")
  set(WEIGHTCACHE_NLOHMANN_JSON_INCLUDE ${_wc_host_headers} CACHE PATH "nlohmann/json headers for the cross build")
endif()

# GoogleTest is built from Debian's sources for the target (tests/CMakeLists.txt).
set(WEIGHTCACHE_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH "GoogleTest sources to build for the target")
