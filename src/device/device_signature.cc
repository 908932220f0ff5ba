#include "src/device/device_signature.h"

#include "src/core/comm.h"

namespace attn {

bool deviceOpSignature(const DeviceOp& op, CollSignature* sig) {
  CollSignature s;
  s.datatype = op.type;
  s.count = op.count;
  switch (op.kind) {
    case DeviceOpKind::kAllGather: s.kind = (uint32_t)CollKind::kAllGather; break;
    case DeviceOpKind::kReduceScatter: s.kind = (uint32_t)CollKind::kReduceScatter; s.op = op.op; break;
    case DeviceOpKind::kAllReduce: s.kind = (uint32_t)CollKind::kAllReduce; s.op = op.op; break;
    case DeviceOpKind::kBroadcast: s.kind = (uint32_t)CollKind::kBroadcast; s.root = op.root; break;
    case DeviceOpKind::kReduce:
      s.kind = (uint32_t)CollKind::kReduce;
      s.op = op.op;
      s.root = op.root;
      break;
    case DeviceOpKind::kAllToAll: s.kind = (uint32_t)CollKind::kAllToAll; break;
    case DeviceOpKind::kAllToAllv: s.kind = (uint32_t)CollKind::kAllToAllv; s.count = 0; break;
    case DeviceOpKind::kBarrier:
      s = CollSignature{};
      s.kind = (uint32_t)CollKind::kBarrier;
      break;
    default: return false;
  }
  *sig = s;
  return true;
}

attnResult_t checkDeviceSignature(attnComm* comm, const DeviceOp& op) {
  CollSignature sig;
  if (!comm->config.checkSignatures || !deviceOpSignature(op, &sig)) return attnSuccess;
  return checkSignature(comm, sig);
}

}  // namespace attn
