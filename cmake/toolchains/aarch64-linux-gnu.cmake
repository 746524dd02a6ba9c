# Cross-build for 64-bit ARM Linux with Debian's g++-aarch64-linux-gnu; the tests run under
# qemu-user (scripts/test-arch arm64 does all of this, three times: with 4, 16 and 64 KiB pages).
#   cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
# qemu-aarch64 runs the test executables and GoogleTest's test discovery. Binfmt_misc may not be
# set up (a container, a sandbox), so it is named explicitly; the tests' helper processes are
# started through it too (tests/support/spawn.hpp). The page size the guest sees comes from
# QEMU_PAGESIZE in the environment (qemu's -p): sysconf(_SC_PAGESIZE) returns it, and qemu
# refuses file mappings at offsets that are not multiples of it.
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(_wc_triplet aarch64-linux-gnu)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross.cmake)

find_program(WEIGHTCACHE_QEMU NAMES qemu-aarch64 qemu-aarch64-static)
if(WEIGHTCACHE_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${WEIGHTCACHE_QEMU})
endif()
