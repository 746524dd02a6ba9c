# A WEIGHTCACHE_MOBILE build installed into a fresh prefix: the headers of what it has (the spdlog
# route included: header-only, compiled by the app that uses spdlog, nothing of it in the library),
# and nothing of the inspection library it leaves out (inspect.hpp, its pkg-config file, its CMake
# target), whose calls would not link. Needs the libraries built (the suite's tests run after the build).
#   cmake -DBUILD_DIR=... -DPREFIX=... -P install_test.cmake
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install of the mobile build failed (${rc}): ${err}")
endif()
foreach(h weightcache.h weight_cache.hpp spdlog.hpp)
  if(NOT EXISTS "${PREFIX}/include/weightcache/${h}")
    message(FATAL_ERROR "the mobile install has no weightcache/${h}")
  endif()
endforeach()
file(GLOB_RECURSE inspect_files RELATIVE "${PREFIX}" "${PREFIX}/*inspect*")
if(inspect_files)
  message(FATAL_ERROR "the mobile install has the inspection library's files, which it cannot link: ${inspect_files}")
endif()
file(GLOB_RECURSE targets "${PREFIX}/*/weightcacheTargets*.cmake")
foreach(f ${targets})
  file(STRINGS "${f}" lines REGEX "weightcache_inspect")
  if(lines)
    message(FATAL_ERROR "${f} names the inspection library: ${lines}")
  endif()
endforeach()
file(REMOVE_RECURSE "${PREFIX}")
