// Hierarchical all-gather (rails). From the outermost level in, each rank
// runs a ring over its rail at that level (the ranks that share every other
// coordinate) once per combination of the outer coordinates it already
// holds. On 2 hosts x 4 ranks: each rank swaps its block with its twin on
// the other host (the only traffic over the slow link: every block crosses
// it once), then each host's ranks all-gather over shared memory, twice
// (one pass per host's blocks). Every block stays at its global-rank offset
// in `buf`, so no scratch and no final copy.
//
// Pipelined (hier_pipeline.h): the levels are stages over segments, so the
// host-local passes of segment s run while segment s+1 crosses the hosts.
#include "src/coll/coll.h"
#include "src/coll/hier_pipeline.h"
#include "src/coll/hierarchy.h"
#include "src/core/error.h"

namespace attn {

attnResult_t hierAllGatherv(Engine& e, const Hierarchy& h, int me, char* buf,
                            const std::vector<Block>& blocks, size_t chunk) {
  const int levels = h.levels();
  if (levels == 0) return attnSuccess;
  size_t maxBlock = 0;
  for (const Block& b : blocks) maxBlock = std::max(maxBlock, b.bytes);
  const int segments = hierSegments(maxBlock);
  // Stage l is level levels-1-l: the outermost goes first.
  auto make = [&](int stage, int seg) -> std::unique_ptr<CollOp> {
    const int k = levels - 1 - stage;
    Ring ring;
    ring.pos = h.coords[me][k];
    ring.ranks = sliceMembers(h, me, k, sliceOf(h, me, k));  // my rail at level k
    auto seq = std::make_unique<SeqOp>();
    for (int j = 0; j < slicesAbove(h, k); ++j) {
      // Position m forwards the block of this slice it got from outer levels.
      std::vector<int> owners = sliceMembers(h, me, k, j);
      std::vector<Block> ringBlocks(h.shape[k]);
      for (int m = 0; m < h.shape[k]; ++m) ringBlocks[m] = segmentOf(blocks[owners[m]], seg, segments, 1);
      seq->add(makeRingAllGatherOp(e, ring, buf, std::move(ringBlocks), chunk));
    }
    return seq;
  };
  return runWaves(e, levels, segments, make);
}

}  // namespace attn
