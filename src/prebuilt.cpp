#include "prebuilt.hpp"

#include "format/format.hpp"

#include <algorithm>
#include <array>
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
  auto names = pf.list_directory(dir);
  if (!names) {
    out.unreadable = names.error().message;
    return out;
  }
  std::sort(names->begin(), names->end());
  auto consider = [&](const std::string& path) {
    ++out.looked_at;
    if (suits(pf, path, compat, align, not_this, out.skipped)) out.suitable.push_back(path);
  };
  for (const auto& name : names.value()) {
    const std::string path = join(dir, name);
    auto st = pf.stat_path(path, /*follow=*/false);
    if (!st || st->symlink) continue;
    if (st->regular) {
      if (has_suffix(name, ".wcache")) consider(path);
      continue;
    }
    // One level down: an image volume or an unpacked artifact per CPU profile.
    auto inner = pf.list_directory(path);
    if (!inner) continue;
    std::sort(inner->begin(), inner->end());
    for (const auto& n : inner.value()) {
      if (!has_suffix(n, ".wcache")) continue;
      const std::string p = join(path, n);
      auto s = pf.stat_path(p, /*follow=*/false);
      if (s && s->regular && !s->symlink) consider(p);
    }
  }
  return out;
}

}  // namespace weightcache::prebuilt
