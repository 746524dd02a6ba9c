// The real command-line tool (WEIGHTCACHE_CLI_PATH) run as a separate process, its output
// captured in files of a temporary directory. POSIX only, as the tool's own suite.
#pragma once

#include "mp_test_util.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>

#ifndef WEIGHTCACHE_CLI_PATH
#error "WEIGHTCACHE_CLI_PATH must name the weightcache executable (see tests/multiprocess/CMakeLists.txt)"
#endif

namespace weightcache::test::mp {

struct CliRun {
  int code = -1;
  std::string out, err;
};

inline CliRun run_cli(const TempDir& aux, const std::vector<std::string>& args) {
  const std::string out = aux.file("cli.out"), err = aux.file("cli.err");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<std::string> storage;
#ifdef WEIGHTCACHE_TEST_EMULATOR
  storage.push_back(WEIGHTCACHE_TEST_EMULATOR);  // see tests/support/spawn.hpp
#endif
  storage.push_back(WEIGHTCACHE_CLI_PATH);
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  CliRun r;
  const int rc = ::posix_spawn(&pid, storage.front().c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << WEIGHTCACHE_CLI_PATH;
    return r;
  }
  const ExitStatus st = wait_process(pid);
  r.code = st.exited ? st.code : 128 + st.signal;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

}  // namespace weightcache::test::mp
