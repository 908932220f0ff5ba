// Migration's bytes for a device pool: the K and V of every block as one
// group of device sends and receives, run here on the proxy thread by the
// backend that runs send/recv groups (src/device/backends/cuda_ipc/ipc_p2p.h). A receiver on this host that reaches the
// sender's GPU copies each block straight out of the sender's slot (peer
// copies; NVLink where present); any other pair goes over the host
// transport, device memory as it is where the transport takes it, else
// through pinned host memory.
#include <cuda_runtime_api.h>

#include "src/core/comm.h"
#include "src/attn/device/kv_device.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/device_op.h"
#include "src/device/device_route.h"

namespace attn {
namespace {

class DeviceBlockIo : public KvBlockIo {
 public:
  explicit DeviceBlockIo(KvPool& pool) : pool_(pool) {}

  attnResult_t move(const std::vector<KvBlockTransfer>& blocks) override {
    if (blocks.empty()) return attnSuccess;  // a group involves only the ranks it names
    attnComm* comm = pool_.comm();
    const size_t bb = pool_.blockBytes();
    DeviceOp op;
    op.kind = DeviceOpKind::kP2pGroup;
    op.stageChunk = stageChunkBytes();
    op.p2p.reserve(2 * blocks.size());
    for (const KvBlockTransfer& b : blocks) {
      op.p2p.push_back(P2pOp{b.send, b.peer, pool_.k(b.slot), bb});
      op.p2p.push_back(P2pOp{b.send, b.peer, pool_.v(b.slot), bb});
    }
    return deviceRunOnProxy(comm, op);  // on the proxy already: the backend that runs send/recv groups
  }

 private:
  KvPool& pool_;
};

}  // namespace

std::unique_ptr<KvBlockIo> makeKvBlockIoDevice(KvPool& pool) { return std::make_unique<DeviceBlockIo>(pool); }

}  // namespace attn
