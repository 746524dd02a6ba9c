// What memory a runtime hands over: is [p, p + n) a shared mapping of a named file (so that the
// file's identity may stand for the bytes), memory the process owns, or memory that may change
// under the load? The ggml buffer type asks this of every tensor's source bytes (Linux only).
//
// The answer must hold *now*, not when some earlier look at the address space was taken: another
// GGUF, or the same one privately or at another offset, may since have been mapped where the first
// one was. Two ways to ask, in order:
// - the PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11 and later): the kernel looks up the
//   mapping at that address under the address-space lock and gives its bounds, flags, file
//   offset, device, inode and path. No privilege is needed;
// - else (older kernels; qemu-user, which does not emulate the ioctl but emulates the file for
//   the guest) a read of /proc/self/maps made for this question: each of its lines is produced
//   under the address-space lock.
// (/proc/self/map_files, used before, needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE and names only
// the file, not the offset or whether the mapping is shared.)
// A range the answer cannot vouch for is `changeable`: the caller works from a private copy.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::source {

/// One line of /proc/self/maps.
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::uint64_t offset = 0;
  dev_t dev = 0;
  ino_t ino = 0;  // 0: anonymous memory
  bool shared = false, writable = false;
  std::string path;  // the file's path, or the kernel's name for the mapping ("[heap]", "/memfd:x (deleted)")
  /// A mapping of a file a path names now ("/..." and not deleted).
  bool named_file() const;
};

/// The process's mappings, as /proc/self/maps lists them now (anonymous ones too when `all`);
/// `ok` says whether it could be read.
std::vector<Mapping> read_maps(bool all = false, bool* ok = nullptr);

/// How MappingProbe asks. `automatic` is the product's; tests force the others to cover kernels
/// and privileges the machine running them does not have.
enum class MappingCheck { automatic, procmap_query, maps_read };

class MappingProbe {
 public:
  enum class Kind {
    file,        // inside one shared mapping of a named file, checked now (*out says which)
    own,         // anonymous private memory: the process's own, for the caller to keep still
    changeable,  // anything else: a private or unnamed file mapping, a range over several, unknown
  };

  explicit MappingProbe(MappingCheck how = MappingCheck::automatic) : how_(how) {}

  /// What holds [p, p + n) now. Not thread-safe (one probe per caller, or a lock around it).
  Kind find(const void* p, std::size_t n, Mapping* out);

  /// The way the last find was answered (for tests): procmap_query or maps_read.
  MappingCheck answered_by() const { return answered_by_; }

 private:
  enum class Answer { file, own, changeable, unknown };  // unknown: ask another way
  Answer by_query(std::uintptr_t a, std::size_t n, Mapping* out);
  Answer query(int fd, std::uintptr_t a, std::size_t n, Mapping* out);
  Answer by_maps(std::uintptr_t a, std::size_t n, Mapping* out);
  static Answer classify(const std::vector<Mapping>& maps, std::uintptr_t a, std::size_t n, std::size_t* first);

  MappingCheck how_;
  MappingCheck answered_by_ = MappingCheck::automatic;
  bool query_unsupported_ = false;
};

}  // namespace weightcache::source
