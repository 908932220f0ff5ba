#include "src/coll/coll_runners.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels/cpu/reduce.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

namespace {

attnRedOp_t folded(attnRedOp_t op) { return op == attnAvg ? attnSum : op; }

// attnAvg: the sum divided by n, on the root only.
void divideAtRoot(attnComm* comm, int root, char* out, size_t count, attnDataType_t type, attnRedOp_t op) {
  if (op == attnAvg && comm->rank == root) cpu::divideInPlace(out, count, type, comm->nranks);
}

// The proximity ring turned so that it starts at its position `first`.
Ring turnedRing(const Ring& ring, int first) {
  const int n = ring.size();
  Ring out;
  out.ranks.resize(size_t(n));
  for (int i = 0; i < n; ++i) out.ranks[size_t(i)] = ring.at(first + i);
  out.pos = ((ring.pos - first) % n + n) % n;
  return out;
}

int positionOf(const Ring& ring, int rank) {
  return int(std::find(ring.ranks.begin(), ring.ranks.end(), rank) - ring.ranks.begin());
}

// Staged direct all-gather (algo_select.h): worth a local copy when every
// peer would read this block through a mapping of shareable memory, the
// block is not already in such memory, and it is within the staging limit.
bool shouldStage(attnComm* comm, const CollTopo& t, const char* block, size_t bytes) {
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
attnResult_t sourceFor(attnComm* comm, CollTopo& t, const char* data, size_t bytes, const char** src) {
  *src = data;
  if (!shouldStage(comm, t, data, bytes)) return attnSuccess;
  ATTN_CHECK(t.staging.reserve(bytes));
  std::memcpy(t.staging.data(), data, bytes);
  *src = t.staging.data();
  return attnSuccess;
}

}  // namespace

attnResult_t allGatherRing(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz) {
  const CollTopo& t = collTopo(comm);
  return ringAllGatherv(*comm->engine, t.ring, buf, blocksByRing(t.ring, byRank), chunkBytes(esz));
}

attnResult_t allGatherHier(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t esz) {
  return hierAllGatherv(*comm->engine, collTopo(comm).hier, comm->rank, buf, byRank, chunkBytes(esz));
}

attnResult_t allGatherDirect(attnComm* comm, char* buf, const std::vector<Block>& byRank, size_t) {
  // Every peer gets this rank's block; the pairwise exchange posts them all.
  // The own block is already in place (size 0 both ways: no self copy).
  CollTopo& t = collTopo(comm);
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

attnResult_t reduceScatterRing(attnComm* comm, const char* in, char* out, const std::vector<Block>& byRank,
                               attnDataType_t type, attnRedOp_t op) {
  const CollTopo& t = collTopo(comm);
  return ringReduceScatterv(*comm->engine, t.ring, in, out, blocksByRing(t.ring, byRank), type, op,
                            chunkBytes(dataTypeSize(type)));
}

attnResult_t reduceScatterHier(attnComm* comm, const char* in, char* out, const std::vector<Block>& byRank,
                               attnDataType_t type, attnRedOp_t op) {
  return hierReduceScatterv(*comm->engine, collTopo(comm).hier, comm->rank, in, out, byRank, type, op,
                            chunkBytes(dataTypeSize(type)));
}

// Broadcast's tree: the proximity ring turned to start at the root.
attnResult_t broadcastTree(attnComm* comm, int root, char* buf, size_t bytes, size_t) {
  const Ring& ring = collTopo(comm).ring;
  return treeBroadcast(*comm->engine, turnedRing(ring, positionOf(ring, root)), buf, bytes);
}

// Broadcast's chain: in rank order from the root.
attnResult_t broadcastChain(attnComm* comm, int root, char* buf, size_t bytes, size_t esz) {
  const int n = comm->nranks;
  Ring ring;
  ring.ranks.resize(size_t(n));
  for (int i = 0; i < n; ++i) ring.ranks[size_t(i)] = (root + i) % n;
  ring.pos = (comm->rank - root + n) % n;
  return chainBroadcast(*comm->engine, ring, buf, bytes, chunkBytes(esz) / 2);
}

attnResult_t broadcastDirect(attnComm* comm, int root, char* buf, size_t bytes, size_t) {
  const char* src = buf;
  if (comm->rank == root) ATTN_CHECK(sourceFor(comm, collTopo(comm), buf, bytes, &src));
  return directBroadcast(*comm->engine, root, src, buf, bytes);
}

// Reduce's tree: the proximity ring turned to start at the root.
attnResult_t reduceTree(attnComm* comm, int root, const char* in, char* out, size_t count, attnDataType_t type,
                        attnRedOp_t op) {
  const Ring& ring = collTopo(comm).ring;
  ATTN_CHECK(treeReduce(*comm->engine, turnedRing(ring, positionOf(ring, root)), in, out, count, type, folded(op)));
  divideAtRoot(comm, root, out, count, type, op);
  return attnSuccess;
}

// Reduce's chain: the proximity ring turned to start just after the root,
// so that it comes last.
attnResult_t reduceChain(attnComm* comm, int root, const char* in, char* out, size_t count, attnDataType_t type,
                         attnRedOp_t op) {
  const Ring& ring = collTopo(comm).ring;
  ATTN_CHECK(chainReduce(*comm->engine, turnedRing(ring, positionOf(ring, root) + 1), in, out, count, type,
                         folded(op), chunkBytes(dataTypeSize(type)) / 2));
  divideAtRoot(comm, root, out, count, type, op);
  return attnSuccess;
}

attnResult_t reduceDirect(attnComm* comm, int root, const char* in, char* out, size_t count, attnDataType_t type,
                          attnRedOp_t op) {
  ATTN_CHECK(directReduce(*comm->engine, root, in, out, count, type, folded(op)));
  divideAtRoot(comm, root, out, count, type, op);
  return attnSuccess;
}

// Every rank reduces a slice (by the all-reduce's algorithm), then the
// slices go to the root: no more than an all-reduce moves, with the
// reductions spread over the ranks. The gather posts only the n-1 messages
// to the root (the pairwise all-to-all would also exchange empty ones
// between every pair).
attnResult_t reduceScatterGather(attnComm* comm, int root, const char* in, char* out, size_t count,
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

attnResult_t allReduceDoubling(attnComm* comm, AlgoSetting, const char* in, char* out, size_t count,
                               attnDataType_t type, attnRedOp_t op) {
  ATTN_CHECK(doublingAllReduce(*comm->engine, collTopo(comm).ring, in, out, count, type, folded(op)));
  if (op == attnAvg) cpu::divideInPlace(out, count, type, comm->nranks);
  return attnSuccess;
}

attnResult_t allReduceScatter(attnComm* comm, AlgoSetting s, const char* in, char* out, size_t count,
                              attnDataType_t type, attnRedOp_t op) {
  const size_t esz = dataTypeSize(type);
  const std::vector<Block> blocks = splitEvenly(count, comm->nranks, esz);
  const CollAlgo a = pickAlgo(comm, s, kAllReduceIdx, "AllReduce", count * esz);
  const Block& mine = blocks[comm->rank];
  ATTN_CHECK(reduceScatterWith(comm, a, in, out + mine.offset, blocks, type, op));
  return allGatherWith(comm, a, out, blocks, esz);
}

}  // namespace attn
