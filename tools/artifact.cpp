#include "artifact.hpp"

#include "oci_layout.hpp"
#include "output.hpp"
#include "pending_file.hpp"
#include "sha256.hpp"
#include "tar.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weightcache.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc, _GNU_SOURCE)
#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::cli {
namespace {

namespace fs = std::filesystem;
using oci::Descriptor;
using oci::Failure;
using oci::Json;
using oci::Outcome;
// What the tool prints: fields in the order docs/CLI.md shows (the documents themselves are
// oci::Json, with sorted keys).
using Report = nlohmann::ordered_json;

constexpr const char* kCompatHashAnnotation = "org.weightcache.compat-key.xxh3";
constexpr const char* kCompatKeyAnnotation = "org.weightcache.compat-key";
constexpr const char* kRuntimeAnnotation = "org.weightcache.runtime";
constexpr const char* kCpuProfileAnnotation = "org.weightcache.cpu-profile";
constexpr const char* kModelShaAnnotation = "org.weightcache.model.sha256";
constexpr const char* kModelNameAnnotation = "org.weightcache.model.name";
constexpr const char* kFileNameAnnotation = "org.weightcache.file.name";
constexpr const char* kFileShaAnnotation = "org.weightcache.file.sha256";
constexpr const char* kFileSizeAnnotation = "org.weightcache.file.size";
constexpr const char* kFormatAnnotation = "org.weightcache.format";

// Bytes moved per read when streaming a cache, a model or a layer: caches are tens of GiB.
constexpr std::size_t kChunk = std::size_t{1} << 20;

int report(const Failure& f) {
  std::fprintf(stderr, "weightcache: %s\n", f.message.c_str());
  return f.exit_code;
}

void print(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

void print_json(const Report& j) { print(j.dump(-1, ' ', false, Report::error_handler_t::replace) + "\n"); }

std::string labelled(const char* label, const std::string& value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%-17s", label);
  return buf + value + "\n";
}

Failure read_failure(const std::string& path, const Error& e) {
  if (e.code == Errc::no_memory) return {kExitIo, "out of memory"};
  return {kExitCannotRead, "cannot read '" + path + "': " + e.message};
}

Failure write_failure(const Error& e) { return {kExitIo, e.code == Errc::no_memory ? "out of memory" : e.message}; }

void print_findings(const std::string& path, const inspect::Inspection& in) {
  for (const auto& f : in.findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
}

// A descriptor owned for the length of a scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads up to n bytes, retrying interrupted reads; -1 with errno on failure.
ssize_t read_some(int fd, void* p, std::size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd, p, n);
    if (r >= 0 || errno != EINTR) return r;
  }
}

// ---- what an artifact records ------------------------------------------------------------------

bool printable_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

bool valid_utf8(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::type_error&) {
    return false;
  }
}

// The member's name, in the layer and in SET_DIR: one plain file name that every tar reader and
// file system takes as such. 1 to 100 bytes (the tar name field, without a prefix), printable
// ASCII without spaces, '/' or '\', not starting with '.' or '-', ending in ".wcache".
bool plain_file_name(std::string_view n) {
  constexpr std::string_view kExt = ".wcache";
  if (n.size() <= kExt.size() || n.size() > 100 || n.substr(n.size() - kExt.size()) != kExt) return false;
  if (n[0] == '.' || n[0] == '-') return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return c > 0x20 && c < 0x7f && c != '/' && c != '\\'; });
}

// A tag as registries take it (the distribution spec's tag grammar): skopeo's oci:DIR:TAG and
// docker://HOST/REPO:TAG both need one.
bool valid_tag(std::string_view t) {
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (t.empty() || t.size() > 128 || !word(t[0])) return false;
  return std::all_of(t.begin(), t.end(), [&](char c) { return word(c) || c == '.' || c == '-'; });
}

// GOARCH-style names ("amd64", "arm64", "386", "ppc64le"), as the image config wants them.
bool valid_arch(std::string_view a) {
  return !a.empty() && a.size() <= 32 &&
         std::all_of(a.begin(), a.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

// The architecture this tool was built for, in the image config's words; nullptr when the
// compiler names none we know (then --arch is required).
const char* build_arch() {
#if defined(__x86_64__) || defined(_M_X64)
  return "amd64";
#elif defined(__aarch64__) || defined(_M_ARM64)
  return "arm64";
#elif defined(__i386__) || defined(_M_IX86)
  return "386";
#elif defined(__arm__)
  return "arm";
#elif defined(__riscv) && __riscv_xlen == 64
  return "riscv64";
#elif defined(__powerpc64__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return "ppc64le";
#elif defined(__powerpc64__)
  return "ppc64";
#elif defined(__s390x__)
  return "s390x";
#elif defined(__loongarch64)
  return "loong64";
#else
  return nullptr;
#endif
}

// A compatibility key as people read it: itself when printable ASCII, else "hex:" + its bytes.
std::string readable_key(std::string_view key) {
  if (printable_ascii(key)) return std::string(key);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "hex:";
  for (const unsigned char c : key) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// The keys whose readable form (readable_key) is `readable`: the text itself when it is printable
// ASCII, and the bytes "hex:..." spells when they are not (printable bytes would have been
// recorded as themselves). Empty when pack could not have written it.
std::vector<std::string> keys_read_as(std::string_view readable) {
  std::vector<std::string> keys;
  if (printable_ascii(readable)) keys.emplace_back(readable);
  constexpr std::string_view kHex = "hex:";
  if (readable.substr(0, kHex.size()) != kHex || readable.size() % 2 != 0) return keys;
  auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  std::string bytes;
  for (std::size_t i = kHex.size(); i < readable.size(); i += 2) {
    const int hi = digit(readable[i]), lo = digit(readable[i + 1]);
    if (hi < 0 || lo < 0) return keys;
    bytes.push_back(static_cast<char>(hi << 4 | lo));
  }
  if (!printable_ascii(bytes)) keys.push_back(std::move(bytes));
  return keys;
}

// What --model-file records as the model's name.
std::string model_name(const std::string& model_file) { return fs::path(model_file).filename().string(); }

std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  if (s.size() != 18 || s.substr(0, 2) != "0x") return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s.substr(2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

// A decimal as pack writes one (std::to_string): digits only, no sign, no leading zero, fits 64 bits.
std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// ---- pack: the arguments and the source ----------------------------------------------------------

Outcome check_pack_options(const PackOptions& o) {
  if (!valid_tag(o.tag))
    return Failure{kExitUsage, "--tag '" + o.tag +
                                   "' is not a tag (letters, digits, '_', '.', '-'; up to 128, "
                                   "not starting with '.' or '-')"};
  if (o.name && !plain_file_name(*o.name))
    return Failure{kExitUsage, "--name '" + *o.name +
                                   "' must be a plain file name ending in .wcache: up to 100 "
                                   "printable ASCII characters, no '/', '\\' or space, not "
                                   "starting with '.' or '-'"};
  if (o.arch && !valid_arch(*o.arch))
    return Failure{kExitUsage, "--arch '" + *o.arch + "' is not an architecture name such as amd64, arm64 or 386"};
  if (!o.arch && build_arch() == nullptr)
    return Failure{kExitUsage, "this build does not know its architecture's OCI name; pass --arch"};
  if (o.runtime && !valid_utf8(*o.runtime)) return Failure{kExitUsage, "--runtime is not valid UTF-8"};
  if (o.cpu_profile && !valid_utf8(*o.cpu_profile)) return Failure{kExitUsage, "--cpu-profile is not valid UTF-8"};
  if (o.model_file && !valid_utf8(model_name(*o.model_file)))
    return Failure{kExitUsage, "the --model-file name is not valid UTF-8"};
  return std::nullopt;
}

// OCI_DIR without --force must not exist; with it, it must be an image layout or empty (so that
// a slip of the argument never removes a directory that is not ours to remove).
Outcome check_target(const std::string& oci_dir, bool force, bool* exists) {
  const fs::path p(oci_dir);
  const std::string last = (p.has_filename() ? p : p.parent_path()).filename().string();
  if (last.empty() || last == "." || last == "..")
    return Failure{kExitUsage, "OCI_DIR '" + oci_dir + "' must end in a directory name"};
  struct stat st {};
  if (::lstat(oci_dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Failure{kExitCannotRead, "cannot look at '" + oci_dir + "': " + std::strerror(errno)};
    *exists = false;
    return std::nullopt;
  }
  *exists = true;
  if (!force) return Failure{kExitUsage, "'" + oci_dir + "' exists; pass --force to replace it"};
  if (!S_ISDIR(st.st_mode)) return Failure{kExitUsage, "'" + oci_dir + "' is not a directory; not replaced"};
  std::error_code ec;
  const bool empty = fs::is_empty(oci_dir, ec);
  if (ec) return Failure{kExitCannotRead, "cannot list '" + oci_dir + "': " + ec.message()};
  struct stat layout {};
  if (!empty && (::lstat((oci_dir + "/oci-layout").c_str(), &layout) != 0 || !S_ISREG(layout.st_mode)))
    return Failure{kExitUsage, "'" + oci_dir +
                                   "' is not an OCI image layout (no oci-layout file); --force only "
                                   "replaces a layout or an empty directory"};
  return std::nullopt;
}

// CACHE must pass what `verify` checks (and the key check of `verify --compat-key`).
Outcome check_cache(const std::string& path, const std::optional<std::string>& compat_key, std::uint64_t* compat_hash) {
  auto file = inspect::File::open(path);
  if (!file)
    return Failure{file.error().code == Errc::no_memory ? kExitIo : kExitCannotRead,
                   file.error().code == Errc::no_memory ? "out of memory" : file.error().message};
  auto in = inspect::inspect(file.value());
  if (!in) return read_failure(path, in.error());
  if (in->format == inspect::FileFormat::xpwc)
    return Failure{kExitProblems, "'" + path +
                                      "' is an ExecuTorch XPWC file; turn it into a weightcache file with "
                                      "'weightcache convert' first"};
  if (in->format != inspect::FileFormat::weightcache) {
    print_findings(path, in.value());
    return Failure{kExitProblems, "'" + path + "' is not a weightcache file"};
  }
  if (in->header_ok && compat_key && inspect::compat_hash(*compat_key) != in->header.compat_hash)
    return Failure{kExitUsage, "--compat-key does not match the compatibility key '" + path + "' was written for " +
                                   "(the file's key hash is " + hex64(in->header.compat_hash) + ", KEY's is " +
                                   hex64(inspect::compat_hash(*compat_key)) + ")"};
  if (in->header_ok && in->index_usable && in->findings.empty()) {
    Progress progress("verifying", in->payload_bytes());
    auto r = inspect::check_checksums(file.value(), &in.value(), progress.callback());
    if (!r) return read_failure(path, r.error());
  }
  if (!in->header_ok || !in->index_usable || !in->findings.empty()) {
    print_findings(path, in.value());
    return Failure{kExitProblems, "'" + path + "' has problems (see 'weightcache verify " + path + "'); not packed"};
  }
  *compat_hash = in->header.compat_hash;
  return std::nullopt;
}

// "sha256:<hex>" of a whole file, streamed.
Outcome hash_file(const std::string& path, std::string* digest) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return Failure{kExitCannotRead, "cannot open '" + path + "': " + std::strerror(errno)};
  Sha256 h;
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t n = read_some(f.fd, buf.data(), buf.size());
    if (n < 0) return Failure{kExitCannotRead, "cannot read '" + path + "': " + std::strerror(errno)};
    if (n == 0) break;
    h.update(buf.data(), static_cast<std::size_t>(n));
  }
  *digest = "sha256:" + h.hex();
  return std::nullopt;
}

// ---- pack: the layout ------------------------------------------------------------------------------

// Removes a directory tree when the scope ends, unless disarmed.
struct RemoveOnExit {
  std::string path;
  RemoveOnExit() = default;
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

struct Layer {
  Descriptor descriptor;
  std::string file_digest;  // of the cache file inside it
  std::uint64_t file_size = 0;
};

struct Packed {
  std::string name, arch;
  std::uint64_t compat_hash = 0;
  std::string model_digest;  // with --model-file
  Layer layer;
  Descriptor manifest;
};

// Copies CACHE into the layout being built and rewrites the copy in canonical form (the library's
// compaction: key order, zero padding, one commit), which is what the layer holds. Returns the
// format version of the copy, which must still be the verified file's kind.
Outcome canonical_copy(const std::string& cache, const std::string& copy, std::uint64_t compat_hash,
                       std::uint32_t* format_version) {
  std::error_code ec;
  if (!fs::copy_file(cache, copy, ec)) return Failure{kExitIo, "cannot copy '" + cache + "': " + ec.message()};
  // A cache shipped read-only (0444) is copied so: the compaction rewrites the copy.
  fs::permissions(copy, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add, ec);
  wc_options o;
  wc_options_init(&o);
  o.path = copy.c_str();
  o.durability = WC_DURABILITY_NONE;  // the copy is scratch: the layer blob is what gets synced
  wc_compact_report r;
  wc_compact_report_init(&r);
  const wc_status st = wc_compact_ex(&o, WC_COMPACT_CANONICAL | WC_COMPACT_ANY_KEY, &r);
  if (st == WC_ERR_CORRUPT)
    return Failure{kExitProblems, "the copy of '" + cache + "' fails the library's checks (" + wc_last_error() +
                                      "); was it changed while it was copied?"};
  if (st == WC_ERR_NO_MEMORY) return Failure{kExitIo, "out of memory"};
  if (st != WC_OK) return Failure{kExitIo, "canonical compaction of the copy failed: " + std::string(wc_last_error())};
  auto file = inspect::File::open(copy);
  if (!file) return read_failure(copy, file.error());
  auto in = inspect::inspect(file.value());
  if (!in) return read_failure(copy, in.error());
  if (in->format != inspect::FileFormat::weightcache || !in->header_ok || !in->index_usable || !in->findings.empty() ||
      in->header.compat_hash != compat_hash)
    return Failure{kExitProblems, "the canonical copy of '" + cache +
                                      "' is not the file that was verified; was it "
                                      "changed while it was copied?"};
  *format_version = in->header.format_version;
  return std::nullopt;
}

// Streams the canonical file into the layer blob: a one-member tar, hashed as it is written (the
// layer's digest) and the member's bytes hashed on their own (the file's digest).
Outcome write_layer(const std::string& layout, const std::string& copy, const std::string& name, Layer* out) {
  Fd in;
  in.fd = ::open(copy.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (in.fd < 0 || ::fstat(in.fd, &st) != 0)
    return Failure{kExitIo, "cannot open the canonical copy '" + copy + "': " + std::strerror(errno)};
  const auto size = static_cast<std::uint64_t>(st.st_size);
  auto blob = PendingFile::create(layout + "/blobs/sha256", "layer");
  if (!blob) return write_failure(blob.error());
  Sha256 tar_hash, file_hash;
  auto emit = [&](const void* p, std::size_t n) -> Outcome {
    tar_hash.update(p, n);
    if (auto r = blob->write(p, n); !r) return write_failure(r.error());
    return std::nullopt;
  };
  const tar::Block header = tar::file_header(name, size);
  if (auto f = emit(header.data(), header.size())) return f;
  std::vector<char> buf(kChunk);
  Progress progress("packing", size);
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t n =
        read_some(in.fd, buf.data(), static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - done)));
    if (n <= 0)
      return Failure{kExitIo,
                     "cannot read the canonical copy '" + copy + "': " + (n < 0 ? std::strerror(errno) : "it shrank")};
    file_hash.update(buf.data(), static_cast<std::size_t>(n));
    if (auto f = emit(buf.data(), static_cast<std::size_t>(n))) return f;
    done += static_cast<std::uint64_t>(n);
    progress.add(static_cast<std::uint64_t>(n));
  }
  progress.finish();
  // The member's padding, then the end-of-archive marker: two zero blocks.
  const std::vector<char> zeros(tar::padding(size) + 2 * tar::kBlockSize, 0);
  if (auto f = emit(zeros.data(), zeros.size())) return f;
  const std::string digest = "sha256:" + tar_hash.hex();
  if (auto r = blob->commit_as(digest.substr(7)); !r) return write_failure(r.error());
  out->descriptor = Descriptor{
      oci::kLayerTarMediaType, digest, tar::kBlockSize + size + zeros.size(), {{oci::kTitleAnnotation, name}}};
  out->file_digest = "sha256:" + file_hash.hex();
  out->file_size = size;
  return std::nullopt;
}

std::string config_document(const std::string& arch, const std::string& diff_id) {
  const Json j = {{"architecture", arch},
                  {"os", "linux"},
                  {"rootfs", {{"type", "layers"}, {"diff_ids", Json::array({diff_id})}}},
                  {"config", Json::object()}};
  return j.dump();
}

std::string manifest_document(const Descriptor& config, const Descriptor& layer,
                              const std::map<std::string, std::string>& annotations) {
  const Json j = {{"schemaVersion", 2},
                  {"mediaType", oci::kManifestMediaType},
                  {"config", oci::to_json(config)},
                  {"layers", Json::array({oci::to_json(layer)})},
                  {"annotations", annotations}};
  return j.dump();
}

std::string index_document(Descriptor manifest, const std::string& tag) {
  manifest.annotations = {{oci::kRefNameAnnotation, tag}};
  const Json j = {
      {"schemaVersion", 2}, {"mediaType", oci::kIndexMediaType}, {"manifests", Json::array({oci::to_json(manifest)})}};
  return j.dump();
}

// The manifest's annotations (docs/CLI.md lists them).
std::map<std::string, std::string> annotations_for(const PackOptions& o, const Packed& p,
                                                   std::uint32_t format_version) {
  std::map<std::string, std::string> a;
  a[kCompatHashAnnotation] = hex64(p.compat_hash);
  if (o.compat_key) a[kCompatKeyAnnotation] = readable_key(*o.compat_key);
  if (o.runtime) a[kRuntimeAnnotation] = *o.runtime;
  if (o.cpu_profile) a[kCpuProfileAnnotation] = *o.cpu_profile;
  if (o.model_file) {
    a[kModelShaAnnotation] = p.model_digest;
    a[kModelNameAnnotation] = model_name(*o.model_file);
  }
  a[kFileNameAnnotation] = p.name;
  a[kFileShaAnnotation] = p.layer.file_digest;
  a[kFileSizeAnnotation] = std::to_string(p.layer.file_size);
  a[kFormatAnnotation] = std::to_string(format_version);
  return a;
}

Outcome make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0)
    return Failure{kExitIo, "cannot create the directory '" + path + "': " + std::strerror(errno)};
  return std::nullopt;
}

// Fills `staging` (an empty new directory) with the whole layout.
Outcome build_layout(const std::string& cache, const std::string& staging, const PackOptions& o, Packed* p) {
  const std::string scratch = staging + "/scratch";
  for (const std::string& d : {staging + "/blobs", staging + "/blobs/sha256", scratch})
    if (auto f = make_directory(d)) return f;
  const std::string copy = scratch + "/" + p->name;
  std::uint32_t format_version = 0;
  if (auto f = canonical_copy(cache, copy, p->compat_hash, &format_version)) return f;
  if (auto f = write_layer(staging, copy, p->name, &p->layer)) return f;
  std::error_code ec;
  fs::remove_all(scratch, ec);
  if (ec) return Failure{kExitIo, "cannot remove '" + scratch + "': " + ec.message()};
  const auto annotations = annotations_for(o, *p, format_version);
  if (auto r = sync_directory(staging + "/blobs"); !r) return write_failure(r.error());
  Descriptor config;
  if (auto f = oci::write_blob(staging, config_document(p->arch, p->layer.descriptor.digest), oci::kConfigMediaType,
                               &config))
    return f;
  if (auto f = oci::write_blob(staging, manifest_document(config, p->layer.descriptor, annotations),
                               oci::kManifestMediaType, &p->manifest))
    return f;
  if (auto f = oci::write_file(staging, "index.json", index_document(p->manifest, o.tag))) return f;
  return oci::write_file(staging, "oci-layout", oci::kLayoutFile);
}

// Puts the finished layout at OCI_DIR. An existing layout (--force) is swapped out in one step
// where the system can (renameat2 RENAME_EXCHANGE) and left at `staging` for the caller to remove.
Outcome install_layout(const std::string& staging, const std::string& oci_dir, bool exists) {
  if (exists) {
#if defined(RENAME_EXCHANGE)
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, oci_dir.c_str(), RENAME_EXCHANGE) == 0) return std::nullopt;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      return Failure{kExitIo, "cannot replace '" + oci_dir + "': " + std::strerror(errno)};
#endif
    const std::string old = staging + ".old";
    if (::rename(oci_dir.c_str(), old.c_str()) != 0)
      return Failure{kExitIo, "cannot move the old '" + oci_dir + "' aside: " + std::strerror(errno)};
    if (::rename(staging.c_str(), oci_dir.c_str()) != 0) {
      const int err = errno;
      (void)::rename(old.c_str(), oci_dir.c_str());
      return Failure{kExitIo, "cannot rename the new layout to '" + oci_dir + "': " + std::strerror(err)};
    }
    std::error_code ec;
    fs::remove_all(old, ec);
    return std::nullopt;
  }
  if (::rename(staging.c_str(), oci_dir.c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY)
      return Failure{kExitUsage, "'" + oci_dir + "' appeared meanwhile; not replaced"};
    return Failure{kExitIo, "cannot rename the new layout to '" + oci_dir + "': " + std::strerror(err)};
  }
  return std::nullopt;
}

std::string parent_of(const std::string& oci_dir) {
  fs::path p(oci_dir);
  if (!p.has_filename()) p = p.parent_path();
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

void print_packed(const std::string& cache, const std::string& oci_dir, const std::string& tag, const Packed& p,
                  bool json) {
  if (json) {
    print_json({{"cache", cache},
                {"oci_dir", oci_dir},
                {"tag", tag},
                {"manifest_digest", p.manifest.digest},
                {"manifest_size", p.manifest.size},
                {"layer_digest", p.layer.descriptor.digest},
                {"layer_size", p.layer.descriptor.size},
                {"file_name", p.name},
                {"file_sha256", p.layer.file_digest},
                {"file_size", p.layer.file_size},
                {"compat_hash", hex64(p.compat_hash)},
                {"architecture", p.arch}});
    return;
  }
  print("packed " + cache + " into " + oci_dir + ":" + tag + "\n" +
        labelled("manifest:", p.manifest.digest + " (" + std::to_string(p.manifest.size) + " bytes)") +
        labelled("layer:", p.layer.descriptor.digest + " (" + std::to_string(p.layer.descriptor.size) + " bytes)") +
        labelled("file:", p.name + " (" + std::to_string(p.layer.file_size) + " bytes)") +
        labelled("file sha256:", p.layer.file_digest) + labelled("compat key hash:", hex64(p.compat_hash)) +
        labelled("architecture:", p.arch));
}

// ---- unpack ------------------------------------------------------------------------------------------

// What unpack needs from a manifest, after checking its form.
struct Artifact {
  Descriptor config, layer;
  std::map<std::string, std::string> annotations;
  std::string file_digest;
  std::uint64_t file_size = 0;
  std::uint32_t format_version = 0;
  std::uint64_t compat_hash = 0;
};

Outcome annotations_of(const Json& manifest, std::map<std::string, std::string>* out) {
  const auto a = manifest.find("annotations");
  if (a == manifest.end()) return std::nullopt;
  if (!a->is_object()) return Failure{kExitProblems, "the manifest's annotations are not a JSON object"};
  for (const auto& [k, v] : a->items()) {
    if (!v.is_string()) return Failure{kExitProblems, "the manifest's annotation '" + k + "' is not a string"};
    (*out)[k] = v.get<std::string>();
  }
  return std::nullopt;
}

// The config names the layer's uncompressed digest, which for an uncompressed layer is its digest.
Outcome check_config(const std::string& layout, const Artifact& a) {
  std::string bytes;
  if (auto f = oci::read_document_blob(layout, a.config, &bytes)) return f;
  const Json config = Json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("rootfs") || !config["rootfs"].is_object() ||
      config["rootfs"].value("diff_ids", Json()) != Json::array({a.layer.digest}))
    return Failure{kExitProblems,
                   "the image config's rootfs.diff_ids is not [the layer's digest " + a.layer.digest + "]"};
  return std::nullopt;
}

Outcome read_artifact(const std::string& layout, const oci::SelectedManifest& m, Artifact* out) {
  const Json& j = m.manifest;
  if (const auto mt = j.find("mediaType"); mt != j.end() && *mt != oci::kManifestMediaType)
    return Failure{kExitProblems, "the manifest's mediaType is not " + std::string(oci::kManifestMediaType)};
  if (!j.contains("config")) return Failure{kExitProblems, "the manifest has no config"};
  if (auto f = oci::parse_descriptor(j["config"], "the manifest's config", &out->config)) return f;
  if (out->config.media_type != oci::kConfigMediaType)
    return Failure{kExitProblems, "the manifest's config is " + out->config.media_type + ", not an image config (" +
                                      oci::kConfigMediaType + ")"};
  const auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array() || layers->size() != 1)
    return Failure{kExitProblems, "the manifest must have exactly one layer (a weightcache artifact's)"};
  if (auto f = oci::parse_descriptor((*layers)[0], "the manifest's layer", &out->layer)) return f;
  if (out->layer.media_type != oci::kLayerTarMediaType) {
    // A compressed tar is what a copy without --preserve-digests makes of the layer: say how to
    // avoid it. Anything else is not a weightcache artifact's layer at all.
    const std::string compressed_prefix = std::string(oci::kLayerTarMediaType) + "+";
    if (out->layer.media_type.rfind(compressed_prefix, 0) == 0 ||
        out->layer.media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip")
      return Failure{kExitProblems, "the layer is " + out->layer.media_type + ", not an uncompressed tar (" +
                                        oci::kLayerTarMediaType +
                                        "); copy artifacts with 'skopeo copy "
                                        "--preserve-digests' so that skopeo does not compress the layer"};
    return Failure{kExitProblems, "the layer is " + out->layer.media_type + ", not " + oci::kLayerTarMediaType +
                                      " (a weightcache artifact's layer is an uncompressed tar)"};
  }
  if (auto f = annotations_of(j, &out->annotations)) return f;
  const auto sha = out->annotations.find(kFileShaAnnotation);
  if (sha == out->annotations.end() || !oci::valid_digest(sha->second))
    return Failure{kExitProblems, std::string("the manifest has no valid ") + kFileShaAnnotation + " annotation"};
  out->file_digest = sha->second;
  // Pack always records the size and the format; a manifest without them was not written by it.
  const auto size = out->annotations.find(kFileSizeAnnotation);
  const auto parsed_size = size == out->annotations.end() ? std::nullopt : parse_decimal(size->second);
  if (!parsed_size)
    return Failure{kExitProblems, std::string("the manifest has no valid ") + kFileSizeAnnotation +
                                      " annotation (a size in bytes, in decimal)"};
  out->file_size = *parsed_size;
  const auto format = out->annotations.find(kFormatAnnotation);
  const auto parsed_format = format == out->annotations.end() ? std::nullopt : parse_decimal(format->second);
  if (!parsed_format || *parsed_format > std::numeric_limits<std::uint32_t>::max())
    return Failure{kExitProblems, std::string("the manifest has no valid ") + kFormatAnnotation +
                                      " annotation (a format version, in decimal)"};
  out->format_version = static_cast<std::uint32_t>(*parsed_format);
  const auto hash = out->annotations.find(kCompatHashAnnotation);
  const auto parsed = hash == out->annotations.end() ? std::nullopt : parse_hex64(hash->second);
  if (!parsed)
    return Failure{kExitProblems, std::string("the manifest has no valid ") + kCompatHashAnnotation + " annotation"};
  out->compat_hash = *parsed;
  // The readable key, when recorded, must be the key the hash is of: a node that picks artifacts
  // by the key it reads there must get a file written for that key.
  if (const auto key = out->annotations.find(kCompatKeyAnnotation); key != out->annotations.end()) {
    const auto keys = keys_read_as(key->second);
    if (keys.empty())
      return Failure{kExitProblems, std::string("the manifest's ") + kCompatKeyAnnotation +
                                        " is neither printable ASCII nor hex:<lowercase hex bytes>, as pack records a "
                                        "key"};
    // The message hashes keys.back(): for "hex:..." the bytes it spells, as pack records a key
    // that is not printable.
    if (std::none_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return inspect::compat_hash(k) == out->compat_hash; }))
      return Failure{kExitProblems, std::string("the manifest's ") + kCompatKeyAnnotation + " '" + key->second +
                                        "' hashes to " + hex64(inspect::compat_hash(keys.back())) + ", not to its " +
                                        kCompatHashAnnotation + " " + hex64(out->compat_hash) +
                                        ": it names another key than the file was written for"};
  }
  return check_config(layout, *out);
}

// The layer blob, read in order and hashed as it goes.
class LayerStream {
 public:
  LayerStream(int fd, std::string path, std::uint64_t size) : fd_(fd), path_(std::move(path)), remaining_(size) {}
  /// Exactly n bytes, or exit 1 when the layer ends first (3 when it cannot be read).
  Outcome read(void* p, std::size_t n) {
    if (n > remaining_)
      return Failure{kExitProblems, "the layer's tar ends in the middle of its member or its end marker"};
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = read_some(fd_, static_cast<char*>(p) + got, n - got);
      if (r < 0) return Failure{kExitCannotRead, "cannot read the layer '" + path_ + "': " + std::strerror(errno)};
      if (r == 0) return Failure{kExitProblems, "the layer '" + path_ + "' is shorter than its descriptor says"};
      got += static_cast<std::size_t>(r);
    }
    hash_.update(p, n);
    remaining_ -= n;
    return std::nullopt;
  }
  std::uint64_t remaining() const { return remaining_; }
  /// Reads what is left (hashed) and returns the layer's digest; call once.
  Outcome finish(std::string* digest) {
    std::vector<char> buf(kChunk);
    while (remaining_ != 0)
      if (auto f = read(buf.data(), static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), remaining_))))
        return f;
    *digest = "sha256:" + hash_.hex();
    return std::nullopt;
  }

 private:
  int fd_;
  std::string path_;
  std::uint64_t remaining_;
  Sha256 hash_;
};

// A problem found in the tar: when the layer also fails its digest, that is what went wrong (the
// blob was altered), so that is the message.
Failure blame(LayerStream& s, const Descriptor& layer, Failure tar_problem) {
  std::string digest;
  if (s.finish(&digest) || digest == layer.digest) return tar_problem;
  return {kExitProblems, "the layer blob does not match its digest " + layer.digest + " (its bytes hash to " + digest +
                             "): the layout was altered or damaged"};
}

std::string type_name(char type) {
  switch (type) {
    case 'x':
      return "a pax extended header (pax headers are refused)";
    case 'g':
      return "a pax global header (pax headers are refused)";
    case 'L':
    case 'K':
      return "a GNU long-name header (refused)";
    case '1':
      return "a hard link";
    case '2':
      return "a symbolic link";
    case '5':
      return "a directory";
    default:
      return std::string("of type '") + type + "'";
  }
}

// The member's header, checked: one regular file with a plain name, fitting the layer.
Outcome read_member_header(LayerStream& s, const Artifact& a, tar::Member* m) {
  tar::Block header{};
  if (auto f = s.read(header.data(), header.size())) return f;
  std::string why;
  auto parsed = tar::parse_header(header, &why);
  if (!parsed) return Failure{kExitProblems, "the layer's tar is refused: " + why};
  *m = *parsed;
  if (m->type != '0')
    return Failure{kExitProblems, "the layer's tar member is " + type_name(m->type) + ", not a regular file"};
  if (!plain_file_name(m->name))
    return Failure{kExitProblems, "the layer's tar member is named '" + m->name +
                                      "', not a plain file name ending in .wcache; refused"};
  if (const auto n = a.annotations.find(kFileNameAnnotation); n != a.annotations.end() && n->second != m->name)
    return Failure{kExitProblems,
                   "the layer's tar member is named '" + m->name + "' but the manifest says '" + n->second + "'"};
  if (m->size != a.file_size)
    return Failure{kExitProblems, "the layer's tar member is " + std::to_string(m->size) +
                                      " bytes but the manifest's " + kFileSizeAnnotation + " says " +
                                      std::to_string(a.file_size)};
  if (m->size > s.remaining() || s.remaining() - m->size < tar::padding(m->size))
    return Failure{kExitProblems, "the layer is too short for its member of " + std::to_string(m->size) + " bytes"};
  if (const std::uint64_t after = s.remaining() - m->size - tar::padding(m->size); after < 2 * tar::kBlockSize)
    return Failure{kExitProblems, "the layer's tar has no end-of-archive marker after its member: " +
                                      std::to_string(after) + " bytes follow it where two zero blocks (" +
                                      std::to_string(2 * tar::kBlockSize) + " bytes) must"};
  return std::nullopt;
}

// After the member: zero padding, then only zero blocks (at least the two of the end marker).
Outcome read_member_tail(LayerStream& s, std::uint64_t size) {
  tar::Block block{};
  const std::size_t pad = static_cast<std::size_t>(tar::padding(size));
  if (auto f = s.read(block.data(), pad)) return f;
  if (!std::all_of(block.begin(), block.begin() + static_cast<std::ptrdiff_t>(pad),
                   [](unsigned char c) { return c == 0; }))
    return Failure{kExitProblems, "the layer's tar has data in its member's padding"};
  if (s.remaining() % tar::kBlockSize != 0 || s.remaining() < 2 * tar::kBlockSize)
    return Failure{kExitProblems, "the layer's tar does not end with its end-of-archive marker"};
  while (s.remaining() != 0) {
    if (auto f = s.read(block.data(), block.size())) return f;
    if (!tar::is_zero(block))
      return Failure{kExitProblems, "the layer's tar holds more than one member (only one cache file is read)"};
  }
  return std::nullopt;
}

// Copies the member into `out` (a temporary in SET_DIR) and returns its digest.
Outcome copy_member(LayerStream& s, std::uint64_t size, PendingFile& out, std::string* digest) {
  Sha256 h;
  std::vector<char> buf(kChunk);
  Progress progress("unpacking", size);
  for (std::uint64_t done = 0; done < size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - done));
    if (auto f = s.read(buf.data(), n)) return f;
    h.update(buf.data(), n);
    if (auto r = out.write(buf.data(), n); !r) return write_failure(r.error());
    done += n;
    progress.add(n);
  }
  *digest = "sha256:" + h.hex();
  return std::nullopt;
}

// The unpacked file must be a sound cache for the key hash the manifest names.
Outcome check_unpacked(const std::string& path, const Artifact& a) {
  auto file = inspect::File::open(path);
  if (!file) return read_failure(path, file.error());
  auto in = inspect::inspect(file.value());
  if (!in) return read_failure(path, in.error());
  if (in->format != inspect::FileFormat::weightcache || !in->header_ok || !in->index_usable || !in->findings.empty())
    return Failure{kExitProblems, "the unpacked file is not a sound weightcache file"};
  Progress progress("verifying", in->payload_bytes());
  auto r = inspect::check_checksums(file.value(), &in.value(), progress.callback());
  progress.finish();
  if (!r) return read_failure(path, r.error());
  if (!in->findings.empty()) return Failure{kExitProblems, "the unpacked file has entries that fail their checksums"};
  if (in->header.format_version != a.format_version)
    return Failure{kExitProblems, "the unpacked file is format version " + std::to_string(in->header.format_version) +
                                      " but the manifest's " + kFormatAnnotation + " says " +
                                      std::to_string(a.format_version)};
  if (in->header.compat_hash != a.compat_hash)
    return Failure{kExitProblems, "the unpacked file's compatibility key hash " + hex64(in->header.compat_hash) +
                                      " does not match the manifest's " + kCompatHashAnnotation + " " +
                                      hex64(a.compat_hash)};
  return std::nullopt;
}

// Removes a directory this command created when the command fails (it is empty then: the
// temporary in it is gone first).
struct RemoveCreatedDir {
  std::string path;
  RemoveCreatedDir() = default;
  RemoveCreatedDir(const RemoveCreatedDir&) = delete;
  RemoveCreatedDir& operator=(const RemoveCreatedDir&) = delete;
  ~RemoveCreatedDir() {
    if (!path.empty()) ::rmdir(path.c_str());
  }
};

struct Unpacked {
  std::string path, name, file_digest;
  std::uint64_t file_size = 0;
};

// Streams the layer into SET_DIR/NAME through a temporary, checking everything on the way.
Outcome extract(const std::string& layout, const Artifact& a, const std::string& set_dir, RemoveCreatedDir* created,
                Unpacked* out) {
  Fd fd;
  if (auto f = oci::open_blob(layout, a.layer, &fd.fd)) return f;
  LayerStream s(fd.fd, oci::blob_path(layout, a.layer.digest), a.layer.size);
  tar::Member m;
  if (auto f = read_member_header(s, a, &m)) return blame(s, a.layer, *f);
  std::error_code ec;
  if (fs::create_directories(set_dir, ec)) created->path = set_dir;
  if (ec) return Failure{kExitIo, "cannot create '" + set_dir + "': " + ec.message()};
  auto file = PendingFile::create(set_dir, m.name);
  if (!file) return write_failure(file.error());
  if (auto f = copy_member(s, m.size, file.value(), &out->file_digest))
    return f->exit_code == kExitProblems ? blame(s, a.layer, *f) : *f;  // a short layer, or SET_DIR's I/O
  if (auto f = read_member_tail(s, m.size)) return blame(s, a.layer, *f);
  std::string layer_digest;
  if (auto f = s.finish(&layer_digest)) return f;
  if (layer_digest != a.layer.digest)
    return Failure{kExitProblems, "the layer blob does not match its digest " + a.layer.digest +
                                      " (its bytes hash to " + layer_digest + "): the layout was altered or damaged"};
  if (out->file_digest != a.file_digest)
    return Failure{kExitProblems, "the unpacked file's sha256 " + out->file_digest + " does not match the manifest's " +
                                      kFileShaAnnotation + " " + a.file_digest};
  if (auto r = file->sync(); !r) return write_failure(r.error());
  if (auto f = check_unpacked(file->temp_path(), a)) return f;
  if (auto r = file->set_mode(0444); !r) return write_failure(r.error());
  if (auto r = file->commit(); !r) return write_failure(r.error());
  out->path = file->final_path();
  out->name = m.name;
  out->file_size = m.size;
  return std::nullopt;
}

std::optional<std::string> annotation(const Artifact& a, const char* key) {
  const auto it = a.annotations.find(key);
  return it == a.annotations.end() ? std::nullopt : std::optional(it->second);
}

Report optional_json(const std::optional<std::string>& s) { return s ? Report(*s) : Report(nullptr); }

void print_unpacked(const oci::SelectedManifest& m, const Artifact& a, const Unpacked& u, bool json) {
  const auto runtime = annotation(a, kRuntimeAnnotation), cpu = annotation(a, kCpuProfileAnnotation);
  if (json) {
    print_json({{"path", u.path},
                {"file_name", u.name},
                {"compat_hash", hex64(a.compat_hash)},
                {"runtime", optional_json(runtime)},
                {"cpu_profile", optional_json(cpu)},
                {"file_sha256", u.file_digest},
                {"file_size", u.file_size},
                {"manifest_digest", m.descriptor.digest},
                {"tag", optional_json(m.tag)}});
    return;
  }
  print("wrote " + u.path + "\n" + labelled("compat key hash:", hex64(a.compat_hash)) +
        labelled("runtime:", runtime.value_or("(not recorded)")) +
        labelled("cpu profile:", cpu.value_or("(not recorded)")) +
        labelled("file:", u.file_digest + " (" + std::to_string(u.file_size) + " bytes)") +
        labelled("manifest:", m.descriptor.digest + (m.tag ? " (tag " + *m.tag + ")" : std::string())));
}

}  // namespace

int run_artifact_pack(const std::string& cache, const std::string& oci_dir, const PackOptions& o) {
  if (auto f = check_pack_options(o)) return report(*f);
  bool exists = false;
  if (auto f = check_target(oci_dir, o.force, &exists)) return report(*f);
  Packed p;
  if (auto f = check_cache(cache, o.compat_key, &p.compat_hash)) return report(*f);
  if (o.model_file)
    if (auto f = hash_file(*o.model_file, &p.model_digest)) return report(*f);
  p.arch = o.arch ? *o.arch : build_arch();
  p.name = o.name ? *o.name : hex64(p.compat_hash).substr(2) + ".wcache";
  // Built beside OCI_DIR (same file system: the cache's copy and the blobs are renamed, not copied)
  // and renamed into place whole, so a failed pack leaves neither a half layout nor the copy.
  fs::path target(oci_dir);
  if (!target.has_filename()) target = target.parent_path();
  RemoveOnExit staging;
  staging.path = parent_of(oci_dir) + "/." + target.filename().string() + ".tmp." + std::to_string(::getpid());
  if (auto f = make_directory(staging.path)) {
    staging.path.clear();
    return report(*f);
  }
  if (auto f = build_layout(cache, staging.path, o, &p)) return report(*f);
  if (auto f = install_layout(staging.path, oci_dir, exists)) return report(*f);
  if (!exists) staging.path.clear();  // it is OCI_DIR now; with --force it holds the old layout
  if (auto r = sync_directory(parent_of(oci_dir)); !r) return report(write_failure(r.error()));
  print_packed(cache, oci_dir, o.tag, p, o.json);
  return kExitOk;
}

int run_artifact_unpack(const std::string& oci_dir, const std::string& set_dir, const UnpackOptions& o) {
  oci::SelectedManifest m;
  if (auto f = oci::select_manifest(oci_dir, o.tag, &m)) return report(*f);
  Artifact a;
  if (auto f = read_artifact(oci_dir, m, &a)) return report(*f);
  RemoveCreatedDir created;
  Unpacked u;
  if (auto f = extract(oci_dir, a, set_dir, &created, &u)) return report(*f);
  created.path.clear();
  print_unpacked(m, a, u, o.json);
  return kExitOk;
}

int run_artifact_show(const std::string& oci_dir, const UnpackOptions& o) {
  oci::SelectedManifest m;
  if (auto f = oci::select_manifest(oci_dir, o.tag, &m)) return report(*f);
  std::map<std::string, std::string> annotations;
  if (auto f = annotations_of(m.manifest, &annotations)) return report(*f);
  if (o.json) {
    print_json({{"oci_dir", oci_dir},
                {"tag", optional_json(m.tag)},
                {"manifest_digest", m.descriptor.digest},
                {"manifest_size", m.descriptor.size},
                {"annotations", annotations}});
    return kExitOk;
  }
  std::string out = labelled("manifest:", m.descriptor.digest + " (" + std::to_string(m.descriptor.size) + " bytes)") +
                    labelled("tag:", m.tag.value_or("(none)")) + "annotations:\n";
  for (const auto& [k, v] : annotations) out += "  " + k + ": " + v + "\n";
  print(out);
  return kExitOk;
}

}  // namespace weightcache::cli
