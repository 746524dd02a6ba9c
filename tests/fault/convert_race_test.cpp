// convert_xpwc beside a rewrite of IN in place. ExecuTorch rewrites its cache file where it is,
// and an XPWC file has no checksums: a copy made meanwhile could hold two versions of IN, the
// inspected index over rewritten bytes, or some entries of each version. The rewrite is made at a
// chosen read of IN during the conversion, by a real write of the test's own (as a writer in
// another process would make it, so it moves IN's change time); a rewrite within one timestamp
// tick of the inspection is made by also having IN's fstat report the times the inspection saw.
// A conversion must then fail as corrupt and leave nothing behind, or (for a change the copy
// cannot have straddled) hold one version whole; never two.
#include "platform/platform.hpp"
#include "platform/posix_calls.hpp"
#include "random_bytes.hpp"
#include "temp_dir.hpp"
#include "xpwc_image.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace inspect = weightcache::inspect;
namespace platform = weightcache::platform;
using weightcache::test::make_xpwc;
using weightcache::test::XpwcEntry;

constexpr std::size_t kEntrySize = 256 << 10;
constexpr int kEntries = 4;

// Version `v` of IN's entries: the same names and sizes every version, other bytes.
std::vector<XpwcEntry> version(int v) {
  std::vector<XpwcEntry> e;
  for (int i = 0; i < kEntries; ++i)
    e.push_back({"layer" + std::to_string(i) + ".weight",
                 weightcache::test::random_bytes(static_cast<std::uint64_t>(100 * v + i), kEntrySize)});
  return e;
}

void write_new(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes `bytes` over the start of `path` in place, through a descriptor of its own and the real
// system calls (not the hooked table), as a writer in another process would.
void overwrite(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

// While installed and armed: IN's `rewrite_before`-th pread (counted from arming) first runs
// `rewrite`; with `hide_times`, IN's fstat reports the mtime and ctime it had when installed,
// as a file system that stamped the rewrite within the tick of IN's last change would.
struct RewriteDuringConvert {
  static inline ino_t inode = 0;
  static inline struct timespec mtime {}, ctime{};
  static inline std::atomic<bool> armed{false};
  static inline std::atomic<int> reads{0};
  static inline std::atomic<int> rewrites{0};
  static inline int rewrite_before = 0;
  static inline bool hide_times = false;
  static inline std::function<void()> rewrite;

  static bool is_in(int fd) {
    struct stat st {};
    return platform::default_posix_calls().fstat(fd, &st) == 0 && st.st_ino == inode;
  }
  static ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    if (armed.load() && is_in(fd) && reads.fetch_add(1) + 1 == rewrite_before && rewrite) {
      rewrite();
      rewrites.fetch_add(1);
    }
    return platform::default_posix_calls().pread(fd, buf, n, off);
  }
  static int fstat(int fd, struct stat* st) {
    const int r = platform::default_posix_calls().fstat(fd, st);
    if (r == 0 && hide_times && armed.load() && st->st_ino == inode) {
      st->st_mtim = mtime;
      st->st_ctim = ctime;
    }
    return r;
  }

  explicit RewriteDuringConvert(const std::string& in) {
    struct stat st {};
    EXPECT_EQ(::stat(in.c_str(), &st), 0) << in;
    inode = st.st_ino;
    mtime = st.st_mtim;
    ctime = st.st_ctim;
    armed = false;
    reads = 0;
    rewrites = 0;
    rewrite_before = 0;
    hide_times = false;
    rewrite = nullptr;
    platform::posix_calls().fstat = &fstat;
    platform::posix_calls().pread = &pread;
  }
  ~RewriteDuringConvert() {
    platform::posix_calls().fstat = platform::default_posix_calls().fstat;
    platform::posix_calls().pread = platform::default_posix_calls().pread;
    rewrite = nullptr;
  }
};

class ConvertRace : public ::testing::Test {
 protected:
  void SetUp() override {
    in_ = dir_.file("in.xnn");
    out_ = dir_.file("out.wcache");
    write_new(in_, make_xpwc(1, version(1)).image);
  }

  // Inspects IN (before anything is armed), then arms the hooks and converts.
  weightcache::Result<inspect::ConvertReport> convert(RewriteDuringConvert& race) {
    auto f = inspect::File::open(in_);
    EXPECT_TRUE(f) << f.error().message;
    if (!f) return f.error();
    auto ins = inspect::inspect(f.value());
    EXPECT_TRUE(ins && ins->index_usable && ins->findings.empty());
    if (!ins) return ins.error();
    race.armed = true;
    auto r = inspect::convert_xpwc(f.value(), ins.value(), out_, {});
    race.armed = false;
    return r;
  }

  // Which version of IN each entry of OUT holds (0: neither), read by the library.
  std::vector<int> versions_in_out() {
    std::vector<int> got;
    weightcache::Options o;
    o.path = out_;
    o.read_only = true;
    o.verify = weightcache::Verify::on_open;
    auto c = weightcache::WeightCache::open(o);
    EXPECT_TRUE(c) << c.error().message;
    if (!c) return got;
    for (int i = 0; i < kEntries; ++i) {
      const std::string key = "layer" + std::to_string(i) + ".weight";
      const std::size_t off = c->look_up(key);
      const void* p = off == weightcache::kNotFound ? nullptr : c->offset_to_addr(off);
      int v = 0;
      for (int candidate : {1, 2})
        if (p != nullptr && std::memcmp(p, version(candidate)[i].bytes.data(), kEntrySize) == 0) v = candidate;
      got.push_back(v);
    }
    return got;
  }

  // Files beside IN: none but OUT (and its lease file) may be there.
  std::vector<std::string> others() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      const std::string n = e.path().filename().string();
      if (n != "in.xnn" && n != "out.wcache" && n != "out.wcache.lock") out.push_back(n);
    }
    return out;
  }

  weightcache::test::TempDir dir_{"wc-fault-convert"};
  std::string in_, out_;
};

// The harness can fail: armed, with no rewrite, the conversion goes through with version 1 whole,
// and the hooks saw IN read (each entry, then its index again).
TEST_F(ConvertRace, WithoutARewriteTheConversionGoesThrough) {
  RewriteDuringConvert race(in_);
  race.hide_times = true;
  const auto r = convert(race);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_GE(race.reads.load(), kEntries + 1);
  EXPECT_EQ(versions_in_out(), std::vector<int>(kEntries, 1));
}

// Version 2 written over IN after its first entry was copied: OUT would hold entry 0 of version 1
// and the rest of version 2. The rewrite moves IN's change time.
TEST_F(ConvertRace, ARewriteDuringTheCopyIsRefused) {
  {
    // Where change times do not show every change at once (tmpfs, network file systems), a
    // same-size rewrite within IN's last tick is the residual src/inspect/convert.cpp names.
    auto f = platform::os().open_file(in_, platform::OpenMode::read, 0, true);
    ASSERT_TRUE(f) << f.error().message;
    auto info = platform::os().stat_file(f.value());
    ASSERT_TRUE(info) << info.error().message;
    if (platform::os().change_window_ns(f.value(), info.value()) <= 0)
      GTEST_SKIP() << "the file system of " << in_ << " keeps no change-time window";
  }
  RewriteDuringConvert race(in_);
  race.rewrite_before = 2;  // the second entry's read
  race.rewrite = [this] { overwrite(in_, make_xpwc(1, version(2)).image); };
  const auto r = convert(race);
  ASSERT_EQ(race.rewrites.load(), 1) << "the rewrite was never made";
  ASSERT_FALSE(r) << "converted beside a rewrite";
  EXPECT_EQ(r.error().code, weightcache::Errc::corrupt);
  EXPECT_NE(r.error().message.find("changed while it was being converted"), std::string::npos) << r.error().message;
  EXPECT_FALSE(fs::exists(out_));
  EXPECT_EQ(others(), std::vector<std::string>{});
}

// Within the tick of the inspection, so that the times do not move: version 2 with entries 0 and
// 1 swapped (same names, same sizes, so the same file size; the index differs). A copy by the
// inspected index would serve entry 0 under entry 1's name: only the index read again shows it.
TEST_F(ConvertRace, AnIndexRewrittenWithinTheTickOfTheInspectionIsRefused) {
  RewriteDuringConvert race(in_);
  race.hide_times = true;
  race.rewrite_before = 1;  // before the first entry is read
  race.rewrite = [this] {
    auto v2 = version(2);
    std::swap(v2[0], v2[1]);
    const std::string image = make_xpwc(1, v2).image;
    ASSERT_EQ(image.size(), fs::file_size(in_));
    overwrite(in_, image);
  };
  const auto r = convert(race);
  ASSERT_EQ(race.rewrites.load(), 1) << "the rewrite was never made";
  ASSERT_FALSE(r) << "converted the inspected index over rewritten bytes";
  EXPECT_EQ(r.error().code, weightcache::Errc::corrupt);
  EXPECT_NE(r.error().message.find("its index differs"), std::string::npos) << r.error().message;
  EXPECT_FALSE(fs::exists(out_));
  EXPECT_EQ(others(), std::vector<std::string>{});
}

// The same, but only the bytes change (the index stays): what the times do not show happened
// before the copy read anything, so the copy holds version 2 whole. This is the case the
// argument in src/inspect/convert.cpp allows through; it must never be a mix.
TEST_F(ConvertRace, BytesRewrittenWithinTheTickOfTheInspectionAreCopiedWhole) {
  RewriteDuringConvert race(in_);
  race.hide_times = true;
  race.rewrite_before = 1;
  race.rewrite = [this] { overwrite(in_, make_xpwc(1, version(2)).image); };
  const auto r = convert(race);
  ASSERT_EQ(race.rewrites.load(), 1) << "the rewrite was never made";
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(versions_in_out(), std::vector<int>(kEntries, 2));
}

}  // namespace
