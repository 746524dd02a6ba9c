// Two caches of one file in this process (by path, descriptor or handle, or on duplicates of
// one handle): while one holds the writer lease, the other is refused at once, never made to
// wait lease_timeout for its own process; once the holder finalizes, the other writes.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace weightcache::test {

// `holder` takes the lease (a reservation past the committed end keeps it until finalize);
// `other` must be refused with busy and a message containing `message_part`.
inline void expect_refused_until_holder_finalizes(WeightCache& holder, WeightCache& other,
                                                  const std::string& message_part) {
  void* held = holder.reserve(1000);
  ASSERT_NE(held, nullptr) << last_error().message;
  EXPECT_EQ(other.reserve(1000), nullptr) << "both caches held the lease";
  EXPECT_EQ(last_error().code, Errc::busy) << last_error().message;
  EXPECT_NE(last_error().message.find(message_part), std::string::npos) << last_error().message;
  EXPECT_EQ(other.stats().lease_timeouts, 0u) << "waited lease_timeout for its own process";
  std::memset(held, 1, 1000);
  ASSERT_NE(holder.look_up_or_insert("held", held, 1000), kNotFound);
  ASSERT_TRUE(holder.finalize().ok()) << last_error().message;  // lets the lease go
  ASSERT_NE(other.insert("other", "after the holder"), kNotFound) << last_error().message;
  ASSERT_TRUE(other.finalize().ok()) << last_error().message;
  EXPECT_EQ(other.stats().heap_bytes, 0u);
}

}  // namespace weightcache::test
