// Every error about an open file names that file. The platform layer's handle-based calls
// (fstat, pread, pwrite, posix_fallocate, ftruncate, fdatasync, mmap, msync, flock, lseek, and the
// in-use lock's fcntl) used to say '<cache>' or '<cache file>' (a full disk read "cannot allocate
// disk space for '<cache>'"), before each File carried its path to every message. Each is failed
// here in turn, from each of its first few calls on, in a whole open / pack / finalize / reopen run,
// and every message the library returned or logged is read.
#include "hooks.hpp"
#include "log_capture.hpp"
#include "scenario.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using wctest::Call;
using wctest::Decision;

TEST(ErrorMessages, EveryHandleErrorNamesTheFile) {
  weightcache::test::TempDir dir("wc-messages");
  const Call handle_calls[] = {Call::fstat, Call::pread, Call::pwrite, Call::posix_fallocate,
                               Call::ftruncate, Call::fdatasync, Call::mmap, Call::msync,
                               Call::flock, Call::lseek, Call::fcntl_lock};
  // How often a clean run makes each call.
  std::map<Call, int> made;
  {
    wctest::Hooks count([&](Call c, std::uint64_t) {
      ++made[c];
      return Decision{};
    });
    (void)wctest::run_scenario(dir.file("clean.wc"), 2, 4);
  }
  int runs = 0, messages = 0, naming_the_file = 0, full_disk_named = 0;
  for (Call victim : handle_calls) {
    for (int nth = 1; nth <= std::min(made[victim], 4); ++nth) {
      for (int err : {EIO, ENOSPC}) {
        const std::string path = dir.file("c" + std::to_string(runs++) + ".wc");
        weightcache::test::LogCapture log;
        std::vector<weightcache::Error> errors;
        {
          int seen = 0;
          wctest::Hooks hooks([&](Call c, std::uint64_t) {
            // From the nth call on: a full disk stays full (and growth retries a smaller size).
            if (c == victim && ++seen >= nth) return Decision{Decision::fail, err};
            return Decision{};
          });
          (void)wctest::run_scenario(path, 2, 4, weightcache::Options{}.max_file_bytes, &errors);
          errors.push_back(weightcache::last_error());
        }
        std::vector<std::string> texts;
        for (const auto& e : errors) texts.push_back(e.message);
        for (const auto& m : log.at_least(WC_LOG_WARN)) texts.push_back(m.text);
        const std::string what = std::string(wctest::call_name(victim)) + " #" + std::to_string(nth) + " failing with " +
                                 std::strerror(err);
        for (const auto& t : texts) {
          if (t.empty()) continue;
          ++messages;
          EXPECT_EQ(t.find("<cache>"), std::string::npos) << what << ": " << t;
          EXPECT_EQ(t.find("<cache file>"), std::string::npos) << what << ": " << t;
          EXPECT_EQ(t.find("(unknown file)"), std::string::npos) << what << ": " << t;
          naming_the_file += t.find(path) != std::string::npos;
          if (victim == Call::posix_fallocate && err == ENOSPC &&
              t.find("cannot allocate disk space for '" + path + "': " + std::strerror(ENOSPC)) != std::string::npos)
            ++full_disk_named;
        }
      }
    }
  }
  std::printf("%d faulted runs, %d messages, %d naming the file\n", runs, messages, naming_the_file);
  EXPECT_GT(naming_the_file, 0);
  // The full disk, as the host sees it: reserve's error (wc_last_error) names the file.
  EXPECT_GT(full_disk_named, 0);
}

}  // namespace
