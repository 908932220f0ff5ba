#include "src/core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "src/core/error.h"

namespace attn::auth {
namespace {

void appendPart(std::vector<uint8_t>* buf, Bytes part) {
  const uint64_t len = part.size();
  const auto* l = reinterpret_cast<const uint8_t*>(&len);
  buf->insert(buf->end(), l, l + sizeof(len));
  buf->insert(buf->end(), part.begin(), part.end());
}

}  // namespace

// The kernel's generator rather than RAND_bytes: libcrypto would keep a
// generator per calling thread, state that a child of fork() inherits from
// threads it does not have.
attnResult_t randomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return setError(attnSystemError, "getrandom: %s", strerror(errno));
    }
    p += got;
    n -= size_t(got);
  }
  return attnSuccess;
}

attnResult_t freshNonce(Nonce* out) { return randomBytes(out->bytes, kNonceBytes); }

void threadDone() { OPENSSL_thread_stop(); }

// Some option must be asked for: with none, OPENSSL_init_crypto returns
// before it registers its exit-time cleanup.
void initCrypto() { OPENSSL_init_crypto(OPENSSL_INIT_ADD_ALL_DIGESTS, nullptr); }

namespace {

bool computeMac(const uint8_t secret[kSecretBytes], std::string_view label,
                std::initializer_list<Bytes> parts, Mac* mac) {
  size_t total = sizeof(uint64_t) + label.size();
  for (Bytes p : parts) total += sizeof(uint64_t) + p.size();
  std::vector<uint8_t> msg;
  msg.reserve(total);
  appendPart(&msg, Bytes(reinterpret_cast<const uint8_t*>(label.data()), label.size()));
  for (Bytes p : parts) appendPart(&msg, p);
  unsigned int len = 0;
  return HMAC(EVP_sha256(), secret, int(kSecretBytes), msg.data(), msg.size(), mac->bytes,
              &len) != nullptr &&
         len == kMacBytes;
}

}  // namespace

Mac prove(const uint8_t secret[kSecretBytes], std::string_view label,
          std::initializer_list<Bytes> parts) {
  Mac mac{};
  // Cannot fail with a working libcrypto; should it, the proof is random
  // bytes, which the other side refuses.
  if (!computeMac(secret, label, parts, &mac)) (void)randomBytes(mac.bytes, kMacBytes);
  return mac;
}

bool verify(const uint8_t secret[kSecretBytes], std::string_view label,
            std::initializer_list<Bytes> parts, const uint8_t* claimed) {
  Mac want{};
  return computeMac(secret, label, parts, &want) && equal(want.bytes, claimed, kMacBytes);
}

Digest sha256(Bytes data) {
  Digest d{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), d.bytes, &len, EVP_sha256(), nullptr) != 1 ||
      len != sizeof(d.bytes))
    (void)randomBytes(d.bytes, sizeof(d.bytes));  // cannot happen; never matches then
  return d;
}

bool equal(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void wipe(void* p, size_t n) { OPENSSL_cleanse(p, n); }

}  // namespace attn::auth
