// Pairwise all-to-all(v): at step s rank r sends to r+s and receives from
// r-s, which spreads the load instead of every rank hitting rank 0 first.
// Concurrent: every step is posted at once (receives first). Stepped: one
// step at a time.
#include <cstring>

#include "src/coll/coll.h"
#include "src/coll/request_set.h"

namespace attn {

namespace {

attnResult_t checkArrived(int from, const Request& r, const Block& expected) {
  if (r.bytes != expected.bytes)
    return setError(attnInvalidUsage,
                    "all-to-all: peer %d sent %zu bytes where %zu were expected "
                    "(send and receive counts disagree)",
                    from, r.bytes, expected.bytes);
  return attnSuccess;
}

attnResult_t copySelf(int me, const char* send, const std::vector<Block>& sendBlocks, char* recv,
                      const std::vector<Block>& recvBlocks) {
  if (sendBlocks[me].bytes != recvBlocks[me].bytes)
    return setError(attnInvalidArgument, "all-to-all: %zu bytes to self but %zu expected from self",
                    sendBlocks[me].bytes, recvBlocks[me].bytes);
  // Zero bytes may come with null buffers (a rank with nothing to send).
  if (sendBlocks[me].bytes != 0)
    std::memmove(recv + recvBlocks[me].offset, send + sendBlocks[me].offset, sendBlocks[me].bytes);
  return attnSuccess;
}

attnResult_t steppedAllToAllv(Engine& e, const char* send, const std::vector<Block>& sendBlocks,
                              char* recv, const std::vector<Block>& recvBlocks) {
  const int n = e.nranks(), me = e.rank();
  ATTN_CHECK(copySelf(me, send, sendBlocks, recv, recvBlocks));
  for (int s = 1; s < n; ++s) {
    const int from = (me - s + n) % n, to = (me + s) % n;
    Request pair[2];  // receive, send
    ATTN_CHECK(e.irecv(from, recv + recvBlocks[from].offset, recvBlocks[from].bytes, &pair[0]));
    attnResult_t r = e.isend(to, send + sendBlocks[to].offset, sendBlocks[to].bytes, &pair[1]);
    if (r != attnSuccess) {
      e.breakWith(r, threadLastError());  // the posted receive must not outlive `pair`
      return r;
    }
    ATTN_CHECK(e.waitAll(pair, 2));
    ATTN_CHECK(checkArrived(from, pair[0], recvBlocks[from]));
  }
  return attnSuccess;
}

}  // namespace

attnResult_t pairwiseAllToAllv(Engine& e, const char* send, const std::vector<Block>& sendBlocks,
                               char* recv, const std::vector<Block>& recvBlocks,
                               AllToAllSchedule schedule) {
  if (schedule == AllToAllSchedule::kStepped)
    return steppedAllToAllv(e, send, sendBlocks, recv, recvBlocks);
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
  ATTN_CHECK(copySelf(me, send, sendBlocks, recv, recvBlocks));
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
    const int from = (me - s + n) % n;
    ATTN_CHECK(checkArrived(from, *rreq.at(s), recvBlocks[from]));
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
