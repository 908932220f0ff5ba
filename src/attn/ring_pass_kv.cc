// Ring pass-KV (CP paper Alg. 2). Each rank keeps its queries; the KV blocks
// travel around the ring N-1 times. At step j a rank attends to the block it
// holds (its own at j = 0) while the next block is already in flight: it
// sends the current block to rank+1 and receives the next from rank-1 into
// the other of two buffers. Blocks carry their own lengths and positions, so
// ranks with different numbers of keys need no padding.
#include <algorithm>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/progress_thread.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

attnResult_t runPassKv(AttnCall& c) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;
  const int next = (me + 1) % n, prev = (me - 1 + n) % n;

  size_t capacity = 0;
  for (int r = 0; r < n; ++r)
    capacity = std::max(capacity, BlockLayout::of(c.numSeqs, c.kvRowsOf[r], c.kvRowBytes, 2).total);
  ShareableBuffer* buf = c.state->rotation;
  ATTN_CHECK(buf[0].reserve(capacity));
  ATTN_CHECK(buf[1].reserve(capacity));
  size_t curBytes = packBlockInto(me, c.numSeqs, c.kvOffsets.data(), c.kv.pos, c.kv.rows, c.kv.t0,
                                  c.kv.t1, c.kvRowBytes, buf[0].data())
                        .total;

  // Step s's send and receive (they outlive the loop body: see the guard).
  std::unique_ptr<Request[]> ring(new Request[2 * n]);
  BreakOnEarlyExit guard(e);
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
  int cur = 0;
  for (int step = 0; step < n; ++step) {
    const bool moving = step < n - 1;
    const auto stepStart = Clock::now();
    const double computeBefore = c.stats.computeUs;
    Request& sendReq = ring[2 * step];
    Request& recvReq = ring[2 * step + 1];
    if (moving) {
      ATTN_CHECK(e.irecv(prev, buf[1 - cur].data(), capacity, &recvReq));
      ATTN_CHECK(e.isend(next, buf[cur].data(), curBytes, &sendReq));
      driver->kick();
    }
    // Step s holds rank me-s's block, from prev (our own at step 0).
    BlockView block;
    ATTN_CHECK(parseBlock(buf[cur].data(), curBytes, cardBlock(c, step ? prev : me, (me - step + n) % n, true),
                          &block));
    ATTN_CHECK(c.accumulate(c.q, RowsRef::of(block), c.accO.data(), c.accLse.data()));
    if (moving) {
      auto t0 = Clock::now();
      ATTN_CHECK(driver->wait(&sendReq));
      ATTN_CHECK(driver->wait(&recvReq));
      c.stats.waitUs += usSince(t0);
      curBytes = recvReq.bytes;
      cur = 1 - cur;
    }
    ATTN_TRACE(kLogAttn, "pass-KV step %d: compute %.0f us, step %.0f us", step,
               c.stats.computeUs - computeBefore, usSince(stepStart));
  }
  guard.done();
  return attnSuccess;
}

}  // namespace attn
