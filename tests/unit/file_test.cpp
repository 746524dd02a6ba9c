// The owners of OS resources (src/platform/file.hpp, address_space.hpp): a File names its file
// in every error and is closed exactly once, by the platform that opened it, however it is moved;
// a Lease is given back when it goes; an AddressReservation is released when it goes. Through
// the platform seam, so on every OS.
#include "unit_test_util.hpp"

#include "forwarding_platform.hpp"
#include "platform/address_space.hpp"
#include "platform/file.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifndef _WIN32
#include <fcntl.h>
#include <unistd.h>
#endif

namespace weightcache::test {
namespace {

using platform::File;
using platform::OpenMode;

// Counts what a wrapping platform sees given back.
class CountingPlatform final : public ForwardingPlatform {
 public:
  void close_file(Handle h) noexcept override {
    closed.push_back(h);
    ForwardingPlatform::close_file(h);
  }
  void unlock(const File& f) noexcept override {
    ++unlocks;
    ForwardingPlatform::unlock(f);
  }
  void release_address_space(void* b, std::size_t n) noexcept override {
    released.push_back(b);
    ForwardingPlatform::release_address_space(b, n);
  }
  std::vector<Handle> closed;
  std::vector<void*> released;
  int unlocks = 0;
};

TEST(FileOwner, ErrorsAboutAnOpenFileNameIt) {
  TempDir dir("wc-file");
  const std::string path = dir.file("short.bin");
  auto& pf = platform::os();
  auto f = pf.open_file(path, OpenMode::create_new, 0644, false);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->path(), path);
  ASSERT_TRUE(pf.write_at(f.value(), "abc", 3, 0).ok());
  char buf[16];
  auto r = pf.read_at(f.value(), buf, sizeof buf, 0);  // past the end
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::corrupt);
  EXPECT_NE(r.error().message.find("'" + path + "'"), std::string::npos) << r.error().message;
}

TEST(FileOwner, TheOpeningPlatformClosesItOnceWhereverItIsMoved) {
  TempDir dir("wc-file");
  CountingPlatform pf;
  platform::Handle h = platform::kInvalidHandle;
  {
    auto opened = pf.open_file(dir.file("a"), OpenMode::create_new, 0644, false);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    h = opened->handle();
    File moved = std::move(opened).value();
    File assigned;
    assigned = std::move(moved);
    EXPECT_FALSE(moved.is_open());  // NOLINT(bugprone-use-after-move): a moved-from File is closed
    EXPECT_TRUE(assigned.is_open());
    EXPECT_EQ(assigned.path(), dir.file("a"));
    EXPECT_TRUE(pf.closed.empty());
  }
  EXPECT_EQ(pf.closed, std::vector<platform::Handle>{h}) << "closed once, through the platform that opened it";

  // Closing by hand closes now, keeps the name for messages, and is not repeated later.
  auto again = pf.open_file(dir.file("a"), OpenMode::read_write, 0644, false);
  ASSERT_TRUE(again.ok()) << again.error().message;
  again->close();
  EXPECT_FALSE(again->is_open());
  EXPECT_EQ(again->path(), dir.file("a"));
  again = Error{Errc::io, 0, "gone"};  // destroys the File
  EXPECT_EQ(pf.closed.size(), 2u);

  // Assigning over an open File closes what it held.
  auto first = pf.open_file(dir.file("a"), OpenMode::read, 0644, false);
  auto second = pf.open_file(dir.file("a"), OpenMode::read, 0644, false);
  ASSERT_TRUE(first.ok() && second.ok());
  const platform::Handle old = first->handle();
  first.value() = std::move(second).value();
  ASSERT_EQ(pf.closed.size(), 3u);
  EXPECT_EQ(pf.closed.back(), old);
}

TEST(FileOwner, ALeaseIsGivenBackWhenItGoes) {
  TempDir dir("wc-file");
  CountingPlatform pf;
  const std::string lock = dir.file("c.lock");
  auto take = [&]() -> Result<platform::Lease> {
    auto f = pf.open_file(lock, OpenMode::lock_file, 0644, false);
    if (!f) return f.error();
    return platform::Lease::try_take(std::move(f).value());
  };
  {
    auto held = take();
    ASSERT_TRUE(held.ok()) << held.error().message;
    EXPECT_TRUE(held->held());
    EXPECT_EQ(held->file().path(), lock);
    auto refused = take();  // another open of the lock file: another holder, as another process
    ASSERT_TRUE(refused.ok()) << refused.error().message;
    EXPECT_FALSE(refused->held());
  }
  EXPECT_EQ(pf.unlocks, 1) << "only the lease that was held is unlocked";
  EXPECT_EQ(pf.closed.size(), 2u);
  auto later = take();
  ASSERT_TRUE(later.ok()) << later.error().message;
  EXPECT_TRUE(later->held());
  later->release();
  EXPECT_FALSE(later->held());
  EXPECT_FALSE(later->file().is_open());
  EXPECT_EQ(pf.unlocks, 2);

  auto no_file = platform::Lease::try_take(File());
  EXPECT_FALSE(no_file.ok());
}

TEST(FileOwner, AnAddressReservationIsReleasedWhenItGoes) {
  CountingPlatform pf;
  const std::size_t size = std::size_t{4} << 20, align = pf.map_granularity();
  void* base = nullptr;
  {
    auto r = platform::AddressReservation::reserve(pf, size, align);
    ASSERT_TRUE(r.ok()) << r.error().message;
    base = r->base();
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(r->size(), size);
    EXPECT_TRUE(r->contains(r->base() + size - 1));
    EXPECT_FALSE(r->contains(r->base() + size));
    platform::AddressReservation moved = std::move(r).value();
    EXPECT_TRUE(pf.released.empty());
  }
  EXPECT_EQ(pf.released, std::vector<void*>{base});
}

#ifndef _WIN32
// A File the platform made from a caller's descriptor is named after it: "fd N".
TEST(FileOwner, AReopenedDescriptorIsNamedAfterIt) {
  TempDir dir("wc-file");
  const int fd = ::open(dir.file("d").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  auto f = platform::os().reopen(fd, true);
  ::close(fd);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const std::string label = "fd " + std::to_string(fd);
  EXPECT_EQ(f->path(), label);
  char buf[8];
  auto r = platform::os().read_at(f.value(), buf, sizeof buf, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'" + label + "'"), std::string::npos) << r.error().message;
}
#endif

}  // namespace
}  // namespace weightcache::test
