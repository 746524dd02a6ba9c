# ONNX Runtime for the ONNX Runtime execution provider, its tests, benchmarks and the demo.
#
# Inputs (cache variables; scripts/ort-args prints them):
#   ONNXRUNTIME_ROOT               an official release (include/ and lib/); wins over the two below
#   WEIGHTCACHE_ORT_INCLUDE_DIR    a directory holding onnxruntime_c_api.h and onnxruntime_ep_c_api.h
#   WEIGHTCACHE_ORT_LIBRARY        the runtime: libonnxruntime.so[.1] (onnxruntime.dll's import
#                                  library on Windows)
# Outputs:
#   weightcache_ort_headers        INTERFACE target: the C API and plugin-EP API headers (SYSTEM)
#   WEIGHTCACHE_ORT_HEADERS_FOUND  TRUE when it exists; WEIGHTCACHE_ORT_API_VERSION their ORT_API_VERSION
#   weightcache::onnxruntime       IMPORTED target: the runtime shared library, with the headers
#   WEIGHTCACHE_ORT_RUNTIME_FOUND  TRUE when it exists
#
# The execution provider builds against the headers only and never links the runtime: ONNX
# Runtime loads the provider (RegisterExecutionProviderLibrary) and hands it its API table, so
# the provider must work with whichever libonnxruntime the application brought. Only the programs
# that play the application (test hosts, benchmarks, the demo) link weightcache::onnxruntime.
include_guard(GLOBAL)

set(ONNXRUNTIME_ROOT "" CACHE PATH "An ONNX Runtime release (include/, lib/) for the ONNX Runtime EP, its tests and benchmarks")
set(WEIGHTCACHE_ORT_INCLUDE_DIR "" CACHE PATH "Directory with onnxruntime_c_api.h and onnxruntime_ep_c_api.h (ignored when ONNXRUNTIME_ROOT is set)")
set(WEIGHTCACHE_ORT_LIBRARY "" CACHE FILEPATH "The ONNX Runtime shared library for tests, benchmarks and the demo (ignored when ONNXRUNTIME_ROOT is set)")

set(WEIGHTCACHE_ORT_HEADERS_FOUND FALSE)
set(WEIGHTCACHE_ORT_RUNTIME_FOUND FALSE)
set(WEIGHTCACHE_ORT_API_VERSION "")

# Where the headers and the library are: from the release when one is named, else the two paths.
set(_wc_ort_include "")
set(_wc_ort_library "")
set(_wc_ort_from "")
if(ONNXRUNTIME_ROOT)
  get_filename_component(_wc_ort_root "${ONNXRUNTIME_ROOT}" ABSOLUTE)
  # A release has the headers straight in include/; a source tree or a package built from one
  # keeps them under include/onnxruntime/core/session.
  foreach(_dir "${_wc_ort_root}/include" "${_wc_ort_root}/include/onnxruntime/core/session"
               "${_wc_ort_root}/include/onnxruntime")
    if(EXISTS "${_dir}/onnxruntime_c_api.h")
      set(_wc_ort_include "${_dir}")
      break()
    endif()
  endforeach()
  # The unversioned name first (a release's symlink); else the soname file, else any version.
  if(WIN32)
    set(_wc_ort_candidates "${_wc_ort_root}/lib/onnxruntime.lib")
  else()
    file(GLOB _wc_ort_versioned "${_wc_ort_root}/lib/libonnxruntime.so.*")
    set(_wc_ort_candidates "${_wc_ort_root}/lib/libonnxruntime.so" "${_wc_ort_root}/lib/libonnxruntime.so.1"
      ${_wc_ort_versioned} "${_wc_ort_root}/lib/libonnxruntime.dylib")
  endif()
  foreach(_lib ${_wc_ort_candidates})
    if(EXISTS "${_lib}")
      set(_wc_ort_library "${_lib}")
      break()
    endif()
  endforeach()
  set(_wc_ort_from " in ONNXRUNTIME_ROOT=${_wc_ort_root}")
else()
  if(WEIGHTCACHE_ORT_INCLUDE_DIR)
    get_filename_component(_wc_ort_include "${WEIGHTCACHE_ORT_INCLUDE_DIR}" ABSOLUTE)
  endif()
  if(WEIGHTCACHE_ORT_LIBRARY AND EXISTS "${WEIGHTCACHE_ORT_LIBRARY}")
    get_filename_component(_wc_ort_library "${WEIGHTCACHE_ORT_LIBRARY}" ABSOLUTE)
  endif()
endif()

# The headers: both are needed (the plugin EP API is the second), or neither counts.
if(_wc_ort_include AND EXISTS "${_wc_ort_include}/onnxruntime_c_api.h" AND EXISTS "${_wc_ort_include}/onnxruntime_ep_c_api.h")
  file(STRINGS "${_wc_ort_include}/onnxruntime_c_api.h" _wc_ort_api_line REGEX "^#define ORT_API_VERSION [0-9]+")
  string(REGEX REPLACE "^#define ORT_API_VERSION ([0-9]+).*" "\\1" WEIGHTCACHE_ORT_API_VERSION "${_wc_ort_api_line}")
  if(NOT TARGET weightcache_ort_headers)
    add_library(weightcache_ort_headers INTERFACE)
    # SYSTEM: ONNX Runtime's headers are not held to this project's warnings.
    target_include_directories(weightcache_ort_headers SYSTEM INTERFACE "${_wc_ort_include}")
  endif()
  set(WEIGHTCACHE_ORT_HEADERS_FOUND TRUE)
elseif(_wc_ort_include)
  message(STATUS "weightcache: ${_wc_ort_include} lacks onnxruntime_c_api.h or onnxruntime_ep_c_api.h "
                 "(the plugin EP API came with ONNX Runtime 1.22): no ONNX Runtime headers")
endif()

# The runtime, only with the headers it is used through.
if(WEIGHTCACHE_ORT_HEADERS_FOUND AND _wc_ort_library)
  if(NOT TARGET weightcache::onnxruntime)
    add_library(weightcache::onnxruntime SHARED IMPORTED GLOBAL)
    if(WIN32)
      # The import library is linked; the DLL beside it (or in bin/) is what runs.
      get_filename_component(_wc_ort_libdir "${_wc_ort_library}" DIRECTORY)
      set_target_properties(weightcache::onnxruntime PROPERTIES IMPORTED_IMPLIB "${_wc_ort_library}")
      foreach(_dll "${_wc_ort_libdir}/onnxruntime.dll" "${_wc_ort_libdir}/../bin/onnxruntime.dll")
        if(EXISTS "${_dll}")
          set_target_properties(weightcache::onnxruntime PROPERTIES IMPORTED_LOCATION "${_dll}")
          break()
        endif()
      endforeach()
    else()
      # Linked by its full path; the build tree's RPATH then holds its directory, so the test
      # hosts run without LD_LIBRARY_PATH. The npm build's file is libonnxruntime.so.1 (its soname).
      set_target_properties(weightcache::onnxruntime PROPERTIES IMPORTED_LOCATION "${_wc_ort_library}")
    endif()
    set_target_properties(weightcache::onnxruntime PROPERTIES INTERFACE_LINK_LIBRARIES weightcache_ort_headers)
  endif()
  set(WEIGHTCACHE_ORT_RUNTIME_FOUND TRUE)
endif()

if(WEIGHTCACHE_ORT_RUNTIME_FOUND)
  message(STATUS "weightcache: ONNX Runtime headers ORT_API_VERSION ${WEIGHTCACHE_ORT_API_VERSION} (${_wc_ort_include}), "
                 "runtime ${_wc_ort_library}")
elseif(WEIGHTCACHE_ORT_HEADERS_FOUND)
  message(STATUS "weightcache: ONNX Runtime headers ORT_API_VERSION ${WEIGHTCACHE_ORT_API_VERSION} (${_wc_ort_include}), "
                 "no runtime: the EP builds, its tests and benchmarks do not (set ONNXRUNTIME_ROOT or pass $(scripts/ort-args))")
else()
  message(STATUS "weightcache: no ONNX Runtime${_wc_ort_from}: the ONNX Runtime EP, its tests and benchmarks are skipped "
                 "(pass -DONNXRUNTIME_ROOT=<release> or $(scripts/ort-args))")
endif()
