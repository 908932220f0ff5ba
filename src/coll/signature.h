// ATTN_CHECK=1: before a collective, ranks all-gather a signature of the call
// (operation, count, type, op, root, sequence number) and fail together on a
// mismatch instead of exchanging mismatched buffers. The exchange itself is
// fixed-size, so a mismatch can never make it hang or corrupt memory.
#pragma once

#include <cstdint>

#include "attncomm.h"

struct attnComm;

namespace attn {

enum class CollKind : uint32_t {
  kAllGather = 1, kReduceScatter, kAllReduce, kBroadcast, kAllToAll, kAllToAllv, kBarrier,
  kRingAttention, kReduce, kMergeReduceScatter, kMergeAllGather
};

struct CollSignature {
  uint32_t kind = 0;
  int32_t datatype = -1;
  int32_t op = -1;
  int32_t root = -1;
  uint64_t count = 0;  // per-rank count as the API names it (0 for alltoallv)
  uint64_t seq = 0;
  int32_t status = 0;  // attnSuccess, or why this rank refused the call (its arguments)
  int32_t pad = 0;
};

const char* collKindName(CollKind k);
// Exchanges and compares signatures when the communicator checks them; also
// advances the collective sequence number. Fails on every rank at once. A
// refused signature (status set) fails the call everywhere: on its rank with
// that status (the text already set there), on the others naming that rank.
attnResult_t checkSignature(attnComm* comm, const CollSignature& mine);
// A rank that refused its arguments (`refused.status` set) takes part in the
// call's exchange with this, so its peers fail the call naming it. Returns
// only a failure of the exchange itself.
attnResult_t sendRefusedSignature(attnComm* comm, const CollSignature& refused);

}  // namespace attn
