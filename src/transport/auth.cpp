// Written on OpenSSL (HMAC, RAND_bytes, CRYPTO_memcmp) rather than by hand:
// a MAC and a CSPRNG are what a maintained library is for.
#include "transport/auth.h"

#include <array>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "tide/common/error.h"

#include "transport/fields.h"

namespace tide::transport::auth {

std::string nonce() {
  std::string out(kNonceSize, '\0');
  if (RAND_bytes(
          reinterpret_cast<unsigned char*>(out.data()),
          static_cast<int>(out.size())) != 1) {
    throw Error("the system's random generator failed (RAND_bytes)");
  }
  return out;
}

std::string proof(
    std::string_view secret, Role role, const Session& session, uint32_t lane) {
  std::string message = FieldWriter()
                            .str("tide-rpc-auth-v1")
                            .u32(static_cast<uint32_t>(role))
                            .str(session.caller_nonce)
                            .str(session.callee_nonce)
                            .i32(session.caller_id)
                            .i32(session.callee_id)
                            .u32(lane)
                            .take();
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int len = 0;
  // HMAC() takes a null key as "no key"; an empty secret still needs a
  // valid pointer.
  static const char kEmpty = 0;
  const void* key = secret.empty() ? &kEmpty : secret.data();
  if (HMAC(
          EVP_sha256(),
          key,
          static_cast<int>(secret.size()),
          reinterpret_cast<const unsigned char*>(message.data()),
          message.size(),
          mac.data(),
          &len) == nullptr) {
    throw Error("HMAC-SHA256 failed (OpenSSL)");
  }
  return {reinterpret_cast<const char*>(mac.data()), len};
}

bool verify(
    std::string_view secret,
    Role role,
    const Session& session,
    std::string_view claimed,
    uint32_t lane) {
  std::string expected = proof(secret, role, session, lane);
  return claimed.size() == expected.size() &&
         CRYPTO_memcmp(claimed.data(), expected.data(), expected.size()) == 0;
}

}  // namespace tide::transport::auth
