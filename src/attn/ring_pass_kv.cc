// Ring pass-KV (CP paper Alg. 2). Each rank keeps its queries; the KV blocks
// travel around the ring N-1 times. At step j a rank attends to the block it
// holds (its own at j = 0) while the next block is already in flight: it
// sends the current block to rank+1 and receives the next from rank-1 into
// the other of two buffers. Blocks carry their own lengths and positions, so
// ranks with different numbers of keys need no padding. Under a sliding
// window a block travels only as far as the last rank that may see it, and
// is attended to only where it may be seen.
#include <algorithm>

#include "src/attn/attn_call.h"
#include "src/attn/ring_steps.h"
#include "src/core/error.h"

namespace attn {

attnResult_t runPassKv(AttnCall& c) {
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;

  size_t capacity = 0;
  for (int r = 0; r < n; ++r)
    capacity = std::max(capacity, BlockLayout::of(c.numSeqs, c.kvRowsOf[r], c.kvRow()).total);
  ShareableBuffer* buf = c.state->rotation;
  ATTN_CHECK(buf[0].reserve(capacity));
  ATTN_CHECK(buf[1].reserve(capacity));
  RingSteps steps(c, capacity);
  steps.skipHidden(false);
  // Under a window our block carries only the rows the ranks it reaches
  // (as far as the last that needs it) may see; it is attended to here
  // from our own rows, not from the block.
  std::vector<int> readers;
  for (int s = 1; s < n; ++s)
    if (c.vis.sees(steps.rankAt(s), me)) readers.push_back(steps.rankAt(s));
  const size_t ownBytes = packVisibleKv(c, readers, buf[0].data());

  HostRingMover mover(e, buf, capacity, ownBytes, steps.next(), steps.prev());
  ATTN_CHECK(steps.run(mover, "pass-KV", [&](int step) -> attnResult_t {
    // Step s holds the block of origin(s), from prev (our own at step 0).
    if (!steps.holds(step) || !c.vis.sees(me, steps.origin(step))) return attnSuccess;
    if (step == 0) return c.accumulate(c.q, c.kv, c.accO.data(), c.accLse.data());
    BlockView block;
    ATTN_CHECK(parseBlock(mover.block(), mover.bytes(), cardBlock(c, steps.prev(), steps.origin(step), true),
                          &block));
    return c.accumulate(c.q, RowsRef::of(block), c.accO.data(), c.accLse.data());
  }));
  steps.done();
  c.stats.bytesSent += mover.sentBytes();
  return attnSuccess;
}

}  // namespace attn
