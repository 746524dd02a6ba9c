// The OCI image layout the artifact commands write and read (opencontainers/image-spec:
// image-layout.md, descriptor.md, manifest.md): `oci-layout`, `index.json` and content-addressed
// blobs under blobs/sha256/. Reading trusts nothing in the directory: every blob read is checked
// against the digest and size of the descriptor that named it, and a digest is checked for form
// before it becomes a path.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace weightcache::cli::oci {

inline constexpr const char* kIndexMediaType = "application/vnd.oci.image.index.v1+json";
inline constexpr const char* kManifestMediaType = "application/vnd.oci.image.manifest.v1+json";
inline constexpr const char* kConfigMediaType = "application/vnd.oci.image.config.v1+json";
inline constexpr const char* kLayerTarMediaType = "application/vnd.oci.image.layer.v1.tar";
inline constexpr const char* kRefNameAnnotation = "org.opencontainers.image.ref.name";
inline constexpr const char* kTitleAnnotation = "org.opencontainers.image.title";
/// The bytes of `oci-layout`.
inline constexpr std::string_view kLayoutFile = R"({"imageLayoutVersion":"1.0.0"})";
/// Largest index, manifest or config read: these documents are a few KiB; a descriptor claiming
/// more is refused before anything is allocated for it.
inline constexpr std::uint64_t kMaxDocumentSize = std::uint64_t{4} << 20;

/// The documents are nlohmann::json: keys sorted (std::map), so dump() is deterministic.
using Json = nlohmann::json;

/// Why a command stops, and its exit code (output.hpp's ExitCode).
struct Failure {
  int exit_code;
  std::string message;
};
using Outcome = std::optional<Failure>;  // nullopt = success

struct Descriptor {
  std::string media_type;
  std::string digest;  // "sha256:" + 64 lowercase hex digits
  std::uint64_t size = 0;
  std::map<std::string, std::string> annotations;
};

Json to_json(const Descriptor& d);
/// A descriptor from JSON: mediaType and digest strings, size an unsigned integer, annotations (if
/// any) an object of strings. `what` names it in messages. Exit 1 when malformed.
Outcome parse_descriptor(const Json& j, const std::string& what, Descriptor* out);

/// True for "sha256:" followed by 64 lowercase hex digits (the only digests read or written).
bool valid_digest(std::string_view digest);
/// `<layout>/blobs/sha256/<hex>` of a valid digest.
std::string blob_path(const std::string& layout, std::string_view digest);

/// Writes `bytes` as a blob of `layout` (a temporary, synced, renamed to its digest) and returns
/// its descriptor (media type `media_type`) in *out. Exit 5 when writing fails.
Outcome write_blob(const std::string& layout, std::string_view bytes, const char* media_type, Descriptor* out);
/// Writes `<dir>/<name>` through a temporary name, synced and renamed. Exit 5 when writing fails.
Outcome write_file(const std::string& dir, const std::string& name, std::string_view bytes);

/// Opens the blob `d` names for reading: a regular file of exactly d.size bytes (its digest is the
/// reader's to check as it streams). Exit 1 when missing or of another size, 3 when unreadable.
/// The caller closes *fd.
Outcome open_blob(const std::string& layout, const Descriptor& d, int* fd);
/// Reads a document blob (at most kMaxDocumentSize) whole and checks its size and digest.
/// Exit 1 on any mismatch, 3 when unreadable.
Outcome read_document_blob(const std::string& layout, const Descriptor& d, std::string* bytes);

/// The manifest a tag names, read and checked.
struct SelectedManifest {
  Descriptor descriptor;           // from index.json
  std::optional<std::string> tag;  // its org.opencontainers.image.ref.name, if any
  Json manifest;                   // the parsed manifest blob
  std::string bytes;               // the manifest blob
};
/// Reads `oci-layout` (version 1.x) and index.json, picks the image manifest whose ref.name is
/// `tag` (without one: the only manifest; several is exit 2, naming their tags), and reads and
/// checks its blob. Exit 3 when the layout cannot be read (oci-layout or index.json missing,
/// unreadable, or not a regular file: a FIFO there is refused, never read), 2 for a tag it does
/// not have, 1 when a document is malformed or a blob does not match its descriptor.
Outcome select_manifest(const std::string& layout, const std::optional<std::string>& tag, SelectedManifest* out);

}  // namespace weightcache::cli::oci
