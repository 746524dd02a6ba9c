// weightcache: inspect and maintain weightcache files (docs/CLI.md).
#include "artifact.hpp"
#include "output.hpp"
#include "rewrite.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <new>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::cli {
namespace {

using inspect::display_key;
using inspect::FileFormat;
using inspect::Inspection;
// Fields come out in the order they are set, the order docs/CLI.md shows.
using Json = nlohmann::ordered_json;

constexpr const char* kExitCodesHelp =
    "exit codes:\n"
    "  0  success\n"
    "  1  problems found (verify); no such entry or it fails its checksum (cat);\n"
    "     damaged entries or a damaged input (compact, convert); artifact: CACHE is not a sound\n"
    "     weightcache file (pack), the artifact fails a check (unpack, show; nothing written)\n"
    "  2  usage error, or a command that does not apply to the file's format; artifact: an\n"
    "     existing OCI_DIR without --force, a --compat-key CACHE was not written for, a --tag\n"
    "     the layout does not have\n"
    "  3  cannot open or read the file, or it is not a usable cache file; convert: IN changed\n"
    "     while it was being converted (nothing written); artifact: OCI_DIR is not a layout\n"
    "     (no oci-layout or index.json that is a readable regular file)\n"
    "  4  busy: a writer holds the lease on FILE.lock (compact, convert), or FILE is in use\n"
    "     (compact); gc: files in use were kept and the directory is still over the budget\n"
    "  5  other I/O failure (creating, writing, syncing or renaming the new file; gc: files\n"
    "     that could not be removed left the directory over the budget); out of memory\n";

constexpr const char* kMainHelp =
    "usage: weightcache COMMAND [OPTIONS] ARGS...\n"
    "       weightcache --version\n"
    "\n"
    "Inspects and maintains weightcache files; also reads ExecuTorch XPWC weight caches.\n"
    "\n"
    "commands:\n"
    "  info FILE        format, version, compatibility-key hash, alignment, sizes, dead bytes\n"
    "  ls FILE          one line per entry: key, offset, size, checksum\n"
    "  verify FILE      check every structure and every entry checksum\n"
    "  cat FILE KEY     write an entry's bytes to stdout\n"
    "  compact FILE     rewrite FILE with only its live entries\n"
    "  convert IN OUT   turn an ExecuTorch XPWC file into a weightcache file\n"
    "  gc DIR --max-size SIZE\n"
    "                   remove the least recently used unused caches of DIR down to SIZE\n"
    "  artifact pack CACHE OCI_DIR\n"
    "                   write CACHE's canonical form as an OCI image layout (for skopeo)\n"
    "  artifact unpack OCI_DIR SET_DIR\n"
    "                   check an OCI artifact and write its cache file into SET_DIR\n"
    "  artifact show OCI_DIR\n"
    "                   an OCI artifact's manifest digest and annotations\n"
    "\n"
    "Run 'weightcache COMMAND --help' for a command's options.\n"
    "\n";

struct Command {
  const char* name;
  std::size_t positional;
  std::set<std::string> flags;    // options without a value
  std::set<std::string> valued;   // options taking a value
  const char* help;
};

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"info", 1, {"--json"}, {},
       "usage: weightcache info [--json] FILE\n"
       "\n"
       "Prints the format and version, the compatibility-key hash, the alignment, the number of\n"
       "entries, payload bytes (sum of entry sizes), file bytes, and dead bytes: file bytes used by\n"
       "no live entry, not the header and not the index + footer in use (replaced entries, old\n"
       "indexes, alignment padding, an uncommitted tail). 'weightcache compact' reclaims them.\n"
       "\n"
       "  --json   one JSON object instead of text\n"},
      {"ls", 1, {"--json"}, {},
       "usage: weightcache ls [--json] FILE\n"
       "\n"
       "One line per entry, tab-separated: key, offset, size, checksum (XXH3-64, hex; '-' for XPWC\n"
       "files, which have none). A key is shown as-is when it is printable ASCII and does not start\n"
       "with '0x'; otherwise as 0x followed by its bytes in hex. Either form is accepted by 'cat'.\n"
       "\n"
       "  --json   one JSON object with an \"entries\" array instead of text\n"},
      {"verify", 1, {"--json"}, {"--compat-key"},
       "usage: weightcache verify [--json] [--compat-key KEY] FILE\n"
       "\n"
       "Checks the header, both commit slots, the index in use and the footer, every entry's bounds,\n"
       "alignment and overlaps, duplicate keys, and every entry's checksum. Prints one line per\n"
       "problem and exits 1 if there is any, 0 if the file is sound; at most 100 problems of one\n"
       "kind are listed for each thing checked, then one line says how many more there were. XPWC\n"
       "files have no checksums: only their structure and bounds are checked. Reads with pread,\n"
       "never a mapping, so a truncated file is reported, not crashed on.\n"
       "\n"
       "  --json            one JSON object with \"ok\" and a \"problems\" array instead of text\n"
       "  --compat-key KEY  also a problem (exit 1) unless FILE was written for KEY: check a shipped\n"
       "                    cache before use (an XPWC file has no key, so it never matches)\n"},
      {"cat", 2, {}, {},
       "usage: weightcache cat FILE KEY\n"
       "\n"
       "Writes the bytes of the entry stored under KEY to stdout, after checking its checksum.\n"
       "KEY is the key as text, or 0x followed by hex digits for its bytes (as 'ls' shows it).\n"
       "For XPWC version 2 files the key is NAME#seed=SEED. Use '--' before a KEY starting with '-'.\n"
       "Exits 1, writing nothing, when there is no such entry or it fails its checksum.\n"},
      {"compact", 1, {"--drop-corrupt", "--canonical"}, {"--compat-key"},
       "usage: weightcache compact [--compat-key KEY] [--drop-corrupt] [--canonical] FILE\n"
       "\n"
       "Writes a new file next to FILE with only the live entries (same alignment and compatibility\n"
       "key), reads it back, and renames it over FILE. Only while no process has FILE open and no\n"
       "writer holds its lease (FILE.lock): exits 4 at once otherwise, changing nothing. A file\n"
       "with structural problems (see 'verify') is left alone (exit 1): rewriting it would discard\n"
       "what a damaged commit holds.\n"
       "\n"
       "  --compat-key KEY  FILE must have been written for KEY (exit 2 otherwise)\n"
       "  --drop-corrupt    leave out entries that fail their checksum (default: refuse, exit 1)\n"
       "  --canonical       entries in key order, deterministic padding and header: files holding\n"
       "                    the same entries become byte-identical (for shipping prebuilt caches)\n"},
      {"convert", 2, {"--force"}, {"--compat-key", "--alignment"},
       "usage: weightcache convert [--compat-key KEY] [--alignment N] [--force] IN OUT\n"
       "\n"
       "Reads the ExecuTorch XPWC file IN (version 1 or 2) and writes its entries as the weightcache\n"
       "file OUT. Keys are the entry names; for version 2 the seed is appended: NAME#seed=SEED.\n"
       "IN must not be rewritten meanwhile: a change to it seen during the conversion exits 3 and\n"
       "writes nothing (run again once nothing writes IN).\n"
       "\n"
       "  --compat-key KEY  compatibility key of OUT (default: the empty key)\n"
       "  --alignment N     entry alignment of OUT, a power of two up to 16777216 (default 64)\n"
       "  --force           replace OUT if it exists\n"},
      {"gc", 1, {"--json"}, {"--max-size"},
       "usage: weightcache gc DIR --max-size SIZE [--json]\n"
       "\n"
       "Removes the least recently used cache files of DIR (not its subdirectories) until the caches\n"
       "there take at most SIZE bytes, each with its lock file FILE.lock. A cache is recognised by its\n"
       "header, not its name; no other file, directory or symlink is touched. Last used = the later\n"
       "modification time of FILE and FILE.lock (every writable open touches FILE.lock). A file some\n"
       "process has open, or whose writer lease is held, is never removed: it is kept and reported,\n"
       "as is one this user cannot open for writing. Prints what was removed and kept and why, and\n"
       "the total before and after. Exits 0 when DIR is within SIZE afterwards, 4 when files in use\n"
       "kept it over, 5 when files that could not be removed did.\n"
       "\n"
       "  --max-size SIZE  the budget: bytes, or a number with K, M or G (1024-based), e.g. 20G\n"
       "  --json           one JSON object instead of text\n"},
      {"artifact pack", 2, {"--force", "--json"},
       {"--tag", "--name", "--compat-key", "--runtime", "--cpu-profile", "--model-file", "--arch"},
       "usage: weightcache artifact pack [OPTIONS] CACHE OCI_DIR\n"
       "\n"
       "Writes CACHE as an OCI image layout at OCI_DIR (oci-layout, index.json, blobs/sha256/), to be\n"
       "published with 'skopeo copy --preserve-digests oci:OCI_DIR:TAG docker://HOST/REPO:TAG'.\n"
       "CACHE must pass 'weightcache verify'. The layer is an uncompressed tar of one file: CACHE's\n"
       "canonical form ('compact --canonical', made on a copy), so caches holding the same entries\n"
       "give the same digests whatever order they were filled in. Nothing records a time.\n"
       "\n"
       "  --tag TAG           the tag, org.opencontainers.image.ref.name (default latest)\n"
       "  --name NAME         the file's name in the layer (default <compat key hash>.wcache)\n"
       "  --compat-key KEY    CACHE must have been written for KEY (exit 2); recorded readably\n"
       "  --runtime TEXT      recorded as the annotation org.weightcache.runtime\n"
       "  --cpu-profile TEXT  recorded as the annotation org.weightcache.cpu-profile\n"
       "  --model-file PATH   the source model: its SHA-256 and base name are recorded\n"
       "  --arch ARCH         the image config's architecture (default: this build's)\n"
       "  --force             replace OCI_DIR if it exists (an image layout or an empty directory)\n"
       "  --json              one JSON object instead of text\n"},
      {"artifact unpack", 2, {"--json"}, {"--tag"},
       "usage: weightcache artifact unpack [--tag TAG] [--json] OCI_DIR SET_DIR\n"
       "\n"
       "Reads the artifact TAG names in the OCI image layout OCI_DIR (without --tag: its only one),\n"
       "checks every blob against its digest and size, the media types of the config and the layer,\n"
       "the layer's tar (one regular file with a plain name ending in .wcache, then the end-of-archive\n"
       "marker), the file's SHA-256, size, format version and compatibility key hash (and the readable\n"
       "key, when recorded) against the manifest, and the file as 'verify' does; then writes it\n"
       "read-only (0444) as SET_DIR/NAME (SET_DIR is created if missing). On any mismatch it exits 1\n"
       "and writes nothing; 3 when OCI_DIR has no oci-layout or index.json that is a regular file.\n"
       "\n"
       "  --tag TAG  the manifest to read (its org.opencontainers.image.ref.name)\n"
       "  --json     one JSON object instead of text\n"},
      {"artifact show", 1, {"--json"}, {"--tag"},
       "usage: weightcache artifact show [--tag TAG] [--json] OCI_DIR\n"
       "\n"
       "Prints the digest of the manifest TAG names in OCI_DIR (without --tag: its only one), after\n"
       "checking the manifest against it, and the manifest's annotations.\n"
       "\n"
       "  --tag TAG  the manifest to read (its org.opencontainers.image.ref.name)\n"
       "  --json     one JSON object instead of text\n"},
  };
  return kCommands;
}

struct Args {
  std::set<std::string> flags;
  std::map<std::string, std::string> values;
  std::vector<std::string> positional;

  std::optional<std::string> value(const char* name) const {
    const auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional(it->second);
  }
  bool flag(const char* name) const { return flags.count(name) != 0; }
};

constexpr const char* kArtifactHelp =
    "usage: weightcache artifact pack [OPTIONS] CACHE OCI_DIR\n"
    "       weightcache artifact unpack [--tag TAG] [--json] OCI_DIR SET_DIR\n"
    "       weightcache artifact show [--tag TAG] [--json] OCI_DIR\n"
    "\n"
    "A cache file as an OCI image-layout artifact, for registries (through skopeo) and Kubernetes\n"
    "image volumes. Run 'weightcache artifact SUBCOMMAND --help' for a subcommand's options.\n";

int usage_error(const std::string& msg, const char* cmd) {
  std::fprintf(stderr, "weightcache: %s\n", msg.c_str());
  std::fprintf(stderr, "Run 'weightcache %s--help' for usage.\n", cmd ? (std::string(cmd) + " ").c_str() : "");
  return kExitUsage;
}

void say_error(const std::string& msg) { std::fprintf(stderr, "weightcache: %s\n", msg.c_str()); }

bool write_all(std::FILE* out, const void* p, std::size_t n) { return std::fwrite(p, 1, n, out) == n; }

void print(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

std::string u64s(std::uint64_t v) { return std::to_string(v); }

// One JSON document on one line. A string that is not valid UTF-8 (a path is whatever bytes the
// filesystem holds) has each invalid byte replaced by U+FFFD, so the output is always valid
// JSON; keys never need it (display_key shows a key that is not printable ASCII in hex).
void print_json(const Json& j) { print(j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n"); }

Json optional_string(const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); }

// A read of FILE that failed: says why and gives the exit code. Running out of memory says
// nothing about the file: it is exit 5 with the one message every command gives for it.
int read_failed(const std::string& path, const Error& e) {
  if (e.code == Errc::no_memory) {
    say_error("out of memory");
    return kExitIo;
  }
  say_error("cannot read '" + path + "': " + e.message);
  return kExitCannotRead;
}

// Opens and inspects FILE; on failure prints why and returns the exit code in *code.
std::optional<std::pair<inspect::File, Inspection>> load(const std::string& path, int* code) {
  auto f = inspect::File::open(path);
  if (!f) {
    if (f.error().code == Errc::no_memory) {
      *code = read_failed(path, f.error());
    } else {
      say_error(f.error().message);
      *code = kExitCannotRead;
    }
    return std::nullopt;
  }
  auto in = inspect::inspect(f.value());
  if (!in) {
    *code = read_failed(path, in.error());
    return std::nullopt;
  }
  return std::make_pair(std::move(f.value()), std::move(in.value()));
}

// info, ls and cat need an index that verifies.
bool require_index(const std::string& path, const Inspection& in, int* code) {
  if (in.index_usable) return true;
  for (const auto& f : in.findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
  say_error("'" + path + "' has no usable index (run 'weightcache verify " + path + "' for details)");
  *code = kExitCannotRead;
  return false;
}

std::string format_line(const Inspection& in) {
  if (in.format == FileFormat::xpwc)
    return "ExecuTorch XPWC, version " + std::to_string(in.xpwc_version) +
           (in.byte_swapped ? ", big-endian (byte-swapped: written on a big-endian host)" : ", little-endian");
  return "weightcache, format version " + std::to_string(in.header.format_version);
}

int cmd_info(const std::string& path, bool json) {
  int code = kExitOk;
  auto loaded = load(path, &code);
  if (!loaded) return code;
  const Inspection& in = loaded->second;
  if (!require_index(path, in, &code)) return code;
  const bool ours = in.format == FileFormat::weightcache;
  if (json) {
    Json o = {{"file", path},
              {"format", inspect::to_string(in.format)},
              {"version", ours ? in.header.format_version : in.xpwc_version},
              {"byte_order", in.byte_swapped ? "big" : "little"}};
    if (ours) {
      o["compat_hash"] = hex64(in.header.compat_hash);
      o["alignment"] = in.header.alignment;
      o["size_alignment"] = in.header.size_alignment;
      o["sequence"] = in.commit.sequence;
      o["slot"] = in.slot_index;
      o["newest_commit_damaged"] = in.newest_commit_damaged;
    } else {
      for (const char* none : {"compat_hash", "alignment", "size_alignment", "sequence", "slot"}) o[none] = nullptr;
      o["newest_commit_damaged"] = false;
    }
    o["offset_alignment"] = in.offset_alignment();
    o["entries"] = in.entries.size();
    o["payload_bytes"] = in.payload_bytes();
    o["file_bytes"] = in.file_size;
    o["dead_bytes"] = in.dead_bytes();
    o["problems"] = in.problem_count();
    print_json(o);
    return kExitOk;
  }
  std::string o;
  auto line = [&o](const char* label, const std::string& value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%-17s", label);
    o += buf;
    o += value;
    o += '\n';
  };
  line("file:", path);
  line("format:", format_line(in));
  if (ours) {
    line("compat key hash:", hex64(in.header.compat_hash));
    line("alignment:", u64s(in.header.alignment));
    line("size alignment:", u64s(in.header.size_alignment));
    line("commit:", "sequence " + u64s(in.commit.sequence) + " (slot " + u64s(in.slot_index) + ")" +
                        (in.newest_commit_damaged ? "; the newest commit is damaged" : ""));
  } else {
    line("compat key hash:", "none (XPWC files carry no compatibility key)");
    line("alignment:", in.entries.empty()
                           ? std::string("not recorded")
                           : "not recorded (entry offsets are multiples of " + u64s(in.offset_alignment()) + ")");
  }
  line("entries:", u64s(in.entries.size()));
  line("payload bytes:", u64s(in.payload_bytes()));
  line("file bytes:", u64s(in.file_size));
  line("dead bytes:", u64s(in.dead_bytes()));
  if (!in.findings.empty())
    line("problems:", u64s(in.problem_count()) + " (run 'weightcache verify' for details)");
  print(o);
  return kExitOk;
}

int cmd_ls(const std::string& path, bool json) {
  int code = kExitOk;
  auto loaded = load(path, &code);
  if (!loaded) return code;
  const Inspection& in = loaded->second;
  if (!require_index(path, in, &code)) return code;
  if (json) {
    // Written as it is made, one entry at a time: a document of millions of entries is never
    // held in memory (as a Json value it cost ~700 bytes per entry).
    const auto dump = [](const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
    std::string o = "{\"file\":" + dump(path) + ",\"format\":" + dump(inspect::to_string(in.format)) + ",\"entries\":[";
    bool first = true;
    for (const auto& e : in.entries) {
      Json j = {{"key", display_key(e.key)},
                {"offset", e.offset},
                {"size", e.size},
                {"checksum", optional_string(e.checksum ? std::optional(hex64(*e.checksum)) : std::nullopt)}};
      if (in.format == FileFormat::xpwc) {
        j["name"] = display_key(e.name());
        j["seed"] = e.seed ? Json(*e.seed) : Json(nullptr);
      }
      if (!first) o += ',';
      first = false;
      o += dump(j);
      if (o.size() > (1u << 16)) {
        print(o);
        o.clear();
      }
    }
    print(o + "]}\n");
    return kExitOk;
  }
  std::string o;
  for (const auto& e : in.entries) {
    o += display_key(e.key) + "\t" + u64s(e.offset) + "\t" + u64s(e.size) + "\t" +
         (e.checksum ? hex64(*e.checksum) : std::string("-")) + "\n";
    if (o.size() > (1u << 16)) {
      print(o);
      o.clear();
    }
  }
  print(o);
  return kExitOk;
}

int cmd_verify(const std::string& path, bool json, const std::optional<std::string>& compat_key) {
  int code = kExitOk;
  auto loaded = load(path, &code);
  if (!loaded) return code;
  Inspection& in = loaded->second;
  if (compat_key) inspect::check_compat_key(&in, *compat_key);
  std::uint64_t hashed = 0;
  {
    Progress progress("verifying", in.payload_bytes());
    auto r = inspect::check_checksums(loaded->first, &in, progress.callback());
    if (!r) {
      progress.finish();
      return read_failed(path, r.error());
    }
    hashed = r.value();
  }
  const bool ok = in.findings.empty();
  const std::uint64_t problem_count = in.problem_count();
  if (json) {
    Json problems = Json::array();
    for (const auto& f : in.findings) {
      Json p = {{"kind", f.kind}};
      if (f.key) p["key"] = display_key(*f.key);
      p["message"] = f.message;
      if (f.unlisted != 0) p["unlisted"] = f.unlisted;
      problems.push_back(std::move(p));
    }
    print_json({{"file", path},
                {"format", inspect::to_string(in.format)},
                {"ok", ok},
                {"entries", in.entries.size()},
                {"checksummed_bytes", hashed},
                {"problem_count", problem_count},
                {"problems", std::move(problems)}});
    return ok ? kExitOk : kExitProblems;
  }
  std::string o;
  for (const auto& f : in.findings) o += path + ": " + f.message + "\n";
  if (ok) {
    o += path + ": OK (" + format_line(in) + "; " + u64s(in.entries.size()) + " entries, ";
    o += in.format == FileFormat::xpwc ? "structure and bounds checked; XPWC files have no checksums)\n"
                                       : u64s(hashed) + " bytes checksummed)\n";
  } else {
    o += path + ": " + u64s(problem_count) + (problem_count == 1 ? " problem" : " problems") + " found\n";
  }
  print(o);
  return ok ? kExitOk : kExitProblems;
}

int cmd_cat(const std::string& path, const std::string& key_arg) {
  const auto key = inspect::parse_key(key_arg);
  if (!key) return usage_error("KEY '" + key_arg + "' starts with 0x but is not an even number of hex digits", "cat");
  int code = kExitOk;
  auto loaded = load(path, &code);
  if (!loaded) return code;
  const Inspection& in = loaded->second;
  if (!require_index(path, in, &code)) return code;
  const inspect::Entry* e = nullptr;
  for (const auto& x : in.entries)
    if (x.key == *key) e = &x;
  if (e == nullptr) {
    say_error("no entry with key '" + display_key(*key) + "' in '" + path + "'");
    return kExitProblems;
  }
  if (!e->in_bounds) {
    say_error("entry '" + display_key(*key) + "' lies outside the file's data area; nothing written");
    return kExitProblems;
  }
  // Check first, then write: a damaged entry must produce no output at all. The second read of
  // a large entry comes from the page cache.
  if (e->checksum) {
    auto h = inspect::hash_range(loaded->first, e->offset, e->size);
    if (!h) return read_failed(path, h.error());
    if (h.value() != *e->checksum) {
      say_error("entry '" + display_key(*key) + "' fails its checksum (the index says " + hex64(*e->checksum) +
                ", the data hashes to " + hex64(h.value()) + "); nothing written");
      return kExitProblems;
    }
  }
  bool write_failed = false;
  auto sink = [&](const std::byte* p, std::size_t n) -> Result<void> {
    if (!write_all(stdout, p, n)) {
      write_failed = true;
      return Error{Errc::io, errno, "write to stdout failed"};
    }
    return {};
  };
  auto h = inspect::hash_range(loaded->first, e->offset, e->size, {}, sink);
  if (write_failed || std::fflush(stdout) != 0) {
    say_error(std::string("cannot write to stdout: ") + std::strerror(errno));
    return kExitIo;
  }
  if (!h) return read_failed(path, h.error());
  if (e->checksum && h.value() != *e->checksum) {
    say_error("entry '" + display_key(*key) + "' changed while it was being written");
    return kExitProblems;
  }
  return kExitOk;
}

std::optional<std::uint64_t> parse_alignment(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const std::uint64_t v = std::stoull(s);
  if (v == 0 || (v & (v - 1)) != 0 || v > kMaxAlignment) return std::nullopt;
  return v;
}

// SIZE of --max-size: decimal digits, then an optional K, M or G (powers of 1024).
std::optional<std::uint64_t> parse_size(const std::string& s) {
  if (s.empty()) return std::nullopt;
  unsigned shift = 0;
  switch (s.back()) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    default: break;
  }
  const std::string digits = s.substr(0, s.size() - (shift != 0 ? 1 : 0));
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : digits) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  if (v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

// "2026-11-24T13:00:01.123456789Z" (UTC).
std::string utc_time(std::int64_t ns) {
  const std::int64_t sec = ns >= 0 ? ns / 1000000000 : (ns - 999999999) / 1000000000;
  const auto frac = static_cast<long>(ns - sec * 1000000000);
  const std::time_t t = static_cast<std::time_t>(sec);
  const std::tm* tm = std::gmtime(&t);
  if (tm == nullptr) return "unknown";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09ldZ", tm->tm_year + 1900, tm->tm_mon + 1,
                tm->tm_mday, tm->tm_hour, tm->tm_min, tm->tm_sec, frac);
  return buf;
}

std::string bytes_and_human(std::uint64_t n) { return u64s(n) + " bytes (" + human_bytes(n) + ")"; }

int cmd_gc(const std::string& dir, const std::string& size_arg, bool json) {
  const auto max_bytes = parse_size(size_arg);
  if (!max_bytes)
    return usage_error("--max-size must be a number of bytes, optionally followed by K, M or G: '" + size_arg + "'",
                       "gc");
  auto r = gc(dir, *max_bytes);
  if (!r) {
    say_error(r.error().message);
    switch (r.error().code) {
      case Errc::invalid_argument: return kExitUsage;
      case Errc::io: return kExitCannotRead;
      default: return kExitIo;
    }
  }
  const GcReport& g = r.value();
  const int code = g.within_budget() ? kExitOk : g.kept_in_use != 0 ? kExitBusy : kExitIo;
  if (json) {
    Json files = Json::array();
    for (const GcFile& f : g.files)
      files.push_back({{"path", f.path},
                       {"bytes", f.bytes},
                       {"last_used", utc_time(f.last_used_ns)},
                       {"action", f.removed ? "removed" : "kept"},
                       {"reason", to_string(f.reason)},
                       {"detail", optional_string(f.detail.empty() ? std::nullopt : std::optional(f.detail))}});
    print_json({{"dir", dir},
                {"max_bytes", g.max_bytes},
                {"total_before", g.total_before},
                {"total_after", g.total_after},
                {"within_budget", g.within_budget()},
                {"removed_files", g.removed_files},
                {"removed_bytes", g.removed_bytes},
                {"kept_files", g.kept_files},
                {"kept_bytes", g.kept_bytes},
                {"kept_in_use", g.kept_in_use},
                {"kept_in_use_bytes", g.kept_in_use_bytes},
                {"kept_unremovable", g.kept_unremovable},
                {"kept_unremovable_bytes", g.kept_unremovable_bytes},
                {"removed_temporaries", g.removed_temporaries},
                {"removed_temporary_bytes", g.removed_temporary_bytes},
                {"files", std::move(files)}});
    return code;
  }
  std::string o;
  for (const GcFile& f : g.files) {
    std::string why = f.reason == GcReason::least_recently_used ? "least recently used"
                      : f.reason == GcReason::within_budget     ? "within budget"
                      : f.reason == GcReason::in_use            ? "in use"
                      : f.reason == GcReason::not_writable      ? "not writable"
                      : f.reason == GcReason::changed           ? "changed meanwhile"
                                                                : "failed";
    if (!f.detail.empty()) why += ": " + f.detail;
    o += std::string(f.removed ? "removed " : "kept    ") + f.path + "  (" + human_bytes(f.bytes) + ", last used " +
         utc_time(f.last_used_ns) + ")  " + why + "\n";
  }
  if (g.removed_temporaries != 0)
    o += "removed " + u64s(g.removed_temporaries) + " temporary files of dead writers (" +
         human_bytes(g.removed_temporary_bytes) + ")\n";
  o += "caches: " + u64s(g.files.size()) + ", removed " + u64s(g.removed_files) + ", kept " + u64s(g.kept_files) +
       (g.kept_in_use != 0 ? " (" + u64s(g.kept_in_use) + " in use)" : std::string()) + "\n";
  o += "total before: " + bytes_and_human(g.total_before) + "\n";
  o += "total after:  " + bytes_and_human(g.total_after) + "\n";
  o += "budget:       " + bytes_and_human(g.max_bytes) +
       (g.within_budget() ? ": within budget\n"
                          : g.kept_in_use != 0 ? ": still over budget, because files in use were kept\n"
                                               : ": still over budget, because files could not be removed\n");
  print(o);
  return code;
}

int run_artifact(const std::string& c, const Args& args) {
#if !defined(WEIGHTCACHE_CLI_ARTIFACT)
  (void)args;
  say_error("this build has no '" + c + "': it was built without OpenSSL's libcrypto (SHA-256)");
  return kExitUsage;
#else
  const auto& p = args.positional;
  if (c == "artifact pack") {
    PackOptions o;
    if (auto tag = args.value("--tag")) o.tag = *tag;
    o.name = args.value("--name");
    o.compat_key = args.value("--compat-key");
    o.runtime = args.value("--runtime");
    o.cpu_profile = args.value("--cpu-profile");
    o.model_file = args.value("--model-file");
    o.arch = args.value("--arch");
    o.force = args.flag("--force");
    o.json = args.flag("--json");
    return run_artifact_pack(p[0], p[1], o);
  }
  UnpackOptions o;
  o.tag = args.value("--tag");
  o.json = args.flag("--json");
  return c == "artifact unpack" ? run_artifact_unpack(p[0], p[1], o) : run_artifact_show(p[0], o);
#endif
}

int run(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) {
    std::fputs(kMainHelp, stderr);
    std::fputs(kExitCodesHelp, stderr);
    return kExitUsage;
  }
  if (a[0] == "--help" || a[0] == "-h" || a[0] == "help") {
    std::fputs(kMainHelp, stdout);
    std::fputs(kExitCodesHelp, stdout);
    return kExitOk;
  }
  if (a[0] == "--version") {
    std::printf("weightcache %s\n", wc_version());
    return kExitOk;
  }
  // `artifact` groups subcommands: "artifact pack" and so on are commands of their own.
  std::string name = a[0];
  std::size_t first = 1;
  if (name == "artifact") {
    if (a.size() < 2) return usage_error("artifact needs a subcommand: pack, unpack or show", "artifact");
    if (a[1] == "--help" || a[1] == "-h") {
      std::fputs(kArtifactHelp, stdout);
      return kExitOk;
    }
    name += " " + a[1];
    first = 2;
  }
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (name == c.name) cmd = &c;
  if (cmd == nullptr) return usage_error("unknown command '" + name + "'", nullptr);

  Args args;
  bool options_done = false;
  for (std::size_t i = first; i < a.size(); ++i) {
    const std::string& s = a[i];
    if (options_done || s.size() < 2 || s[0] != '-') {
      args.positional.push_back(s);
      continue;
    }
    if (s == "--") {
      options_done = true;
      continue;
    }
    if (s == "--help" || s == "-h") {
      std::fputs(cmd->help, stdout);
      std::fputs("\n", stdout);
      std::fputs(kExitCodesHelp, stdout);
      return kExitOk;
    }
    const auto eq = s.find('=');
    const std::string name = s.substr(0, eq);
    if (cmd->flags.count(name) != 0 && eq == std::string::npos) {
      args.flags.insert(name);
    } else if (cmd->valued.count(name) != 0) {
      if (eq != std::string::npos) {
        args.values[name] = s.substr(eq + 1);
      } else if (i + 1 < a.size()) {
        args.values[name] = a[++i];
      } else {
        return usage_error("option " + name + " needs a value", cmd->name);
      }
    } else {
      return usage_error("unknown option '" + s + "' for " + cmd->name, cmd->name);
    }
  }
  if (args.positional.size() != cmd->positional)
    return usage_error(std::string(cmd->name) + " takes " + std::to_string(cmd->positional) +
                           (cmd->positional == 1 ? " argument" : " arguments") + ", got " +
                           std::to_string(args.positional.size()),
                       cmd->name);

  const bool json = args.flags.count("--json") != 0;
  const auto& p = args.positional;
  const std::string c = cmd->name;
  if (c == "info") return cmd_info(p[0], json);
  if (c == "ls") return cmd_ls(p[0], json);
  if (c == "verify") {
    std::optional<std::string> key;
    if (auto it = args.values.find("--compat-key"); it != args.values.end()) key = it->second;
    return cmd_verify(p[0], json, key);
  }
  if (c == "cat") return cmd_cat(p[0], p[1]);
  if (c == "gc") {
    const auto it = args.values.find("--max-size");
    if (it == args.values.end()) return usage_error("gc needs --max-size SIZE", "gc");
    return cmd_gc(p[0], it->second, json);
  }
  if (c.rfind("artifact ", 0) == 0) return run_artifact(c, args);
  if (c == "compact") {
    CompactOptions o;
    if (auto it = args.values.find("--compat-key"); it != args.values.end()) o.compat_key = it->second;
    o.drop_corrupt = args.flags.count("--drop-corrupt") != 0;
    o.canonical = args.flags.count("--canonical") != 0;
    return run_compact(p[0], o);
  }
  ConvertOptions o;
  if (auto it = args.values.find("--compat-key"); it != args.values.end()) o.compat_key = it->second;
  if (auto it = args.values.find("--alignment"); it != args.values.end()) {
    const auto v = parse_alignment(it->second);
    if (!v) return usage_error("--alignment must be a power of two from 1 to 16777216", "convert");
    o.alignment = *v;
  }
  o.force = args.flags.count("--force") != 0;
  return run_convert(p[0], p[1], o);
}

}  // namespace
}  // namespace weightcache::cli

int main(int argc, char** argv) {
  // The library reports its own failures through the errors we print; keep its logger quiet
  // unless the user asked for it.
  if (std::getenv("WEIGHTCACHE_LOG_LEVEL") == nullptr) weightcache::set_log_level(weightcache::LogLevel::off);
  try {
    return weightcache::cli::run(argc, argv);
  } catch (const std::bad_alloc&) {
    // Nothing here may end in std::terminate: out of memory is an exit code like any failure.
    std::fputs("weightcache: out of memory\n", stderr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcache: unexpected failure: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "weightcache: unexpected failure\n");
  }
  return weightcache::cli::kExitIo;
}
