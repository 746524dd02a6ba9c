// `weightcache artifact pack | unpack | show`: a cache file as an OCI image-layout artifact, for
// publishing with skopeo to a registry and pulling (or mounting as a Kubernetes image volume) on
// the nodes (docs/CLI.md, "artifact"). No registry client: only the layout directory is written
// and read. The layer is an uncompressed one-member tar of the cache's canonical form
// (wc_compact_ex with WC_COMPACT_CANONICAL), so the manifest digest is a function of the entries,
// the compatibility key and the annotations, not of the order the cache was filled in.
#pragma once

#include <optional>
#include <string>

namespace weightcache::cli {

struct PackOptions {
  std::string tag = "latest";
  std::optional<std::string> name;        // file name in the layer; default <compat hash hex>.wcache
  std::optional<std::string> compat_key;  // the file must have been written for it (exit 2)
  std::optional<std::string> runtime;     // recorded as annotations when given
  std::optional<std::string> cpu_profile;
  std::optional<std::string> model_file;  // its SHA-256 and base name are recorded
  std::optional<std::string> arch;        // the image config's architecture; default: this build's
  bool force = false;                     // replace an existing OCI_DIR (an image layout or empty)
  bool json = false;
};

struct UnpackOptions {
  std::optional<std::string> tag;  // default: the layout's only manifest
  bool json = false;
};

/// Each prints its own messages and returns an ExitCode (docs/CLI.md lists them).
int run_artifact_pack(const std::string& cache, const std::string& oci_dir, const PackOptions& options);
int run_artifact_unpack(const std::string& oci_dir, const std::string& set_dir, const UnpackOptions& options);
int run_artifact_show(const std::string& oci_dir, const UnpackOptions& options);

}  // namespace weightcache::cli
