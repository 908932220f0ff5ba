// The NCCL backend as the route sees it (nccl_bridge.h): every operation of
// a communicator made over the engine's NCCL communicator, as NCCL calls on
// the caller's stream.
#include "src/core/comm.h"
#include "src/device/backends/device_backend.h"
#include "src/device/backends/nccl/nccl_bridge.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

class NcclBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "nccl"; }
  BackendCaps caps() const override {
    return {true, true, true,
            kCollectiveKinds | kindBit(DeviceOpKind::kBarrier) | kindBit(DeviceOpKind::kP2pGroup)};
  }
  bool takes(const attnComm* comm, const DeviceOp& op) const override {
    return ncclBacked(comm) && caps().runs(op.kind);
  }
  attnResult_t enqueue(attnComm* comm, attnStream_t stream, DeviceOp& op) const override {
    return ncclEnqueue(comm, comm->device->nccl.get(), stream, op);
  }
};

}  // namespace

const DeviceBackend& ncclBackend() {
  static const NcclBackend b;
  return b;
}

}  // namespace attn
