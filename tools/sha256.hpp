// SHA-256 for the OCI artifact commands (digests of blobs, of the cache file and of the model),
// through OpenSSL's libcrypto EVP interface. Only the tool links libcrypto, never the library.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weightcache::cli {

/// A running SHA-256: feed it with update(), read it once with hex(). Move-only owner of its
/// EVP_MD_CTX. Throws std::bad_alloc when libcrypto cannot allocate its context, and
/// std::runtime_error should libcrypto refuse the algorithm (neither happens with a working
/// libcrypto; the tool's main turns both into exit 5).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, std::size_t size);
  /// The digest as 64 lowercase hex digits. Ends the hash: call it once.
  std::string hex();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX*; libcrypto's type stays out of this header
};

/// "sha256:" + the hex digest of `bytes`: an OCI digest.
std::string sha256_digest(std::string_view bytes);

}  // namespace weightcache::cli
