// One harness for the suites that run a runtime program of ours as an application gets it
// (weightcache-ggml, weightcache-llama: installed by `cmake --install` into a prefix, each load a
// new process on a GGUF that weightcache-gguf-gen makes). A suite describes its program in a
// RuntimeProgram; runtime_scenarios.cpp holds the scenarios every such program must pass (stock,
// cold and warm agree; a changed GGUF is seen; a damaged cache or an impossible path still give
// the stock outputs; four processes share one copy), which the suite instantiates with
//
//   WEIGHTCACHE_RUNTIME_SCENARIOS(Llama, kLlama);
//
// (the suite's name, its RuntimeProgram), and its own tests take the same helpers through a
// RuntimeTest fixture.
#pragma once

#include <gtest/gtest.h>

#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

namespace weightcache::test {

// One runtime program, and what only it reports.
struct RuntimeProgram {
  const char* name;          // "llama": the instances' names, the temporary directories'
  const char* prefix;        // where `cmake --install` put the programs
  const char* program;       // "weightcache-llama"
  const char* install_test;  // the test that installs it, named when it is missing
  // Every load's arguments besides --model and the cache (--json and a short, fixed run), and the
  // four sharing processes' (one thread, the shortest run).
  std::vector<std::string> load_args, shared_load_args;
  std::vector<std::string> gen_args;  // weightcache-gguf-gen's, besides the model's shape and seed
  // The JSON fields that two runs on the same weights must give alike (the outputs' checksums).
  std::vector<std::string> outputs;
  // The JSON count, in a run with a cache, of the weights it sends to the cache.
  const char* to_cache;
  // What the stock-cold-warm scenario checks beyond the shared expectations, on this program's own
  // fields (memory, counters only it reports).
  void (*more_stock_cold_warm)(const ToolRun& stock, const ToolRun& cold, const ToolRun& warm);
};

// A test's parameter, as GoogleTest prints it: the program's name.
inline void PrintTo(const RuntimeProgram* p, std::ostream* os) { *os << p->program; }

// How a load takes its repacked weights: `kStock` (the runtime's own repacking), `kNoRepack`
// (plain buffers), or else the path of a cache file.
inline const std::string kStock = "stock", kNoRepack = "no-repack";

// A generated llama-architecture model.
struct ModelShape {
  std::string type = "q4_0", seed = "1", dim = "256", ffn = "512", layers = "2";
};

// The weights stock ggml puts in a layout the cache serves (AMX, KleidiAI, CPU_REPACK), from a report's
// stock_buffer_types ("AMX=7,CPU_REPACK=9").
std::uint64_t served_layouts(const std::string& buffer_types);

// The file offset of a tensor's data in a GGUF; 0 when it has none.
std::size_t tensor_offset(const std::string& gguf, const char* name);

// A temporary directory and the runs of one program in it.
class RuntimeFixture {
 public:
  explicit RuntimeFixture(const RuntimeProgram& p) : p_(p), dir_(std::string("wc-") + p.name) {}

  std::string f(const std::string& name) const { return dir_.file(name); }
  std::string installed(const char* tool) const { return std::string(p_.prefix) + "/bin/" + tool; }
  // An installed tool (weightcache, weightcache-ggml, ...) with `args`, to completion.
  ToolRun run(const char* tool, const std::vector<std::string>& args) const;
  // The program on `model`, its weights as `how` says (kStock, kNoRepack, or a cache path).
  ToolRun load(const std::string& model, const std::string& how, const std::vector<std::string>& extra = {}) const;
  void make_model(const std::string& out, const ModelShape& shape = {}) const;
  // Two runs that must have computed with the same weights: the program's outputs agree.
  void expect_same_outputs(const ToolRun& a, const ToolRun& b, const std::string& what) const;
  void expect_installed() const;

 protected:
  const RuntimeProgram& p_;
  TempDir dir_;
};

// A suite's own tests: `class Llama : public RuntimeTest { protected: Llama() : RuntimeTest(kLlama) {} };`
class RuntimeTest : public ::testing::Test, public RuntimeFixture {
 protected:
  using RuntimeFixture::RuntimeFixture;
  void SetUp() override { expect_installed(); }
};

// The shared scenarios, once per program.
class RuntimeSuite : public ::testing::TestWithParam<const RuntimeProgram*>, public RuntimeFixture {
 protected:
  RuntimeSuite() : RuntimeFixture(*GetParam()) {}
  void SetUp() override { expect_installed(); }
};

// The stock-cold-warm scenario, once per program and quantization type.
class RuntimeTypes : public ::testing::TestWithParam<std::tuple<const RuntimeProgram*, std::string>>,
                     public RuntimeFixture {
 protected:
  RuntimeTypes() : RuntimeFixture(*std::get<0>(GetParam())) {}
  void SetUp() override { expect_installed(); }
};

// The quantization types every program is checked on, for RuntimeTypes.
inline auto types_of(const RuntimeProgram& p) {
  return ::testing::Combine(::testing::Values(&p), ::testing::Values("q4_0", "q4_k", "iq4_nl"));
}
inline std::string program_name(const ::testing::TestParamInfo<const RuntimeProgram*>& info) {
  return info.param->name;
}
inline std::string type_name(const ::testing::TestParamInfo<std::tuple<const RuntimeProgram*, std::string>>& info) {
  return std::get<1>(info.param);
}

}  // namespace weightcache::test

// The shared scenarios for `program` (a RuntimeProgram), named <Suite>/RuntimeSuite.<scenario>/<its
// name> and <Suite>/RuntimeTypes.<scenario>/<type>. At namespace scope.
#define WEIGHTCACHE_RUNTIME_SCENARIOS(Suite, program)                                      \
  using ::weightcache::test::RuntimeSuite;                                                \
  using ::weightcache::test::RuntimeTypes;                                                \
  INSTANTIATE_TEST_SUITE_P(Suite, RuntimeSuite, ::testing::Values(&(program)),            \
                           ::weightcache::test::program_name);                            \
  INSTANTIATE_TEST_SUITE_P(Suite, RuntimeTypes, ::weightcache::test::types_of(program), \
                           ::weightcache::test::type_name)
