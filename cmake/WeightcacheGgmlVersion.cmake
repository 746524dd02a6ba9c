# weightcache_ggml_version(<ggml tree> <out var>): the tree's version, from its CMakeLists.txt
# (GGML_VERSION_MAJOR/MINOR/PATCH); a configure error when it cannot be read.
function(weightcache_ggml_version dir out)
  file(STRINGS "${dir}/CMakeLists.txt" _lines REGEX "^set\\(GGML_VERSION_(MAJOR|MINOR|PATCH) [0-9]+\\)")
  set(_version "")
  foreach(_part MAJOR MINOR PATCH)
    foreach(_line IN LISTS _lines)
      if(_line MATCHES "GGML_VERSION_${_part} ([0-9]+)")
        string(APPEND _version "${CMAKE_MATCH_1}.")
      endif()
    endforeach()
  endforeach()
  string(REGEX REPLACE "\\.$" "" _version "${_version}")
  if(NOT _version MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
    message(FATAL_ERROR "weightcache: cannot read ggml's version from ${dir}/CMakeLists.txt")
  endif()
  set(${out} "${_version}" PARENT_SCOPE)
endfunction()

# _weightcache_files_id(<out var> <dir> <files>...): a 16-hex-digit fingerprint of the files' paths
# (relative to dir) and contents; an edit to one of them configures the build again.
function(_weightcache_files_id out dir)
  set(_files ${ARGN})
  list(SORT _files)
  set(_all "")
  foreach(_f IN LISTS _files)
    file(SHA256 "${_f}" _h)
    file(RELATIVE_PATH _rel "${dir}" "${_f}")
    string(APPEND _all "${_rel}:${_h};")
  endforeach()
  set_property(DIRECTORY "${CMAKE_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_files})
  string(SHA256 _id "${_all}")
  string(SUBSTRING "${_id}" 0 16 _id)
  set(${out} "${_id}" PARENT_SCOPE)
endfunction()

# weightcache_ggml_repack_id(<ggml tree> <out var>): a fingerprint of the code that decides and
# writes ggml's repacked layouts (src/ggml-cpu/repack.*, arch/*/repack.cpp, ggml-common.h), part of
# the ggml buffer type's cache keys. ggml's own build commit is no such thing: a tree without git
# says "unknown", and a tree unpacked inside another repository gets that repository's commit.
function(weightcache_ggml_repack_id dir out)
  file(GLOB _files "${dir}/src/ggml-cpu/repack.*" "${dir}/src/ggml-cpu/arch/*/repack.cpp" "${dir}/src/ggml-common.h")
  if(NOT _files)
    message(FATAL_ERROR "weightcache: ${dir} has no src/ggml-cpu/repack.cpp: not a ggml with CPU repacking")
  endif()
  _weightcache_files_id(_id "${dir}" ${_files})
  set(${out} "${_id}" PARENT_SCOPE)
endfunction()

# weightcache_ggml_amx_id(<ggml tree> <out var>): the same fingerprint for the code that writes the
# AMX buffer type's tile layout (src/ggml-cpu/amx/*, ggml-common.h); "none" for a tree without it.
function(weightcache_ggml_amx_id dir out)
  file(GLOB _files "${dir}/src/ggml-cpu/amx/*")
  if(NOT _files)
    set(${out} "none" PARENT_SCOPE)
    return()
  endif()
  _weightcache_files_id(_id "${dir}" ${_files} "${dir}/src/ggml-common.h")
  set(${out} "${_id}" PARENT_SCOPE)
endfunction()

# weightcache_ggml_kleidiai_id(<ggml tree> <KleidiAI tree or ""> <out var>): the same fingerprint for
# the code that writes the KleidiAI buffer type's packed layout (src/ggml-cpu/kleidiai/*,
# ggml-common.h, and src/ggml-cpu/CMakeLists.txt, which pins the KleidiAI release ggml builds), and
# the KleidiAI tree's own CMakeLists.txt (its version) when one is given; "none" for a tree without it.
function(weightcache_ggml_kleidiai_id dir kleidiai out)
  file(GLOB _files "${dir}/src/ggml-cpu/kleidiai/*")
  if(NOT _files)
    set(${out} "none" PARENT_SCOPE)
    return()
  endif()
  list(APPEND _files "${dir}/src/ggml-common.h" "${dir}/src/ggml-cpu/CMakeLists.txt")
  if(kleidiai AND EXISTS "${kleidiai}/CMakeLists.txt")
    # Hashed by content under a fixed name: the path of the unpacked tree must not change the key.
    file(SHA256 "${kleidiai}/CMakeLists.txt" _kai)
    set_property(DIRECTORY "${CMAKE_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${kleidiai}/CMakeLists.txt")
  else()
    set(_kai "pinned")
  endif()
  _weightcache_files_id(_id "${dir}" ${_files})
  string(SHA256 _id "${_id}|kleidiai ${_kai}")
  string(SUBSTRING "${_id}" 0 16 _id)
  set(${out} "${_id}" PARENT_SCOPE)
endfunction()

# weightcache_ggml_cpu_settings(<args var> <KleidiAI tree or "">): the CPU a third-party ggml build
# (ggml, llama.cpp) targets. Natively: GGML_NATIVE, the build machine's CPU. Cross-compiling
# (cmake/toolchains): this build's toolchain file, no GGML_NATIVE, and for aarch64 the
# architecture WEIGHTCACHE_GGML_CPU_ARM_ARCH names (default armv8.6-a with the dot-product and
# i8mm extensions, which qemu's -cpu max has). With a KleidiAI tree (WEIGHTCACHE_KLEIDIAI_SOURCE_DIR,
# aarch64 only): GGML_CPU_KLEIDIAI, built from that tree instead of ggml's download.
function(weightcache_ggml_cpu_settings args_var kleidiai)
  set(_args ${${args_var}})
  if(CMAKE_CROSSCOMPILING)
    list(REMOVE_ITEM _args -DGGML_NATIVE=ON)
    list(APPEND _args -DGGML_NATIVE=OFF)
    if(CMAKE_TOOLCHAIN_FILE)
      list(APPEND _args -DCMAKE_TOOLCHAIN_FILE=${CMAKE_TOOLCHAIN_FILE})
    endif()
    if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
      list(APPEND _args -DGGML_CPU_ARM_ARCH=${WEIGHTCACHE_GGML_CPU_ARM_ARCH})
    endif()
  endif()
  if(kleidiai)
    if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
      message(FATAL_ERROR "weightcache: WEIGHTCACHE_KLEIDIAI_SOURCE_DIR is for arm64 builds (KleidiAI's kernels are Arm's)")
    endif()
    list(APPEND _args -DGGML_CPU_KLEIDIAI=ON -DFETCHCONTENT_SOURCE_DIR_KLEIDIAI_DOWNLOAD=${kleidiai})
  endif()
  set(${args_var} "${_args}" PARENT_SCOPE)
endfunction()

# weightcache_external_build_settings(<args var> <jobs var>): what an ExternalProject build of a
# third-party tree (ggml, llama.cpp) takes from this build: the compiler launchers (ccache) appended
# to <args var>, and the parallel jobs (WEIGHTCACHE_XNNPACK_BUILD_JOBS, else every core) in <jobs var>.
function(weightcache_external_build_settings args_var jobs_var)
  set(_args ${${args_var}})
  foreach(_lang C CXX)
    if(CMAKE_${_lang}_COMPILER_LAUNCHER)
      list(APPEND _args -DCMAKE_${_lang}_COMPILER_LAUNCHER=${CMAKE_${_lang}_COMPILER_LAUNCHER})
    endif()
  endforeach()
  if(DEFINED WEIGHTCACHE_XNNPACK_BUILD_JOBS)
    set(_jobs ${WEIGHTCACHE_XNNPACK_BUILD_JOBS})
  else()
    cmake_host_system_information(RESULT _jobs QUERY NUMBER_OF_LOGICAL_CORES)
  endif()
  set(${args_var} "${_args}" PARENT_SCOPE)
  set(${jobs_var} "${_jobs}" PARENT_SCOPE)
endfunction()
