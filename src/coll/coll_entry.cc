#include "src/coll/coll_entry.h"

#include <algorithm>
#include <cstring>

#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

attnResult_t readCollSettings(CollKind kind, CollSettings* out) {
  *out = CollSettings{};
  switch (kind) {
    case CollKind::kAllReduce:
      ATTN_CHECK(readAllReduceSetting(&out->allReduce));
      return readAlgoSetting(&out->algo);
    case CollKind::kAllGather:
    case CollKind::kReduceScatter:
      return readAlgoSetting(&out->algo);
    case CollKind::kBroadcast:
      return readBroadcastSetting(&out->broadcast);
    case CollKind::kReduce:
      return readReduceSetting(&out->reduce);
    case CollKind::kAllToAll:
    case CollKind::kAllToAllv:
      return readAllToAllSetting(&out->allToAll);
    default:
      return attnSuccess;
  }
}

namespace {

std::vector<Block> evenBlocks(int n, size_t bytes) {
  std::vector<Block> blocks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) blocks[size_t(i)] = {size_t(i) * bytes, bytes};
  return blocks;
}

std::vector<Block> blocksOf(const std::vector<size_t>& counts, const std::vector<size_t>& displs, int n,
                            size_t esz) {
  std::vector<Block> blocks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) blocks[size_t(i)] = {displs[size_t(i)] * esz, counts[size_t(i)] * esz};
  return blocks;
}

}  // namespace

attnResult_t runHostCollective(attnComm* comm, const CollArgs& a, const CollSettings& s) {
  const int n = comm->nranks, me = comm->rank;
  const size_t esz = dataTypeSize(a.type), bytes = a.count * esz;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  switch (a.kind) {
    case CollKind::kAllGather:
      if (in != out + size_t(me) * bytes) std::memcpy(out + size_t(me) * bytes, in, bytes);
      return runAllGather(comm, s.algo, "AllGather", out, evenBlocks(n, bytes), esz);
    case CollKind::kReduceScatter:
      return runReduceScatter(comm, s.algo, "ReduceScatter", in, out, evenBlocks(n, bytes), a.type, a.op);
    case CollKind::kAllReduce:
      return runAllReduce(comm, s.allReduce, s.algo, in, out, a.count, a.type, a.op);
    case CollKind::kReduce:
      return runReduce(comm, s.reduce, a.root, in, me == a.root ? out : nullptr, a.count, a.type, a.op);
    case CollKind::kBroadcast:
      if (me == a.root && in != out) std::memmove(out, in, bytes);
      return runBroadcast(comm, s.broadcast, a.root, out, bytes, esz);
    case CollKind::kAllToAll: {
      const std::vector<Block> blocks = evenBlocks(n, bytes);
      return pairwiseAllToAllv(*comm->engine, in, blocks, out, blocks,
                               pickAllToAllSchedule(comm, s.allToAll, bytes));
    }
    case CollKind::kAllToAllv: {
      if (a.sendcounts.size() != size_t(n) || a.sdispls.size() != size_t(n) || a.recvcounts.size() != size_t(n) ||
          a.rdispls.size() != size_t(n))
        return setError(attnInternalError, "all-to-allv: counts and displacements need %d entries each", n);
      const std::vector<Block> sb = blocksOf(a.sendcounts, a.sdispls, n, esz);
      const std::vector<Block> rb = blocksOf(a.recvcounts, a.rdispls, n, esz);
      size_t maxBlock = 0;
      for (int p = 0; p < n; ++p) maxBlock = std::max({maxBlock, sb[size_t(p)].bytes, rb[size_t(p)].bytes});
      return pairwiseAllToAllv(*comm->engine, in, sb, out, rb, pickAllToAllSchedule(comm, s.allToAll, maxBlock));
    }
    case CollKind::kBarrier:
      return disseminationBarrier(*comm->engine);
    default:
      return setError(attnInternalError, "runHostCollective: kind %u is not a standard collective",
                      unsigned(a.kind));
  }
}

}  // namespace attn
