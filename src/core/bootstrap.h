// Out-of-band rendezvous and small-message exchange used while creating a
// communicator (like NCCL's bootstrap).
//
// attnGetUniqueId starts a root listener in the calling process; the unique
// id carries the root's address and a random 128-bit secret. Every rank
// connects to the root, proves the secret, checks that the root proves it
// too, and learns the listening address of every other rank. After that,
// ranks talk to each other directly through sockets authenticated the same
// way both ways (challenge-response, bootstrap_wire.h; the secret itself
// never travels), and the root goes away once all ranks have met.
//
// Frames are length-prefixed and bounded: a malformed, unauthenticated or
// oversized frame is dropped (connection closed) without disturbing the
// other ranks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"

namespace attn {

struct BootstrapAddress;  // socket address, defined in socket.h

// The decoded unique id.
struct UniqueIdData {
  uint32_t magic = 0;
  uint32_t version = 0;
  uint8_t secret[16] = {};
  uint8_t address[64] = {};  // serialized root socket address (sockaddr_in/in6)
  uint32_t addressLen = 0;
  uint64_t nonce = 0;        // distinguishes communicators from one root host
};

attnResult_t encodeUniqueId(const UniqueIdData& data, attnUniqueId* id);
attnResult_t decodeUniqueId(const attnUniqueId& id, UniqueIdData* data);

// Creates a fresh secret and starts a root listener on this process (on the
// interface from ATTN_SOCKET_IFNAME, else the default route's), serving one
// communicator of any size; the listener exits after all ranks met or after
// the timeout. Writes the id.
attnResult_t bootstrapCreateRoot(attnUniqueId* id);
// As above at a fixed "host:port" and with a given secret (used by
// attnCommInitFromEnv on rank 0).
attnResult_t bootstrapCreateRootAt(const std::string& hostPort,
                                   const uint8_t secret[16],
                                   attnUniqueId* id);
// Builds the id that non-root ranks use with attnCommInitFromEnv.
attnResult_t bootstrapIdFor(const std::string& hostPort,
                            const uint8_t secret[16], attnUniqueId* id);

class Bootstrap {
 public:
  // Joins the communicator described by `id` as `rank` of `nranks`. Blocks
  // until every rank has joined, the timeout passes (attnTimeout), or
  // *abortFlag becomes true.
  static attnResult_t create(const attnUniqueId& id, int rank, int nranks,
                             int timeoutMs, const std::atomic<bool>* abortFlag,
                             std::unique_ptr<Bootstrap>* out);
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual const uint8_t* secret() const = 0;  // 16 bytes
  // The local IP address (text) ranks should listen on for data transports:
  // the interface the bootstrap used.
  virtual std::string localIp() const = 0;

  // In place: `data` holds nranks slots of `bytesPerRank`; this rank's slot
  // is filled in, the others are filled on return.
  virtual attnResult_t allGather(void* data, size_t bytesPerRank) = 0;
  // Tagged point-to-point for small setup messages. A recv of (peer, tag)
  // matches the send of the same tag from that peer; size must match.
  virtual attnResult_t send(int peer, uint32_t tag, const void* data, size_t bytes) = 0;
  virtual attnResult_t recv(int peer, uint32_t tag, void* data, size_t bytes) = 0;
  // send() that gives up after timeoutMs (a peer that may be dead, where
  // send() would keep dialling for the whole bootstrap timeout).
  virtual attnResult_t sendWithin(int peer, uint32_t tag, const void* data, size_t bytes, int timeoutMs);
  // The next message with `tag` from whichever peer sent one (the lowest
  // rank first when several wait); *from receives the sender. For protocols
  // that must hear from ranks they did not expect (attnCommShrink). Fails
  // when a peer in `awaited` is gone, on timeout or on abort. Test doubles
  // that serve only connection setup need not provide it.
  virtual attnResult_t recvAny(uint32_t tag, void* data, size_t bytes, const std::vector<int>& awaited,
                               int* from);
  virtual attnResult_t barrier() = 0;
  // Unblocks waits (abort).
  virtual void close() = 0;
};

}  // namespace attn
