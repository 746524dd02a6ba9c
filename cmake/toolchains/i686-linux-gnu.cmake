# Build for 32-bit x86 Linux with Debian's g++-i686-linux-gnu (gcc-multilib's -m32 would do too,
# but Debian's multilib packages conflict with every cross compiler, the aarch64 one included).
# An x86-64 kernel runs the (static) test executables natively: scripts/test-arch i386.
#   cmake -S . -B build/i386 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/i686-linux-gnu.cmake
set(CMAKE_SYSTEM_PROCESSOR i686)
set(_wc_triplet i686-linux-gnu)
include(${CMAKE_CURRENT_LIST_DIR}/linux-cross.cmake)
