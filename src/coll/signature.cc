#include "src/coll/signature.h"

#include <cstring>
#include <vector>

#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

const char* collKindName(CollKind k) {
  switch (k) {
    case CollKind::kAllGather: return "AllGather";
    case CollKind::kReduceScatter: return "ReduceScatter";
    case CollKind::kAllReduce: return "AllReduce";
    case CollKind::kBroadcast: return "Broadcast";
    case CollKind::kAllToAll: return "AllToAll";
    case CollKind::kAllToAllv: return "AllToAllv";
    case CollKind::kBarrier: return "Barrier";
    case CollKind::kRingAttention: return "RingAttention";
    case CollKind::kReduce: return "Reduce";
    case CollKind::kMergeReduceScatter: return "MergeAttnReduceScatter";
    case CollKind::kMergeAllGather: return "MergeAttnAllGather";
  }
  return "?";
}

namespace {
std::string describe(const CollSignature& s) {
  char buf[160];
  snprintf(buf, sizeof(buf), "%s(count=%llu, type=%s, op=%s, root=%d) #%llu",
           collKindName(static_cast<CollKind>(s.kind)), (unsigned long long)s.count,
           s.datatype >= 0 ? dataTypeName(static_cast<attnDataType_t>(s.datatype)) : "-",
           s.op >= 0 ? redOpName(static_cast<attnRedOp_t>(s.op)) : "-", s.root,
           (unsigned long long)s.seq);
  return buf;
}
}  // namespace

attnResult_t checkSignature(attnComm* comm, const CollSignature& in) {
  CollSignature mine = in;
  mine.seq = comm->collSeq++;
  if (!comm->config.checkSignatures || comm->nranks == 1) return attnSuccess;
  const int n = comm->nranks;
  std::vector<CollSignature> all(n);
  all[comm->rank] = mine;
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * sizeof(CollSignature), sizeof(CollSignature)};
  ATTN_CHECK(ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n),
                            reinterpret_cast<char*>(all.data()), blocks, chunkBytes(1)));
  if (mine.status != attnSuccess) return attnResult_t(mine.status);  // its own text stands
  for (int r = 0; r < n; ++r)
    if (all[r].status != attnSuccess)
      return setError(attnRemoteError, "%s #%llu: rank %d could not take part (%s; its own error says why)",
                      collKindName(static_cast<CollKind>(mine.kind)), (unsigned long long)mine.seq, r,
                      attnGetErrorString(attnResult_t(all[r].status)));
  for (int r = 0; r < n; ++r)
    if (std::memcmp(&all[r], &all[0], sizeof(CollSignature)) != 0)
      return setError(attnInvalidUsage,
                      "collective mismatch (ATTN_CHECK): rank 0 called %s but rank %d called %s",
                      describe(all[0]).c_str(), r, describe(all[r]).c_str());
  return attnSuccess;
}

attnResult_t sendRefusedSignature(attnComm* comm, const CollSignature& refused) {
  const attnResult_t r = checkSignature(comm, refused);
  return r == attnResult_t(refused.status) ? attnSuccess : r;
}

}  // namespace attn
