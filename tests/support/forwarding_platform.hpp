// A platform that forwards every call to the real backend (platform::os()): tests derive from
// it and override only the calls they observe or fail. The files it opens are its own (the
// backend's, handed over), so their closes come back through close_file here too.
#pragma once

#include "platform/platform.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace weightcache::test {

class ForwardingPlatform : public platform::Platform {
 public:
  using Handle = platform::Handle;
  using File = platform::File;

  Result<File> open_file(const std::string& p, platform::OpenMode m, unsigned perm, bool f) override {
    return ours(os_.open_file(p, m, perm, f));
  }
  void close_file(Handle h) noexcept override { os_.close_file(h); }
  Result<platform::FileInfo> stat_file(const File& h) noexcept override { return os_.stat_file(h); }
  Result<platform::FileInfo> stat_path(const std::string& p, bool f) noexcept override { return os_.stat_path(p, f); }
  Result<void> read_at(const File& h, void* b, std::size_t n, std::uint64_t o) noexcept override {
    return os_.read_at(h, b, n, o);
  }
  Result<void> write_at(const File& h, const void* b, std::size_t n, std::uint64_t o) noexcept override {
    return os_.write_at(h, b, n, o);
  }
  Result<void> allocate(const File& h, std::uint64_t o, std::uint64_t n) noexcept override {
    return os_.allocate(h, o, n);
  }
  Result<void> truncate(const File& h, std::uint64_t n) noexcept override { return os_.truncate(h, n); }
  Result<void> sync(const File& h) noexcept override { return os_.sync(h); }
  Result<void> rename(const std::string& a, const std::string& b) noexcept override { return os_.rename(a, b); }
  Result<void> sync_parent_dir(const std::string& p) noexcept override { return os_.sync_parent_dir(p); }
  void remove(const std::string& p) noexcept override { os_.remove(p); }
  Result<void> remove_file(const std::string& p) noexcept override { return os_.remove_file(p); }
  Result<std::vector<std::string>> list_directory(const std::string& d) override { return os_.list_directory(d); }
  Result<void*> reserve_address_space(std::size_t n, std::size_t a) noexcept override {
    return os_.reserve_address_space(n, a);
  }
  void release_address_space(void* b, std::size_t n) noexcept override { os_.release_address_space(b, n); }
  Result<void> map_file(const File& h, std::uint64_t o, std::size_t n, void* at, bool w) noexcept override {
    return os_.map_file(h, o, n, at, w);
  }
  Result<void> commit_memory(void* at, std::size_t n) noexcept override { return os_.commit_memory(at, n); }
  Result<void> flush_mapping(void* a, std::size_t n, bool w) noexcept override { return os_.flush_mapping(a, n, w); }
  void prefetch(void* a, std::size_t n) noexcept override { os_.prefetch(a, n); }
  bool populate_read(void* a, std::size_t n) noexcept override { return os_.populate_read(a, n); }
  Result<std::uint64_t> first_hole(const File& h, std::uint64_t o, std::uint64_t n) noexcept override {
    return os_.first_hole(h, o, n);
  }
  Result<bool> try_lock(const File& h) noexcept override { return os_.try_lock(h); }
  void unlock(const File& h) noexcept override { os_.unlock(h); }
  void touch(const File& h) noexcept override { os_.touch(h); }
  Result<File> reopen(int d, bool w) override { return ours(os_.reopen(d, w)); }
  Result<File> create_anonymous(const char* n) override { return ours(os_.create_anonymous(n)); }
  int native_descriptor(const File& h) const noexcept override { return os_.native_descriptor(h); }
  bool replaces_open_files() const noexcept override { return os_.replaces_open_files(); }
  Result<bool> try_lock_in_use(const File& h, bool exclusive) noexcept override {
    return os_.try_lock_in_use(h, exclusive);
  }
  void unlock_in_use(const File& h) noexcept override { os_.unlock_in_use(h); }
  Result<bool> in_use_by_others(const File& h) override { return os_.in_use_by_others(h); }
  std::size_t map_granularity() const noexcept override { return os_.map_granularity(); }
  int process_id() const noexcept override { return os_.process_id(); }
  std::uint64_t file_size_limit() const noexcept override { return os_.file_size_limit(); }
  std::uint64_t address_space_limit() const noexcept override { return os_.address_space_limit(); }
  Result<File> reopen_os_handle(void* h, bool w) override { return ours(os_.reopen_os_handle(h, w)); }
  void* native_os_handle(const File& f) const noexcept override { return os_.native_os_handle(f); }
  bool vanishes_with_holders(const File& f) noexcept override { return os_.vanishes_with_holders(f); }
  bool boot_id(std::uint8_t (&out)[16]) noexcept override { return os_.boot_id(out); }
  std::int64_t change_clock_ns() noexcept override { return os_.change_clock_ns(); }
  std::int64_t monotonic_ns() noexcept override { return os_.monotonic_ns(); }
  std::int64_t change_window_ns(const File& f, const platform::FileInfo& info) noexcept override {
    return os_.change_window_ns(f, info);
  }
  bool write_back(const File& f, std::uint64_t o, std::uint64_t n) noexcept override { return os_.write_back(f, o, n); }
  bool has_access_list(const File& f) noexcept override { return os_.has_access_list(f); }
  Result<void> prepare_for_stores(const File& f, std::uint64_t o, std::uint64_t n) override {
    return os_.prepare_for_stores(f, o, n);
  }
  void start_write_back(const File& f, std::uint64_t o, std::uint64_t n) noexcept override {
    os_.start_write_back(f, o, n);
  }

 protected:
  /// A file the backend opened, handed over to this platform.
  Result<File> ours(Result<File> r) noexcept {
    if (!r) return r;
    return std::move(r).value().handed_to(*this);
  }

  platform::Platform& os_ = platform::os();
};

}  // namespace weightcache::test
