// Ship-Q: one hop instead of N-1 (DistAttention's MicroAttention, CSPS's SP
// decode). Every rank sends its query block straight to every KV holder;
// each holder computes the visitor's partial over its keys and sends it
// back; owners merge partials as they arrive. Latency is two message times
// whatever N is, at the price of N-1 concurrent sends of Q: the right shape
// for decode, where Q is one row per sequence.
//
// Between two ranks the order is: query block, then the partial for it.
// Under a sliding window a rank sends its queries only to the holders of
// keys they may see (RankVisibility, decided alike on both sides).
#include <algorithm>

#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/progress_thread.h"
#include "src/core/error.h"

namespace attn {

attnResult_t runShipQ(AttnCall& c) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;
  const size_t myPartial = c.partialBytes(c.q.rows);
  const size_t oFloats = static_cast<size_t>(c.q.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v;

  // Our query block (read by every peer) and the partials we serve, in
  // shareable memory: peers in other processes read them through a mapping.
  PeerSlots slot(n);
  slot.add(me, BlockLayout::of(c.numSeqs, c.q.rows, c.qRow()).total);
  for (int p = 0; p < n; ++p)
    if (p != me) slot.add(p, c.partialBytes(c.qRowsOf[p]));
  ATTN_CHECK(c.state->outgoing.reserve(slot.total));
  char* const out = c.state->outgoing.data();
  const size_t mineBytes = packBlockInto(me, c.numSeqs, c.qOffsets.data(), c.q.pos, c.q.rows, c.q.t0,
                                         nullptr, c.qRow(), out + slot.offset[me])
                               .total;
  std::vector<std::vector<char>> qin(n), pin(n);
  std::unique_ptr<Request[]> qinReq(new Request[n]), pinReq(new Request[n]), qoutReq(new Request[n]),
      poutReq(new Request[n]);
  // served[p]: p's queries answered (or p's queries see none of our keys);
  // folded[p]: p's partial merged (or our queries see none of p's keys).
  std::vector<bool> served(n, true), folded(n, true);
  int remaining = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    served[p] = !c.vis.sees(p, me);
    folded[p] = !c.vis.sees(me, p);
    remaining += !served[p] + !folded[p];
  }
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (!served[p]) {
      qin[p].resize(BlockLayout::of(c.numSeqs, c.qRowsOf[p], c.qRow()).total);
      ATTN_CHECK(e.irecv(p, qin[p].data(), qin[p].size(), &qinReq[p]));
    }
    if (!folded[p]) {
      pin[p].resize(myPartial);
      ATTN_CHECK(e.irecv(p, pin[p].data(), pin[p].size(), &pinReq[p]));
    }
  }
  for (int s = 1; s < n; ++s) {
    int p = (me + s) % n;
    if (folded[p]) continue;
    ATTN_CHECK(e.isend(p, out + slot.offset[me], mineBytes, &qoutReq[p]));
    c.stats.bytesSent += mineBytes;
  }
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) {
    size_t largest = std::max(mineBytes, myPartial);
    for (int p = 0; p < n; ++p) largest = std::max({largest, qin[p].size(), c.partialBytes(c.qRowsOf[p])});
    driver = std::make_unique<ProgressThread>(e, c.comm->prefix, driveModeFor(largest, largestKernelMacs(c)));
    ATTN_CHECK(driver->kick());
  }
  ATTN_CHECK(c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()));

  std::vector<bool> answered(served), asked(folded);  // which requests were posted: !answered, !asked
  int spins = 0;
  auto waitStart = Clock::now();
  const double computeBefore = c.stats.computeUs;
  while (remaining > 0) {
    bool did = false;
    ATTN_CHECK(driver->poll());
    for (int s = 1; s < n; ++s) {
      int p = (me - s + n) % n;  // serve in the order the visitors were sent
      if (!served[p] && !qinReq[p].pending()) {
        ATTN_CHECK(driver->wait(&qinReq[p]));
        BlockView visitor;
        ATTN_CHECK(parseBlock(qin[p].data(), qinReq[p].bytes, cardBlock(c, p, p, false), &visitor));
        float* o = reinterpret_cast<float*>(out + slot.offset[p]);
        float* lse = o + static_cast<size_t>(visitor.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v;
        ATTN_CHECK(c.partial(RowsRef::of(visitor), c.kv, o, lse));
        ATTN_CHECK(e.isend(p, o, c.partialBytes(visitor.rows), &poutReq[p]));
        c.stats.bytesSent += c.partialBytes(visitor.rows);
        ATTN_CHECK(driver->kick());
        served[p] = did = true;
        --remaining;
      }
      if (!folded[p] && !pinReq[p].pending()) {
        ATTN_CHECK(driver->wait(&pinReq[p]));
        if (pinReq[p].bytes != myPartial)
          return setError(attnRemoteError, "ship-Q: the partial from rank %d has %zu bytes, %zu expected", p,
                          pinReq[p].bytes, myPartial);
        const float* o = reinterpret_cast<const float*>(pin[p].data());
        ATTN_CHECK(c.fold(o, o + oFloats));
        folded[p] = did = true;
        --remaining;
      }
    }
    if (did) {
      spins = 0;
      continue;
    }
    // Nothing arrived: sleep on the first outstanding request.
    if (++spins > 50) {
      for (int p = 0; p < n; ++p) {
        if (!served[p]) { ATTN_CHECK(driver->wait(&qinReq[p])); break; }
        if (!folded[p]) { ATTN_CHECK(driver->wait(&pinReq[p])); break; }
      }
    } else {
      std::this_thread::yield();
    }
  }
  for (int p = 0; p < n; ++p)
    if (p != me) {
      if (!asked[p]) ATTN_CHECK(driver->wait(&qoutReq[p]));
      if (!answered[p]) ATTN_CHECK(driver->wait(&poutReq[p]));
    }
  c.stats.waitUs += usSince(waitStart) - (c.stats.computeUs - computeBefore);
  guard.done();
  return attnSuccess;
}

}  // namespace attn
