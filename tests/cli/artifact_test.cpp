// `weightcache artifact pack | unpack | show`, run as a child process (WEIGHTCACHE_CLI_PATH) on
// caches made through the public C API: the layout they write against the OCI image spec's rules,
// that its digests depend on the entries and not on the order they were inserted in, and that
// unpack refuses every altered layout, writing nothing. Altered layouts are made here byte by
// byte (a tar writer of the test's own, so that the tool's is not checked against itself), and
// re-chained (blobs renamed, digests fixed up from the layer to index.json) where the test wants
// the descriptor chain consistent so that only the altered content is at fault.
#include "random_bytes.hpp"
#include "sha256.hpp"
#include "tar.hpp"
#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <weightcache/weightcache.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using weightcache::cli::sha256_digest;
using weightcache::test::ToolRun;

constexpr const char* kKey = "model-a|avx2|packer-1";
constexpr const char* kFileSha = "org.weightcache.file.sha256";
constexpr const char* kCompatHash = "org.weightcache.compat-key.xxh3";
constexpr const char* kCompatKey = "org.weightcache.compat-key";
constexpr const char* kFileSize = "org.weightcache.file.size";
constexpr const char* kFormat = "org.weightcache.format";

std::string slurp(const std::string& path) { return weightcache::test::slurp(path); }

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string pattern(std::size_t n, unsigned seed) { return weightcache::test::random_bytes(seed, n); }

using Entries = std::vector<std::pair<std::string, std::string>>;

Entries some_entries() {
  Entries e;
  for (int i = 0; i < 40; ++i)
    e.emplace_back("layer." + std::to_string(i) + ".weight", pattern(100 + 613 * i % 9000, i));
  return e;
}

// Every file under `root`, as paths relative to it.
std::vector<std::string> files_under(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator(); ++it)
    if (!it->is_directory()) out.push_back(fs::relative(it->path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- tar members written by hand ---------------------------------------------------------------
struct TarMember {
  std::string name;
  std::string data;
  char type = '0';
  std::string prefix;  // the ustar prefix field (a directory part of the path)
};

// A POSIX ustar header, field by field (POSIX.1-2001, pax "ustar Interchange Format").
std::string ustar_header(const TarMember& m) {
  std::string h(512, '\0');
  auto put = [&](std::size_t off, const std::string& s) { h.replace(off, s.size(), s); };
  auto octal = [](std::uint64_t v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%0*llo", digits, static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  put(0, m.name.substr(0, 100));
  put(100, octal(0444, 7));
  put(108, octal(0, 7));
  put(116, octal(0, 7));
  put(124, octal(m.data.size(), 11));
  put(136, octal(0, 11));
  h[156] = m.type;
  put(257, std::string("ustar\0"
                       "00",
                       8));
  put(345, m.prefix);
  put(148, "        ");
  unsigned sum = 0;
  for (const unsigned char c : h) sum += c;
  put(148, octal(sum, 6));
  h[154] = '\0';
  h[155] = ' ';
  return h;
}

std::string tar_of(const std::vector<TarMember>& members) {
  std::string t;
  for (const auto& m : members) {
    t += ustar_header(m) + m.data;
    t.append((512 - m.data.size() % 512) % 512, '\0');
  }
  t.append(1024, '\0');
  return t;
}

// ---- a layout, edited and re-chained -----------------------------------------------------------
std::string blob_file(const std::string& layout, const std::string& digest) {
  return layout + "/blobs/sha256/" + digest.substr(7);
}

struct Layout {
  std::string dir;
  Json index, manifest, config;

  static Layout load(const std::string& dir) {
    Layout l;
    l.dir = dir;
    l.index = Json::parse(slurp(dir + "/index.json"));
    l.manifest = Json::parse(slurp(blob_file(dir, l.index["manifests"][0]["digest"])));
    l.config = Json::parse(slurp(blob_file(dir, l.manifest["config"]["digest"])));
    return l;
  }
  std::string manifest_digest() const { return index["manifests"][0]["digest"]; }
  std::string layer_path() const { return blob_file(dir, manifest["layers"][0]["digest"]); }

  // A blob with these bytes, under its digest; returns the digest.
  std::string put_blob(const std::string& bytes) const {
    const std::string d = sha256_digest(bytes);
    spit(blob_file(dir, d), bytes);
    return d;
  }
  // Makes `tar` the layer, and the config, manifest and index name it again.
  void set_layer(const std::string& tar) {
    const std::string d = put_blob(tar);
    manifest["layers"][0]["digest"] = d;
    manifest["layers"][0]["size"] = tar.size();
    config["rootfs"]["diff_ids"] = Json::array({d});
  }
  // Writes config, manifest and index.json as they are now, each digest fixed up.
  void store() {
    const std::string c = config.dump();
    manifest["config"]["digest"] = put_blob(c);
    manifest["config"]["size"] = c.size();
    const std::string m = manifest.dump();
    index["manifests"][0]["digest"] = put_blob(m);
    index["manifests"][0]["size"] = m.size();
    spit(dir + "/index.json", index.dump());
  }
};

void flip_byte(const std::string& path, std::size_t offset) {
  std::string b = slurp(path);
  ASSERT_LT(offset, b.size());
  b[offset] = static_cast<char>(b[offset] ^ 0x20);
  spit(path, b);
}

// Runs a shell command (another program: skopeo, tar) with its output in a file of `dir`. Paths
// in it must be quoted by the caller.
struct ShellRun {
  int code = -1;
  std::string out;
};
ShellRun shell(const weightcache::test::TempDir& dir, const std::string& command) {
  const std::string out = dir.file("shell.out");
  const int status = std::system((command + " >'" + out + "' 2>&1").c_str());
  return {status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out)};
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

// ---- the fixture --------------------------------------------------------------------------------
class ArtifactTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  ToolRun tool(const std::vector<std::string>& args) {
    return weightcache::test::run_tool(dir_, WEIGHTCACHE_CLI_PATH, args);
  }

  // `tool`, for a run that could hang (a FIFO in the layout): killed after `seconds`, and then
  // reported as exit -1 with "still running" in its err.
  ToolRun tool_within(const std::vector<std::string>& args, int seconds) {
    const std::string tag = std::to_string(bounded_runs_++);
    const std::string out = path("bounded" + tag + ".out"), err = path("bounded" + tag + ".err");
    const pid_t pid = weightcache::test::spawn_to_files(WEIGHTCACHE_CLI_PATH, args, out, err);
    ToolRun r;
    if (pid <= 0) return r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        r.err = "still running after " + std::to_string(seconds) + " s: killed";
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // A cache of `entries` through the C API, inserted in the order given, finalized every
  // `finalize_every` inserts; `replaced`, if not empty, is inserted first and then replaced, so the
  // file holds dead bytes that only compaction removes.
  void make_cache(const std::string& file, const Entries& entries, std::size_t finalize_every = 7,
                  const std::string& key = kKey, bool with_replaced_entry = false) {
    wc_options o;
    wc_options_init(&o);
    o.path = file.c_str();
    o.compat_key = key.data();
    o.compat_key_size = key.size();
    o.backing = WC_BACKING_FILE;
    o.durability = WC_DURABILITY_NONE;  // tests do not need power-loss durability
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    if (with_replaced_entry) {
      const std::string old = pattern(3000, 99);
      ASSERT_NE(wc_look_up_or_insert(c, entries[0].first.data(), entries[0].first.size(), const_cast<char*>(old.data()),
                                     old.size()),
                WC_NOT_FOUND);
      ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& [k, v] = entries[i];
      // Half through a reservation filled in place, half copied: both ways a runtime inserts.
      void* p = i % 2 == 0 ? wc_reserve_space(c, v.size()) : nullptr;
      if (p != nullptr) std::memcpy(p, v.data(), v.size());
      const size_t off =
          wc_look_up_or_insert(c, k.data(), k.size(), p != nullptr ? p : const_cast<char*>(v.data()), v.size());
      ASSERT_NE(off, WC_NOT_FOUND) << k << ": " << wc_last_error();
      if ((i + 1) % finalize_every == 0) {
        ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
      }
    }
    ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
    wc_close(c);
  }

  // True when the library, opening `file` read-only for `key`, serves every entry's bytes.
  ::testing::AssertionResult library_serves(const std::string& file, const Entries& entries,
                                            const std::string& key = kKey) {
    wc_options o;
    wc_options_init(&o);
    o.path = file.c_str();
    o.compat_key = key.data();
    o.compat_key_size = key.size();
    o.backing = WC_BACKING_FILE;
    o.read_only = 1;
    o.verify = WC_VERIFY_ON_OPEN;
    wc_cache* c = nullptr;
    if (wc_open(&o, &c) != WC_OK) return ::testing::AssertionFailure() << "wc_open: " << wc_last_error();
    for (const auto& [k, v] : entries) {
      const size_t off = wc_look_up(c, k.data(), k.size());
      const void* p = off == WC_NOT_FOUND ? nullptr : wc_offset_to_addr(c, off);
      if (p == nullptr || std::memcmp(p, v.data(), v.size()) != 0) {
        wc_close(c);
        return ::testing::AssertionFailure() << "entry " << k << " missing or different";
      }
    }
    wc_close(c);
    return ::testing::AssertionSuccess();
  }

  // Packs `cache` into `oci` and returns the tool's JSON report (a failure if it did not succeed).
  Json pack(const std::string& cache, const std::string& oci, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"artifact", "pack", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(cache);
    args.push_back(oci);
    const ToolRun r = tool(args);
    EXPECT_EQ(r.code, 0) << r.describe();
    return r.j;
  }

  // `artifact unpack` that must fail with exit 1 naming `what`, leaving no file in SET_DIR.
  void expect_refused(const std::string& oci, const std::string& what, const std::string& why) {
    const std::string set = path("set-" + std::to_string(refusals_++));
    const ToolRun r = tool({"artifact", "unpack", oci, set});
    EXPECT_EQ(r.code, 1) << why << "\n" << r.describe();
    EXPECT_NE(r.err.find(what), std::string::npos) << why << ": the message should name '" << what << "'\n" << r.err;
    EXPECT_FALSE(fs::exists(set)) << why << ": SET_DIR (created by unpack) is left, holding " << files_under(set).size()
                                  << " files";
  }

  // A fresh copy of the layout `from`, to alter.
  std::string copy_of(const std::string& from, const std::string& name) {
    const std::string to = path(name);
    fs::copy(from, to, fs::copy_options::recursive);
    return to;
  }

  weightcache::test::TempDir dir_{"wc-artifact"};
  int refusals_ = 0;
  int bounded_runs_ = 0;
};

// ---- usage -----------------------------------------------------------------------------------------

TEST_F(ArtifactTest, HelpNamesTheSubcommandsAndUsageErrorsExitTwo) {
  ToolRun r = tool({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"artifact pack", "artifact unpack", "artifact show"})
    EXPECT_NE(r.out.find(c), std::string::npos) << c;
  r = tool({"artifact", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: weightcache artifact pack"), std::string::npos) << r.out;
  for (const char* c : {"pack", "unpack", "show"}) {
    r = tool({"artifact", c, "--help"});
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find(std::string("usage: weightcache artifact ") + c), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("exit codes"), std::string::npos) << c;
  }
  EXPECT_EQ(tool({"artifact"}).code, 2);
  EXPECT_EQ(tool({"artifact", "push", path("a"), path("b")}).code, 2);
  EXPECT_EQ(tool({"artifact", "pack", path("a")}).code, 2);
  EXPECT_EQ(tool({"artifact", "unpack", "--force", path("a"), path("b")}).code, 2);
  EXPECT_EQ(tool({"artifact", "show", path("no-such-layout")}).code, 3);
}

// ---- pack, unpack ----------------------------------------------------------------------------------

// The unpacked file is the canonical form of the cache (what `compact --canonical` makes of it),
// byte for byte, read-only, under <compat hash>.wcache, and the library serves every entry of it.
TEST_F(ArtifactTest, UnpackGivesTheCanonicalFileAndTheLibraryServesIt) {
  const Entries entries = some_entries();
  const std::string cache = path("cache.wcache"), canonical = path("canonical.wcache");
  make_cache(cache, entries, 7, kKey, /*with_replaced_entry=*/true);
  fs::copy_file(cache, canonical);
  ASSERT_EQ(tool({"compact", "--canonical", canonical}).code, 0);
  ASSERT_NE(slurp(cache), slurp(canonical)) << "the cache should not already be canonical";

  const Json p = pack(cache, path("oci"), {"--compat-key", kKey});
  const std::string hash = p.at("compat_hash");
  EXPECT_EQ(p.at("file_name"), hash.substr(2) + ".wcache");
  EXPECT_EQ(p.at("file_sha256"), sha256_digest(slurp(canonical)));
  EXPECT_EQ(p.at("file_size"), slurp(canonical).size());

  const ToolRun u = tool({"artifact", "unpack", "--json", path("oci"), path("set/sub")});
  ASSERT_EQ(u.code, 0) << u.describe();
  const std::string unpacked = path("set/sub/" + hash.substr(2) + ".wcache");
  EXPECT_EQ(u.j.at("path"), unpacked);
  EXPECT_EQ(u.j.at("compat_hash"), hash);
  EXPECT_EQ(u.j.at("manifest_digest"), p.at("manifest_digest"));
  EXPECT_TRUE(slurp(unpacked) == slurp(canonical)) << "the unpacked file is not the canonical form";
  struct stat st {};
  ASSERT_EQ(::stat(unpacked.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  EXPECT_EQ(files_under(path("set/sub")), std::vector<std::string>{hash.substr(2) + ".wcache"});
  EXPECT_TRUE(library_serves(unpacked, entries));
  // The source is untouched: pack works on a copy.
  EXPECT_TRUE(library_serves(cache, entries));
}

// What the layout holds, document by document, against the image spec and the artifact's rules.
TEST_F(ArtifactTest, TheLayoutHoldsWhatTheImageSpecAsksAndNoTimestamp) {
  const Entries entries = some_entries();
  const std::string cache = path("cache.wcache"), model = path("model.onnx");
  const std::string key = "key\x01\x02";  // not printable: recorded in hex
  make_cache(cache, entries, 7, key);
  spit(model, pattern(50000, 7));
  const Json p = pack(cache, path("oci"),
                      {"--tag", "ort-1.20-avx2", "--runtime", "onnxruntime 1.20", "--cpu-profile", "x86-64-v3",
                       "--model-file", model, "--compat-key", key, "--arch", "arm64"});
  ASSERT_FALSE(p.is_null());
  // Exactly the layout's files: nothing left of the copy, the tar or a temporary.
  const Layout l = Layout::load(path("oci"));
  const std::string layer = l.manifest["layers"][0]["digest"], config = l.manifest["config"]["digest"];
  std::vector<std::string> expected = {"blobs/sha256/" + l.manifest_digest().substr(7),
                                       "blobs/sha256/" + layer.substr(7), "blobs/sha256/" + config.substr(7),
                                       "index.json", "oci-layout"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files_under(path("oci")), expected);
  std::vector<std::string> beside;
  for (const auto& e : fs::directory_iterator(dir_.path())) beside.push_back(e.path().filename().string());
  EXPECT_EQ(std::count_if(beside.begin(), beside.end(),
                          [](const std::string& n) { return n.find(".tmp") != std::string::npos; }),
            0);

  EXPECT_EQ(slurp(path("oci/oci-layout")), R"({"imageLayoutVersion":"1.0.0"})");
  // Every document is compact JSON with sorted keys: the bytes a parse-and-dump gives back.
  for (const std::string& doc :
       {slurp(path("oci/index.json")), slurp(blob_file(l.dir, l.manifest_digest())), slurp(blob_file(l.dir, config))}) {
    EXPECT_EQ(Json::parse(doc).dump(), doc);
    EXPECT_EQ(doc.find("created"), std::string::npos) << doc;
  }
  EXPECT_EQ(l.index["schemaVersion"], 2);
  EXPECT_EQ(l.index["mediaType"], "application/vnd.oci.image.index.v1+json");
  ASSERT_EQ(l.index["manifests"].size(), 1u);
  EXPECT_EQ(l.index["manifests"][0]["mediaType"], "application/vnd.oci.image.manifest.v1+json");
  EXPECT_EQ(l.index["manifests"][0]["annotations"], Json({{"org.opencontainers.image.ref.name", "ort-1.20-avx2"}}));
  EXPECT_EQ(l.manifest_digest(), p.at("manifest_digest"));
  EXPECT_EQ(sha256_digest(slurp(blob_file(l.dir, l.manifest_digest()))), l.manifest_digest());

  EXPECT_EQ(l.config, Json::parse(R"({"architecture":"arm64","os":"linux","config":{},
                                       "rootfs":{"type":"layers","diff_ids":[")" +
                                  layer + R"("]}})"));
  EXPECT_EQ(l.manifest["schemaVersion"], 2);
  EXPECT_EQ(l.manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
  EXPECT_EQ(l.manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
  const std::string name = p.at("file_name");
  EXPECT_EQ(l.manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
  EXPECT_EQ(l.manifest["layers"][0]["annotations"], Json({{"org.opencontainers.image.title", name}}));
  const std::string hash = p.at("compat_hash");
  const Json want = {{"org.weightcache.compat-key.xxh3", hash},
                     {"org.weightcache.compat-key", "hex:6b65790102"},
                     {"org.weightcache.runtime", "onnxruntime 1.20"},
                     {"org.weightcache.cpu-profile", "x86-64-v3"},
                     {"org.weightcache.model.sha256", sha256_digest(slurp(model))},
                     {"org.weightcache.model.name", "model.onnx"},
                     {"org.weightcache.file.name", name},
                     {"org.weightcache.file.sha256", p.at("file_sha256")},
                     {"org.weightcache.file.size", std::to_string(p.at("file_size").get<std::uint64_t>())},
                     {"org.weightcache.format", "1"}};
  EXPECT_EQ(l.manifest["annotations"], want);

  // The layer: one ustar member, mode 0444, owner 0:0, mtime 0, then the file, padding, 2 zero blocks.
  const std::string tar = slurp(l.layer_path());
  EXPECT_EQ(sha256_digest(tar), layer);
  const std::uint64_t size = p.at("file_size");
  ASSERT_EQ(tar.size(), 512 + size + (512 - size % 512) % 512 + 1024);
  EXPECT_EQ(tar.substr(0, name.size() + 1), name + std::string(1, '\0'));
  EXPECT_EQ(tar.substr(100, 8), std::string("0000444\0", 8));
  EXPECT_EQ(tar.substr(108, 16), std::string("0000000\0"
                                             "0000000\0",
                                             16));
  EXPECT_EQ(tar.substr(136, 12), std::string("00000000000\0", 12));
  EXPECT_EQ(tar[156], '0');
  EXPECT_EQ(tar.substr(257, 8), std::string("ustar\0"
                                            "00",
                                            8));
  EXPECT_EQ(sha256_digest(tar.substr(512, size)), p.at("file_sha256"));
  EXPECT_EQ(tar.substr(tar.size() - 1024), std::string(1024, '\0'));

  // `show` prints the same annotations, once the manifest matched its digest.
  const ToolRun s = tool({"artifact", "show", "--json", path("oci")});
  ASSERT_EQ(s.code, 0) << s.describe();
  EXPECT_EQ(s.j.at("manifest_digest"), l.manifest_digest());
  EXPECT_EQ(s.j.at("tag"), "ort-1.20-avx2");
  EXPECT_EQ(s.j.at("annotations"), want);
}

// Two packs of one cache, and packs of two caches filled in different orders, give one manifest
// digest; what is not in the manifest (the tag) changes none of its bytes.
TEST_F(ArtifactTest, TheSameEntriesGiveTheSameManifestDigestWhateverTheOrder) {
  Entries entries = some_entries();
  const std::string a = path("a.wcache"), b = path("b.wcache");
  make_cache(a, entries, 7);
  std::reverse(entries.begin(), entries.end());
  make_cache(b, entries, 3, kKey, /*with_replaced_entry=*/true);
  ASSERT_NE(slurp(a), slurp(b)) << "the two caches should differ before canonicalisation";

  const std::string first = pack(a, path("a1")).at("manifest_digest");
  EXPECT_EQ(pack(a, path("a2")).at("manifest_digest"), first) << "packing the same cache twice differs";
  EXPECT_EQ(pack(b, path("b1")).at("manifest_digest"), first) << "another insertion order gives another digest";
  EXPECT_EQ(files_under(path("a1")), files_under(path("b1")));
  EXPECT_EQ(pack(a, path("a3"), {"--tag", "v2"}).at("manifest_digest"), first) << "the tag is not the manifest's";
  // What the manifest records does change it, but not the layer.
  const Json other = pack(a, path("a4"), {"--runtime", "xnnpack"});
  EXPECT_NE(other.at("manifest_digest"), first);
  EXPECT_EQ(other.at("layer_digest"), Layout::load(path("a1")).manifest["layers"][0]["digest"]);
}

// ---- altered layouts -------------------------------------------------------------------------------

// One byte changed anywhere, or a manifest whose recorded sha256 was changed and its digest fixed up
// in index.json: unpack exits 1, names what did not match, and writes nothing.
TEST_F(ArtifactTest, UnpackRefusesATamperedLayoutAndWritesNothing) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  const Json p = pack(path("cache.wcache"), good);
  ASSERT_FALSE(p.is_null());
  const std::uint64_t layer_size = p.at("layer_size");

  {  // A byte in the middle of the layer blob.
    const std::string o = copy_of(good, "mid");
    flip_byte(Layout::load(o).layer_path(), layer_size / 2);
    expect_refused(o, "does not match its digest", "flipped byte in the layer's data");
  }
  {  // A byte of the tar header (inside the member's name).
    const std::string o = copy_of(good, "header");
    flip_byte(Layout::load(o).layer_path(), 3);
    expect_refused(o, "does not match its digest", "flipped byte in the tar header");
  }
  {  // The same in the data, with the chain fixed up: the file's own sha256 does not match.
    const std::string o = copy_of(good, "mid-rechained");
    Layout l = Layout::load(o);
    std::string tar = slurp(l.layer_path());
    tar[layer_size / 2] ^= 0x20;
    l.set_layer(tar);
    l.store();
    expect_refused(o, kFileSha, "flipped data byte, chain fixed up");
  }
  {  // The tar header's mtime, with the chain fixed up: the header checksum does not match.
    const std::string o = copy_of(good, "header-rechained");
    Layout l = Layout::load(o);
    std::string tar = slurp(l.layer_path());
    tar[140] = '1';
    l.set_layer(tar);
    l.store();
    expect_refused(o, "header checksum", "altered tar header, chain fixed up");
  }
  {  // The manifest's file.sha256 changed, and the manifest digest fixed up in index.json.
    const std::string o = copy_of(good, "annotation");
    Layout l = Layout::load(o);
    l.manifest["annotations"][kFileSha] = sha256_digest("something else");
    l.store();
    expect_refused(o, kFileSha, "manifest annotation file.sha256 changed, index fixed up");
  }
  {  // The compat key hash the manifest records, chain fixed up.
    const std::string o = copy_of(good, "compat");
    Layout l = Layout::load(o);
    l.manifest["annotations"][kCompatHash] = "0x0123456789abcdef";
    l.store();
    expect_refused(o, "compatibility key hash", "manifest compat hash changed, index fixed up");
  }
  {  // The manifest changed but index.json not fixed up.
    const std::string o = copy_of(good, "manifest");
    Layout l = Layout::load(o);
    l.manifest["annotations"][kFileSha] = sha256_digest("something else");
    spit(blob_file(o, l.manifest_digest()), l.manifest.dump());
    expect_refused(o, "does not match its digest", "manifest changed under its digest");
  }
  {  // The config changed under its digest.
    const std::string o = copy_of(good, "config");
    Layout l = Layout::load(o);
    l.config["architecture"] = "s390x";
    spit(blob_file(o, l.manifest["config"]["digest"]), l.config.dump());
    expect_refused(o, "does not match its digest", "config changed under its digest");
  }
  {  // A layer cut short (its size no longer the descriptor's).
    const std::string o = copy_of(good, "short");
    const std::string layer = Layout::load(o).layer_path();
    spit(layer, slurp(layer).substr(0, layer_size - 512));
    expect_refused(o, "descriptor says", "layer cut short");
  }
  {  // A digest that is not a sha256 digest must never become a path.
    const std::string o = copy_of(good, "digest-path");
    Layout l = Layout::load(o);
    l.index["manifests"][0]["digest"] = "sha256:../../../etc/passwd";
    spit(o + "/index.json", l.index.dump());
    expect_refused(o, "only sha256", "a digest that names another path");
  }
  // The untouched layout still unpacks.
  EXPECT_EQ(tool({"artifact", "unpack", good, path("set-good")}).code, 0);
}

// The layer must hold exactly one regular file whose name is a plain .wcache file name.
TEST_F(ArtifactTest, UnpackRefusesAMemberThatIsNotOnePlainWcacheFile) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  const Json p = pack(path("cache.wcache"), good);
  ASSERT_FALSE(p.is_null());
  const std::string tar = slurp(Layout::load(good).layer_path());
  const std::string bytes = tar.substr(512, p.at("file_size").get<std::size_t>());
  const std::string name = p.at("file_name");

  struct Case {
    const char* why;
    std::vector<TarMember> members;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a parent-directory name", {{"../x.wcache", bytes}}, "not a plain file name"},
      {"a name in a subdirectory", {{"a/b.wcache", bytes}}, "not a plain file name"},
      {"an absolute name", {{"/abs.wcache", bytes}}, "not a plain file name"},
      {"a name not ending in .wcache", {{"x.bin", bytes}}, "not a plain file name"},
      {"a directory in the ustar prefix", {{name, bytes, '0', "a"}}, "directory prefix"},
      {"a symbolic link", {{name, "", '2'}}, "symbolic link"},
      {"a pax header first", {{"PaxHeaders/x", "26 path=../../evil.wcache\n", 'x'}, {name, bytes}}, "pax"},
      {"two members", {{name, bytes}, {"second.wcache", "x"}}, "more than one member"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string o = copy_of(good, "case" + std::to_string(i));
    Layout l = Layout::load(o);
    l.set_layer(tar_of(cases[i].members));
    l.store();
    expect_refused(o, cases[i].message, cases[i].why);
  }
  EXPECT_FALSE(fs::exists(path("x.wcache")));
  EXPECT_FALSE(fs::exists(path("evil.wcache")));
  // The test's own tar of the right member is accepted: the refusals above are the names' and types'.
  const std::string o = copy_of(good, "handmade");
  Layout l = Layout::load(o);
  l.set_layer(tar_of({{name, bytes}}));
  l.store();
  const ToolRun r = tool({"artifact", "unpack", o, path("set-handmade")});
  EXPECT_EQ(r.code, 0) << r.describe();
}

// A manifest whose annotations describe another file than the layer holds (each altered, the chain
// fixed up so that only the annotation is at fault): the size, the format version, the readable
// compatibility key. unpack exits 1 naming the annotation, and writes nothing.
TEST_F(ArtifactTest, UnpackRefusesAManifestThatMisdescribesTheFile) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  const Json p = pack(path("cache.wcache"), good, {"--compat-key", kKey});
  ASSERT_FALSE(p.is_null());
  const std::uint64_t size = p.at("file_size");

  auto altered = [&](const std::string& name, const char* annotation, const Json& value) {
    const std::string o = copy_of(good, name);
    Layout l = Layout::load(o);
    if (value.is_null())
      l.manifest["annotations"].erase(annotation);
    else
      l.manifest["annotations"][annotation] = value;
    l.store();
    return o;
  };
  expect_refused(altered("size-more", kFileSize, std::to_string(size + 1)), kFileSize, "file.size one byte more");
  expect_refused(altered("size-less", kFileSize, std::to_string(size - 512)), kFileSize, "file.size a block less");
  expect_refused(altered("size-text", kFileSize, "lots"), kFileSize, "file.size not a number");
  expect_refused(altered("size-sign", kFileSize, "+" + std::to_string(size)), kFileSize, "file.size with a sign");
  expect_refused(altered("size-none", kFileSize, nullptr), kFileSize, "no file.size");
  expect_refused(altered("format-2", kFormat, "2"), kFormat, "format 2 for a format-1 file");
  expect_refused(altered("format-0", kFormat, "0"), kFormat, "format 0 for a format-1 file");
  expect_refused(altered("format-text", kFormat, "one"), kFormat, "format not a number");
  expect_refused(altered("format-none", kFormat, nullptr), kFormat, "no format");
  expect_refused(altered("key-other", kCompatKey, "model-b|avx2|packer-1"), kCompatKey,
                 "the readable key of another cache (its hash left as the file's)");
  expect_refused(altered("key-hex", kCompatKey, "hex:6d6f64656c2d61"), kCompatKey,
                 "a hex key whose bytes are printable (pack would have written them as they are)");
  expect_refused(altered("key-utf8", kCompatKey, "mod\u00e8le"), kCompatKey, "a key that is not printable ASCII");
  // The untouched layout still unpacks, and so does one without the (optional) readable key.
  EXPECT_EQ(tool({"artifact", "unpack", good, path("set-good")}).code, 0);
  const ToolRun r = tool({"artifact", "unpack", altered("key-none", kCompatKey, nullptr), path("set-key-none")});
  EXPECT_EQ(r.code, 0) << r.describe();
}

// The readable key, both ways pack writes it: bytes that are not printable as "hex:" and their
// hex, and a printable key that happens to start with "hex:" as itself. Both unpack; a changed
// byte of the hex form does not.
TEST_F(ArtifactTest, UnpackChecksTheReadableKeyInBothOfItsForms) {
  const Entries entries = some_entries();
  const std::string keys[] = {"key\x01\x02", "hex:41"};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::string& key = keys[i];
    SCOPED_TRACE(key == "hex:41" ? "printable key hex:41" : "binary key");
    const std::string tag = std::to_string(i);
    const std::string cache = path("cache" + tag + ".wcache"), oci = path("oci" + tag);
    make_cache(cache, entries, 7, key);
    ASSERT_FALSE(pack(cache, oci, {"--compat-key", key}).is_null());
    const std::string recorded = Layout::load(oci).manifest["annotations"][kCompatKey];
    EXPECT_EQ(recorded, key == "hex:41" ? "hex:41" : "hex:6b65790102");
    const ToolRun r = tool({"artifact", "unpack", oci, path("set" + tag)});
    EXPECT_EQ(r.code, 0) << r.describe();
    const std::string o = copy_of(oci, "changed" + tag);
    Layout l = Layout::load(o);
    l.manifest["annotations"][kCompatKey] = key == "hex:41" ? "hex:42" : "hex:6b65790103";
    l.store();
    expect_refused(o, kCompatKey, "one byte of the readable key changed");
  }
}

// The config and the layer must be of the media types pack writes; a compressed layer is what a
// copy without --preserve-digests gives, and the message says so; any other type does not.
TEST_F(ArtifactTest, UnpackRefusesAConfigOrLayerOfAnotherMediaType) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  ASSERT_FALSE(pack(path("cache.wcache"), good).is_null());
  auto altered = [&](const std::string& name, const char* part, const std::string& media_type) {
    const std::string o = copy_of(good, name);
    Layout l = Layout::load(o);
    if (std::string(part) == "config")
      l.manifest["config"]["mediaType"] = media_type;
    else
      l.manifest["layers"][0]["mediaType"] = media_type;
    l.store();
    return o;
  };
  expect_refused(altered("config-json", "config", "application/json"), "application/vnd.oci.image.config.v1+json",
                 "config of type application/json");
  expect_refused(altered("config-layer", "config", "application/vnd.oci.image.layer.v1.tar"),
                 "application/vnd.oci.image.config.v1+json", "config of the layer's type");
  expect_refused(altered("layer-gzip", "layer", "application/vnd.oci.image.layer.v1.tar+gzip"), "--preserve-digests",
                 "gzip layer");
  expect_refused(altered("layer-zstd", "layer", "application/vnd.oci.image.layer.v1.tar+zstd"), "--preserve-digests",
                 "zstd layer");
  const std::string o = altered("layer-octet", "layer", "application/octet-stream");
  expect_refused(o, "application/vnd.oci.image.layer.v1.tar", "layer of type application/octet-stream");
  const ToolRun r = tool({"artifact", "unpack", o, path("set-octet")});
  EXPECT_EQ(r.err.find("--preserve-digests"), std::string::npos)
      << "a layer that is no tar at all is not a copy's compression: " << r.err;
}

// A tar that stops after its member's padding (no end-of-archive marker, or half of one) is
// refused as such, not as too short for its member; one cut inside the member is too short.
TEST_F(ArtifactTest, UnpackNamesAMissingEndOfArchiveMarker) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  const Json p = pack(path("cache.wcache"), good);
  ASSERT_FALSE(p.is_null());
  const std::string tar = slurp(Layout::load(good).layer_path());
  ASSERT_EQ(tar.substr(tar.size() - 1024), std::string(1024, '\0'));
  const struct {
    const char* name;
    std::size_t cut;
    const char* message;
  } cases[] = {{"no-marker", 1024, "no end-of-archive marker"},
               {"half-marker", 512, "no end-of-archive marker"},
               {"in-member", 1024 + 512 + 512, "too short for its member"}};
  for (const auto& c : cases) {
    const std::string o = copy_of(good, c.name);
    Layout l = Layout::load(o);
    l.set_layer(tar.substr(0, tar.size() - c.cut));
    l.store();
    expect_refused(o, c.message, c.name);
  }
}

// oci-layout or index.json that is not a regular file (a FIFO, a directory) means OCI_DIR is not an
// image layout: exit 3, as docs/CLI.md's table says, without waiting on the FIFO for a writer.
TEST_F(ArtifactTest, ALayoutFileThatIsNotARegularFileIsNotALayout) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string good = path("good");
  ASSERT_FALSE(pack(path("cache.wcache"), good).is_null());
  for (const char* file : {"index.json", "oci-layout"}) {
    for (const char* kind : {"fifo", "directory"}) {
      SCOPED_TRACE(std::string(file) + " as a " + kind);
      const std::string o = copy_of(good, std::string(kind) + "-" + file);
      ASSERT_TRUE(fs::remove(o + "/" + file));
      if (std::string(kind) == "fifo") {
        ASSERT_EQ(::mkfifo((o + "/" + file).c_str(), 0644), 0) << std::strerror(errno);
      } else {
        fs::create_directory(o + "/" + file);
      }
      const std::string set = path(std::string("set-") + kind + "-" + file);
      ToolRun r = tool_within({"artifact", "unpack", o, set}, 30);
      EXPECT_EQ(r.code, 3) << r.describe();
      EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("not an OCI image layout"), std::string::npos) << r.err;
      EXPECT_FALSE(fs::exists(set));
      r = tool_within({"artifact", "show", o}, 30);
      EXPECT_EQ(r.code, 3) << r.describe();
    }
  }
}

// ---- pack's refusals --------------------------------------------------------------------------------

TEST_F(ArtifactTest, PackRefusesACacheWrittenForAnotherKey) {
  make_cache(path("cache.wcache"), some_entries());
  const ToolRun r =
      tool({"artifact", "pack", "--compat-key", "model-b|avx2|packer-1", path("cache.wcache"), path("oci")});
  EXPECT_EQ(r.code, 2) << r.describe();
  EXPECT_NE(r.err.find("--compat-key does not match"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("oci")));
  for (const auto& f : files_under(dir_.path().string()))  // no copy, staging directory or blob left
    EXPECT_TRUE(f.rfind("cache.wcache", 0) == 0 || f.rfind("run", 0) == 0) << f;
}

TEST_F(ArtifactTest, PackRefusesWhatIsNotASoundWeightcacheFile) {
  const Entries entries = some_entries();
  const std::string cache = path("cache.wcache");
  make_cache(cache, entries);
  // An entry's bytes damaged: verify's finding is printed, nothing is written.
  std::string b = slurp(cache);
  const std::size_t at = b.find(entries[5].second.substr(0, 64));
  ASSERT_NE(at, std::string::npos);
  b[at + 10] ^= 1;
  spit(cache, b);
  ToolRun r = tool({"artifact", "pack", cache, path("oci")});
  EXPECT_EQ(r.code, 1) << r.describe();
  EXPECT_NE(r.err.find(entries[5].first), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("oci")));

  spit(path("not-a-cache"), pattern(10000, 3));
  r = tool({"artifact", "pack", path("not-a-cache"), path("oci")});
  EXPECT_EQ(r.code, 1) << r.describe();
  EXPECT_EQ(tool({"artifact", "pack", path("missing.wcache"), path("oci")}).code, 3);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--name", "a/b.wcache"}, {"--name", "x.bin"}, {"--tag", "-x"}, {"--arch", "AMD64"}}) {
    std::vector<std::string> args = {"artifact", "pack"};
    args.insert(args.end(), bad.begin(), bad.end());
    args.push_back(path("not-a-cache"));
    args.push_back(path("oci"));
    EXPECT_EQ(tool(args).code, 2) << bad[0] << " " << bad[1];
  }
  EXPECT_FALSE(fs::exists(path("oci")));
}

// An existing OCI_DIR is replaced only with --force, and only when it is a layout or empty.
TEST_F(ArtifactTest, PackReplacesAnExistingLayoutOnlyWithForce) {
  make_cache(path("cache.wcache"), some_entries());
  const std::string oci = path("oci");
  ASSERT_FALSE(pack(path("cache.wcache"), oci).is_null());
  const std::string before = slurp(oci + "/index.json");
  ToolRun r = tool({"artifact", "pack", "--tag", "v2", path("cache.wcache"), oci});
  EXPECT_EQ(r.code, 2) << r.describe();
  EXPECT_EQ(slurp(oci + "/index.json"), before);
  ASSERT_FALSE(pack(path("cache.wcache"), oci, {"--force", "--tag", "v2"}).is_null());
  EXPECT_NE(slurp(oci + "/index.json").find("\"v2\""), std::string::npos);
  EXPECT_EQ(files_under(oci).size(), 5u);

  fs::create_directory(path("precious"));
  spit(path("precious/notes.txt"), "keep me");
  r = tool({"artifact", "pack", "--force", path("cache.wcache"), path("precious")});
  EXPECT_EQ(r.code, 2) << r.describe();
  EXPECT_EQ(slurp(path("precious/notes.txt")), "keep me");
}

// ---- tags ----------------------------------------------------------------------------------------------

// A layout holding two tagged manifests (two packs merged): unpack and show need --tag.
TEST_F(ArtifactTest, SeveralManifestsNeedATag) {
  const Entries entries = some_entries();
  make_cache(path("a.wcache"), entries);
  make_cache(path("b.wcache"), entries, 7, "model-a|neon|packer-1");
  ASSERT_FALSE(pack(path("a.wcache"), path("oci"), {"--tag", "avx2"}).is_null());
  ASSERT_FALSE(pack(path("b.wcache"), path("other"), {"--tag", "neon"}).is_null());
  for (const auto& f : fs::directory_iterator(path("other/blobs/sha256")))
    fs::copy_file(f.path(), path("oci/blobs/sha256") / f.path().filename(), fs::copy_options::skip_existing);
  Json index = Json::parse(slurp(path("oci/index.json")));
  index["manifests"].push_back(Json::parse(slurp(path("other/index.json")))["manifests"][0]);
  spit(path("oci/index.json"), index.dump());

  ToolRun r = tool({"artifact", "unpack", path("oci"), path("set")});
  EXPECT_EQ(r.code, 2) << r.describe();
  EXPECT_NE(r.err.find("avx2, neon"), std::string::npos) << r.err;
  EXPECT_EQ(tool({"artifact", "unpack", "--tag", "sse4", path("oci"), path("set")}).code, 2);
  EXPECT_TRUE(files_under(path("set")).empty());
  r = tool({"artifact", "unpack", "--json", "--tag", "neon", path("oci"), path("set")});
  ASSERT_EQ(r.code, 0) << r.describe();
  EXPECT_EQ(r.j.at("tag"), "neon");
  EXPECT_TRUE(library_serves(r.j.at("path").get<std::string>(), entries, "model-a|neon|packer-1"));
  r = tool({"artifact", "show", "--tag", "avx2", path("oci")});
  EXPECT_EQ(r.code, 0) << r.describe();
  EXPECT_NE(r.out.find("tag:             avx2"), std::string::npos) << r.out;
}

// ---- skopeo ------------------------------------------------------------------------------------------

// skopeo reads the layout as an image and copies it (with --preserve-digests, as docs/CLI.md says
// to publish: otherwise skopeo compresses the layer); the copy keeps the manifest digest and
// unpacks to the same file.
TEST_F(ArtifactTest, SkopeoCopiesTheLayoutAndUnpackReadsTheCopy) {
  if (!on_path("skopeo")) GTEST_SKIP() << "skopeo is not installed (apt-get install skopeo; scripts/setup does)";
  const Entries entries = some_entries();
  make_cache(path("cache.wcache"), entries);
  const Json p = pack(path("cache.wcache"), path("oci"), {"--tag", "v1"});
  ASSERT_FALSE(p.is_null());
  const ShellRun c = shell(dir_, "skopeo --insecure-policy copy --preserve-digests 'oci:" + path("oci") +
                                     ":v1' 'oci:" + path("copy") + ":v1'");
  ASSERT_EQ(c.code, 0) << c.out;
  const ToolRun s = tool({"artifact", "show", "--json", "--tag", "v1", path("copy")});
  ASSERT_EQ(s.code, 0) << s.describe();
  EXPECT_EQ(s.j.at("manifest_digest"), p.at("manifest_digest"));
  const ToolRun u = tool({"artifact", "unpack", "--json", path("copy"), path("set")});
  ASSERT_EQ(u.code, 0) << u.describe();
  EXPECT_TRUE(library_serves(u.j.at("path").get<std::string>(), entries));
}

// ---- the tar header ------------------------------------------------------------------------------

// Sizes of 8 GiB and more do not fit the 11 octal digits: GNU's base-256 form, which the reader
// takes back and GNU tar lists (on a sparse archive: nothing of the 8 GiB is written).
TEST(ArtifactTar, SizesOf8GiBAndMoreAreBase256) {
  namespace tar = weightcache::cli::tar;
  const std::uint64_t big = (std::uint64_t{1} << 33) + 5;
  const auto octal = tar::encode_size(big - 6);
  EXPECT_EQ(std::string(octal.begin(), octal.end()), std::string("77777777777\0", 12));
  const auto b256 = tar::encode_size(big);
  const unsigned char want[12] = {0x80, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0x05};
  EXPECT_TRUE(std::equal(b256.begin(), b256.end(), want));
  for (const std::uint64_t v :
       {std::uint64_t{0}, std::uint64_t{511}, big - 6, big, std::uint64_t{1} << 40, (std::uint64_t{1} << 62) + 12345}) {
    const auto f = tar::encode_size(v);
    EXPECT_EQ(tar::decode_number(f.data(), f.size()), v);
  }
  const unsigned char negative[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe};
  EXPECT_FALSE(tar::decode_number(negative, 12));

  const tar::Block header = tar::file_header("big.wcache", big);
  std::string why;
  const auto m = tar::parse_header(header, &why);
  ASSERT_TRUE(m) << why;
  EXPECT_EQ(m->name, "big.wcache");
  EXPECT_EQ(m->size, big);
  EXPECT_EQ(std::string(header.begin() + 257, header.begin() + 265), std::string("ustar  \0", 8));

  if (!on_path("tar")) GTEST_SKIP() << "no tar to cross-check with";
  weightcache::test::TempDir dir("wc-artifact-tar");
  const std::string archive = dir.file("big.tar");
  const int fd = ::open(archive.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, header.data(), header.size()), 512);
  const bool sparse = ::ftruncate(fd, static_cast<off_t>(512 + big + tar::padding(big) + 1024)) == 0;
  ::close(fd);
  if (!sparse) GTEST_SKIP() << "this file system cannot hold a sparse 8 GiB file";
  const ShellRun r = shell(dir, "tar -tvf '" + archive + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(std::to_string(big)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("r--r--r-- root/root"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("big.wcache"), std::string::npos) << r.out;
}

}  // namespace
