// Pairwise all-to-all(v): every peer's block is posted at once (receives
// first), ordered so that at step s rank r talks to r+s and r-s, which
// spreads the load instead of every rank hitting rank 0 first.
#include <cstring>

#include "src/coll/coll.h"
#include "src/coll/request_set.h"

namespace attn {

attnResult_t pairwiseAllToAllv(Engine& e, const char* send, const std::vector<Block>& sendBlocks,
                               char* recv, const std::vector<Block>& recvBlocks) {
  const int n = e.nranks(), me = e.rank();
  RequestSet rreq(n), sreq(n);
  for (int s = 1; s < n; ++s) {
    int from = (me - s + n) % n;
    ATTN_CHECK(e.irecv(from, recv + recvBlocks[from].offset, recvBlocks[from].bytes, rreq.at(s)));
    rreq.markPosted(s);
  }
  for (int s = 1; s < n; ++s) {
    int to = (me + s) % n;
    ATTN_CHECK(e.isend(to, send + sendBlocks[to].offset, sendBlocks[to].bytes, sreq.at(s)));
    sreq.markPosted(s);
  }
  if (sendBlocks[me].bytes != recvBlocks[me].bytes)
    return setError(attnInvalidArgument, "all-to-all: %zu bytes to self but %zu expected from self",
                    sendBlocks[me].bytes, recvBlocks[me].bytes);
  std::memmove(recv + recvBlocks[me].offset, send + sendBlocks[me].offset, sendBlocks[me].bytes);
  auto finished = [&] {
    for (int s = 1; s < n; ++s)
      if (rreq.at(s)->pending() || sreq.at(s)->pending()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, [](bool*) { return attnSuccess; }, finished));
  for (int s = 1; s < n; ++s) {
    bool ok;
    ATTN_CHECK(sreq.done(s, &ok));
    ATTN_CHECK(rreq.done(s, &ok));
    int from = (me - s + n) % n;
    if (rreq.at(s)->bytes != recvBlocks[from].bytes)
      return setError(attnInvalidUsage,
                      "all-to-all: peer %d sent %zu bytes where %zu were expected "
                      "(send and receive counts disagree)",
                      from, rreq.at(s)->bytes, recvBlocks[from].bytes);
  }
  return attnSuccess;
}

attnResult_t disseminationBarrier(Engine& e) {
  const int n = e.nranks(), me = e.rank();
  for (int d = 1; d < n; d *= 2) {
    Request s, r;
    char dummy = 0;
    ATTN_CHECK(e.irecv((me - d + n) % n, &dummy, 0, &r));
    ATTN_CHECK(e.isend((me + d) % n, &dummy, 0, &s));
    Request* both[2] = {&s, &r};
    for (Request* q : both) ATTN_CHECK(e.wait(q));
  }
  return attnSuccess;
}

}  // namespace attn
