// Bodies of the public all-gather / reduce-scatter / all-reduce / broadcast:
// choose the flat ring (proximity order), the hierarchical or the direct
// algorithm (the chain or the direct one for broadcast), then run it.
#include <algorithm>
#include <cstring>

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

// Staged direct all-gather (algo_select.h): worth a local copy when every
// peer would read this block through a mapping of shareable memory, the
// block is not already in such memory, and it is within the staging limit.
static bool shouldStage(attnComm* comm, const CollTopo& t, const char* block, size_t bytes) {
  if (!t.peersAreProcesses || bytes == 0 || bytes > readStageMaxBlock()) return false;
  for (int r = 0; r < comm->nranks; ++r) {
    if (r == comm->rank) continue;
    const size_t min = comm->engine->mappedSendMin(r);
    if (min == 0 || bytes < min) return false;
  }
  ShareableRegion region;
  return !findShareable(block, bytes, &region);
}

// Where peers read from: `data` itself, or (staging) a copy of it in the
// communicator's shareable staging buffer.
static attnResult_t sourceFor(attnComm* comm, CollTopo& t, const char* data, size_t bytes,
                              const char** src) {
  *src = data;
  if (!shouldStage(comm, t, data, bytes)) return attnSuccess;
  ATTN_CHECK(t.staging.reserve(bytes));
  std::memcpy(t.staging.data(), data, bytes);
  *src = t.staging.data();
  return attnSuccess;
}

static attnResult_t directAllGather(attnComm* comm, CollTopo& t, char* buf,
                                    const std::vector<Block>& byRank) {
  // Every peer gets this rank's block; the pairwise exchange posts them all.
  // The own block is already in place (size 0 both ways: no self copy).
  const int me = comm->rank;
  const Block mine = byRank[me];
  std::vector<Block> recvBlocks = byRank;
  recvBlocks[me].bytes = 0;
  const char* src;
  ATTN_CHECK(sourceFor(comm, t, buf + mine.offset, mine.bytes, &src));
  std::vector<Block> sendBlocks(byRank.size(), Block{0, mine.bytes});
  sendBlocks[me].bytes = 0;
  return pairwiseAllToAllv(*comm->engine, src, sendBlocks, buf, recvBlocks);
}

static attnResult_t allGatherWith(attnComm* comm, CollAlgo a, char* buf,
                                  const std::vector<Block>& byRank, size_t esz) {
  CollTopo& t = collTopo(comm);
  if (a == CollAlgo::kDirect) return directAllGather(comm, t, buf, byRank);
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

attnResult_t runBroadcast(attnComm* comm, int root, char* buf, size_t bytes, size_t elemSize) {
  CollTopo& t = collTopo(comm);
  const int n = comm->nranks, me = comm->rank;
  // The same on every rank: peers' pids, the size, the (alike) limit.
  if (t.peersAreProcesses && bytes >= kDirectBroadcastMin && bytes <= readStageMaxBlock()) {
    const char* src = buf;
    if (me == root) ATTN_CHECK(sourceFor(comm, t, buf, bytes, &src));
    return directBroadcast(*comm->engine, root, src, buf, bytes);
  }
  Ring ring;
  ring.ranks.resize(n);
  for (int i = 0; i < n; ++i) ring.ranks[i] = (root + i) % n;
  ring.pos = (me - root + n) % n;
  return chainBroadcast(*comm->engine, ring, buf, bytes, chunkBytes(elemSize) / 2);
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
