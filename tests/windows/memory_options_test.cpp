// What cannot be asked of a ':memory:' cache, on every platform (this file is built on Linux
// too): a new anonymous cache cannot be read-only (a reader joins one through wc_options.fd or
// .handle), and there is no file to compact.
#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <string>

namespace weightcache::test {
namespace {

TEST(MemoryOptions, ReadOnlyMemoryAndCompactingMemoryAreInvalidArguments) {
  for (Backing b : {Backing::file, Backing::automatic}) {
    Options o;
    o.path = kMemoryPath;
    o.compat_key = "memory-options";
    o.backing = b;
    o.read_only = true;
    auto c = WeightCache::open(o);
    ASSERT_FALSE(c.ok()) << "a read-only ':memory:' cache opened";
    EXPECT_EQ(c.error().code, Errc::invalid_argument) << c.error().message;
    EXPECT_NE(c.error().message.find("read-only"), std::string::npos) << c.error().message;
  }
  wc_options w;
  wc_options_init(&w);
  w.path = ":memory:";
  w.read_only = 1;
  wc_cache* out = nullptr;
  EXPECT_EQ(wc_open(&w, &out), WC_ERR_INVALID_ARGUMENT) << wc_last_error();
  EXPECT_EQ(out, nullptr);
  w.read_only = 0;
  EXPECT_EQ(wc_compact(&w), WC_ERR_INVALID_ARGUMENT) << wc_last_error();
  EXPECT_NE(std::string(wc_last_error()).find("no file to compact"), std::string::npos) << wc_last_error();
}

}  // namespace
}  // namespace weightcache::test
