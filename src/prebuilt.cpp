#include "prebuilt.hpp"

#include "format/format.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <span>

namespace weightcache::prebuilt {
namespace {

bool has_suffix(const std::string& name, std::string_view suffix) {
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && (dir.back() == '/' || dir.back() == '\\') ? dir + name : dir + "/" + name;
}

// Whether the file at `path` is a cache written for `compat` whose alignment `align` divides;
// why it could not be read goes to `skipped`.
bool suits(platform::Platform& pf, const std::string& path, std::uint64_t compat, std::size_t align,
           const platform::FileInfo* not_this, std::vector<std::string>& skipped) {
  auto f = pf.open_file(path, platform::OpenMode::read, 0, /*follow=*/false);
  if (!f) {
    skipped.push_back(path + " (" + f.error().message + ")");
    return false;
  }
  auto info = pf.stat_file(f.value());
  if (!info || !info->regular || info->size < format::kHeaderSize) return false;
  if (not_this != nullptr && info->device == not_this->device && info->inode == not_this->inode) return false;
  std::array<std::byte, format::kHeaderSize> head{};
  if (auto r = pf.read_at(f.value(), head.data(), head.size(), 0); !r) {
    skipped.push_back(path + " (" + r.error().message + ")");
    return false;
  }
  format::DecodedHeader h;
  if (format::decode_header(std::span<const std::byte>(head), &h) != format::Problem::none) return false;
  return h.fixed.compat_hash == compat && align != 0 && h.fixed.alignment % align == 0;
}

}  // namespace

Scan scan(platform::Platform& pf, const std::string& dir, std::uint64_t compat, std::size_t align,
          const platform::FileInfo* not_this) {
  Scan out;
  // The "*.wcache" files of `d` in name order, and with `below` those one level down (an image
  // volume or an unpacked artifact per CPU profile). Symlinks are neither followed nor read.
  std::function<void(const std::string&, bool)> look_in = [&](const std::string& d, bool below) {
    auto names = pf.list_directory(d);
    if (!names) {
      if (below) out.unreadable = names.error().message;  // the set itself; a subdirectory is skipped
      return;
    }
    std::sort(names->begin(), names->end());
    for (const auto& name : names.value()) {
      const bool cache = has_suffix(name, ".wcache");
      if (!cache && !below) continue;
      const std::string path = join(d, name);
      auto st = pf.stat_path(path, /*follow=*/false);
      if (!st || st->symlink) continue;
      if (st->regular && cache) {
        ++out.looked_at;
        if (suits(pf, path, compat, align, not_this, out.skipped)) out.suitable.push_back(path);
      } else if (!st->regular && below) {
        look_in(path, false);
      }
    }
  };
  look_in(dir, true);
  return out;
}

}  // namespace weightcache::prebuilt
