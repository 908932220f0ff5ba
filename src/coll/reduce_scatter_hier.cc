// Hierarchical reduce-scatter, the mirror of allgather_hier.cc. Level 0
// (ranks of one host): one ring reduce-scatter per combination of outer
// coordinates leaves each rank the host's partials of the blocks its rail
// owns. Each outer level then reduce-scatters those partials over its rail,
// halving (or so) what is left, until the last leaves this rank's block
// reduced over every rank. Only partials cross the slower boundaries, once.
//
// Pipelined (hier_pipeline.h): the levels are stages over segments, so the
// partials of segment s cross the hosts while the host-local rings reduce
// segment s+1.
//
// Partials live in the engine's scratch as "entries", one per rank whose
// level-0 coordinate equals ours, ordered by the outer coordinates with the
// innermost most significant: at every level, each rail member's share is
// then one contiguous range. Each segment has its own area of entries, laid
// out the same way, and each level its own staging (levels run at once).
#include <algorithm>
#include <cstring>

#include "src/coll/coll.h"
#include "src/coll/hier_pipeline.h"
#include "src/coll/hierarchy.h"
#include "src/core/datatype.h"
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
  const size_t esz = dataTypeSize(type);
  size_t maxBlock = 0;
  for (const Block& b : blocks) maxBlock = std::max(maxBlock, b.bytes);
  const int segments = hierSegments(maxBlock);
  auto seg = [&](int rank, int s) { return segmentOf(blocks[rank], s, segments, esz); };

  // Entry j = the rank in level-0 position ours with outer slice j.
  const int entries = slicesAbove(h, 0);
  const int pos0 = h.coords[me][0];
  std::vector<int> entryRank(entries);
  for (int j = 0; j < entries; ++j) entryRank[j] = sliceMembers(h, me, 0, j)[pos0];
  // entryOff[s][j]: entry j of segment s, from the start of the entries.
  std::vector<std::vector<size_t>> entryOff(segments, std::vector<size_t>(entries + 1, 0));
  size_t area = 0, maxArea = 0, maxSeg = 0;
  for (int s = 0; s < segments; ++s) {
    entryOff[s][0] = area;
    for (int j = 0; j < entries; ++j) entryOff[s][j + 1] = entryOff[s][j] + seg(entryRank[j], s).bytes;
    maxArea = std::max(maxArea, entryOff[s][entries] - area);
    area = entryOff[s][entries];
    for (int r = 0; r < h.nranks; ++r) maxSeg = std::max(maxSeg, seg(r, s).bytes);
  }
  // Staging of one ring reduce-scatter: twice its largest block (a segment
  // of a block at level 0, at most one segment's entries above it).
  const size_t stagingBytes = 2 * std::max(maxSeg, maxArea);
  const size_t entryBytes = levels > 1 ? area : 0;
  char* scratch = e.scratch(entryBytes + levels * stagingBytes);
  char* entryBase = scratch;
  auto staging = [&](int level) { return scratch + entryBytes + level * stagingBytes; };
  // `out` holds segment s of this rank's block at its offset within the block.
  auto outOf = [&](int s) { return out + (seg(me, s).offset - blocks[me].offset); };

  // Entries [lo[k], lo[k] + slicesAbove(k-1)) are still ours at level k.
  std::vector<int> lo(levels + 1, 0);
  for (int k = 1; k < levels; ++k) lo[k + 1] = lo[k] + h.coords[me][k] * slicesAbove(h, k);

  auto make = [&](int k, int s) -> std::unique_ptr<CollOp> {
    Ring ring;
    ring.pos = h.coords[me][k];
    ring.ranks = sliceMembers(h, me, k, sliceOf(h, me, k));
    if (k == 0) {  // from the caller's buffer, one ring per outer slice
      auto seq = std::make_unique<SeqOp>();
      for (int j = 0; j < entries; ++j) {
        std::vector<int> owners = sliceMembers(h, me, 0, j);
        std::vector<Block> ringBlocks(h.shape[0]);
        for (int m = 0; m < h.shape[0]; ++m) ringBlocks[m] = seg(owners[m], s);
        char* dst = levels == 1 ? outOf(s) : entryBase + entryOff[s][j];
        seq->add(makeRingReduceScatterOp(e, ring, in, dst, std::move(ringBlocks), type, op, chunk,
                                         staging(0)));
      }
      return seq;
    }
    const int share = slicesAbove(h, k);  // entries per rail member
    std::vector<Block> ringBlocks(h.shape[k]);
    for (int m = 0; m < h.shape[k]; ++m) {
      const int a = lo[k] + m * share, b = a + share;
      ringBlocks[m] = {entryOff[s][a], entryOff[s][b] - entryOff[s][a]};
    }
    char* dst = k == levels - 1 ? outOf(s) : entryBase + entryOff[s][lo[k + 1]];
    return makeRingReduceScatterOp(e, ring, entryBase, dst, std::move(ringBlocks), type, op, chunk,
                                   staging(k));
  };
  return runWaves(e, levels, segments, make);
}

}  // namespace attn
