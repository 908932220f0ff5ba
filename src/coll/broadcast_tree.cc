// Binomial-tree broadcast for small messages: the root sends to the
// position 2^k away for the largest 2^k below n, then 2^(k-1) and so on;
// each rank, once it has the message, does the same within its subtree.
// Every rank has it after ceil(log2 n) message latencies where the chain
// takes n-1. The farthest child is sent to first (its subtree is the
// largest), and with the proximity order only those first sends cross to
// other hosts.
#include "src/coll/coll.h"
#include "src/core/error.h"

namespace attn {

attnResult_t treeBroadcast(Engine& e, const Ring& ring, char* buf, size_t bytes) {
  const int n = ring.size(), v = ring.pos;  // position 0 is the root
  if (n == 1 || bytes == 0) return attnSuccess;
  int mask = 1;
  while (mask < n && !(v & mask)) mask <<= 1;
  if (v != 0) ATTN_CHECK(recvWholeMessage(e, ring.ranks[v - mask], buf, bytes, "broadcast"));
  // Children: v + m for every m below v's lowest set bit (every m for the
  // root) that stays inside the ring, the farthest first.
  Request reqs[32];  // at most one child per bit of an int
  size_t k = 0;
  for (int m = mask >> 1; m > 0; m >>= 1)
    if (v + m < n) ATTN_CHECK(e.isend(ring.ranks[v + m], buf, bytes, &reqs[k++]));
  return k == 0 ? attnSuccess : e.waitAll(reqs, k);
}

}  // namespace attn
