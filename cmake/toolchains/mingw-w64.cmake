# Cross-build for 64-bit Windows with Debian's mingw-w64 and run the results under Wine.
#   cmake -S . -B build/windows -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/mingw-w64.cmake
# (scripts/test-windows does this, installs the packages and runs the tests.)
#
# The -posix compilers: the default win32 thread model lacks std::thread and std::mutex.
# Everything is linked statically (libgcc, libstdc++, winpthread), so test executables run
# under Wine without copying DLLs next to them.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(_wc_triplet x86_64-w64-mingw32)

find_program(_wc_mingw_cxx NAMES ${_wc_triplet}-g++-posix REQUIRED)
find_program(_wc_mingw_cc NAMES ${_wc_triplet}-gcc-posix REQUIRED)
set(CMAKE_C_COMPILER ${_wc_mingw_cc})
set(CMAKE_CXX_COMPILER ${_wc_mingw_cxx})
find_program(CMAKE_RC_COMPILER NAMES ${_wc_triplet}-windres)

set(CMAKE_FIND_ROOT_PATH /usr/${_wc_triplet})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-static")

# Wine runs the test executables (and GoogleTest's test discovery).
find_program(WEIGHTCACHE_WINE NAMES wine64 wine)
if(WEIGHTCACHE_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${WEIGHTCACHE_WINE})
endif()

# fmt and xxHash are header-only here (nlohmann/json too, for the CLI). Debian ships them
# for the host under /usr/include; adding that whole directory
# would let glibc's headers shadow mingw's. Instead, a directory of the build tree holds symlinks
# to just these packages' headers. (try_compile projects load this file too: they need none.)
if(NOT CMAKE_BINARY_DIR MATCHES "CMakeFiles/CMakeScratch|CMakeFiles/CMakeTmp")
  set(_wc_host_headers ${CMAKE_BINARY_DIR}/host-headers)
  file(MAKE_DIRECTORY ${_wc_host_headers})
  foreach(_wc_entry xxhash.h fmt nlohmann)
    if(EXISTS /usr/include/${_wc_entry} AND NOT EXISTS ${_wc_host_headers}/${_wc_entry})
      file(CREATE_LINK /usr/include/${_wc_entry} ${_wc_host_headers}/${_wc_entry} SYMBOLIC)
    endif()
  endforeach()
  set(WEIGHTCACHE_XXHASH_INCLUDE ${_wc_host_headers} CACHE PATH "xxhash.h for the Windows build")
  set(WEIGHTCACHE_FMT_INCLUDE ${_wc_host_headers} CACHE PATH "fmt headers for the Windows build")
  set(WEIGHTCACHE_NLOHMANN_JSON_INCLUDE ${_wc_host_headers} CACHE PATH "nlohmann/json headers for the Windows build")
endif()

# GoogleTest is built from Debian's sources (/usr/src/googletest) inside the Windows build:
# tests/CMakeLists.txt does that when this is set.
set(WEIGHTCACHE_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH "GoogleTest sources to build for the target")
