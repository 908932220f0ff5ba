// The cuda_ipc backend as the route sees it (device_backend.h): send/recv
// groups on every device communicator, settled pair by pair (ipc_p2p.h);
// collectives whose kind is implemented when every rank is on this host.
// Whether the ranks allow cuda_ipc (ATTN_TRANSPORT / config.transports) and
// reach each other's GPUs they agree inside the first collective; where
// not, or where some rank's buffer cannot be served, every rank declines
// and the route runs the collective on the next backend.
#include <memory>

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/backends/cuda_ipc/ipc_collectives.h"
#include "src/device/backends/cuda_ipc/ipc_p2p.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"
#include "src/device/backends/device_backend.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

bool allOnThisHost(const attnComm* comm) {
  const uint64_t host = comm->peers[comm->rank].hostHash;
  for (const PeerInfo& p : comm->peers)
    if (p.hostHash != host) return false;
  return true;
}

class CudaIpcBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cuda_ipc"; }
  BackendCaps caps() const override {
    uint32_t kinds = kindBit(DeviceOpKind::kP2pGroup);
    for (uint32_t k = 0; k < 32; ++k)
      if (kCollectiveKinds & (1u << k) && ipc::implements(DeviceOpKind(k))) kinds |= 1u << k;
    return {false, true, false, kinds};
  }
  bool takes(const attnComm* comm, const DeviceOp& op) const override {
    // Groups go pair by pair (each pair pulls or goes through host memory),
    // so every rank of every device communicator runs them here: the two
    // sides of a pair must speak the same protocol.
    if (op.kind == DeviceOpKind::kP2pGroup) return true;
    return ipc::implements(op.kind) && allOnThisHost(comm);
  }

  attnResult_t run(attnComm* comm, DeviceState& st, const DeviceOp& op, cudaStream_t copy,
                   bool* declined) const override {
    *declined = false;
    if (!st.ipc) st.ipc = std::make_unique<ipc::IpcState>(comm->config.device);
    if (op.kind == DeviceOpKind::kP2pGroup) return ipc::runP2pGroup(comm, *st.ipc, op, copy);
    ATTN_CHECK(st.ipc->agree(comm));
    bool elsewhere = !st.ipc->enabled();
    if (!elsewhere) ATTN_CHECK(ipc::runCollective(comm, *st.ipc, op, copy, &elsewhere));
    if (elsewhere) {
      ipc::ipcCounters().stagedOps.fetch_add(1, std::memory_order_relaxed);
      *declined = true;
      return attnSuccess;
    }
    ipc::ipcCounters().ops.fetch_add(1, std::memory_order_relaxed);
    return attnSuccess;
  }
};

}  // namespace

const DeviceBackend& cudaIpcBackend() {
  static const CudaIpcBackend b;
  return b;
}

}  // namespace attn
