// Caches on a caller's HANDLE where the easy path is not there: a sandboxed process whose token
// the file's ACL refuses (ReOpenFile fails with access denied, simulated through the call table)
// uses a duplicate of its handle, synchronous handles only; a handle of something that is no
// regular file is an invalid argument, whatever it is.
#include "temp_dir.hpp"
#include "win32_hooks.hpp"
#include "lease_exclusion.hpp"
#include "windows_test_util.hpp"

#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace weightcache::test {
namespace {

using wctest::WinCall;

// A wait for the lease, were there one, is short here.
Options sandbox_options(HANDLE h) {
  Options o = on_handle(h);
  o.lease_timeout = std::chrono::milliseconds(100);
  return o;
}

// Debug messages of the library while it lives.
struct DebugLog {
  DebugLog() {
    set_log_level(LogLevel::debug);
    set_log_callback(&sink, this);
  }
  ~DebugLog() {
    set_log_callback(nullptr, nullptr);
    set_log_level(LogLevel::warn);
  }
  static void sink(void* self, wc_log_level, const char* message, std::size_t size) {
    auto* log = static_cast<DebugLog*>(self);
    std::lock_guard<std::mutex> l(log->mu);
    log->text.append(message, size).append("\n");
  }
  std::string all() {
    std::lock_guard<std::mutex> l(mu);
    return text;
  }
  std::mutex mu;
  std::string text;
};

// ReOpenFile refused as a sandbox's token would be refused by the file's ACL, every other call
// made; the calls of each kind counted.
struct SandboxedReopen {
  std::atomic<int> reopens{0};
  wctest::Win32Hooks hooks{[this](WinCall c, std::uint64_t) {
    if (c != WinCall::re_open_file) return wctest::WinDecision{};
    ++reopens;
    return wctest::WinDecision{wctest::WinDecision::fail, ERROR_ACCESS_DENIED};
  }};
};

TEST(WindowsHandleSandbox, RefusedReopenUsesADuplicateThatServesFinalizesAndStillExcludesASecondCache) {
  warm_up();
  TempDir dir;
  const std::string path = dir.file("sandboxed.wcache");
  HANDLE mine = open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW);
  ASSERT_NE(mine, INVALID_HANDLE_VALUE);
  const auto entries = shared_entries(7);
  {
    DebugLog log;
    SandboxedReopen sandbox;
    auto x = WeightCache::open(sandbox_options(mine));
    ASSERT_TRUE(x.ok()) << "the cache could not be opened on a handle ReOpenFile refuses: " << x.error().message;
    EXPECT_GE(sandbox.reopens.load(), 1) << "ReOpenFile was not tried first";
    EXPECT_NE(log.all().find("duplicate"), std::string::npos) << "no debug message says which path was taken:\n"
                                                              << log.all();
    EXPECT_NE(x->file_handle(), static_cast<void*>(mine)) << "the cache must hold a handle of its own";
    for (const auto& e : entries) ASSERT_NE(pack_entry(*x, e), kNotFound) << last_error().message;
    ASSERT_TRUE(x->finalize().ok()) << last_error().message;
    for (const auto& e : entries) EXPECT_EQ(entry_problem(*x, e), "");

    // A second cache of this process on the same caller's handle: another duplicate of the same
    // file object, whose byte-range locks are the first one's too. The lease must still exclude.
    auto y = WeightCache::open(sandbox_options(mine));
    ASSERT_TRUE(y.ok()) << y.error().message;
    for (const auto& e : entries) EXPECT_EQ(entry_problem(*y, e), "");
    // The OS's part of it, on a byte of no use to the library: an exclusive byte-range lock taken
    // through one duplicate refuses the other, although both are the same file object.
    OVERLAPPED scratch{};
    scratch.OffsetHigh = 1u << 7;  // 2^39
    const auto hx = static_cast<HANDLE>(x->file_handle()), hy = static_cast<HANDLE>(y->file_handle());
    ASSERT_TRUE(::LockFileEx(hx, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &scratch));
    EXPECT_FALSE(::LockFileEx(hy, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &scratch))
        << "an exclusive lock of one file object did not exclude another handle of it";
    ASSERT_TRUE(::UnlockFileEx(hx, 0, 1, 0, &scratch));
    // Both caches share one file object: the lease still excludes.
    expect_refused_until_holder_finalizes(x.value(), y.value(), "this process already holds the writer lease");
  }
  ASSERT_TRUE(::CloseHandle(mine));
  // What went through the duplicates is an ordinary cache file.
  Options by_path = suite_options(path);
  by_path.read_only = true;
  auto r = WeightCache::open(by_path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (const auto& e : entries) EXPECT_EQ(entry_problem(*r, e), "");
  EXPECT_NE(r->look_up("held"), kNotFound);
  EXPECT_NE(r->look_up("other"), kNotFound);
}

// A duplicate keeps the file object's mode: an overlapped handle cannot serve the backend's
// synchronous reads, writes and locks, and the caller hears what to pass instead.
TEST(WindowsHandleSandbox, RefusedReopenOfAnOverlappedHandleIsAnInvalidArgument) {
  warm_up();
  TempDir dir;
  const std::string path = dir.file("overlapped.wcache");
  HANDLE mine = open_handle(path, GENERIC_READ | GENERIC_WRITE, CREATE_NEW, FILE_FLAG_OVERLAPPED);
  ASSERT_NE(mine, INVALID_HANDLE_VALUE);
  {
    SandboxedReopen sandbox;
    for (bool read_only : {false, true}) {
      Options o = sandbox_options(mine);
      o.read_only = read_only;
      auto c = WeightCache::open(o);
      ASSERT_FALSE(c.ok()) << "a cache opened on a duplicate of an overlapped handle";
      EXPECT_EQ(c.error().code, Errc::invalid_argument) << c.error().message;
      EXPECT_NE(c.error().message.find("synchronous"), std::string::npos) << c.error().message;
      EXPECT_EQ(sandbox.hooks.open_handles(), 0u) << "a handle outlived the refused open";
    }
  }
  // Not refused where ReOpenFile works: the reopened file object is synchronous.
  auto c = WeightCache::open(sandbox_options(mine));
  EXPECT_TRUE(c.ok()) << c.error().message;
  ::CloseHandle(mine);
}

// Handles of things that are no regular file: the header promises an invalid argument, and the
// message says what the handle is rather than an access or I/O error of a later step.
TEST(WindowsHandleSandbox, HandlesOfWhatIsNoRegularFileAreInvalidArguments) {
  TempDir dir;
  const std::string sub = dir.file("a-directory");
  ASSERT_TRUE(::CreateDirectoryW(wide(sub).c_str(), nullptr));
  HANDLE directory = ::CreateFileW(wide(sub).c_str(), GENERIC_READ | GENERIC_WRITE, kShareAll, nullptr, OPEN_EXISTING,
                                   FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  ASSERT_NE(directory, INVALID_HANDLE_VALUE);
  HANDLE pipe_read = nullptr, pipe_write = nullptr;
  ASSERT_TRUE(::CreatePipe(&pipe_read, &pipe_write, nullptr, 0));
  HANDLE event = ::CreateEventW(nullptr, TRUE, FALSE, nullptr);
  HANDLE mutex = ::CreateMutexW(nullptr, FALSE, nullptr);
  ASSERT_NE(event, nullptr);
  ASSERT_NE(mutex, nullptr);
  const struct {
    const char* what;
    HANDLE h;
    const char* says;
  } cases[] = {{"directory", directory, "directory"}, {"pipe (read end)", pipe_read, "pipe"},
               {"pipe (write end)", pipe_write, "pipe"}, {"event", event, "not the handle of an open file"},
               {"mutex", mutex, "not the handle of an open file"}};
  for (const auto& k : cases) {
    for (bool read_only : {false, true}) {
      Options o = sandbox_options(k.h);
      o.read_only = read_only;
      auto c = WeightCache::open(o);
      ASSERT_FALSE(c.ok()) << k.what << " opened as a cache";
      EXPECT_EQ(c.error().code, Errc::invalid_argument) << k.what << ", read_only " << read_only << ": "
                                                        << c.error().message;
      EXPECT_NE(c.error().message.find(k.says), std::string::npos) << k.what << ": " << c.error().message;
    }
  }
  for (HANDLE h : {directory, pipe_read, pipe_write, event, mutex}) ::CloseHandle(h);
}

}  // namespace
}  // namespace weightcache::test
