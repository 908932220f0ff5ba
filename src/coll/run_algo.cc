// Bodies of the public all-gather / reduce-scatter / all-reduce / broadcast /
// reduce: pick the algorithm (algo_select.h), then run its row of the
// collective's table (coll_algorithms.h).
#include <algorithm>

#include "kernels/cpu/reduce.h"
#include "src/coll/algo_select.h"
#include "src/coll/coll_algorithms.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

namespace {

size_t totalOf(const std::vector<Block>& blocks) {
  size_t t = 0;
  for (const Block& b : blocks) t += b.bytes;
  return t;
}

// The row of `a`: every chooser answers an algorithm of its table, so a
// miss is a bug, not a user error.
template <typename Row, typename Algo>
attnResult_t rowOf(std::span<const Row> rows, Algo a, const char* coll, const Row** out) {
  *out = findAlgo(rows, a);
  if (*out) return attnSuccess;
  return setError(attnInternalError, "%s: algorithm %d has no row in its table", coll, int(a));
}

}  // namespace

attnResult_t allGatherWith(attnComm* comm, CollAlgo a, char* buf, const std::vector<Block>& byRank,
                           size_t elemSize) {
  const AllGatherRow* row;
  ATTN_CHECK(rowOf(allGatherAlgorithms(), a, "all-gather", &row));
  return row->run(comm, buf, byRank, elemSize);
}

attnResult_t reduceScatterWith(attnComm* comm, CollAlgo a, const char* in, char* out,
                               const std::vector<Block>& byRank, attnDataType_t type, attnRedOp_t op) {
  // Reduce-scatter has no direct row: the ring runs under that name.
  const ReduceScatterRow* row = findAlgo(reduceScatterAlgorithms(), a);
  if (!row) ATTN_CHECK(rowOf(reduceScatterAlgorithms(), CollAlgo::kRing, "reduce-scatter", &row));
  ATTN_CHECK(row->run(comm, in, out, byRank, type, op == attnAvg ? attnSum : op));
  if (op == attnAvg)
    cpu::divideInPlace(out, byRank[comm->rank].bytes / dataTypeSize(type), type, comm->nranks);
  return attnSuccess;
}

attnResult_t runAllGather(attnComm* comm, AlgoSetting s, const char* coll, char* buf,
                          const std::vector<Block>& byRank, size_t elemSize) {
  size_t maxBlock = 0;
  for (const Block& b : byRank) maxBlock = std::max(maxBlock, b.bytes);
  const CollAlgo a = pickAlgo(comm, s, kAllGatherIdx, coll, totalOf(byRank), maxBlock);
  return allGatherWith(comm, a, buf, byRank, elemSize);
}

attnResult_t runReduceScatter(attnComm* comm, AlgoSetting s, const char* coll, const char* in,
                              char* out, const std::vector<Block>& byRank, attnDataType_t type,
                              attnRedOp_t op) {
  const CollAlgo a = pickAlgo(comm, s, kReduceScatterIdx, coll, totalOf(byRank));
  return reduceScatterWith(comm, a, in, out, byRank, type, op);
}

attnResult_t runBroadcast(attnComm* comm, BroadcastSetting s, int root, char* buf, size_t bytes,
                          size_t elemSize) {
  // The same on every rank: the setting, peers' pids, the size, the limit.
  const BroadcastRow* row;
  ATTN_CHECK(rowOf(broadcastAlgorithms(), pickBroadcastAlgo(comm, s, bytes), "broadcast", &row));
  return row->run(comm, root, buf, bytes, elemSize);
}

attnResult_t runReduce(attnComm* comm, ReduceSetting s, int root, const char* in, char* out, size_t count,
                       attnDataType_t type, attnRedOp_t op) {
  const ReduceRow* row;
  ATTN_CHECK(rowOf(reduceAlgorithms(), pickReduceAlgo(comm, s, count * dataTypeSize(type)), "reduce", &row));
  return row->run(comm, root, in, out, count, type, op);
}

attnResult_t runAllReduce(attnComm* comm, AllReduceSetting ar, AlgoSetting s, const char* in, char* out,
                          size_t count, attnDataType_t type, attnRedOp_t op) {
  const AllReduceRow* row;
  ATTN_CHECK(rowOf(allReduceAlgorithms(), pickAllReduceAlgo(comm, ar, count * dataTypeSize(type)), "all-reduce",
                   &row));
  return row->run(comm, s, in, out, count, type, op);
}

}  // namespace attn
