// All-gather KV (Llama 3's context parallelism): every rank's KV block goes
// to every other rank at once, and each rank attends its queries to each
// block as it arrives (merge on receive), so the kernel over the first
// arrivals overlaps the rest of the gather. One message time of latency
// instead of a ring's N-1, at the price of holding every rank's keys: the
// right shape when KV blocks are small against the attention (GQA, short
// contexts on shared memory).
//
// Between two ranks there is one message: the sender's packed KV block,
// unless a sliding window hides those keys from every query of the
// receiver (RankVisibility, decided alike on both sides).
#include <algorithm>
#include <memory>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/progress_thread.h"
#include "src/core/error.h"

namespace attn {

attnResult_t runAllGatherKv(AttnCall& c) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;

  // Our block goes out from shareable memory (peers in other processes map
  // it); the peers' blocks land in per-peer slots of a buffer kept between
  // calls, so a steady stream of calls does not fault fresh pages in.
  const size_t mineCap = BlockLayout::of(c.numSeqs, c.kv.rows, c.kvRow()).total;
  ATTN_CHECK(c.state->outgoing.reserve(mineCap));
  // Under a window the one block every reader gets carries only the rows
  // some reader may see.
  std::vector<int> readers;
  for (int p = 0; p < n; ++p)
    if (p != me && c.vis.sees(p, me)) readers.push_back(p);
  const size_t mineBytes = packVisibleKv(c, readers, c.state->outgoing.data());
  PeerSlots slot(n);
  std::vector<size_t> cap(n, 0);
  for (int p = 0; p < n; ++p)
    if (p != me) {
      cap[p] = BlockLayout::of(c.numSeqs, c.kvRowsOf[p], c.kvRow()).total;
      slot.add(p, cap[p]);
    }
  ShareableBuffer& in = c.state->rotation[0];
  ATTN_CHECK(in.reserve(std::max<size_t>(slot.total, 1)));

  std::unique_ptr<Request[]> recvReq(new Request[n]), sendReq(new Request[n]);
  // folded[p]: p's block merged, or none coming (our queries see none of
  // its keys); sends[p]: p's queries see some of ours.
  std::vector<bool> folded(n, true), sends(n, false);
  int remaining = 0;
  for (int p = 0; p < n; ++p)
    if (p != me) {
      folded[p] = !c.vis.sees(me, p);
      sends[p] = c.vis.sees(p, me);
      remaining += !folded[p];
    }
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p)
    if (!folded[p]) ATTN_CHECK(e.irecv(p, in.data() + slot.offset[p], cap[p], &recvReq[p]));
  // Staggered, so the N-1 senders do not all start on the same peer.
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    if (!sends[p]) continue;
    ATTN_CHECK(e.isend(p, c.state->outgoing.data(), mineBytes, &sendReq[p]));
    c.stats.bytesSent += mineBytes;
  }
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) {
    size_t largest = mineBytes;
    for (int p = 0; p < n; ++p) largest = std::max(largest, cap[p]);
    driver = std::make_unique<ProgressThread>(e, c.comm->prefix, driveModeFor(largest, largestKernelMacs(c)));
    ATTN_CHECK(driver->kick());
  }
  // Our own keys first: no wait, and the peers' blocks move meanwhile.
  ATTN_CHECK(c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()));

  const auto waitStart = Clock::now();
  const double computeBefore = c.stats.computeUs;
  while (remaining > 0) {
    // Sleep until some block is in (the driver's waits, with its timeout
    // and abort checks), then fold every block that is.
    ATTN_CHECK(driver->waitFor([&] {
      for (int p = 0; p < n; ++p)
        if (!folded[p] && !recvReq[p].pending()) return true;
      return false;
    }));
    for (int s = 1; s < n; ++s) {
      const int p = (me - s + n) % n;  // the order the peers sent to us
      if (folded[p] || recvReq[p].pending()) continue;
      ATTN_CHECK(driver->wait(&recvReq[p]));  // its result: failed, or done
      BlockView block;
      ATTN_CHECK(parseBlock(in.data() + slot.offset[p], recvReq[p].bytes, cardBlock(c, p, p, true), &block));
      ATTN_CHECK(c.accumulate(c.q, RowsRef::of(block), c.accO.data(), c.accLse.data()));
      folded[p] = true;
      --remaining;
    }
  }
  for (int p = 0; p < n; ++p)
    if (sends[p]) ATTN_CHECK(driver->wait(&sendReq[p]));
  c.stats.waitUs += usSince(waitStart) - (c.stats.computeUs - computeBefore);
  guard.done();
  return attnSuccess;
}

}  // namespace attn
