# The integrations (src/integrations: XNNPACK, ONNX Runtime, ggml, llama.cpp) are examples a
# runtime author can copy, so they are built on the public API only: a quoted include must name
# a file of the integrations' own tree, and an angle-bracket include must not name one of the
# library's internal headers (a file under src/).
#
#   cmake -DROOT=<src/integrations> -DINTERNAL=<src> -P public_includes.cmake
#   cmake -DSELF_TEST=ON -DWORK=<scratch dir> -P public_includes.cmake
#
# The second form checks that the check fails: it writes an integration with one internal include
# of each kind and expects exactly those two to be reported.
cmake_minimum_required(VERSION 3.20)

function(check_includes root internal out_problems)
  file(GLOB_RECURSE files LIST_DIRECTORIES false "${root}/*.c" "${root}/*.cc" "${root}/*.cpp" "${root}/*.h"
       "${root}/*.hpp" "${root}/*.inc")
  set(problems "")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include")
    get_filename_component(dir "${f}" DIRECTORY)
    file(RELATIVE_PATH shown "${root}" "${f}")
    foreach(line IN LISTS lines)
      if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        get_filename_component(target "${dir}/${CMAKE_MATCH_1}" ABSOLUTE)
        file(RELATIVE_PATH rel "${root}" "${target}")
        if(rel MATCHES "^\\.\\." OR IS_ABSOLUTE "${rel}" OR NOT EXISTS "${target}")
          list(APPEND problems "${shown}: ${line} (not a file of the integrations' own tree)")
        endif()
      elseif(line MATCHES "#[ \t]*include[ \t]*<([^>]+)>")
        if(EXISTS "${internal}/${CMAKE_MATCH_1}")
          list(APPEND problems "${shown}: ${line} (an internal header of the library)")
        endif()
      endif()
    endforeach()
  endforeach()
  set(${out_problems} "${problems}" PARENT_SCOPE)
endfunction()

if(SELF_TEST)
  file(REMOVE_RECURSE "${WORK}")
  file(WRITE "${WORK}/src/core.hpp" "#pragma once\n")
  file(WRITE "${WORK}/src/integrations/own/own.hpp" "#pragma once\n")
  file(WRITE "${WORK}/src/integrations/own/adapter.cpp"
       "#include <weightcache/weightcache.h>\n#include <vector>\n#include \"own.hpp\"\n#include \"../own/own.hpp\"\n"
       "#include \"../../core.hpp\"\n  #  include <core.hpp>\n")
  check_includes("${WORK}/src/integrations" "${WORK}/src" problems)
  list(LENGTH problems n)
  if(NOT n EQUAL 2 OR NOT problems MATCHES "\\.\\./\\.\\./core\\.hpp" OR NOT problems MATCHES "<core\\.hpp>")
    message(FATAL_ERROR "the check reported ${n} problems, not the 2 internal includes:\n${problems}")
  endif()
  message(STATUS "the check finds both kinds of internal include")
  return()
endif()

check_includes("${ROOT}" "${INTERNAL}" problems)
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "integrations must use the public headers only (include/weightcache/), as a runtime "
                      "author's code would; extend the public API instead (docs/INTEGRATION.md):\n  ${text}")
endif()
message(STATUS "every integration includes public headers only")
