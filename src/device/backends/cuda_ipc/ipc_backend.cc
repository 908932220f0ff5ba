#include "src/device/cuda_ipc/ipc_backend.h"

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/device_route.h"
#include "src/device/device_signature.h"
#include "src/device/device_state.h"
#include "src/device/cuda_ipc/ipc_collectives.h"
#include "src/device/cuda_ipc/ipc_p2p.h"
#include "src/device/cuda_ipc/ipc_stats.h"

namespace attn {

bool ipcSelected(const attnComm* comm, const DeviceOp& op) {
  // Groups go pair by pair (each pair pulls or goes through host memory),
  // so every rank of every device communicator runs them here: the two
  // sides of a pair must speak the same protocol.
  if (op.kind == DeviceOpKind::kP2pGroup) return true;
  if (!ipc::implements(op.kind)) return false;
  const uint64_t host = comm->peers[comm->rank].hostHash;
  for (const PeerInfo& p : comm->peers)
    if (p.hostHash != host) return false;
  return true;
}

attnResult_t ipcEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op) {
  // The work reaches its state through comm->device, which deviceFree keeps
  // until the bridge is idle.
  auto work = [comm, op = std::move(op)](cudaStream_t copy) -> attnResult_t {
    ErrorContext ctx(comm->prefix);
    std::unique_ptr<ipc::IpcState>& state = comm->device->ipc;
    if (!state) state = std::make_unique<ipc::IpcState>(comm->config.device);
    if (op.kind == DeviceOpKind::kP2pGroup) return ipc::runP2pGroup(comm, *state, op, copy);
    ATTN_CHECK(checkDeviceSignature(comm, op));  // before the handshakes: a refusal meets it
    ATTN_CHECK(state->agree(comm));
    bool elsewhere = !state->enabled();
    if (!elsewhere) ATTN_CHECK(ipc::runCollective(comm, *state, op, copy, &elsewhere));
    if (elsewhere) {
      ipc::ipcCounters().stagedOps.fetch_add(1, std::memory_order_relaxed);
      return deviceRunViaTransport(comm, op);
    }
    ipc::ipcCounters().ops.fetch_add(1, std::memory_order_relaxed);
    return attnSuccess;
  };
  return comm->device->bridge->enqueue(reinterpret_cast<cudaStream_t>(stream), std::move(work));
}

}  // namespace attn
