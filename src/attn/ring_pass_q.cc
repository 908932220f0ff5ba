// Ring pass-Q (CP paper Alg. 3). KV stays; the query blocks travel around
// the ring. At step j a rank holds the queries of rank me-j: at j = 0 its
// own, folded straight into its accumulator; otherwise it computes the
// partial (O, lse) of the visitor over its local keys and sends it home at
// once. The paper's closing all-to-all thus starts during the ring, and each
// owner merges a partial the moment it arrives (merge-on-receive).
//
// Message order between two ranks is fixed, so receives can be posted
// early: rank-1 sends us N-1 query blocks and then our partial; every other
// rank sends us only our partial. Under a sliding window a query block
// travels only as far as the last rank whose keys it may see, and only
// those ranks compute and return a partial for it.
#include <algorithm>

#include "src/attn/attn_call.h"
#include "src/attn/ring_steps.h"
#include "src/core/error.h"

namespace attn {
namespace {

// Partials coming home: one buffer and request per peer.
struct Homecoming {
  std::vector<std::vector<char>> buf;
  std::unique_ptr<Request[]> req;
  std::vector<bool> posted, folded;
  Homecoming(int n) : buf(n), req(new Request[n]), posted(n, false), folded(n, false) {}
};

attnResult_t foldArrived(AttnCall& c, Homecoming& h, int me) {
  const size_t oBytes = static_cast<size_t>(c.q.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v * sizeof(float);
  for (size_t p = 0; p < h.buf.size(); ++p) {
    if ((int)p == me || !h.posted[p] || h.folded[p] || h.req[p].pending()) continue;
    if (h.req[p].state.load() == Request::kFailed)
      return setError(h.req[p].error, "%s", h.req[p].message.c_str());
    if (h.req[p].bytes != h.buf[p].size())
      return setError(attnRemoteError, "pass-Q: the partial from rank %zu has %zu bytes, %zu expected", p,
                      h.req[p].bytes, h.buf[p].size());
    const float* o = reinterpret_cast<const float*>(h.buf[p].data());
    ATTN_CHECK(c.fold(o, reinterpret_cast<const float*>(h.buf[p].data() + oBytes)));
    h.folded[p] = true;
  }
  return attnSuccess;
}

}  // namespace

attnResult_t runPassQ(AttnCall& c) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;
  const size_t myPartial = c.partialBytes(c.q.rows);

  size_t capacity = 0;
  for (int r = 0; r < n; ++r)
    capacity = std::max(capacity, BlockLayout::of(c.numSeqs, c.qRowsOf[r], c.qRow()).total);
  ShareableBuffer* buf = c.state->rotation;
  ATTN_CHECK(buf[0].reserve(capacity));
  ATTN_CHECK(buf[1].reserve(capacity));
  const size_t ownBytes = packBlockInto(me, c.numSeqs, c.qOffsets.data(), c.q.pos, c.q.rows, c.q.t0, nullptr,
                                        c.qRow(), buf[0].data())
                              .total;

  Homecoming home(n);
  std::unique_ptr<Request[]> outReq(new Request[n]);
  size_t largestPartial = myPartial;
  for (int r = 0; r < n; ++r) largestPartial = std::max(largestPartial, c.partialBytes(c.qRowsOf[r]));
  RingSteps steps(c, std::max(capacity, largestPartial));
  // Under a window the ring may turn backwards (contiguous shards: a
  // rank's queries are needed by the ranks before it).
  steps.skipHidden(true);
  const int prev = steps.prev();
  for (int p = 0; p < n; ++p)
    if (p != me) home.buf[p].resize(myPartial);
  // Partials from ranks other than prev can be expected at once; none from
  // a rank whose keys our queries cannot see.
  for (int p = 0; p < n; ++p)
    if (p != me && !c.vis.sees(me, p)) home.folded[p] = true;
  for (int p = 0; p < n; ++p)
    if (p != me && p != prev && !home.folded[p]) {
      ATTN_CHECK(e.irecv(p, home.buf[p].data(), myPartial, &home.req[p]));
      home.posted[p] = true;
    }

  // Partials we send home, one slot per owner, in shareable memory so an
  // owner in another process reads them through its mapping.
  PeerSlots outSlot(n);
  for (int p = 0; p < n; ++p)
    if (p != me) outSlot.add(p, c.partialBytes(c.qRowsOf[p]));
  ATTN_CHECK(c.state->outgoing.reserve(outSlot.total));

  ProgressThread* driver = steps.driver();
  std::vector<bool> outPosted(n, false);
  HostRingMover mover(e, buf, capacity, ownBytes, steps.next(), prev);
  ATTN_CHECK(steps.run(mover, "pass-Q", [&](int step) -> attnResult_t {
    if (step == n - 2 && !home.folded[prev]) {  // prev's last query block is posted: its partial comes next
      ATTN_CHECK(e.irecv(prev, home.buf[prev].data(), myPartial, &home.req[prev]));
      home.posted[prev] = true;
      ATTN_CHECK(driver->kick());
    }
    if (n == 1) {
      ATTN_CHECK(c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()));
    } else if (!steps.holds(step) || !c.vis.sees(steps.origin(step), me)) {
      // No block here, or queries that see none of our keys: pass it on.
    } else {
      // Step s holds the queries of origin(s), from prev (our own at step 0).
      BlockView visitor;
      ATTN_CHECK(parseBlock(mover.block(), mover.bytes(), cardBlock(c, step ? prev : me, steps.origin(step), false),
                            &visitor));
      if (visitor.origin == me) {
        ATTN_CHECK(c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data()));
      } else {
        const int owner = visitor.origin;
        char* part = c.state->outgoing.data() + outSlot.offset[owner];
        float* o = reinterpret_cast<float*>(part);
        float* lse = o + static_cast<size_t>(visitor.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v;
        ATTN_CHECK(c.partial(RowsRef::of(visitor), c.kv, o, lse));
        ATTN_CHECK(e.isend(owner, part, c.partialBytes(visitor.rows), &outReq[owner]));
        c.stats.bytesSent += c.partialBytes(visitor.rows);
        outPosted[owner] = true;
        ATTN_CHECK(driver->kick());
      }
    }
    return foldArrived(c, home, me);
  }));
  // The rest of the all-to-all: fold partials in arrival order.
  auto t0 = Clock::now();
  for (int p = 0; p < n; ++p) {
    if (p == me || !home.posted[p]) continue;
    ATTN_CHECK(driver->wait(&home.req[p]));
    ATTN_CHECK(foldArrived(c, home, me));
  }
  for (int p = 0; p < n; ++p)
    if (outPosted[p]) ATTN_CHECK(driver->wait(&outReq[p]));
  c.stats.waitUs += usSince(t0);
  steps.done();
  c.stats.bytesSent += mover.sentBytes();
  return attnSuccess;
}

}  // namespace attn
