// libFuzzer target: the input (after one configuration byte, see fuzz_common.hpp) becomes a cache
// file, which is opened through the public API; every seed key is looked up and every byte a
// hit returns is read. Optionally an entry is inserted and finalized on top of what was loaded.
//
// Beyond the sanitizers, two oracles. Unless the input asked for its checksums to be re-sealed
// (which lets it forge a valid index naming any bytes) or for Verify::none, a key may only ever
// be served with the bytes the seed files store under it: breaking that without an XXH3
// collision is a library bug. And an entry written to the file by a finalize that reported
// success is served by the next open.
#include "fuzz_common.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace {

using namespace weightcache;

std::string g_dir;
std::string g_path;

void remove_dir() {
  std::error_code ec;
  if (!g_dir.empty()) std::filesystem::remove_all(g_dir, ec);
}

void write_input(const std::vector<std::byte>& bytes) {
  // Truncate in place: a rebuild by the previous run may have renamed a new file over the path,
  // which is fine; either way the path ends up holding exactly these bytes.
  const int fd = ::open(g_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("fuzz_open: cannot write the input file");
    std::abort();
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::perror("fuzz_open: short write");
      std::abort();
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

[[noreturn]] void wrong_bytes(const std::string& key, const char* what) {
  std::fprintf(stderr, "fuzz_open: key '%s' %s\n", key.c_str(), what);
  std::abort();
}

volatile unsigned char g_sink;

void touch(const void* p, std::size_t n) {
  // Read every byte a hit hands out: a mapping past EOF or a bad address shows up here.
  unsigned char acc = 0;
  for (std::size_t i = 0; i < n; ++i) acc ^= static_cast<const unsigned char*>(p)[i];
  g_sink = acc;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::off);
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/wc-fuzz-open-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("fuzz_open: mkdtemp");
    std::abort();
  }
  g_dir = pattern;
  g_path = g_dir + "/cache.wc";
  std::atexit(remove_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t config = data[0];
  std::vector<std::byte> file(size - 1);
  if (size > 1) std::memcpy(file.data(), data + 1, size - 1);
  if (config & fuzz::kReseal) fuzz::reseal(file);
  write_input(file);

  Options o;
  o.path = g_path;
  o.compat_key = fuzz::kCompatKey;
  // Open the way the writer of the file did: with the alignment its header states (any file
  // alignment is a multiple of 1, the fallback for headers that state nonsense).
  o.alignment = 1;
  if (file.size() >= format::kHeaderSize) {
    const std::uint64_t a = format::get_u64(&file[24]);
    if (a != 0 && (a & (a - 1)) == 0 && a <= kMaxAlignment) o.alignment = static_cast<std::size_t>(a);
  }
  o.durability = Durability::none;
  o.read_only = (config & fuzz::kReadOnly) != 0;
  o.verify = fuzz::verify_of(config);
  if (config & fuzz::kSmallSpan) o.max_file_bytes = std::uint64_t{1} << 20;
  const bool strict = !(config & fuzz::kReseal) && o.verify != Verify::none;

  auto cache = WeightCache::open(o);
  if (!cache) return 0;  // automatic backing: only allocation failures get here
  for (std::size_t i = 0; i < fuzz::kKeyCount; ++i) {
    const std::string k = fuzz::key(i);
    const std::size_t off = cache->look_up(k);
    if (off == kNotFound) continue;
    const void* p = cache->offset_to_addr(off);
    if (p == nullptr) wrong_bytes(k, "was served at an offset that maps to nothing");
    touch(p, fuzz::kSizes[i]);
    if (strict) {
      const std::string want = fuzz::bytes(i);
      if (std::memcmp(p, want.data(), want.size()) != 0) wrong_bytes(k, "was served with other bytes");
    }
  }
  if (cache->look_up("absent") != kNotFound && strict) wrong_bytes("absent", "was found");
  (void)cache->stats();

  if (config & fuzz::kWrite) {
    const std::string k = "fuzz-insert";
    const std::string v(300, 'q');
    const std::size_t off = cache->insert(k, v);
    const bool committed = cache->finalize().ok();
    if (off != kNotFound) {
      const void* p = cache->offset_to_addr(cache->look_up(k));
      if (p == nullptr || std::memcmp(p, v.data(), v.size()) != 0) wrong_bytes(k, "lost its bytes after insert");
    }
    (void)cache->refresh();
    // A finalize that reported success for an entry placed in the file must be visible to the
    // next open, whatever the file looked like before.
    const Stats st = cache->stats();
    const bool in_file = st.backing == Backing::file && st.heap_bytes == 0 && !o.read_only;
    cache = WeightCache();
    if (off != kNotFound && committed && in_file) {
      auto again = WeightCache::open(o);
      if (!again) wrong_bytes(k, ": the reopen after a successful finalize failed");
      const std::size_t at = again->look_up(k);
      if (at == kNotFound) wrong_bytes(k, "was lost by a finalize that reported success");
      const void* p = again->offset_to_addr(at);
      if (p == nullptr || std::memcmp(p, v.data(), v.size()) != 0) wrong_bytes(k, "came back with other bytes");
    }
  }
  return 0;
}
