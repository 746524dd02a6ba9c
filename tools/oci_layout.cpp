#include "oci_layout.hpp"

#include "output.hpp"
#include "pending_file.hpp"
#include "sha256.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::cli::oci {
namespace {

Failure malformed(const std::string& what, const std::string& why) { return {kExitProblems, what + " " + why}; }

Failure write_failure(const Error& e) { return {kExitIo, e.code == Errc::no_memory ? "out of memory" : e.message}; }

// Opens a file of the layout for reading. O_NONBLOCK: a FIFO planted under the name must not hang
// the open; fstat then refuses anything but a regular file. `bad_exit` is the code for a name that
// is missing or not a regular file: 3 for oci-layout and index.json (then OCI_DIR is not an image
// layout), 1 for a blob (the layout fails a check).
Outcome open_regular(const std::string& path, const std::string& what, int bad_exit, int* fd, std::uint64_t* size) {
  const int f = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f < 0) {
    const int err = errno;
    return Failure{err == ENOENT ? bad_exit : kExitCannotRead,
                   "cannot open " + what + " '" + path + "': " + std::strerror(err)};
  }
  struct stat st {};
  if (::fstat(f, &st) != 0) {
    const int err = errno;
    ::close(f);
    return Failure{kExitCannotRead, "cannot look at " + what + " '" + path + "': " + std::strerror(err)};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(f);
    return Failure{bad_exit, what + " '" + path + "' is not a regular file"};
  }
  const int flags = ::fcntl(f, F_GETFL);
  if (flags >= 0) ::fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
  *fd = f;
  *size = static_cast<std::uint64_t>(st.st_size);
  return std::nullopt;
}

// Reads `size` bytes from fd (fewer only at the end of the file). Exit 3 on a read error.
Outcome read_exact(int fd, const std::string& path, std::uint64_t size, std::string* out) {
  out->resize(size);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, out->data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Failure{kExitCannotRead, "cannot read '" + path + "': " + std::strerror(errno)};
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out->resize(got);
  return std::nullopt;
}

// A small file of the layout (oci-layout, index.json), whole.
Outcome read_layout_file(const std::string& layout, const std::string& name, std::string* bytes) {
  const std::string path = layout + "/" + name;
  int fd = -1;
  std::uint64_t size = 0;
  if (auto f = open_regular(path, name, kExitCannotRead, &fd, &size)) {
    f->message += " ('" + layout + "' is not an OCI image layout)";
    return f;
  }
  Outcome r = size > kMaxDocumentSize
                  ? Outcome(malformed(name, "is " + std::to_string(size) + " bytes, more than any layout's " + name))
                  : read_exact(fd, path, size, bytes);
  ::close(fd);
  return r;
}

Outcome parse_document(const std::string& bytes, const std::string& what, Json* out) {
  *out = Json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) return malformed(what, "is not a JSON object");
  return std::nullopt;
}

Outcome check_layout_version(const std::string& layout) {
  std::string bytes;
  if (auto f = read_layout_file(layout, "oci-layout", &bytes)) return f;
  Json j;
  if (auto f = parse_document(bytes, "oci-layout", &j)) return f;
  const auto it = j.find("imageLayoutVersion");
  if (it == j.end() || !it->is_string() || it->get<std::string>().rfind("1.", 0) != 0)
    return malformed("oci-layout", "does not name image layout version 1.x");
  return std::nullopt;
}

std::string tag_of(const Descriptor& d) {
  const auto it = d.annotations.find(kRefNameAnnotation);
  return it == d.annotations.end() ? std::string() : it->second;
}

Outcome pick(const std::vector<Descriptor>& all, const std::optional<std::string>& tag, std::size_t* chosen) {
  if (tag) {
    for (std::size_t i = 0; i < all.size(); ++i)
      if (tag_of(all[i]) == *tag) {
        *chosen = i;
        return std::nullopt;
      }
    return Failure{kExitUsage, "index.json has no manifest tagged '" + *tag + "'"};
  }
  if (all.size() == 1) {
    *chosen = 0;
    return std::nullopt;
  }
  if (all.empty()) return malformed("index.json", "lists no manifest");
  std::string tags;
  for (const auto& d : all) tags += (tags.empty() ? "" : ", ") + (tag_of(d).empty() ? "(untagged)" : tag_of(d));
  return Failure{kExitUsage,
                 "index.json lists " + std::to_string(all.size()) + " manifests; pick one with --tag (" + tags + ")"};
}

}  // namespace

Json to_json(const Descriptor& d) {
  Json j = {{"mediaType", d.media_type}, {"digest", d.digest}, {"size", d.size}};
  if (!d.annotations.empty()) j["annotations"] = d.annotations;
  return j;
}

Outcome parse_descriptor(const Json& j, const std::string& what, Descriptor* out) {
  if (!j.is_object()) return malformed(what, "is not a descriptor (a JSON object)");
  const auto media = j.find("mediaType"), digest = j.find("digest"), size = j.find("size");
  if (media == j.end() || !media->is_string()) return malformed(what, "has no mediaType");
  if (digest == j.end() || !digest->is_string()) return malformed(what, "has no digest");
  if (size == j.end() || !size->is_number_unsigned()) return malformed(what, "has no size (a non-negative integer)");
  *out = Descriptor{media->get<std::string>(), digest->get<std::string>(), size->get<std::uint64_t>(), {}};
  if (!valid_digest(out->digest))
    return malformed(what, "has the digest '" + out->digest + "'; only sha256:<64 lowercase hex digits> is read");
  if (const auto a = j.find("annotations"); a != j.end()) {
    if (!a->is_object()) return malformed(what, "has annotations that are not a JSON object");
    for (const auto& [k, v] : a->items()) {
      if (!v.is_string()) return malformed(what, "has an annotation '" + k + "' that is not a string");
      out->annotations[k] = v.get<std::string>();
    }
  }
  return std::nullopt;
}

bool valid_digest(std::string_view digest) {
  constexpr std::string_view kPrefix = "sha256:";
  if (digest.size() != kPrefix.size() + 64 || digest.substr(0, kPrefix.size()) != kPrefix) return false;
  return std::all_of(digest.begin() + kPrefix.size(), digest.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string blob_path(const std::string& layout, std::string_view digest) {
  return layout + "/blobs/sha256/" + std::string(digest.substr(7));
}

Outcome write_file(const std::string& dir, const std::string& name, std::string_view bytes) {
  auto f = PendingFile::create(dir, name);
  if (!f) return write_failure(f.error());
  if (auto r = f->write(bytes.data(), bytes.size()); !r) return write_failure(r.error());
  if (auto r = f->commit(); !r) return write_failure(r.error());
  return std::nullopt;
}

Outcome write_blob(const std::string& layout, std::string_view bytes, const char* media_type, Descriptor* out) {
  *out = Descriptor{media_type, sha256_digest(bytes), bytes.size(), {}};
  return write_file(layout + "/blobs/sha256", out->digest.substr(7), bytes);
}

Outcome open_blob(const std::string& layout, const Descriptor& d, int* fd) {
  const std::string path = blob_path(layout, d.digest);
  std::uint64_t size = 0;
  if (auto f = open_regular(path, "the blob", kExitProblems, fd, &size)) return f;
  if (size != d.size) {
    ::close(*fd);
    *fd = -1;
    return Failure{kExitProblems, "the blob " + d.digest + " is " + std::to_string(size) +
                                      " bytes, but its descriptor says " + std::to_string(d.size)};
  }
  return std::nullopt;
}

Outcome read_document_blob(const std::string& layout, const Descriptor& d, std::string* bytes) {
  if (d.size > kMaxDocumentSize)
    return malformed("the descriptor of " + d.digest,
                     "claims " + std::to_string(d.size) + " bytes for a " + d.media_type + " document; refused");
  int fd = -1;
  if (auto f = open_blob(layout, d, &fd)) return f;
  Outcome r = read_exact(fd, blob_path(layout, d.digest), d.size, bytes);
  ::close(fd);
  if (r) return r;
  if (bytes->size() != d.size)
    return Failure{kExitProblems, "the blob " + d.digest + " ended after " + std::to_string(bytes->size()) + " bytes"};
  const std::string actual = sha256_digest(*bytes);
  if (actual != d.digest)
    return Failure{kExitProblems, "the blob " + d.digest + " does not match its digest (its bytes hash to " + actual +
                                      "): the layout was altered or damaged"};
  return std::nullopt;
}

Outcome select_manifest(const std::string& layout, const std::optional<std::string>& tag, SelectedManifest* out) {
  if (auto f = check_layout_version(layout)) return f;
  std::string bytes;
  if (auto f = read_layout_file(layout, "index.json", &bytes)) return f;
  Json index;
  if (auto f = parse_document(bytes, "index.json", &index)) return f;
  const auto version = index.find("schemaVersion");
  if (version == index.end() || *version != 2) return malformed("index.json", "is not schemaVersion 2");
  const auto manifests = index.find("manifests");
  if (manifests == index.end() || !manifests->is_array()) return malformed("index.json", "has no manifests array");
  std::vector<Descriptor> all(manifests->size());
  for (std::size_t i = 0; i < all.size(); ++i)
    if (auto f = parse_descriptor((*manifests)[i], "index.json's manifest " + std::to_string(i), &all[i])) return f;
  std::size_t chosen = 0;
  if (auto f = pick(all, tag, &chosen)) return f;
  out->descriptor = all[chosen];
  if (!tag_of(out->descriptor).empty()) out->tag = tag_of(out->descriptor);
  if (out->descriptor.media_type != kManifestMediaType)
    return malformed("the manifest " + out->descriptor.digest,
                     "is a " + out->descriptor.media_type + ", not an image manifest (" + kManifestMediaType + ")");
  if (auto f = read_document_blob(layout, out->descriptor, &out->bytes)) return f;
  if (auto f = parse_document(out->bytes, "the manifest " + out->descriptor.digest, &out->manifest)) return f;
  const auto mv = out->manifest.find("schemaVersion");
  if (mv == out->manifest.end() || *mv != 2)
    return malformed("the manifest " + out->descriptor.digest, "is not schemaVersion 2");
  return std::nullopt;
}

}  // namespace weightcache::cli::oci
