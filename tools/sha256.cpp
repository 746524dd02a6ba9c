#include "sha256.hpp"

#include <openssl/evp.h>

#include <new>
#include <stdexcept>
#include <utility>

namespace weightcache::cli {
namespace {

EVP_MD_CTX* as_ctx(void* p) { return static_cast<EVP_MD_CTX*>(p); }

}  // namespace

Sha256::Sha256() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) throw std::bad_alloc();
  ctx_ = ctx;
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) throw std::runtime_error("libcrypto refused SHA-256");
}

Sha256::~Sha256() { EVP_MD_CTX_free(as_ctx(ctx_)); }

Sha256::Sha256(Sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(as_ctx(ctx_));
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void Sha256::update(const void* data, std::size_t size) {
  if (size != 0 && EVP_DigestUpdate(as_ctx(ctx_), data, size) != 1)
    throw std::runtime_error("libcrypto failed to hash");
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(as_ctx(ctx_), md, &n) != 1) throw std::runtime_error("libcrypto failed to hash");
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kDigits[md[i] >> 4]);
    out.push_back(kDigits[md[i] & 15]);
  }
  return out;
}

std::string sha256_digest(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return "sha256:" + h.hex();
}

}  // namespace weightcache::cli
