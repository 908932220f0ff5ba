// One operation on a device communicator, described fully enough for every
// device backend to run it:
//  - NCCL (the communicator was handed an ncclComm_t): the matching NCCL
//    call on the caller's stream;
//  - CUDA IPC (every peer on this host): peer copies between the ranks'
//    device buffers;
//  - staging (always possible): the inputs are copied to pinned host memory,
//    `hostOp` runs the host-memory operation on them, the outputs are copied
//    back.
// The API entry points validate the arguments and fill this; device_route
// picks the backend.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/core/api_call.h"

namespace attn {

enum class DeviceOpKind {
  kAllGather,      // send[count] -> recv[count * nranks]
  kReduceScatter,  // send[count * nranks] -> recv[count], `op`
  kAllReduce,      // send[count] -> recv[count], `op`
  kBroadcast,      // root's send[count] -> recv[count]
  kReduce,         // send[count] -> root's recv[count], `op` (recv null elsewhere)
  kAllToAll,       // send[count * nranks] -> recv[count * nranks]
  kAllToAllv,      // counts and displacements in elements
  kP2pGroup,       // `p2p`: the sends and receives of one group
  kBarrier,
  kOther,          // only the staging backend runs it (e.g. attention)
};

// The seven collectives (not groups, barriers or kOther): the kinds the
// peer-copy and transport-direct backends run.
inline bool isCollective(DeviceOpKind k) {
  switch (k) {
    case DeviceOpKind::kAllGather:
    case DeviceOpKind::kReduceScatter:
    case DeviceOpKind::kAllReduce:
    case DeviceOpKind::kBroadcast:
    case DeviceOpKind::kReduce:
    case DeviceOpKind::kAllToAll:
    case DeviceOpKind::kAllToAllv:
      return true;
    default:
      return false;
  }
}

// For messages.
inline const char* deviceOpName(DeviceOpKind k) {
  switch (k) {
    case DeviceOpKind::kAllGather: return "all-gather";
    case DeviceOpKind::kReduceScatter: return "reduce-scatter";
    case DeviceOpKind::kAllReduce: return "all-reduce";
    case DeviceOpKind::kBroadcast: return "broadcast";
    case DeviceOpKind::kReduce: return "reduce";
    case DeviceOpKind::kAllToAll: return "all-to-all";
    case DeviceOpKind::kAllToAllv: return "all-to-allv";
    case DeviceOpKind::kP2pGroup: return "send/recv group";
    case DeviceOpKind::kBarrier: return "barrier";
    default: return "operation";
  }
}

// A device (or host) buffer the operation reads (`in`) and/or writes
// (`out`). An output that the operation may leave partly untouched must also
// be an input, so the untouched part survives the staging round trip.
struct DeviceSpan {
  const void* ptr = nullptr;
  size_t bytes = 0;
  bool in = false;
  bool out = false;
};
// The host-memory operation, given one staged pointer per span (nullptr for
// empty spans).
using HostOp = std::function<attnResult_t(char* const* host)>;
// The same host operation on `count` elements per block, for one slice of
// a pipelined staging (stage_pipeline.h): `in` and `out` laid out as the
// operation's own buffers of that count.
using SliceOp = std::function<attnResult_t(char* in, char* out, size_t count)>;

struct DeviceOp {
  DeviceOpKind kind = DeviceOpKind::kOther;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  attnDataType_t type = attnFloat32;
  attnRedOp_t op = attnSum;
  int root = -1;
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;  // kAllToAllv
  std::vector<P2pOp> p2p;                                         // kP2pGroup
  size_t stageChunk = 0;  // kP2pGroup: ATTN_DEVICE_STAGE_CHUNK at the call (staged_p2p.h)
  // For the staging backend.
  std::vector<DeviceSpan> spans;
  HostOp hostOp;
  SliceOp sliceOp;  // all-gather, reduce-scatter, all-reduce, broadcast, reduce, all-to-all
};

}  // namespace attn
