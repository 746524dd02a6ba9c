// The real command-line tool (WEIGHTCACHE_CLI_PATH) run as a separate process, its output
// captured in files of a temporary directory. POSIX only, as the tool's own suite.
#pragma once

#include "mp_test_util.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#ifndef WEIGHTCACHE_CLI_PATH
#error "WEIGHTCACHE_CLI_PATH must name the weightcache executable (see tests/multiprocess/CMakeLists.txt)"
#endif

namespace weightcache::test::mp {

struct CliRun {
  int code = -1;
  std::string out, err;
};

/// Starts the tool with its stdout and stderr in the files `name`.out and `name`.err of `aux`;
/// collect it with finish_cli. Several may run at once (with different names).
inline Process start_cli(const TempDir& aux, const std::string& name, const std::vector<std::string>& args) {
  const Process p = spawn_to_files(WEIGHTCACHE_CLI_PATH, args, aux.file(name + ".out"), aux.file(name + ".err"));
  if (p == kNoProcess) ADD_FAILURE() << "cannot start " << WEIGHTCACHE_CLI_PATH;
  return p;
}

/// Waits for a tool started by start_cli and reads what it wrote.
inline CliRun finish_cli(const TempDir& aux, const std::string& name, Process p) {
  CliRun r;
  if (p == kNoProcess) return r;
  const ExitStatus st = wait_process(p);
  r.code = st.exited ? st.code : 128 + st.signal;
  r.out = read_file(aux.file(name + ".out"));
  r.err = read_file(aux.file(name + ".err"));
  return r;
}

/// Runs the tool to its end.
inline CliRun run_cli(const TempDir& aux, const std::vector<std::string>& args) {
  return finish_cli(aux, "cli", start_cli(aux, "cli", args));
}

}  // namespace weightcache::test::mp
