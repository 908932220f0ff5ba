// Direct reduce for small messages between few ranks: every rank sends its
// input straight to the root, which folds the n inputs in rank order. One
// message latency, where the binomial tree waits ceil(log2 n) in sequence;
// the root receives n-1 whole buffers, so it is only worth it for small
// messages and few ranks.
#include <cstring>
#include <memory>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/core/error.h"
#include "src/core/datatype.h"

namespace attn {

attnResult_t directReduce(Engine& e, int root, const char* in, char* out, size_t count, attnDataType_t type,
                          attnRedOp_t op) {
  const int n = e.nranks(), me = e.rank();
  const size_t bytes = count * dataTypeSize(type);
  if (bytes == 0) return attnSuccess;
  if (me != root) {
    Request req;
    ATTN_CHECK(e.isend(root, in, bytes, &req));
    return e.wait(&req);
  }
  if (n == 1) {
    if (out != in) std::memmove(out, in, bytes);
    return attnSuccess;
  }
  // Slot p holds rank p's input; the root's own is `in`, or a copy of it
  // when `out` is `in` (the fold writes `out` before it reads every input).
  char* slots = e.scratch(size_t(n) * bytes);
  auto input = [&](int p) -> const char* { return p == me && out != in ? in : slots + size_t(p) * bytes; };
  if (out == in) std::memcpy(slots + size_t(me) * bytes, in, bytes);
  std::unique_ptr<Request[]> reqs(new Request[size_t(n)]);
  for (int p = 0; p < n; ++p)
    if (p != me) ATTN_CHECK(e.irecv(p, slots + size_t(p) * bytes, bytes, &reqs[size_t(p)]));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ATTN_CHECK(e.wait(&reqs[size_t(p)]));
    ATTN_CHECK(checkWholeMessage(reqs[size_t(p)], "reduce", p, bytes));
  }
  cpu::reduce2(out, input(0), input(1), count, type, op);
  for (int p = 2; p < n; ++p) cpu::reduceInto(out, input(p), count, type, op);
  return attnSuccess;
}

}  // namespace attn
