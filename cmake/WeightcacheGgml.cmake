# ggml with its CPU backend (and CPU_REPACK), built from a user's checkout for the ggml buffer type
# (src/integrations/ggml), its tests, benchmarks and examples. libweightcache itself never links
# ggml: libweightcache_ggml does, and it is compiled against this very tree, since a buffer type
# needs ggml's internal buffer interface (src/ggml-backend-impl.h), which ggml does not install
# and which changes between ggml versions without a change of GGML_BACKEND_API_VERSION.
#
# Input: WEIGHTCACHE_GGML_SOURCE_DIR, a ggml checkout (include/ggml.h at its top), or a llama.cpp
# checkout (ggml/ under it).
# Output: the target weightcache::ggml (static ggml, ggml-base and ggml-cpu, OpenMP, with the
# public headers and the internal one), WEIGHTCACHE_GGML_SOURCE (the ggml tree) and
# WEIGHTCACHE_GGML_VERSION (the tree's version, from its CMakeLists.txt).
#
# ggml is configured and built once per build directory in <build>/third_party/ggml-*, by its own
# CMake (an ExternalProject), static and position-independent, with GGML_NATIVE (the repacked
# layouts are chosen for the CPU it runs on; the cache key holds the CPU features).

include(ExternalProject)
include(${CMAKE_CURRENT_LIST_DIR}/WeightcacheGgmlVersion.cmake)

get_filename_component(_wc_ggml_src "${WEIGHTCACHE_GGML_SOURCE_DIR}" ABSOLUTE)
if(NOT EXISTS "${_wc_ggml_src}/include/ggml.h" AND EXISTS "${_wc_ggml_src}/ggml/include/ggml.h")
  set(_wc_ggml_src "${_wc_ggml_src}/ggml")  # a llama.cpp checkout
endif()
if(NOT EXISTS "${_wc_ggml_src}/include/ggml.h" OR NOT EXISTS "${_wc_ggml_src}/src/ggml-backend-impl.h"
   OR NOT EXISTS "${_wc_ggml_src}/CMakeLists.txt")
  message(FATAL_ERROR "weightcache: WEIGHTCACHE_GGML_SOURCE_DIR=${WEIGHTCACHE_GGML_SOURCE_DIR} is not a ggml or "
                      "llama.cpp checkout (no include/ggml.h, src/ggml-backend-impl.h or CMakeLists.txt)")
endif()
weightcache_ggml_version("${_wc_ggml_src}" WEIGHTCACHE_GGML_VERSION)
weightcache_ggml_repack_id("${_wc_ggml_src}" WEIGHTCACHE_GGML_REPACK_ID)
weightcache_ggml_amx_id("${_wc_ggml_src}" WEIGHTCACHE_GGML_AMX_ID)
weightcache_ggml_kleidiai_id("${_wc_ggml_src}" "${WEIGHTCACHE_KLEIDIAI_SOURCE_DIR}" WEIGHTCACHE_GGML_KLEIDIAI_ID)
set(WEIGHTCACHE_GGML_SOURCE "${_wc_ggml_src}")

if(WEIGHTCACHE_KLEIDIAI_SOURCE_DIR)  # a build of the same tree with KleidiAI is another build
  string(SHA1 _wc_ggml_tag "${_wc_ggml_src}|${WEIGHTCACHE_KLEIDIAI_SOURCE_DIR}")
else()
  string(SHA1 _wc_ggml_tag "${_wc_ggml_src}")
endif()
string(SUBSTRING "${_wc_ggml_tag}" 0 8 _wc_ggml_tag)
set(_wc_ggml_bin "${CMAKE_BINARY_DIR}/third_party/ggml-${_wc_ggml_tag}")
set(WEIGHTCACHE_GGML_LIBDIR "${_wc_ggml_bin}/src")  # the static libraries, for the tests' consumer
set(_wc_ggml_libs
  "${_wc_ggml_bin}/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_ggml_bin}/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml-cpu${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_ggml_bin}/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml-base${CMAKE_STATIC_LIBRARY_SUFFIX}")
set(_wc_ggml_args
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DBUILD_SHARED_LIBS=OFF
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DGGML_NATIVE=ON
  -DGGML_CPU_REPACK=ON
  -DGGML_BUILD_TESTS=OFF
  -DGGML_BUILD_EXAMPLES=OFF)
# A sanitizer build builds ggml with the same sanitizer, and with ggml's own threadpool instead of
# OpenMP (libgomp is not instrumented: TSan would report its synchronization as races).
if(WEIGHTCACHE_SANITIZE)
  string(REPLACE ";" "," _wc_ggml_san "${WEIGHTCACHE_SANITIZE}")
  list(APPEND _wc_ggml_args -DGGML_OPENMP=OFF "-DCMAKE_C_FLAGS=-fsanitize=${_wc_ggml_san} -fno-omit-frame-pointer"
       "-DCMAKE_CXX_FLAGS=-fsanitize=${_wc_ggml_san} -fno-omit-frame-pointer")
  set(_wc_ggml_openmp OFF)
elseif(WEIGHTCACHE_STATIC_EXECUTABLES)
  # Static executables (the cross builds' tests, under qemu-user): the cross compilers have no
  # static libgomp to link, so ggml's own threadpool.
  list(APPEND _wc_ggml_args -DGGML_OPENMP=OFF)
  set(_wc_ggml_openmp OFF)
else()
  list(APPEND _wc_ggml_args -DGGML_OPENMP=ON)
  set(_wc_ggml_openmp ON)
endif()
weightcache_ggml_cpu_settings(_wc_ggml_args "${WEIGHTCACHE_KLEIDIAI_SOURCE_DIR}")
weightcache_external_build_settings(_wc_ggml_args _wc_ggml_jobs)

ExternalProject_Add(weightcache_ggml_build
  PREFIX "${_wc_ggml_bin}-steps"
  SOURCE_DIR "${_wc_ggml_src}"
  BINARY_DIR "${_wc_ggml_bin}"
  CMAKE_ARGS ${_wc_ggml_args}
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target ggml ggml-cpu --parallel ${_wc_ggml_jobs}
  BUILD_ALWAYS ON
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${_wc_ggml_libs}
  LOG_CONFIGURE ON
  LOG_BUILD ON
  LOG_OUTPUT_ON_FAILURE ON
  EXCLUDE_FROM_ALL ON)

add_library(weightcache_ggml_dep INTERFACE)
add_dependencies(weightcache_ggml_dep weightcache_ggml_build)
target_include_directories(weightcache_ggml_dep SYSTEM INTERFACE "${_wc_ggml_src}/include" "${_wc_ggml_src}/src")
# ggml.a registers the CPU backend, which lives in ggml-cpu.a; both need ggml-base.a: linked as a
# group so the order never matters.
target_link_libraries(weightcache_ggml_dep INTERFACE
  "-Wl,--start-group" ${_wc_ggml_libs} "-Wl,--end-group" Threads::Threads m ${CMAKE_DL_LIBS})
if(_wc_ggml_openmp)
  find_package(OpenMP REQUIRED COMPONENTS C CXX)
  target_link_libraries(weightcache_ggml_dep INTERFACE OpenMP::OpenMP_CXX OpenMP::OpenMP_C)
endif()
add_library(weightcache::ggml ALIAS weightcache_ggml_dep)
message(STATUS "weightcache: ggml ${WEIGHTCACHE_GGML_VERSION} from ${_wc_ggml_src} for the ggml buffer type, its "
               "tests, benchmarks and examples; built in ${_wc_ggml_bin}")
