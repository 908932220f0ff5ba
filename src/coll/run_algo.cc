// Bodies of the public all-gather / reduce-scatter / all-reduce: choose the
// flat ring (proximity order) or the hierarchical algorithm, then run it.
#include <algorithm>

#include "kernels/cpu/reduce.h"
#include "src/coll/algo_select.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

namespace {
enum CollIndex { kAllGatherIdx = 0, kReduceScatterIdx = 1, kAllReduceIdx = 2 };

size_t totalOf(const std::vector<Block>& blocks) {
  size_t t = 0;
  for (const Block& b : blocks) t += b.bytes;
  return t;
}
}  // namespace

static attnResult_t allGatherWith(attnComm* comm, CollAlgo a, char* buf,
                                  const std::vector<Block>& byRank, size_t esz) {
  const CollTopo& t = collTopo(comm);
  if (a == CollAlgo::kDirect) {
    // Every peer gets this rank's block; the pairwise exchange posts them all.
    std::vector<Block> mine(byRank.size(), byRank[comm->rank]);
    return pairwiseAllToAllv(*comm->engine, buf, mine, buf, byRank);
  }
  if (a == CollAlgo::kHier)
    return hierAllGatherv(*comm->engine, t.hier, comm->rank, buf, byRank, chunkBytes(esz));
  return ringAllGatherv(*comm->engine, t.ring, buf, blocksByRing(t.ring, byRank), chunkBytes(esz));
}

static attnResult_t reduceScatterWith(attnComm* comm, CollAlgo a, const char* in, char* out,
                                      const std::vector<Block>& byRank, attnDataType_t type,
                                      attnRedOp_t op) {
  const CollTopo& t = collTopo(comm);
  const size_t esz = dataTypeSize(type);
  const attnRedOp_t base = op == attnAvg ? attnSum : op;
  if (a == CollAlgo::kHier)
    ATTN_CHECK(hierReduceScatterv(*comm->engine, t.hier, comm->rank, in, out, byRank, type, base,
                                  chunkBytes(esz)));
  else
    ATTN_CHECK(ringReduceScatterv(*comm->engine, t.ring, in, out, blocksByRing(t.ring, byRank), type,
                                  base, chunkBytes(esz)));
  if (op == attnAvg) cpu::divideInPlace(out, byRank[comm->rank].bytes / esz, type, comm->nranks);
  return attnSuccess;
}

attnResult_t runAllGather(attnComm* comm, AlgoSetting s, const char* coll, char* buf,
                          const std::vector<Block>& byRank, size_t elemSize) {
  size_t maxBlock = 0;
  for (const Block& b : byRank) maxBlock = std::max(maxBlock, b.bytes);
  CollAlgo a = pickAlgo(comm, s, kAllGatherIdx, coll, totalOf(byRank), maxBlock);
  return allGatherWith(comm, a, buf, byRank, elemSize);
}

attnResult_t runReduceScatter(attnComm* comm, AlgoSetting s, const char* coll, const char* in,
                              char* out, const std::vector<Block>& byRank, attnDataType_t type,
                              attnRedOp_t op) {
  CollAlgo a = pickAlgo(comm, s, kReduceScatterIdx, coll, totalOf(byRank));
  return reduceScatterWith(comm, a, in, out, byRank, type, op);
}

attnResult_t runAllReduce(attnComm* comm, AlgoSetting s, const char* in, char* out, size_t count,
                          attnDataType_t type, attnRedOp_t op) {
  const size_t esz = dataTypeSize(type);
  std::vector<Block> blocks = splitEvenly(count, comm->nranks, esz);
  CollAlgo a = pickAlgo(comm, s, kAllReduceIdx, "AllReduce", count * esz);
  const Block& mine = blocks[comm->rank];
  ATTN_CHECK(reduceScatterWith(comm, a, in, out + mine.offset, blocks, type, op));
  return allGatherWith(comm, a, out, blocks, esz);
}

}  // namespace attn
