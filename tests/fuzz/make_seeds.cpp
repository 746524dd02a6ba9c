// Seed-corpus generator: writes valid cache files, made through the public API, as inputs for
// the fuzz targets.
//
//   make_seeds <out-dir>    creates <out-dir>/open/ and <out-dir>/decode/
//
// open/:   one configuration byte (fuzz_common.hpp) + a whole file, for several layouts (empty,
//          one entry, one and several commits, various alignments, a grown tail) and several
//          configurations (strict, re-sealed, read-only, verify on open, with a write).
// decode/: alignment byte + flags byte + either the 4096-byte header or the newest index block
//          with its footer.
#include "fuzz_common.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <stdlib.h>

namespace {

using namespace weightcache;
namespace fs = std::filesystem;

using Bytes = std::vector<std::byte>;

struct Layout {
  std::string name;
  std::size_t alignment = 64;
  std::size_t size_alignment = 1;
  std::vector<std::vector<std::size_t>> commits;  // key indexes inserted before each finalize
  std::size_t grown_tail = 0;                     // zero bytes appended past the footer
};

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes b(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) b[i] = static_cast<std::byte>(raw[i]);
  return b;
}

void write_seed(const fs::path& path, std::initializer_list<std::uint8_t> prefix, const std::byte* data,
                std::size_t size) {
  std::ofstream out(path, std::ios::binary);
  for (std::uint8_t c : prefix) out.put(static_cast<char>(c));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(EXIT_FAILURE);
  }
}

Bytes build(const Layout& l, const fs::path& dir) {
  const std::string path = (dir / (l.name + ".wc")).string();
  Options o;
  o.path = path;
  o.compat_key = fuzz::kCompatKey;
  o.alignment = l.alignment;
  o.size_alignment = l.size_alignment;
  o.backing = Backing::file;
  o.durability = Durability::none;
  if (l.commits.empty()) {
    auto c = WeightCache::open(o);  // creates the fresh file and nothing else
    if (!c) {
      std::fprintf(stderr, "make_seeds: %s\n", c.error().message.c_str());
      std::exit(EXIT_FAILURE);
    }
  }
  for (const auto& commit : l.commits) {
    auto c = WeightCache::open(o);
    if (!c) {
      std::fprintf(stderr, "make_seeds: %s\n", c.error().message.c_str());
      std::exit(EXIT_FAILURE);
    }
    for (std::size_t i : commit)
      if (c->insert(fuzz::key(i), fuzz::bytes(i)) == kNotFound) {
        std::fprintf(stderr, "make_seeds: insert failed\n");
        std::exit(EXIT_FAILURE);
      }
    if (auto r = c->finalize(); !r) {
      std::fprintf(stderr, "make_seeds: finalize: %s\n", r.error().message.c_str());
      std::exit(EXIT_FAILURE);
    }
  }
  Bytes b = read_all(path);
  b.resize(b.size() + l.grown_tail, std::byte{0});
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out-dir>\n", argv[0]);
    return 2;
  }
  set_log_level(LogLevel::error);
  const fs::path out = argv[1];
  fs::create_directories(out / "open");
  fs::create_directories(out / "decode");

  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/wc-seeds-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("make_seeds: mkdtemp");
    return 1;
  }
  const fs::path work = pattern;

  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < fuzz::kKeyCount; ++i) all.push_back(i);
  const std::vector<Layout> layouts = {
      {"empty", 64, 1, {}, 0},
      {"one-entry", 64, 1, {{3}}, 0},
      {"zero-size-entry", 64, 1, {{0, 1}}, 0},
      {"all-one-commit", 64, 1, {all}, 0},
      {"two-commits", 64, 1, {{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}, 0},
      {"three-commits", 16, 1, {{2, 4}, {5}, {9, 11}}, 0},
      {"align-1", 1, 1, {{1, 2, 3, 8, 10}}, 0},
      {"align-4096", 4096, 1, {{3, 5}}, 0},
      {"size-align-8", 32, 8, {{1, 2, 7, 8}}, 0},
      {"grown-tail", 64, 1, {{4, 6}}, 8192},
  };
  const std::uint8_t configs[] = {
      0,
      fuzz::kReseal,
      fuzz::kReadOnly,
      static_cast<std::uint8_t>(1u << fuzz::kVerifyShift),  // on_open
      fuzz::kWrite,
      static_cast<std::uint8_t>(fuzz::kReseal | fuzz::kWrite | fuzz::kSmallSpan),
  };
  std::size_t n_open = 0, n_decode = 0;
  for (const auto& l : layouts) {
    const Bytes file = build(l, work);
    for (std::uint8_t c : configs) {
      char name[96];
      std::snprintf(name, sizeof name, "%s-c%02x", l.name.c_str(), c);
      write_seed(out / "open" / name, {c}, file.data(), file.size());
      ++n_open;
    }
    format::DecodedHeader h;
    if (format::decode_header(file, &h) != format::Problem::none) {
      std::fprintf(stderr, "make_seeds: built an invalid header for %s\n", l.name.c_str());
      return 1;
    }
    unsigned shift = 0;
    while ((std::uint64_t{1} << shift) < l.alignment) ++shift;
    write_seed(out / "decode" / (l.name + "-header"), {static_cast<std::uint8_t>(shift), 0}, file.data(),
               format::kHeaderSize);
    ++n_decode;
    for (int i = 0; i < 2; ++i) {
      if (!h.slot_valid[i]) continue;
      const auto& s = h.slot[i];
      const std::size_t len = s.index_size + format::kFooterSize;
      for (std::uint8_t flags : {0, 1, 2, 3}) {
        write_seed(out / "decode" / (l.name + "-trailer" + std::to_string(i) + "-f" + std::to_string(flags)),
                   {static_cast<std::uint8_t>(shift), flags}, file.data() + s.index_offset, len);
        ++n_decode;
      }
    }
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  std::printf("make_seeds: %zu open seeds, %zu decode seeds in %s\n", n_open, n_decode, out.c_str());
  return 0;
}
