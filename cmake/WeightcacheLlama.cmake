# libllama with ggml and its CPU backend (CPU_REPACK), built from a user's llama.cpp checkout for
# the llama.cpp front of the ggml buffer type (src/integrations/llama), its tests, benchmarks and
# examples. libweightcache never links llama.cpp: libweightcache_llama is compiled against this
# tree's own ggml (its internal buffer interface differs from other ggml versions at the same
# GGML_BACKEND_API_VERSION), and the application links its own libllama of that tree.
#
# Input: WEIGHTCACHE_LLAMA_SOURCE_DIR, a llama.cpp checkout: upstream's (its top-level
# CMakeLists.txt builds libllama) or one without upstream's top-level CMake files but with a
# build-support/CMakeLists.txt that stands in for them.
# Output: the target weightcache::llama (static libllama, ggml, ggml-base and ggml-cpu, OpenMP,
# with llama.h, ggml's public headers and its internal ones), WEIGHTCACHE_LLAMA_GGML_SOURCE (the
# ggml tree inside) and WEIGHTCACHE_LLAMA_GGML_VERSION.
#
# Built once per build directory in <build>/third_party/llama-*, static and position-independent,
# with GGML_NATIVE (as cmake/WeightcacheGgml.cmake, for the same reasons).

include(ExternalProject)
include(${CMAKE_CURRENT_LIST_DIR}/WeightcacheGgmlVersion.cmake)

get_filename_component(_wc_llama_src "${WEIGHTCACHE_LLAMA_SOURCE_DIR}" ABSOLUTE)
if(NOT EXISTS "${_wc_llama_src}/include/llama.h" OR NOT EXISTS "${_wc_llama_src}/ggml/src/ggml-backend-impl.h")
  message(FATAL_ERROR "weightcache: WEIGHTCACHE_LLAMA_SOURCE_DIR=${WEIGHTCACHE_LLAMA_SOURCE_DIR} is not a llama.cpp "
                      "checkout (no include/llama.h or ggml/src/ggml-backend-impl.h)")
endif()
if(EXISTS "${_wc_llama_src}/CMakeLists.txt" AND EXISTS "${_wc_llama_src}/src/CMakeLists.txt")
  set(_wc_llama_cmake_dir "${_wc_llama_src}")  # upstream's own CMake files
  set(_wc_llama_lib_subdir "src/")
elseif(EXISTS "${_wc_llama_src}/build-support/CMakeLists.txt")
  set(_wc_llama_cmake_dir "${_wc_llama_src}/build-support")
  set(_wc_llama_lib_subdir "")
else()
  message(FATAL_ERROR "weightcache: ${_wc_llama_src} has neither upstream's CMakeLists.txt (with src/CMakeLists.txt) "
                      "nor build-support/CMakeLists.txt")
endif()
weightcache_ggml_version("${_wc_llama_src}/ggml" WEIGHTCACHE_LLAMA_GGML_VERSION)
weightcache_ggml_repack_id("${_wc_llama_src}/ggml" WEIGHTCACHE_LLAMA_GGML_REPACK_ID)
weightcache_ggml_amx_id("${_wc_llama_src}/ggml" WEIGHTCACHE_LLAMA_GGML_AMX_ID)
# The llama.cpp tree's ggml pins its own KleidiAI release: WEIGHTCACHE_LLAMA_KLEIDIAI_SOURCE_DIR.
weightcache_ggml_kleidiai_id("${_wc_llama_src}/ggml" "${WEIGHTCACHE_LLAMA_KLEIDIAI_SOURCE_DIR}"
                             WEIGHTCACHE_LLAMA_GGML_KLEIDIAI_ID)
set(WEIGHTCACHE_LLAMA_GGML_SOURCE "${_wc_llama_src}/ggml")
set(WEIGHTCACHE_LLAMA_SOURCE "${_wc_llama_src}")

if(WEIGHTCACHE_LLAMA_KLEIDIAI_SOURCE_DIR)  # a build of the same tree with KleidiAI is another build
  string(SHA1 _wc_llama_tag "${_wc_llama_src}|${WEIGHTCACHE_LLAMA_KLEIDIAI_SOURCE_DIR}")
else()
  string(SHA1 _wc_llama_tag "${_wc_llama_src}")
endif()
string(SUBSTRING "${_wc_llama_tag}" 0 8 _wc_llama_tag)
set(_wc_llama_bin "${CMAKE_BINARY_DIR}/third_party/llama-${_wc_llama_tag}")
set(WEIGHTCACHE_LLAMA_LIBDIRS "${_wc_llama_bin}/${_wc_llama_lib_subdir}" "${_wc_llama_bin}/ggml/src")
set(_wc_llama_libs
  "${_wc_llama_bin}/${_wc_llama_lib_subdir}${CMAKE_STATIC_LIBRARY_PREFIX}llama${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_llama_bin}/ggml/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_llama_bin}/ggml/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml-cpu${CMAKE_STATIC_LIBRARY_SUFFIX}"
  "${_wc_llama_bin}/ggml/src/${CMAKE_STATIC_LIBRARY_PREFIX}ggml-base${CMAKE_STATIC_LIBRARY_SUFFIX}")
# Static executables (cross builds): no static libgomp in the cross compilers, so ggml's threadpool.
if(WEIGHTCACHE_STATIC_EXECUTABLES)
  set(_wc_llama_openmp OFF)
else()
  set(_wc_llama_openmp ON)
endif()
set(_wc_llama_args
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DBUILD_SHARED_LIBS=OFF
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DGGML_NATIVE=ON
  -DGGML_CPU_REPACK=ON
  -DGGML_OPENMP=${_wc_llama_openmp}
  -DGGML_BUILD_TESTS=OFF
  -DGGML_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_COMMON=OFF
  -DLLAMA_CURL=OFF)
weightcache_ggml_cpu_settings(_wc_llama_args "${WEIGHTCACHE_LLAMA_KLEIDIAI_SOURCE_DIR}")
weightcache_external_build_settings(_wc_llama_args _wc_llama_jobs)

ExternalProject_Add(weightcache_llama_build
  PREFIX "${_wc_llama_bin}-steps"
  SOURCE_DIR "${_wc_llama_cmake_dir}"
  BINARY_DIR "${_wc_llama_bin}"
  CMAKE_ARGS ${_wc_llama_args}
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target llama ggml ggml-cpu --parallel ${_wc_llama_jobs}
  BUILD_ALWAYS ON
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${_wc_llama_libs}
  LOG_CONFIGURE ON
  LOG_BUILD ON
  LOG_OUTPUT_ON_FAILURE ON
  EXCLUDE_FROM_ALL ON)

add_library(weightcache_llama_dep INTERFACE)
add_dependencies(weightcache_llama_dep weightcache_llama_build)
target_include_directories(weightcache_llama_dep SYSTEM INTERFACE "${_wc_llama_src}/include"
  "${_wc_llama_src}/ggml/include" "${_wc_llama_src}/ggml/src")
target_link_libraries(weightcache_llama_dep INTERFACE
  "-Wl,--start-group" ${_wc_llama_libs} "-Wl,--end-group" Threads::Threads m ${CMAKE_DL_LIBS})
if(_wc_llama_openmp)
  find_package(OpenMP REQUIRED COMPONENTS C CXX)
  target_link_libraries(weightcache_llama_dep INTERFACE OpenMP::OpenMP_CXX OpenMP::OpenMP_C)
endif()
add_library(weightcache::llama ALIAS weightcache_llama_dep)
message(STATUS "weightcache: llama.cpp (ggml ${WEIGHTCACHE_LLAMA_GGML_VERSION}) from ${_wc_llama_src} for the "
               "llama.cpp front, its tests, benchmarks and examples; built in ${_wc_llama_bin}")
