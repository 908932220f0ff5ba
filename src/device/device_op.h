// One operation on a device communicator, described fully enough for every
// device backend (src/device/backends/device_backend.h) to run it: NCCL as
// the matching NCCL call on the caller's stream, CUDA IPC as peer copies
// between the ranks' device buffers, the direct backend as device memory
// handed to the transports, and staging as the same collective on pinned
// host copies of its buffers (the library's internal collective entry,
// src/coll/coll_entry.h, never the public API). The API entry points
// validate the arguments and fill this; device_route picks the backend.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/coll/coll_entry.h"
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
};

// The seven collectives (not groups or barriers): the kinds the
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
// The host collective that stages `kind` (src/coll/coll_entry.h); false for
// send/recv groups, which have none.
inline bool hostCollKind(DeviceOpKind k, CollKind* out) {
  switch (k) {
    case DeviceOpKind::kAllGather: *out = CollKind::kAllGather; return true;
    case DeviceOpKind::kReduceScatter: *out = CollKind::kReduceScatter; return true;
    case DeviceOpKind::kAllReduce: *out = CollKind::kAllReduce; return true;
    case DeviceOpKind::kBroadcast: *out = CollKind::kBroadcast; return true;
    case DeviceOpKind::kReduce: *out = CollKind::kReduce; return true;
    case DeviceOpKind::kAllToAll: *out = CollKind::kAllToAll; return true;
    case DeviceOpKind::kAllToAllv: *out = CollKind::kAllToAllv; return true;
    case DeviceOpKind::kBarrier: *out = CollKind::kBarrier; return true;
    default: return false;
  }
}

struct DeviceOp {
  DeviceOpKind kind = DeviceOpKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  attnDataType_t type = attnFloat32;
  attnRedOp_t op = attnSum;
  int root = -1;
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;  // kAllToAllv
  std::vector<P2pOp> p2p;                                         // kP2pGroup
  size_t stageChunk = 0;  // ATTN_DEVICE_STAGE_CHUNK at the call (staged_p2p.h, stage_pipeline.h)
  // For the staging backend: the buffers to copy ([0] send, [1] receive),
  // and the algorithm settings read at the call.
  std::vector<DeviceSpan> spans;
  CollSettings settings;
};

}  // namespace attn
