// Bodies of the public all-gather / reduce-scatter / all-reduce / broadcast /
// reduce: choose the flat ring (proximity order), the hierarchical or the
// direct algorithm (recursive doubling or reduce-scatter + all-gather for
// all-reduce; the chain or the direct one for broadcast; the tree, chain or
// scatter for reduce), then run it.
#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels/cpu/reduce.h"
#include "src/coll/algo_select.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

namespace {
enum CollIndex { kAllGatherIdx = 0, kReduceScatterIdx = 1, kAllReduceIdx = 2, kReduceIdx = 3 };

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

attnResult_t runBroadcast(attnComm* comm, BroadcastSetting s, int root, char* buf, size_t bytes,
                          size_t elemSize) {
  CollTopo& t = collTopo(comm);
  const int n = comm->nranks, me = comm->rank;
  // The same on every rank: the setting, peers' pids, the size, the limit.
  const BroadcastAlgo a = pickBroadcastAlgo(comm, s, bytes);
  if (a == BroadcastAlgo::kDirect) {
    const char* src = buf;
    if (me == root) ATTN_CHECK(sourceFor(comm, t, buf, bytes, &src));
    return directBroadcast(*comm->engine, root, src, buf, bytes);
  }
  // The ring turned to start at the root: in proximity order (tree), or in
  // rank order from the root (chain).
  Ring ring;
  ring.ranks.resize(size_t(n));
  if (a == BroadcastAlgo::kTree) {
    const int rootPos = int(std::find(t.ring.ranks.begin(), t.ring.ranks.end(), root) - t.ring.ranks.begin());
    for (int i = 0; i < n; ++i) ring.ranks[size_t(i)] = t.ring.at(rootPos + i);
    ring.pos = (t.ring.pos - rootPos + n) % n;
    return treeBroadcast(*comm->engine, ring, buf, bytes);
  }
  for (int i = 0; i < n; ++i) ring.ranks[size_t(i)] = (root + i) % n;
  ring.pos = (me - root + n) % n;
  return chainBroadcast(*comm->engine, ring, buf, bytes, chunkBytes(elemSize) / 2);
}

// Reduce as reduce-scatter (every rank reduces a slice, by the all-reduce's
// algorithm) and a gather of the slices to the root: no more than an
// all-reduce moves, with the reductions spread over the ranks. The gather
// posts only the n-1 messages to the root (the pairwise all-to-all would
// also exchange empty ones between every pair).
static attnResult_t reduceScatterGather(attnComm* comm, int root, const char* in, char* out, size_t count,
                                        attnDataType_t type, attnRedOp_t op) {
  const int n = comm->nranks, me = comm->rank;
  const size_t esz = dataTypeSize(type);
  const std::vector<Block> blocks = splitEvenly(count, n, esz);
  AlgoSetting s;
  ATTN_CHECK(readAlgoSetting(&s));
  const CollAlgo a = pickAlgo(comm, s, kReduceIdx, "Reduce's reduce-scatter", count * esz);
  std::vector<char> slice(me == root ? 0 : blocks[me].bytes);
  char* mine = me == root ? out + blocks[me].offset : slice.data();
  ATTN_CHECK(reduceScatterWith(comm, a, in, mine, blocks, type, op));
  Engine& e = *comm->engine;
  if (me != root) {
    Request req;
    if (blocks[me].bytes == 0) return attnSuccess;
    ATTN_CHECK(e.isend(root, mine, blocks[me].bytes, &req));
    return e.wait(&req);
  }
  std::unique_ptr<Request[]> reqs(new Request[size_t(n)]);
  std::vector<Request*> posted;
  for (int p = 0; p < n; ++p) {
    if (p == me || blocks[p].bytes == 0) continue;
    ATTN_CHECK(e.irecv(p, out + blocks[p].offset, blocks[p].bytes, &reqs[size_t(p)]));
    posted.push_back(&reqs[size_t(p)]);
  }
  for (Request* r : posted) ATTN_CHECK(e.wait(r));
  for (int p = 0; p < n; ++p)
    if (p != me && blocks[p].bytes && reqs[size_t(p)].bytes != blocks[p].bytes)
      return setError(attnInvalidUsage, "reduce: rank %d sent %zu bytes of its slice where %zu were expected", p,
                      reqs[size_t(p)].bytes, blocks[p].bytes);
  return attnSuccess;
}

attnResult_t runReduce(attnComm* comm, ReduceSetting s, int root, const char* in, char* out, size_t count,
                       attnDataType_t type, attnRedOp_t op) {
  const size_t esz = dataTypeSize(type);
  const ReduceAlgo a = pickReduceAlgo(comm, s, count * esz);
  if (a == ReduceAlgo::kScatter) return reduceScatterGather(comm, root, in, out, count, type, op);
  const attnRedOp_t folded = op == attnAvg ? attnSum : op;
  if (a == ReduceAlgo::kDirect) {
    ATTN_CHECK(directReduce(*comm->engine, root, in, out, count, type, folded));
    if (op == attnAvg && comm->rank == root) cpu::divideInPlace(out, count, type, comm->nranks);
    return attnSuccess;
  }
  // The proximity ring turned to start at the root (tree) or just after
  // it, so that it comes last (chain).
  const CollTopo& t = collTopo(comm);
  const int n = comm->nranks;
  const int rootPos = int(std::find(t.ring.ranks.begin(), t.ring.ranks.end(), root) - t.ring.ranks.begin());
  const int first = a == ReduceAlgo::kTree ? rootPos : rootPos + 1;
  Ring ring;
  ring.ranks.resize(size_t(n));
  for (int i = 0; i < n; ++i) ring.ranks[size_t(i)] = t.ring.at(first + i);
  ring.pos = (t.ring.pos - first + 2 * n) % n;
  if (a == ReduceAlgo::kTree)
    ATTN_CHECK(treeReduce(*comm->engine, ring, in, out, count, type, folded));
  else
    ATTN_CHECK(chainReduce(*comm->engine, ring, in, out, count, type, folded, chunkBytes(esz) / 2));
  if (op == attnAvg && comm->rank == root) cpu::divideInPlace(out, count, type, n);
  return attnSuccess;
}

attnResult_t runAllReduce(attnComm* comm, AllReduceSetting ar, AlgoSetting s, const char* in, char* out,
                          size_t count, attnDataType_t type, attnRedOp_t op) {
  const size_t esz = dataTypeSize(type);
  if (pickAllReduceAlgo(comm, ar, count * esz) == AllReduceAlgo::kDoubling) {
    ATTN_CHECK(doublingAllReduce(*comm->engine, collTopo(comm).ring, in, out, count, type,
                                 op == attnAvg ? attnSum : op));
    if (op == attnAvg) cpu::divideInPlace(out, count, type, comm->nranks);
    return attnSuccess;
  }
  std::vector<Block> blocks = splitEvenly(count, comm->nranks, esz);
  CollAlgo a = pickAlgo(comm, s, kAllReduceIdx, "AllReduce", count * esz);
  const Block& mine = blocks[comm->rank];
  ATTN_CHECK(reduceScatterWith(comm, a, in, out + mine.offset, blocks, type, op));
  return allGatherWith(comm, a, out, blocks, esz);
}

}  // namespace attn
