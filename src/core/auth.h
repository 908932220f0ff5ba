// Proof of the communicator's secret without sending it: HMAC-SHA256 keyed by
// the 16-byte secret over a role label and the handshake's fields, random
// nonces from both sides, constant-time comparison.
//
// Every handshake (rank -> root, rank -> rank, each TCP transport socket)
// follows one pattern: the dialer's hello carries its claims and a fresh
// nonce; the listener answers with a fresh nonce of its own; the dialer
// proves the secret over (its role, hello, listener's nonce); the listener
// checks that and proves itself over (its role, hello, its nonce, its answer).
// Both nonces are in both proofs, so a recorded exchange proves nothing on a
// later connection, and the role labels keep one side's proof from passing
// as the other's.
//
// auth.cc is the only file that calls OpenSSL (libcrypto): a reviewed
// library, not hand-written crypto, for the MAC, the hash and the
// comparison; random numbers come from the kernel (getrandom).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

#include "attncomm.h"

namespace attn::auth {

constexpr size_t kSecretBytes = 16;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;  // HMAC-SHA256

struct Nonce {
  uint8_t bytes[kNonceBytes];
};
struct Mac {
  uint8_t bytes[kMacBytes];
};
struct Digest {
  uint8_t bytes[32];  // SHA-256
};

using Bytes = std::span<const uint8_t>;

template <typename T>
Bytes bytesOf(const T& v) {
  return Bytes(reinterpret_cast<const uint8_t*>(&v), sizeof(T));
}

// Frees libcrypto's state of the calling thread (its error queue, which an
// HMAC allocates). Threads of the library that ran HMACs call it as they
// end: at process exit libcrypto's own cleanup may already have run, and
// then nothing else frees it.
void threadDone();
// Initialises libcrypto now. An object whose destructor joins such threads
// at exit calls it first, so that libcrypto's exit-time cleanup (after
// which threadDone frees nothing) is registered before, and runs after,
// that destructor.
void initCrypto();

// Cryptographically strong random bytes (attnSystemError if the generator
// cannot be seeded).
attnResult_t randomBytes(void* out, size_t n);
attnResult_t freshNonce(Nonce* out);

// HMAC-SHA256 keyed by `secret` over the label and the parts, each preceded
// by its length, so no two different lists of parts give the same input.
Mac prove(const uint8_t secret[kSecretBytes], std::string_view label,
          std::initializer_list<Bytes> parts);
// True when `claimed` (kMacBytes) is prove(secret, label, parts); the
// comparison takes the same time wherever the bytes differ.
bool verify(const uint8_t secret[kSecretBytes], std::string_view label,
            std::initializer_list<Bytes> parts, const uint8_t* claimed);
// SHA-256 of `data`: lets one proof cover a large table cheaply.
Digest sha256(Bytes data);
// Constant-time equality of two byte strings of length n.
bool equal(const void* a, const void* b, size_t n);
// Overwrites n bytes with zeros in a way the compiler cannot drop.
void wipe(void* p, size_t n);

}  // namespace attn::auth
