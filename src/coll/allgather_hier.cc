// Hierarchical all-gather (rails). From the outermost level in, each rank
// runs a ring over its rail at that level (the ranks that share every other
// coordinate) once per combination of the outer coordinates it already
// holds. On 2 hosts x 4 ranks: each rank swaps its block with its twin on
// the other host (the only traffic over the slow link: every block crosses
// it once), then each host's ranks all-gather over shared memory, twice
// (one pass per host's blocks). Every block stays at its global-rank offset
// in `buf`, so no scratch and no final copy.
#include "src/coll/coll.h"
#include "src/coll/hierarchy.h"
#include "src/core/error.h"

namespace attn {

attnResult_t hierAllGatherv(Engine& e, const Hierarchy& h, int me, char* buf,
                            const std::vector<Block>& blocks, size_t chunk) {
  for (int k = h.levels() - 1; k >= 0; --k) {
    Ring ring;
    ring.pos = h.coords[me][k];
    ring.ranks = sliceMembers(h, me, k, sliceOf(h, me, k));  // my rail at level k
    std::vector<Block> ringBlocks(h.shape[k]);
    for (int j = 0; j < slicesAbove(h, k); ++j) {
      // Position m forwards the block of this slice it got from outer levels.
      std::vector<int> owners = sliceMembers(h, me, k, j);
      for (int m = 0; m < h.shape[k]; ++m) ringBlocks[m] = blocks[owners[m]];
      ATTN_CHECK(ringAllGatherv(e, ring, buf, ringBlocks, chunk));
    }
  }
  return attnSuccess;
}

}  // namespace attn
