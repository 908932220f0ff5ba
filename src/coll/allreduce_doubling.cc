// Recursive-doubling all-reduce for small messages: in step k every rank
// swaps its whole partial result with the position 2^k away along the
// proximity ring and folds it in, so after log2(n) steps every rank holds
// the full result. Reduce-scatter + all-gather takes 2(n-1) ring steps (or
// two all-to-all rounds) for the same thing, which is what a small message
// costs. Near positions pair first, so the early steps stay inside a host.
//
// A count of ranks that is not a power of two: the first 2*rem positions
// (rem = n - 2^floor(log2 n)) pair up beforehand, the odd one hands its
// input to the even one and sits out, and gets the result back at the end
// (MPICH's scheme): two more message latencies, for those ranks only.
//
// Every rank ends with the same bits: the two sides of a step combine the
// same two operands, and each of our ops is commutative in IEEE arithmetic
// (a + b == b + a exactly), so partners agree after every step.
#include <cstring>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/core/error.h"
#include "src/core/datatype.h"

namespace attn {

namespace {
// Sends `send` to and receives `bytes` into `recv` from `peer` at once.
attnResult_t swapWith(Engine& e, int peer, const char* send, char* recv, size_t bytes) {
  Request rr, sr;
  ATTN_CHECK(e.irecv(peer, recv, bytes, &rr));
  ATTN_CHECK(e.isend(peer, send, bytes, &sr));
  ATTN_CHECK(e.wait(&sr));
  ATTN_CHECK(e.wait(&rr));
  return checkWholeMessage(rr, "all-reduce", peer, bytes);
}
}  // namespace

attnResult_t doublingAllReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                               attnDataType_t type, attnRedOp_t op) {
  const int n = ring.size(), v = ring.pos;
  const size_t bytes = count * dataTypeSize(type);
  if (n == 1 || bytes == 0) {
    if (out != in && bytes) std::memmove(out, in, bytes);
    return attnSuccess;
  }
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  char* tmp = e.scratch(bytes);

  // Before: the odd one of each of the first rem pairs gives its input to
  // the even one, then waits for the result.
  if (v < 2 * rem && (v & 1)) {
    const int partner = ring.ranks[v - 1];
    Request sr;
    ATTN_CHECK(e.isend(partner, in, bytes, &sr));
    ATTN_CHECK(e.wait(&sr));
    return recvWholeMessage(e, partner, out, bytes, "all-reduce");
  }
  const char* acc = in;  // this rank's partial result so far
  if (v < 2 * rem) {
    ATTN_CHECK(recvWholeMessage(e, ring.ranks[v + 1], tmp, bytes, "all-reduce"));
    cpu::reduce2(out, acc, tmp, count, type, op);
    acc = out;
  }
  // The doubling among p2 positions: the survivor of pair i is number i,
  // every later position v is number v - rem.
  const int me = v < 2 * rem ? v / 2 : v - rem;
  for (int mask = 1; mask < p2; mask <<= 1) {
    const int other = me ^ mask;
    const int peer = ring.ranks[other < rem ? 2 * other : other + rem];
    ATTN_CHECK(swapWith(e, peer, acc, tmp, bytes));
    // The lower number's operand first, so both sides run the same fold.
    if (me < other)
      cpu::reduce2(out, acc, tmp, count, type, op);
    else
      cpu::reduce2(out, tmp, acc, count, type, op);
    acc = out;
  }
  if (v < 2 * rem) {
    Request sr;
    ATTN_CHECK(e.isend(ring.ranks[v + 1], out, bytes, &sr));
    ATTN_CHECK(e.wait(&sr));
  }
  return attnSuccess;
}

}  // namespace attn
