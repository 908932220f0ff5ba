// Hierarchical reduce-scatter, the mirror of allgather_hier.cc. Level 0
// (ranks of one host): one ring reduce-scatter per combination of outer
// coordinates leaves each rank the host's partials of the blocks its rail
// owns. Each outer level then reduce-scatters those partials over its rail,
// halving (or so) what is left, until the last leaves this rank's block
// reduced over every rank. Only partials cross the slower boundaries, once.
//
// Partials live in the engine's scratch as "entries", one per rank whose
// level-0 coordinate equals ours, ordered by the outer coordinates with the
// innermost most significant: at every level, each rail member's share is
// then one contiguous range.
#include <algorithm>
#include <cstring>

#include "src/coll/coll.h"
#include "src/coll/hierarchy.h"
#include "src/core/error.h"

namespace attn {

attnResult_t hierReduceScatterv(Engine& e, const Hierarchy& h, int me, const char* in, char* out,
                                const std::vector<Block>& blocks, attnDataType_t type,
                                attnRedOp_t op, size_t chunk) {
  const int levels = h.levels();
  if (levels == 0) {  // a single rank
    if (out != in + blocks[me].offset) std::memmove(out, in + blocks[me].offset, blocks[me].bytes);
    return attnSuccess;
  }
  // Entry j = the rank in level-0 position ours with outer slice j.
  const int entries = slicesAbove(h, 0);
  const int pos0 = h.coords[me][0];
  std::vector<size_t> entryOff(entries + 1, 0);
  size_t maxBlock = 0;
  for (int j = 0; j < entries; ++j) {
    entryOff[j + 1] = entryOff[j] + blocks[sliceMembers(h, me, 0, j)[pos0]].bytes;
  }
  for (const Block& b : blocks) maxBlock = std::max(maxBlock, b.bytes);
  // Staging of the ring reduce-scatter: twice the largest ring block (a
  // block at level 0, at most half the entries above it).
  const size_t stagingBytes = 2 * std::max(maxBlock, entryOff[entries]);
  char* scratch = levels > 1 ? e.scratch(entryOff[entries] + stagingBytes) : e.scratch(stagingBytes);
  char* entryBase = levels > 1 ? scratch : nullptr;
  char* staging = levels > 1 ? scratch + entryOff[entries] : scratch;

  // Level 0: from the caller's buffer, one ring per outer slice.
  {
    Ring ring;
    ring.pos = pos0;
    ring.ranks = sliceMembers(h, me, 0, sliceOf(h, me, 0));  // this host
    std::vector<Block> ringBlocks(h.shape[0]);
    for (int j = 0; j < entries; ++j) {
      std::vector<int> owners = sliceMembers(h, me, 0, j);
      for (int m = 0; m < h.shape[0]; ++m) ringBlocks[m] = blocks[owners[m]];
      char* dst = levels == 1 ? out : entryBase + entryOff[j];
      ATTN_CHECK(ringReduceScatterv(e, ring, in, dst, ringBlocks, type, op, chunk, staging));
    }
  }
  // Outer levels: entries [lo, lo + slicesAbove(k-1)) are still ours.
  int lo = 0;
  for (int k = 1; k < levels; ++k) {
    const int share = slicesAbove(h, k);  // entries per rail member
    Ring ring;
    ring.pos = h.coords[me][k];
    ring.ranks = sliceMembers(h, me, k, sliceOf(h, me, k));
    std::vector<Block> ringBlocks(h.shape[k]);
    for (int m = 0; m < h.shape[k]; ++m) {
      const int a = lo + m * share, b = a + share;
      ringBlocks[m] = {entryOff[a], entryOff[b] - entryOff[a]};
    }
    lo += ring.pos * share;
    char* dst = k == levels - 1 ? out : entryBase + entryOff[lo];
    ATTN_CHECK(ringReduceScatterv(e, ring, entryBase, dst, ringBlocks, type, op, chunk, staging));
  }
  return attnSuccess;
}

}  // namespace attn
