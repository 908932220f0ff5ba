#include "src/device/device_group.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "src/core/comm.h"
#include "src/device/cuda_check.h"
#include "src/device/device_op.h"
#include "src/device/device_route.h"
#include "src/device/device_scope.h"
#include "src/device/backends/staging/stage_pipeline.h"

namespace attn {
namespace {

// Self sends and receives pair up in order, as on the host path (group.cc).
// Checked here so that a mismatch fails at the call, not later on the stream.
attnResult_t checkSelfPairs(const std::vector<P2pOp>& ops, int self) {
  std::vector<size_t> sends, recvs;
  for (const P2pOp& op : ops)
    if (op.peer == self) (op.isSend ? sends : recvs).push_back(op.bytes);
  if (sends.size() != recvs.size())
    return setError(attnInvalidUsage, "group has %zu send(s) to self but %zu receive(s) from self",
                    sends.size(), recvs.size());
  for (size_t i = 0; i < sends.size(); ++i)
    if (sends[i] != recvs[i])
      return setError(attnInvalidUsage, "send to self of %zu bytes met a receive of %zu bytes", sends[i],
                      recvs[i]);
  return attnSuccess;
}

// `waiter` waits for the work enqueued so far on `signaler`.
attnResult_t streamWait(attnStream_t waiter, attnStream_t signaler) {
  cudaEvent_t ev;
  ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(signaler));
  if (e == cudaSuccess) e = cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(waiter), ev, 0);
  cudaEventDestroy(ev);  // its resources go once the wait has been satisfied
  if (e != cudaSuccess)
    return setError(attnUnhandledCudaError, "joining the group's streams %p and %p failed: %s (%s)",
                    (void*)waiter, (void*)signaler, cudaGetErrorString(e), cudaGetErrorName(e));
  return attnSuccess;
}

}  // namespace

attnResult_t deviceP2pGroup(attnComm* comm, std::vector<P2pOp> ops, StreamJoin* after) {
  *after = StreamJoin{};
  if (ops.empty()) return attnSuccess;
  ATTN_CHECK(checkSelfPairs(ops, comm->rank));
  StreamJoin join;
  join.primary = ops[0].stream;
  for (const P2pOp& o : ops)
    if (o.stream != join.primary &&
        std::find(join.others.begin(), join.others.end(), o.stream) == join.others.end())
      join.others.push_back(o.stream);
  if (!join.others.empty()) {
    DeviceScope dev;  // events belong to the streams' device
    ATTN_CHECK(dev.enter(comm->config.device));
    for (attnStream_t s : join.others) ATTN_CHECK(streamWait(join.primary, s));
  }
  DeviceOp op;
  op.kind = DeviceOpKind::kP2pGroup;
  // Every backend runs groups pair by pair (ipc_p2p.cc, nccl_comm.cc): no
  // host operation to stage around.
  op.p2p = std::move(ops);
  op.stageChunk = stageChunkBytes();  // read on the caller's thread, like every per-call setting
  ATTN_CHECK(deviceEnqueue(comm, join.primary, std::move(op)));
  *after = std::move(join);
  return attnSuccess;
}

attnResult_t deviceJoinAfter(attnComm* comm, const StreamJoin& join) {
  if (join.others.empty()) return attnSuccess;
  DeviceScope dev;
  ATTN_CHECK(dev.enter(comm->config.device));
  for (attnStream_t s : join.others) ATTN_CHECK(streamWait(s, join.primary));
  return attnSuccess;
}

}  // namespace attn
