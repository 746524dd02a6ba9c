# A current XNNPACK, built from a user's checkout for the tests, benchmarks and examples only.
# libweightcache itself never links it (only the ONNX Runtime EP does): weightcache's XNNPACK adapter declares its own mirror of the
# provider interface (include/weightcache/xnnpack.h), so libweightcache has no XNNPACK dependency.
#
# Inputs (cache variables):
#   WEIGHTCACHE_XNNPACK_SOURCE_DIR       the XNNPACK checkout (required to get here)
#   WEIGHTCACHE_PTHREADPOOL_SOURCE_DIR   default: pthreadpool/ beside the XNNPACK checkout
#   WEIGHTCACHE_CPUINFO_SOURCE_DIR       default: cpuinfo/ beside it
#   WEIGHTCACHE_FXDIV_SOURCE_DIR         default: FXdiv/ beside it
#   WEIGHTCACHE_XNNPACK_BUILD_JOBS       parallel jobs of XNNPACK's own build (default: the cores)
# Output: the target weightcache::xnnpack (static XNNPACK + its micro-kernels, pthreadpool and
# cpuinfo, with the XNNPACK and pthreadpool headers), and WEIGHTCACHE_XNNPACK_INCLUDE_DIRS.
#
# XNNPACK is configured and built once per build directory, in <build>/third_party/xnnpack-*, with
# its own CMake (an ExternalProject: its options and compile flags stay out of this project) in
# the configuration that builds offline: static, production micro-kernels only, no KleidiAI, no
# tests or benchmarks. Later builds only re-run its (then empty) ninja step.

include(ExternalProject)

set(WEIGHTCACHE_PTHREADPOOL_SOURCE_DIR "" CACHE PATH "pthreadpool sources for XNNPACK (default: beside the XNNPACK checkout)")
set(WEIGHTCACHE_CPUINFO_SOURCE_DIR "" CACHE PATH "cpuinfo sources for XNNPACK (default: beside the XNNPACK checkout)")
set(WEIGHTCACHE_FXDIV_SOURCE_DIR "" CACHE PATH "FXdiv sources for XNNPACK (default: beside the XNNPACK checkout)")
cmake_host_system_information(RESULT _wc_cores QUERY NUMBER_OF_LOGICAL_CORES)
set(WEIGHTCACHE_XNNPACK_BUILD_JOBS "${_wc_cores}" CACHE STRING "Parallel jobs for building XNNPACK")

get_filename_component(_wc_xnn_src "${WEIGHTCACHE_XNNPACK_SOURCE_DIR}" ABSOLUTE)
get_filename_component(_wc_xnn_parent "${_wc_xnn_src}" DIRECTORY)

# Each dependency: its option if set, else the folder of that name beside XNNPACK; checked by a
# header it must have, so a wrong path fails here with its name rather than deep in XNNPACK's build.
function(_weightcache_xnn_dep var folder header)
  if(${var})
    get_filename_component(_dir "${${var}}" ABSOLUTE)
  else()
    set(_dir "${_wc_xnn_parent}/${folder}")
  endif()
  if(NOT EXISTS "${_dir}/${header}")
    message(FATAL_ERROR "weightcache: no ${header} in ${_dir}: set ${var} to a ${folder} checkout "
                        "(XNNPACK at ${_wc_xnn_src} needs it)")
  endif()
  set(_wc_dep_${folder} "${_dir}" PARENT_SCOPE)
endfunction()
if(NOT EXISTS "${_wc_xnn_src}/include/xnnpack.h" OR NOT EXISTS "${_wc_xnn_src}/CMakeLists.txt")
  message(FATAL_ERROR "weightcache: WEIGHTCACHE_XNNPACK_SOURCE_DIR=${WEIGHTCACHE_XNNPACK_SOURCE_DIR} is not an "
                      "XNNPACK checkout (no include/xnnpack.h or CMakeLists.txt)")
endif()
_weightcache_xnn_dep(WEIGHTCACHE_PTHREADPOOL_SOURCE_DIR pthreadpool include/pthreadpool.h)
_weightcache_xnn_dep(WEIGHTCACHE_CPUINFO_SOURCE_DIR cpuinfo include/cpuinfo.h)
_weightcache_xnn_dep(WEIGHTCACHE_FXDIV_SOURCE_DIR FXdiv include/fxdiv.h)

# One build folder per checkout path: pointing the option at another checkout builds that one
# beside the first instead of confusing XNNPACK's CMake cache with a second source tree.
string(SHA1 _wc_xnn_tag "${_wc_xnn_src}")
string(SUBSTRING "${_wc_xnn_tag}" 0 8 _wc_xnn_tag)
set(_wc_xnn_bin "${CMAKE_BINARY_DIR}/third_party/xnnpack-${_wc_xnn_tag}")
set(_wc_xnn_libs
  "${_wc_xnn_bin}/${CMAKE_STATIC_LIBRARY_PREFIX}XNNPACK${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_xnn_bin}/${CMAKE_STATIC_LIBRARY_PREFIX}xnnpack-microkernels-prod${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_xnn_bin}/pthreadpool/${CMAKE_STATIC_LIBRARY_PREFIX}pthreadpool${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_xnn_bin}/cpuinfo/${CMAKE_STATIC_LIBRARY_PREFIX}cpuinfo${CMAKE_STATIC_LIBRARY_SUFFIX}")

set(_wc_xnn_args
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DXNNPACK_LIBRARY_TYPE=static
  # Position-independent: the ONNX Runtime execution provider links it into a shared library.
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DXNNPACK_BUILD_TESTS=OFF
  -DXNNPACK_BUILD_BENCHMARKS=OFF
  -DXNNPACK_BUILD_ALL_MICROKERNELS=OFF
  -DXNNPACK_ENABLE_KLEIDIAI=OFF
  -DCPUINFO_SOURCE_DIR=${_wc_dep_cpuinfo}
  -DPTHREADPOOL_SOURCE_DIR=${_wc_dep_pthreadpool}
  -DFXDIV_SOURCE_DIR=${_wc_dep_FXdiv})
if(CMAKE_C_COMPILER_LAUNCHER)
  list(APPEND _wc_xnn_args -DCMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER})
endif()
if(CMAKE_CXX_COMPILER_LAUNCHER)
  list(APPEND _wc_xnn_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
if(CMAKE_TOOLCHAIN_FILE)
  list(APPEND _wc_xnn_args -DCMAKE_TOOLCHAIN_FILE=${CMAKE_TOOLCHAIN_FILE})
endif()

# XNNPACK gets none of this project's compile options: a sanitizer build links an uninstrumented
# XNNPACK (scripts/test builds it for the main build only).
# BUILD_ALWAYS: a checkout that changed (a pull, a local patch) is rebuilt incrementally; an
# unchanged one costs one empty ninja run. The libraries are byproducts, so ninja relinks the
# tests only when one of them actually changed.
ExternalProject_Add(weightcache_xnnpack_build
  PREFIX "${_wc_xnn_bin}-steps"
  SOURCE_DIR "${_wc_xnn_src}"
  BINARY_DIR "${_wc_xnn_bin}"
  CMAKE_ARGS ${_wc_xnn_args}
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target XNNPACK --parallel ${WEIGHTCACHE_XNNPACK_BUILD_JOBS}
  BUILD_ALWAYS ON
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${_wc_xnn_libs}
  LOG_CONFIGURE ON
  LOG_BUILD ON
  LOG_OUTPUT_ON_FAILURE ON
  EXCLUDE_FROM_ALL ON)

set(WEIGHTCACHE_XNNPACK_INCLUDE_DIRS "${_wc_xnn_src}/include" "${_wc_dep_pthreadpool}/include")
add_library(weightcache_xnnpack INTERFACE)
add_dependencies(weightcache_xnnpack weightcache_xnnpack_build)
target_include_directories(weightcache_xnnpack SYSTEM INTERFACE ${WEIGHTCACHE_XNNPACK_INCLUDE_DIRS})
target_link_libraries(weightcache_xnnpack INTERFACE ${_wc_xnn_libs} Threads::Threads ${CMAKE_DL_LIBS})
if(NOT WIN32)
  target_link_libraries(weightcache_xnnpack INTERFACE m)
endif()
add_library(weightcache::xnnpack ALIAS weightcache_xnnpack)
message(STATUS "weightcache: XNNPACK from ${_wc_xnn_src} (pthreadpool ${_wc_dep_pthreadpool}, cpuinfo "
               "${_wc_dep_cpuinfo}, FXdiv ${_wc_dep_FXdiv}) for tests, benchmarks and examples; built in ${_wc_xnn_bin}")
