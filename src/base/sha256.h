// SHA-256 of a byte string (OpenSSL), for recording which file a result came from.
#pragma once

#include <string>
#include <string_view>

namespace nibble {

/// The SHA-256 digest of `data` as 64 lowercase hex digits
/// (Sha256Hex("abc") = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad").
std::string Sha256Hex(std::string_view data);

/// The same digest fed in pieces (a file read in chunks): Update, then HexDigest once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::string_view data);
  std::string HexDigest();
  /// The digest of what was fed so far, leaving the state as it is (more Update calls may follow).
  std::string HexDigestSoFar() const;

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace nibble
