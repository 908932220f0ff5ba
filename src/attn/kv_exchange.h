// One round of variable-size messages between every pair of ranks, for the
// KV cache collectives: first a fixed-size header each way (a status and the
// payload's size), then the payloads that are not empty. A rank whose own
// input was bad sends a failing status instead, so every rank fails the
// call together rather than waiting for it. Payloads are reported in the
// order they arrived, for protocols that serve first come, first served.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_wire.h"
#include "src/core/engine.h"

namespace attn {

// A payload as received: not zero-filled first, so an announced size the
// peer does not send commits no memory.
struct PeerBytes {
  std::unique_ptr<char[]> buf;
  size_t size = 0;
  const char* data() const { return buf.get(); }
};

struct PeerExchange {
  std::vector<PeerBytes> in;  // [peer] payload received
  std::vector<int> arrival;   // peers with a payload, in arrival order
};

// out[peer] is sent to each peer (out[me] is ignored). localStatus !=
// attnSuccess sends the failure instead (and nothing else); the call then
// fails everywhere, on the other ranks naming this one. maxBytes[peer]: the
// most this call can take from it (what the local books allow); a peer
// announcing more fails the call, naming it, before anything is allocated.
attnResult_t exchangeWithPeers(Engine& e, int me, int nranks, const char* what,
                               attnResult_t localStatus, const std::vector<std::vector<char>>& out,
                               const std::vector<uint64_t>& maxBytes, PeerExchange* got);

}  // namespace attn
