// A fleet's path for a packed cache, end to end on loopback, each step the program a fleet runs and
// each a process of its own: a "build" directory packs a cache cold, `weightcache artifact pack`
// makes it an OCI artifact, skopeo pushes it to a real registry (Docker Distribution, Debian's
// `docker-registry`, started by each test on a free port of 127.0.0.1) and pulls it into a "node"
// directory, `weightcache artifact unpack` writes it into the node's set, and the node's process
// opens its cache with that set as wc_options.prebuilt_dir. What is checked is what a node sees:
// which file it serves, whether it packed anything, and the output it computed.
#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <weightcache/weightcache.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using weightcache::test::TempDir;
using weightcache::test::ToolRun;

// ---- this machine's programs -------------------------------------------------------------------

// The full path of `program` on PATH; "" when it is not installed.
std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/" + program).c_str(), X_OK) == 0) return d + "/" + program;
  return {};
}

// Starts a program of this machine with its stdout and stderr in files. skopeo and the registry are
// the host's own programs: spawn.hpp would start them through a cross build's emulator.
pid_t start_host(const std::string& exe, const std::vector<std::string>& args, const std::string& out,
                 const std::string& err, char* const* envp) {
  std::vector<std::string> storage{exe};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// The reply to one HTTP/1.0 request to 127.0.0.1:port (the server closes the connection after it),
// "" when nothing answered. Bounded by socket timeouts: a server that accepts and then hangs must
// not hang the test.
std::string http(int port, const std::string& method, const std::string& target, const std::string& headers = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string request = method + " " + target + " HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                "\r\n" + headers + "\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

// A port of 127.0.0.1 that nothing listens on now (the kernel's pick for port 0). Another process
// may take it before the registry binds it: Registry::start then tries another.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A YAML single-quoted scalar.
std::string yaml_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// ---- the registry ----------------------------------------------------------------------------------

// `docker-registry serve` on 127.0.0.1 with its storage in a directory of the test's, stopped by
// stop() or, whatever ended the test, by the destructor.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry() { stop(); }

  // "" once /v2/ answers, else what went wrong (the registry's own words included).
  std::string start(const std::string& exe, const std::string& dir) {
    fs::create_directories(dir);
    // The registry takes any REGISTRY_* variable as a setting over its config file (an inherited
    // REGISTRY_HTTP_ADDR would move it off loopback): the child gets none of them.
    std::vector<std::string> env_storage;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "REGISTRY_", 9) != 0) env_storage.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);

    std::string why;
    // A port taken between free_port() and the registry's bind is the harness's bad luck, not a
    // finding: another port, a few times.
    for (int attempt = 0; attempt < 3; ++attempt) {
      port_ = free_port();
      if (port_ == 0) return "cannot find a free port on 127.0.0.1: " + std::string(std::strerror(errno));
      const std::string config = dir + "/config.yml";
      {
        // Only what a loopback registry needs. Left out, hence off: notifications (webhooks),
        // proxy (a pull-through cache of another registry), redis, reporting (bugsnag, newrelic),
        // the debug server and health checks; the upload purger, a background job, is turned off.
        std::ofstream c(config, std::ios::trunc);
        c << "version: 0.1\n"
             "log:\n"
             "  level: warn\n"
             "  accesslog:\n"
             "    disabled: true\n"
             "storage:\n"
             "  filesystem:\n"
             "    rootdirectory: "
          << yaml_quoted(dir + "/storage")
          << "\n"
             "  maintenance:\n"
             "    uploadpurging:\n"
             "      enabled: false\n"
             "http:\n"
             "  addr: 127.0.0.1:"
          << port_
          << "\n"
             // A fixed secret: without one the registry makes a random one and warns about it.
             "  secret: weightcache-fleet-test\n";
      }
      const std::string log = dir + "/registry.err";
      pid_ = start_host(exe, {"serve", config}, dir + "/registry.out", log, envp.data());
      if (pid_ < 0) return "cannot start " + exe;
      // Until /v2/ answers as a registry does; a fixed sleep would be too short on a loaded machine
      // and wasted on an idle one. 30 s without an answer is a broken registry, not a slow one.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      bool exited = false;
      while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          exited = true;
          break;
        }
        const std::string reply = http(port_, "GET", "/v2/");
        if (reply.rfind("HTTP/1.", 0) == 0 && reply.compare(8, 5, " 200 ") == 0 &&
            reply.find("\r\nDocker-Distribution-Api-Version: registry/2.0\r\n") != std::string::npos)
          return {};
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const std::string said = weightcache::test::slurp(log);
      if (!exited) {
        stop();
        return "docker-registry did not answer on 127.0.0.1:" + std::to_string(port_) + "/v2/ within 30 s: " + said;
      }
      why = "docker-registry on 127.0.0.1:" + std::to_string(port_) + " exited: " + said;
      if (said.find("address already in use") == std::string::npos) return why;
    }
    return why;
  }

  // SIGTERM, then wait for it; SIGKILL only if it has not ended 10 s later, so a registry that
  // ignores SIGTERM cannot hang the run.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 1000; ++i) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  int port() const { return port_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// ---- what the programs print -------------------------------------------------------------------

// One `weightcache-xnn-run launch` line, "launch key=value ...".
struct Launch {
  ToolRun run;
  std::map<std::string, std::string> f;

  // A count it printed; UINT64_MAX when it printed none, which no expectation matches.
  std::uint64_t n(const char* key) const {
    const auto it = f.find(key);
    return it == f.end() ? UINT64_MAX : std::strtoull(it->second.c_str(), nullptr, 10);
  }
  std::string s(const char* key) const {
    const auto it = f.find(key);
    return it == f.end() ? "(not printed)" : it->second;
  }
  std::string describe() const { return run.describe(); }
};

Launch parse_launch(ToolRun r) {
  Launch l;
  std::istringstream in(r.out);
  std::string word;
  if (in >> word && word == "launch")
    while (in >> word)
      if (const auto eq = word.find('='); eq != std::string::npos) l.f[word.substr(0, eq)] = word.substr(eq + 1);
  l.run = std::move(r);
  return l;
}

// The files under `dir` (and its subdirectories, where wc_open also looks), relative to it.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); ++it)
    if (!it->is_directory()) out.push_back(fs::relative(it->path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string cpu_features() {
  std::string s(wc_cpu_features(nullptr, 0), '\0');
  (void)wc_cpu_features(s.data(), s.size() + 1);
  return s;
}

// This CPU's features as an image tag (letters, digits, '_', '.', '-'): what a fleet tags the
// artifact of one CPU profile with.
std::string profile_tag(const std::string& prefix) {
  std::string t = prefix + cpu_features();
  for (char& c : t)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '-';
  return t.substr(0, 128);
}

// A blob of an image layout: blobs/sha256/<hex>.
std::string blob_path(const std::string& layout, const std::string& digest) {
  return layout + "/blobs/sha256/" + digest.substr(digest.find(':') + 1);
}

// The layer blob of a layout holding one manifest: index.json names the manifest, the manifest
// names the layer.
std::string layer_blob(const std::string& layout) {
  const Json index = Json::parse(weightcache::test::slurp(layout + "/index.json"));
  const std::string manifest_blob = blob_path(layout, index.at("manifests").at(0).at("digest"));
  const Json manifest = Json::parse(weightcache::test::slurp(manifest_blob));
  return blob_path(layout, manifest.at("layers").at(0).at("digest"));
}

// XORs one byte of `path` in place (twice: the file as it was).
void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  ASSERT_TRUE(f.get(c)) << path << " has no byte " << offset;
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x20));
  ASSERT_TRUE(f.good());
}

// ---- the fixture -----------------------------------------------------------------------------------

// The model every XNNPACK launch runs: small, so that a cold pack takes milliseconds.
const std::vector<std::string> kXnnModel = {"--dtype", "f32", "--layers", "2", "--dim", "256", "--hidden", "512",
                                            "--seed", "7"};

class Fleet : public ::testing::Test {
 protected:
  // Which CPU the suite ran on: what the packed layouts, and so the compatibility keys, follow.
  static void SetUpTestSuite() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, name = "(no model name in /proc/cpuinfo)";
    while (std::getline(in, line))
      if (line.rfind("model name", 0) == 0) {
        name = line.substr(line.find(':') + 2);
        break;
      }
    std::printf("fleet: this CPU is %s; wc_cpu_features: %s\n", name.c_str(), cpu_features().c_str());
  }

  void SetUp() override {
    const std::string registry = find_on_path("docker-registry");
    skopeo_ = find_on_path("skopeo");
    if (registry.empty())
      GTEST_SKIP() << "docker-registry is not installed (apt-get install docker-registry; scripts/setup does)";
    if (skopeo_.empty()) GTEST_SKIP() << "skopeo is not installed (apt-get install skopeo; scripts/setup does)";
    for (const char* d : {"build", "node"}) fs::create_directories(path(d));
    const std::string why = registry_.start(registry, path("registry"));
    ASSERT_TRUE(why.empty()) << why;
  }
  void TearDown() override { registry_.stop(); }

  std::string path(const std::string& name) const { return dir_.file(name); }

  ToolRun cli(const std::vector<std::string>& args) {
    return weightcache::test::run_tool(dir_, WEIGHTCACHE_CLI_PATH, args);
  }

  // `weightcache-xnn-run launch` on `model` (written by the tool when missing) with `extra`.
  Launch xnn(const std::string& model, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"launch", "--model", model};
    args.insert(args.end(), kXnnModel.begin(), kXnnModel.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_launch(weightcache::test::run_tool(dir_, WEIGHTCACHE_XNN_RUN, args));
  }

  // A cold launch into `cache` (deleted first) that must have packed every weight.
  Launch cold_pack(const std::string& model, const std::string& cache, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--cache", cache, "--fresh"};
    args.insert(args.end(), extra.begin(), extra.end());
    Launch l = xnn(model, args);
    EXPECT_EQ(l.run.code, 0) << l.describe();
    EXPECT_GT(l.n("look_ups"), 0u) << l.run.out;
    EXPECT_EQ(l.n("reservations"), l.n("look_ups")) << "the cold launch did not pack every weight: " << l.run.out;
    EXPECT_EQ(l.n("hits"), 0u) << l.run.out;
    EXPECT_EQ(l.n("prebuilt"), 0u) << l.run.out;
    return l;
  }

  // `weightcache artifact pack --json` of `cache` into `oci`; null on failure (said).
  Json pack(const std::string& cache, const std::string& oci, const std::vector<std::string>& options) {
    std::vector<std::string> args = {"artifact", "pack", "--json"};
    args.insert(args.end(), options.begin(), options.end());
    args.push_back(cache);
    args.push_back(oci);
    const ToolRun r = cli(args);
    EXPECT_EQ(r.code, 0) << r.describe();
    EXPECT_TRUE(r.code != 0 || r.j.is_object()) << "pack printed no JSON: " << r.out;
    return r.code == 0 && r.j.is_object() ? r.j : Json();
  }

  // skopeo copy, digests kept (docs/CLI.md: otherwise skopeo gzips the layer); the registry speaks
  // plain HTTP, so TLS is not verified on its side. `true` when it succeeded (said otherwise).
  ::testing::AssertionResult skopeo_copy(const std::string& from, const std::string& to) {
    std::vector<std::string> args = {"--insecure-policy", "copy", "--preserve-digests"};
    if (from.rfind("docker://", 0) == 0) args.push_back("--src-tls-verify=false");
    if (to.rfind("docker://", 0) == 0) args.push_back("--dest-tls-verify=false");
    args.push_back(from);
    args.push_back(to);
    const std::string tag = std::to_string(copies_++);
    const std::string out = path("skopeo" + tag + ".out"), err = path("skopeo" + tag + ".err");
    const ToolRun r = weightcache::test::finish_tool(start_host(skopeo_, args, out, err, environ), out, err);
    if (r.code == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "skopeo copy " << from << " " << to << ": " << r.describe();
  }
  std::string remote(const std::string& repository, const std::string& tag) const {
    return "docker://" + registry_.host() + "/" + repository + ":" + tag;
  }
  ::testing::AssertionResult push(const std::string& layout, const std::string& tag, const std::string& repository) {
    return skopeo_copy("oci:" + layout + ":" + tag, remote(repository, tag));
  }
  ::testing::AssertionResult pull(const std::string& repository, const std::string& tag, const std::string& layout) {
    return skopeo_copy(remote(repository, tag), "oci:" + layout + ":" + tag);
  }

  // The manifest digest `artifact show --json` reads from a layout of one manifest.
  std::string shown_digest(const std::string& layout) {
    const ToolRun r = cli({"artifact", "show", "--json", layout});
    EXPECT_EQ(r.code, 0) << r.describe();
    return r.code == 0 && r.j.is_object() ? r.j.value("manifest_digest", "(none)") : "(show failed)";
  }

  TempDir dir_{"wc-fleet"};
  Registry registry_;
  std::string skopeo_;
  int copies_ = 0;
};

// ---- the tests -----------------------------------------------------------------------------------

// The whole path once: what the node serves from the pulled artifact is what the build packed, so
// its launch packs nothing, writes no cache of its own, and computes the cold launch's output.
TEST_F(Fleet, APulledArtifactServesBitIdenticalWeightsWithNoPacking) {
  const std::string model = path("build/model.bin"), tag = profile_tag("f32-");
  const Launch built = cold_pack(model, path("build/cache.wcache"));
  ASSERT_EQ(built.run.code, 0);
  ASSERT_FALSE(pack(path("build/cache.wcache"), path("build/oci"),
                    {"--tag", tag, "--runtime", "xnnpack", "--cpu-profile", cpu_features(), "--model-file", model})
                   .is_null());
  ASSERT_TRUE(push(path("build/oci"), tag, "weightcache/mlp"));

  // The node has its own copy of the model (the key names the model's digest, not its path).
  fs::copy_file(model, path("node/model.bin"));
  ASSERT_TRUE(pull("weightcache/mlp", tag, path("node/oci")));
  const ToolRun u = cli({"artifact", "unpack", "--json", path("node/oci"), path("node/set")});
  ASSERT_EQ(u.code, 0) << u.describe();
  ASSERT_EQ(files_under(path("node/set")).size(), 1u);

  const Launch node =
      xnn(path("node/model.bin"), {"--cache", path("node/local.wcache"), "--prebuilt-dir", path("node/set")});
  ASSERT_EQ(node.run.code, 0) << node.describe();
  EXPECT_EQ(node.n("prebuilt"), 1u) << "the node did not take the pulled artifact: " << node.run.out;
  EXPECT_GT(node.n("look_ups"), 0u) << node.run.out;
  EXPECT_EQ(node.n("hits"), node.n("look_ups")) << "a weight the artifact should hold was missing: " << node.run.out;
  EXPECT_EQ(node.n("reservations"), 0u) << "the node packed: " << node.run.out;
  EXPECT_EQ(node.s("output"), built.s("output")) << "the served weights are not the ones the build packed";
  EXPECT_FALSE(fs::exists(path("node/local.wcache"))) << "the node wrote a cache of its own";
}

// Two artifacts of one GGUF model under two keys, both in one node's set: weightcache-llama baked
// with --cpu-compat-key (this CPU's key, the one a process with --prebuilt-dir opens with) and
// without it (the empty key, which such a process never has). The process takes the artifact of
// its own key and repacks nothing. A node whose set holds only the other key's artifact falls back
// to its own cache: it repacks into it once, and its next launch is served from it.
TEST_F(Fleet, EachNodeTakesTheArtifactOfItsOwnKeyAndFallsBackToItsOwnCacheWithout) {
#if !defined(WEIGHTCACHE_LLAMA_RUN) || !defined(WEIGHTCACHE_GGUF_GEN)
  GTEST_SKIP() << "weightcache-llama is not built in this configuration (it needs llama.cpp, scripts/llama-args): "
                  "the XNNPACK example cannot make a cache for another key of the same model on one CPU";
#else
  const std::string model = path("build/model.gguf");
  const ToolRun gen = weightcache::test::run_tool(
      dir_, WEIGHTCACHE_GGUF_GEN,
      {"--out", model, "--type", "q4_0", "--seed", "1", "--layers", "2", "--dim", "256", "--ffn", "512", "--vocab",
       "264"});
  ASSERT_EQ(gen.code, 0) << gen.describe();
  auto llama = [&](const std::string& gguf, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model",     gguf, "--json",   "--threads", "2",
                                     "--n-predict", "4",  "--prompt", "fleet"};
    args.insert(args.end(), extra.begin(), extra.end());
    ToolRun r = weightcache::test::run_tool(dir_, WEIGHTCACHE_LLAMA_RUN, args);
    EXPECT_EQ(r.code, 0) << r.describe();
    EXPECT_TRUE(r.j.is_object()) << r.describe();
    return r;
  };
  // A count it reported; UINT64_MAX when it reported none, which no expectation matches.
  auto u64 = [](const ToolRun& r, const char* key) {
    return r.j.is_object() && r.j.contains(key) && r.j[key].is_number_unsigned() ? r.j[key].get<std::uint64_t>()
                                                                                 : UINT64_MAX;
  };
  auto text = [](const ToolRun& r, const char* key) {
    return r.j.is_object() && r.j.contains(key) && r.j[key].is_string() ? r.j[key].get<std::string>()
                                                                        : std::string("(not reported)");
  };
  // What two runs on the same weights agree on: the first step's logits, all steps', the tokens.
  auto same_outputs = [](const ToolRun& a, const ToolRun& b, const std::string& what) {
    for (const char* key : {"checksum", "checksum_all", "tokens"})
      EXPECT_TRUE(a.j.is_object() && b.j.is_object() && a.j.contains(key) && a.j[key] == b.j.value(key, Json()))
          << what << ": " << key << " differs\n" << a.out << b.out;
  };

  const ToolRun cpu = llama(model, {"--cache", path("build/cpu.wcache"), "--cpu-compat-key"});
  ASSERT_EQ(cpu.code, 0);
  if (u64(cpu, "stock_repacked") == 0)
    GTEST_SKIP() << "stock llama.cpp repacks none of this model's weights on this CPU ("
                 << text(cpu, "cpu") << "): no cache to ship";
  const std::uint64_t routed = u64(cpu, "routed");
  ASSERT_GT(routed, 0u) << cpu.out;
  ASSERT_EQ(u64(cpu, "repacked"), routed) << cpu.out;
  const ToolRun any = llama(model, {"--cache", path("build/any.wcache")});
  ASSERT_EQ(any.code, 0);
  ASSERT_EQ(u64(any, "repacked"), routed) << any.out;
  same_outputs(any, cpu, "the two bakes");

  const std::string cpu_tag = profile_tag("q4_0-");
  const Json a = pack(path("build/cpu.wcache"), path("build/oci-cpu"),
                      {"--tag", cpu_tag, "--runtime", "llama.cpp", "--cpu-profile", cpu_features(), "--model-file",
                       model});
  const Json b = pack(path("build/any.wcache"), path("build/oci-any"),
                      {"--tag", "any", "--runtime", "llama.cpp", "--model-file", model});
  ASSERT_FALSE(a.is_null());
  ASSERT_FALSE(b.is_null());
  ASSERT_NE(a.at("compat_hash"), b.at("compat_hash")) << "the two bakes should be for two keys";
  ASSERT_TRUE(push(path("build/oci-cpu"), cpu_tag, "weightcache/llama"));
  ASSERT_TRUE(push(path("build/oci-any"), "any", "weightcache/llama"));

  {  // A node pulls both tags into one layout and unpacks both into one set.
    fs::copy_file(model, path("node/model.gguf"));
    ASSERT_TRUE(pull("weightcache/llama", cpu_tag, path("node/oci")));
    ASSERT_TRUE(pull("weightcache/llama", "any", path("node/oci")));
    for (const std::string& t : {cpu_tag, std::string("any")}) {
      const ToolRun u = cli({"artifact", "unpack", "--tag", t, path("node/oci"), path("node/set")});
      ASSERT_EQ(u.code, 0) << u.describe();
    }
    const std::vector<std::string> want_set = {a.at("file_name").get<std::string>(),
                                               b.at("file_name").get<std::string>()};
    std::vector<std::string> sorted = want_set;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(files_under(path("node/set")), sorted);

    const ToolRun node = llama(path("node/model.gguf"),
                               {"--cache", path("node/local.wcache"), "--prebuilt-dir", path("node/set")});
    ASSERT_EQ(node.code, 0);
    EXPECT_EQ(u64(node, "prebuilt"), 1u) << node.out;
    EXPECT_EQ(text(node, "cache_file"), path("node/set/" + want_set[0]))
        << "not the artifact of this CPU's key: " << node.out;
    EXPECT_EQ(u64(node, "repacked"), 0u) << node.out;
    EXPECT_EQ(u64(node, "served_from_cache"), routed) << node.out;
    same_outputs(node, cpu, "the node serving the artifact of its key");
    EXPECT_FALSE(fs::exists(path("node/local.wcache"))) << "the node wrote a cache of its own";
  }
  {  // Another node gets only the other key's artifact.
    fs::create_directories(path("node2"));
    fs::copy_file(model, path("node2/model.gguf"));
    ASSERT_TRUE(pull("weightcache/llama", "any", path("node2/oci")));
    const ToolRun u = cli({"artifact", "unpack", path("node2/oci"), path("node2/set")});
    ASSERT_EQ(u.code, 0) << u.describe();
    ASSERT_EQ(files_under(path("node2/set")), std::vector<std::string>{b.at("file_name").get<std::string>()});
    const std::vector<std::string> args = {"--cache", path("node2/local.wcache"), "--prebuilt-dir", path("node2/set")};

    const ToolRun first = llama(path("node2/model.gguf"), args);
    ASSERT_EQ(first.code, 0);
    EXPECT_EQ(u64(first, "prebuilt"), 0u) << "a node took an artifact of another key: " << first.out;
    EXPECT_EQ(text(first, "cache_file"), path("node2/local.wcache")) << first.out;
    EXPECT_EQ(u64(first, "repacked"), routed) << first.out;
    same_outputs(first, cpu, "the node packing for itself");

    const ToolRun next = llama(path("node2/model.gguf"), args);
    ASSERT_EQ(next.code, 0);
    EXPECT_EQ(u64(next, "prebuilt"), 0u) << next.out;
    EXPECT_EQ(text(next, "cache_file"), path("node2/local.wcache")) << next.out;
    EXPECT_EQ(u64(next, "repacked"), 0u) << "the next launch packed again: " << next.out;
    EXPECT_EQ(u64(next, "served_from_cache"), routed) << next.out;
    same_outputs(next, cpu, "the node's next launch from its own cache");
    EXPECT_EQ(files_under(path("node2/set")), std::vector<std::string>{b.at("file_name").get<std::string>()})
        << "the fallback wrote into the set";
  }
#endif
}

// One byte of the layer changed after the pull (on the node's disk, or by whatever served it):
// unpack refuses the layout and writes nothing into the set, and the node, finding nothing for its
// key there, packs for itself and computes the right output. The same byte put back, the layout
// unpacks and is served: the refusal was that byte's.
TEST_F(Fleet, ATamperedLayerPulledFromTheRegistryIsNeverServed) {
  const std::string model = path("build/model.bin"), tag = profile_tag("f32-");
  const Launch built = cold_pack(model, path("build/cache.wcache"));
  ASSERT_EQ(built.run.code, 0);
  ASSERT_FALSE(pack(path("build/cache.wcache"), path("build/oci"), {"--tag", tag, "--model-file", model}).is_null());
  ASSERT_TRUE(push(path("build/oci"), tag, "weightcache/mlp"));
  fs::copy_file(model, path("node/model.bin"));
  ASSERT_TRUE(pull("weightcache/mlp", tag, path("node/oci")));

  const std::string layer = layer_blob(path("node/oci"));
  ASSERT_FALSE(layer.empty());
  const std::uint64_t middle = fs::file_size(layer) / 2;
  ASSERT_NO_FATAL_FAILURE(flip_byte(layer, middle));
  // The node's set exists before it is filled, as a node's cache directory does.
  fs::create_directories(path("node/set"));
  const ToolRun u = cli({"artifact", "unpack", path("node/oci"), path("node/set")});
  EXPECT_EQ(u.code, 1) << u.describe();
  EXPECT_NE(u.err.find("does not match its digest"), std::string::npos) << u.err;
  EXPECT_EQ(files_under(path("node/set")), std::vector<std::string>{}) << "unpack left something in the set";

  const std::vector<std::string> args = {"--cache", path("node/local.wcache"), "--prebuilt-dir", path("node/set")};
  const Launch node = xnn(path("node/model.bin"), args);
  ASSERT_EQ(node.run.code, 0) << node.describe();
  EXPECT_EQ(node.n("prebuilt"), 0u) << node.run.out;
  EXPECT_EQ(node.n("reservations"), node.n("look_ups")) << "the node should have packed every weight: " << node.run.out;
  EXPECT_EQ(node.s("output"), built.s("output"));

  ASSERT_NO_FATAL_FAILURE(flip_byte(layer, middle));
  const ToolRun restored = cli({"artifact", "unpack", path("node/oci"), path("node/set")});
  ASSERT_EQ(restored.code, 0) << restored.describe();
  const Launch served = xnn(path("node/model.bin"), args);
  ASSERT_EQ(served.run.code, 0) << served.describe();
  EXPECT_EQ(served.n("prebuilt"), 1u) << served.run.out;
  EXPECT_EQ(served.s("output"), built.s("output"));
}

// Two independent cold packs of one model on this CPU (one packing thread, two) give one manifest
// digest, so a fleet's builders can rebuild an artifact and get the same one; a push and a pull
// keep it, and the registry names the manifest by it too.
TEST_F(Fleet, TheSameModelOnTheSameCpuGivesTheSameManifestDigest) {
  const std::string model = path("build/model.bin"), tag = profile_tag("f32-");
  const Launch one = cold_pack(model, path("build/one.wcache"), {"--threads", "1"});
  const Launch two = cold_pack(model, path("build/two.wcache"), {"--threads", "2"});
  ASSERT_EQ(one.run.code, 0);
  ASSERT_EQ(two.run.code, 0);
  EXPECT_EQ(one.s("output"), two.s("output"));
  const std::vector<std::string> options = {"--tag", tag, "--runtime", "xnnpack", "--cpu-profile", cpu_features(),
                                            "--model-file", model};
  ASSERT_FALSE(pack(path("build/one.wcache"), path("build/oci-one"), options).is_null());
  ASSERT_FALSE(pack(path("build/two.wcache"), path("build/oci-two"), options).is_null());
  const std::string digest = shown_digest(path("build/oci-one"));
  ASSERT_EQ(digest.rfind("sha256:", 0), 0u) << digest;
  EXPECT_EQ(shown_digest(path("build/oci-two")), digest) << "two cold packs of one model gave two artifacts";

  ASSERT_TRUE(push(path("build/oci-one"), tag, "weightcache/mlp"));
  const std::string head =
      http(registry_.port(), "HEAD", "/v2/weightcache/mlp/manifests/" + tag,
           "Accept: application/vnd.oci.image.manifest.v1+json\r\n");
  EXPECT_NE(head.find("Docker-Content-Digest: " + digest), std::string::npos) << "the registry's digest: " << head;
  ASSERT_TRUE(pull("weightcache/mlp", tag, path("node/oci")));
  EXPECT_EQ(shown_digest(path("node/oci")), digest) << "the push and pull changed the manifest";
}

}  // namespace
