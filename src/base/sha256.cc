// SHA-256 through OpenSSL's EVP interface (libssl-dev).
#include "base/sha256.h"

#include <openssl/evp.h>

#include <cstdio>

#include "base/check.h"

namespace nibble {

namespace {

std::string Hex(const unsigned char* digest, unsigned int len) {
  std::string hex(64, '0');
  for (unsigned int i = 0; i < len; ++i) std::snprintf(&hex[2 * i], 3, "%02x", digest[i]);
  return hex;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  NIBBLE_CHECK(EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) == 1 && len == 32);
  return Hex(digest, len);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  NIBBLE_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(std::string_view data) {
  NIBBLE_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size()) == 1);
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  NIBBLE_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len) == 1 && len == 32);
  return Hex(digest, len);
}

std::string Sha256::HexDigestSoFar() const {
  EVP_MD_CTX* copy = EVP_MD_CTX_new();
  NIBBLE_CHECK(copy != nullptr && EVP_MD_CTX_copy_ex(copy, static_cast<const EVP_MD_CTX*>(ctx_)) == 1);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  NIBBLE_CHECK(EVP_DigestFinal_ex(copy, digest, &len) == 1 && len == 32);
  EVP_MD_CTX_free(copy);
  return Hex(digest, len);
}

}  // namespace nibble
