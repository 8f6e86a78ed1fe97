// SHA-256 through OpenSSL's EVP interface (libssl-dev).
#include "base/sha256.h"

#include <openssl/evp.h>

#include <cstdio>

#include "base/check.h"

namespace nibble {

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  NIBBLE_CHECK(EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) == 1 && len == 32);
  std::string hex(64, '0');
  for (unsigned int i = 0; i < len; ++i) std::snprintf(&hex[2 * i], 3, "%02x", digest[i]);
  return hex;
}

}  // namespace nibble
