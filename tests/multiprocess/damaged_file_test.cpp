// A cache file cut short by something outside the library (a full disk during a copy, a foreign
// truncate) while no process had it open, then used by later launches, each a new process. The
// cut leaves the newest commit slot naming bytes past EOF (or a half index): readers fall back to
// the older commit, but no writer may commit over a slot it could not read. The file is damaged,
// so the next open that finds it unused must repair it (the older commit's entries kept where they
// survive); the launch after that must hit. While another process has the file open it must not
// be replaced or cut, and the open after that process has gone repairs it.
#include "mp_test_util.hpp"

#include "platform/platform.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace weightcache::test::mp {
namespace {

constexpr std::size_t kCount = 4;
constexpr std::size_t kSize = 3000;  // odd, a little under a page: entries end mid-page

struct Layout {
  format::CommitSlot older, newest;
  std::vector<format::IndexRecord> records;  // the newest commit's
  std::uint64_t size = 0;
};

// Two launches: own/a/* (commit 2), then own/b/* (commit 3).
Layout write_two_commits(const std::string& path) {
  for (const char* tag : {"a", "b"}) {
    Children kids;
    kids.start("pack", {arg("path", path), arg("tag", tag), arg("own", kCount), arg("size", kSize)});
    EXPECT_TRUE(kids.all_succeed());
  }
  const std::string raw = read_file(path);
  format::DecodedHeader h;
  EXPECT_EQ(format::decode_header({reinterpret_cast<const std::byte*>(raw.data()), format::kHeaderSize}, &h),
            format::Problem::none);
  EXPECT_TRUE(h.slot_valid[0] && h.slot_valid[1]);
  const int newest = h.slot[0].sequence > h.slot[1].sequence ? 0 : 1;
  Layout l;
  l.newest = h.slot[newest];
  l.older = h.slot[1 - newest];
  EXPECT_EQ(l.newest.sequence, 3u);
  const FileIndex fi = decode_file(path);
  EXPECT_EQ(fi.problem, "");
  EXPECT_EQ(fi.records.size(), 2 * kCount);
  l.records = fi.records;
  l.size = raw.size();
  return l;
}

std::uint64_t inode_of(const std::string& path) {
  return platform::os().stat_path(path, false).value().inode;
}

TEST(DamagedFile, TruncatedFileIsRepairedByTheNextOpenThatFindsItUnused) {
  struct Cut {
    const char* name;
    std::uint64_t (*at)(const Layout&);
  };
  const Cut cuts[] = {
      {"half", [](const Layout& l) { return l.size / 2; }},
      {"just after the header", [](const Layout&) { return std::uint64_t{format::kHeaderSize}; }},
      {"just past the fresh file's empty index", [](const Layout&) { return std::uint64_t{format::kHeaderSize} + 52; }},
      {"mid-entry of the newest commit",
       [](const Layout& l) {
         for (const auto& r : l.records)
           if (r.key.rfind("own/b/", 0) == 0) return r.offset + r.size / 2;
         return l.size / 2;
       }},
      {"at the end of the older commit", [](const Layout& l) { return l.older.committed_size; }},
      {"mid-index of the newest commit", [](const Layout& l) { return l.newest.index_offset + l.newest.index_size / 2; }},
      {"one byte short", [](const Layout& l) { return l.size - 1; }},
  };
  for (const Cut& cut : cuts) {
    SCOPED_TRACE(cut.name);
    TempDir dir("wc-mp-truncated");
    const std::string path = dir.file("cache.wc");
    const Layout l = write_two_commits(path);
    const std::uint64_t at = cut.at(l);
    ASSERT_LT(at, l.size);
    std::filesystem::resize_file(path, at);

    // The next launch: packs own/b/* again (checking the bytes of every key it finds) and its
    // finalize must succeed, into the file (a heap fallback exits kChildFellBack).
    {
      Children kids;
      kids.start("pack", {arg("path", path), arg("tag", "b"), arg("own", kCount), arg("size", kSize)});
      ASSERT_TRUE(kids.all_succeed()) << "cut to " << at << " of " << l.size << " bytes";
    }
    // The file is a whole cache again, and the launch after that hits every key it re-inserted.
    const FileIndex fi = decode_file(path);
    ASSERT_EQ(fi.problem, "");
    EXPECT_EQ(fi.file_size, fi.slot.committed_size);
    for (std::size_t j = 0; j < kCount; ++j) EXPECT_EQ(fi.keys().count(own_key("b", j)), 1u) << own_key("b", j);
    Children kids;
    kids.start("verify", {arg("path", path), arg("tag", "b"), arg("count", kCount), arg("size", kSize),
                          arg("results", dir.file("results-b"))});
    // The older commit survived the cut whole: its entries were kept by the repair.
    if (at >= l.older.committed_size)
      kids.start("verify", {arg("path", path), arg("tag", "a"), arg("count", kCount), arg("size", kSize),
                            arg("results", dir.file("results-a"))});
    ASSERT_TRUE(kids.all_succeed());
    EXPECT_EQ(read_results(dir.file("results-b"))["backing_file"], 1u);
  }
}

TEST(DamagedFile, TruncatedFileInUseIsLeftAloneAndRepairedOnceUnused) {
  TempDir dir("wc-mp-truncated-in-use");
  const std::string path = dir.file("cache.wc");
  const Layout l = write_two_commits(path);
  const std::uint64_t at = l.newest.index_offset + l.newest.index_size / 2;
  std::filesystem::resize_file(path, at);
  const std::uint64_t inode = inode_of(path);

  // A process using the older commit (own/a/*) holds the file open throughout: a reader (a
  // writer opening the unused file would repair it at once).
  Children reader;
  Pipe ready(Pipe::Inherit::write_end);
  const std::string stop = dir.file("stop");
  reader.start("keep_reading", {arg("path", path), arg("tag", "a"), arg("count", kCount), arg("size", kSize),
                                arg("ready_fd", std::to_string(ready.write_fd())), arg("stop", stop),
                                arg("results", dir.file("results-reader")), arg("read_only", 1)});
  ready.close_write();
  ASSERT_TRUE(ready.read_bytes(1)) << "the reader did not start";

  // A writer meanwhile cannot repair it: it serves the older commit, and its finalize fails (the
  // entries stay in its memory). The file is neither replaced nor cut below what the reader maps.
  {
    Children kids;
    const std::size_t w = kids.start("pack", {arg("path", path), arg("tag", "b"), arg("own", kCount), arg("size", kSize)});
    const ExitStatus st = kids.wait(w);
    EXPECT_TRUE(st.exited && st.code == kChildCacheError) << st.describe();
  }
  EXPECT_EQ(inode_of(path), inode);
  EXPECT_GE(std::filesystem::file_size(path), l.older.committed_size);

  { std::ofstream(stop) << "stop\n"; }
  const ExitStatus rs = reader.wait(0);
  EXPECT_TRUE(rs.ok()) << "the reader " << rs.describe();

  // Unused now: the next launch repairs it and commits; the one after hits everything.
  {
    Children kids;
    kids.start("pack", {arg("path", path), arg("tag", "b"), arg("own", kCount), arg("size", kSize)});
    ASSERT_TRUE(kids.all_succeed());
  }
  EXPECT_NE(inode_of(path), inode);  // a fresh file renamed into place, never rewritten in place
  Children kids;
  for (const char* tag : {"a", "b"})
    kids.start("verify", {arg("path", path), arg("tag", tag), arg("count", kCount), arg("size", kSize),
                          arg("results", dir.file(std::string("results-") + tag))});
  ASSERT_TRUE(kids.all_succeed());
  const FileIndex fi = decode_file(path);
  ASSERT_EQ(fi.problem, "");
  EXPECT_EQ(fi.records.size(), 2 * kCount);
}

}  // namespace
}  // namespace weightcache::test::mp
