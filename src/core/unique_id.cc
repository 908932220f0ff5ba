// attnUniqueId <-> UniqueIdData. Fixed layout with magic, version and a
// checksum, so a garbled or foreign id is rejected instead of dialled.
#include <cstring>

#include "src/core/bootstrap.h"
#include "src/core/bootstrap_wire.h"
#include "src/core/error.h"
#include "src/core/socket.h"

namespace attn {
namespace {

// Byte offsets inside attnUniqueId::internal.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffSecret = 8;
constexpr size_t kOffNonce = 24;
constexpr size_t kOffAddrLen = 32;
constexpr size_t kOffAddr = 36;
constexpr size_t kOffChecksum = kOffAddr + kAddressBytes;  // 100
constexpr size_t kUsed = kOffChecksum + 4;
static_assert(kUsed <= ATTN_UNIQUE_ID_BYTES, "unique id layout too large");

uint32_t fnv1a(const char* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(p[i])) * 16777619u;
  return h;
}

}  // namespace

attnResult_t encodeUniqueId(const UniqueIdData& d, attnUniqueId* id) {
  if (id == nullptr) return setError(attnInvalidArgument, "unique id: NULL pointer");
  SocketAddress a;
  if (!deserializeAddress(d.address, d.addressLen, &a))
    return setError(attnInvalidArgument, "unique id: bad root address (length %u)", d.addressLen);
  char* p = id->internal;
  std::memset(p, 0, ATTN_UNIQUE_ID_BYTES);
  std::memcpy(p + kOffMagic, &d.magic, 4);
  std::memcpy(p + kOffVersion, &d.version, 4);
  std::memcpy(p + kOffSecret, d.secret, 16);
  std::memcpy(p + kOffNonce, &d.nonce, 8);
  std::memcpy(p + kOffAddrLen, &d.addressLen, 4);
  std::memcpy(p + kOffAddr, d.address, d.addressLen);
  uint32_t sum = fnv1a(p, kOffChecksum);
  std::memcpy(p + kOffChecksum, &sum, 4);
  return attnSuccess;
}

attnResult_t decodeUniqueId(const attnUniqueId& id, UniqueIdData* d) {
  const char* p = id.internal;
  UniqueIdData t;
  std::memcpy(&t.magic, p + kOffMagic, 4);
  std::memcpy(&t.version, p + kOffVersion, 4);
  if (t.magic != boot::kIdMagic)
    return setError(attnInvalidArgument, "unique id: bad magic 0x%08x (not an attncomm id)", t.magic);
  if (t.version != boot::kIdVersion)
    return setError(attnInvalidArgument, "unique id: version %u, this library reads %u",
                    t.version, boot::kIdVersion);
  uint32_t sum;
  std::memcpy(&sum, p + kOffChecksum, 4);
  if (sum != fnv1a(p, kOffChecksum))
    return setError(attnInvalidArgument, "unique id: checksum mismatch (corrupted id)");
  for (size_t i = kUsed; i < ATTN_UNIQUE_ID_BYTES; ++i)
    if (p[i] != 0) return setError(attnInvalidArgument, "unique id: trailing bytes set");
  std::memcpy(t.secret, p + kOffSecret, 16);
  std::memcpy(&t.nonce, p + kOffNonce, 8);
  std::memcpy(&t.addressLen, p + kOffAddrLen, 4);
  if (t.addressLen > kAddressBytes)
    return setError(attnInvalidArgument, "unique id: address length %u", t.addressLen);
  std::memcpy(t.address, p + kOffAddr, t.addressLen);
  SocketAddress a;
  if (!deserializeAddress(t.address, t.addressLen, &a))
    return setError(attnInvalidArgument, "unique id: root address is not IPv4/IPv6");
  for (size_t i = t.addressLen; i < kAddressBytes; ++i)
    if (p[kOffAddr + i] != 0) return setError(attnInvalidArgument, "unique id: address padding set");
  *d = t;
  return attnSuccess;
}

}  // namespace attn
