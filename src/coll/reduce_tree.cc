// Binomial-tree reduce for small messages: in step k a rank whose position
// (counted from the root along the proximity ring) has bit k set sends its
// partial result to the position 2^k below it and leaves; the others fold
// what their child sent. The root waits ceil(log2 n) message latencies
// where the chain waits n-1, which is what a small message costs. Near
// positions pair first, so with the proximity order the early steps stay
// inside a host and only the last ones cross to other hosts.
#include <cstring>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/core/error.h"
#include "src/core/datatype.h"

namespace attn {

attnResult_t treeReduce(Engine& e, const Ring& ring, const char* in, char* out, size_t count,
                        attnDataType_t type, attnRedOp_t op) {
  const int n = ring.size(), v = ring.pos;  // position 0 is the root
  const size_t bytes = count * dataTypeSize(type);
  std::vector<int> children;  // positions, in the order they are folded
  int parentMask = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      parentMask = mask;
      break;
    }
    if (v + mask < n) children.push_back(v + mask);
  }
  if (v == 0 && n == 1) {
    if (out != in) std::memmove(out, in, bytes);
    return attnSuccess;
  }
  // Every child's message lands in a slot of its own, all posted at once:
  // the subtrees finish in any order. The partial result goes to `out` on
  // the root and to one more slot elsewhere.
  const size_t nslots = children.size() + (v == 0 || children.empty() ? 0 : 1);
  char* slots = nslots ? e.scratch(nslots * bytes) : nullptr;
  std::vector<Request> reqs(children.size());
  for (size_t i = 0; i < children.size(); ++i)
    ATTN_CHECK(e.irecv(ring.ranks[children[i]], slots + i * bytes, bytes, &reqs[i]));
  const char* partial = in;
  char* acc = v == 0 ? out : slots + children.size() * bytes;
  for (size_t i = 0; i < children.size(); ++i) {
    ATTN_CHECK(e.wait(&reqs[i]));
    ATTN_CHECK(checkWholeMessage(reqs[i], "reduce", ring.ranks[children[i]], bytes));
    cpu::reduce2(acc, partial, slots + i * bytes, count, type, op);
    partial = acc;
  }
  if (v == 0) {
    if (children.empty() && out != in) std::memmove(out, in, bytes);
    return attnSuccess;
  }
  Request send;
  ATTN_CHECK(e.isend(ring.ranks[v - parentMask], partial, bytes, &send));
  return e.wait(&send);
}

}  // namespace attn
