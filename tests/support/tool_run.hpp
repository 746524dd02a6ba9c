// Runs an installed program of ours (weightcache-ggml, weightcache-llama, ...) as a new process
// with its output in files of a temporary directory, and reads back its one-line JSON report.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "spawn.hpp"
#include "temp_dir.hpp"

namespace weightcache::test {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct ToolRun {
  int code = -1;
  std::string out, err;
  nlohmann::json j;  // stdout parsed, when the program exited 0
  std::string describe() const { return "exit " + std::to_string(code) + "\nstdout: " + out + "\nstderr: " + err; }
  std::uint64_t u64(const char* key) const { return j.at(key).get<std::uint64_t>(); }
};

/// Waits for `pid` (started with spawn_to_files into out and err) and reads what it wrote.
inline ToolRun finish_tool(Process pid, const std::string& out, const std::string& err) {
  ToolRun r;
  if (pid > 0) {
    const ExitStatus st = wait_process(pid);
    r.code = st.exited ? st.code : 128 + st.signal;
  }
  r.out = slurp(out);
  r.err = slurp(err);
  if (r.code == 0) r.j = nlohmann::json::parse(r.out, nullptr, false);
  return r;
}

/// Runs `exe` with `args` to completion, its output in files of `dir`.
inline ToolRun run_tool(const TempDir& dir, const std::string& exe, const std::vector<std::string>& args) {
  static int runs = 0;
  const std::string tag = std::to_string(runs++);
  const std::string out = dir.file("run" + tag + ".out"), err = dir.file("run" + tag + ".err");
  return finish_tool(spawn_to_files(exe, args, out, err), out, err);
}

}  // namespace weightcache::test
