#include "src/device/device_route.h"

#include <memory>

#include "src/core/comm.h"
#include "src/core/log.h"
#include "src/device/backends/device_backend.h"
#include "src/device/backends/nccl/nccl_bridge.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/device_signature.h"
#include "src/device/device_state.h"

namespace attn {

bool deviceRoute(const attnComm* comm) { return comm->device != nullptr; }

attnResult_t deviceInit(attnComm* comm) {
  if (comm->config.device == ATTN_DEVICE_HOST) return attnSuccess;
  auto st = std::make_shared<DeviceState>();
  auto onError = [comm](attnResult_t code, const std::string& why) {
    attnResult_t none = attnSuccess;
    comm->asyncError.compare_exchange_strong(none, code);
    comm->recordError(why);
  };
  ATTN_CHECK(StreamBridge::create(comm->config.device, onError, &st->bridge));
  comm->device = std::move(st);
  return attnSuccess;
}

void deviceAbort(attnComm* comm) {
  if (comm->device) comm->device->bridge->abort();
}

void deviceFree(attnComm* comm) {
  if (!comm->device) return;
  // Queued work reaches its state through comm->device: let it finish
  // while that is still set (shared_ptr::reset clears it first). Work
  // captured into graphs holds the state too: it is dropped here, so the
  // state goes with the communicator even while its graphs live on.
  comm->device->bridge->retireCaptured();
  comm->device->bridge->waitIdle();
  comm->device.reset();
}

bool deviceBusy(const attnComm* comm) { return comm->device && comm->device->bridge->busy(); }

void deviceWaitIdle(const attnComm* comm) {
  if (comm->device && !StreamBridge::onProxyThread()) comm->device->bridge->waitIdle();
}

namespace {

// On the proxy thread: the operation's signature exchange (once, whichever
// backend runs it), then the backends in order until one runs it.
attnResult_t runOnProxy(attnComm* comm, const DeviceOp& op, cudaStream_t copy) {
  ATTN_CHECK(checkDeviceSignature(comm, op));
  for (const DeviceBackend* b : deviceBackends()) {
    if (b->caps().onCallerStream || !b->takes(comm, op)) continue;
    bool declined = false;
    const attnResult_t r = b->run(comm, *comm->device, op, copy, &declined);
    if (r != attnSuccess || !declined) return r;
    ATTN_TRACE(kLogColl, "%s: device backend %s declined, trying the next", deviceOpName(op.kind), b->name());
  }
  return setError(attnInternalError, "no device backend runs %s", deviceOpName(op.kind));
}

}  // namespace

attnResult_t deviceAsyncError(attnComm* comm) {
  if (!comm->device || !comm->device->nccl) return attnSuccess;
  attnResult_t r = ncclAsyncError(comm->device->nccl.get());
  if (r != attnSuccess) comm->recordError(threadLastError());
  return r;
}

attnResult_t deviceEnqueueWork(attnComm* comm, attnStream_t stream, DeviceWork work) {
  // The work uses the communicator itself, which attnCommDestroy keeps
  // until the bridge is idle (deviceBusy).
  return comm->device->bridge->enqueue(reinterpret_cast<cudaStream_t>(stream),
                                       [work = std::move(work)](cudaStream_t) { return work(); });
}

attnResult_t deviceRunOnProxy(attnComm* comm, const DeviceOp& op) {
  if (!comm->device || !StreamBridge::onProxyThread())
    return setError(attnInternalError, "deviceRunOnProxy outside a device communicator's proxy thread");
  return runOnProxy(comm, op, comm->device->bridge->copyStream());
}

attnResult_t deviceRefuse(attnComm* comm, attnStream_t stream, const CollSignature& refused) {
  if (comm->device->nccl) return ncclRefuse(comm, refused);
  return deviceEnqueueWork(comm, stream, [comm, refused] {
    ErrorContext ctx(comm->prefix);
    return sendRefusedSignature(comm, refused);
  });
}

attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op) {
  if (op.stageChunk == 0) op.stageChunk = stageChunkBytes();  // read here, like every per-call setting
  for (const DeviceBackend* b : deviceBackends())
    if (b->caps().onCallerStream && b->takes(comm, op)) return b->enqueue(comm, stream, op);
  // The work reaches its state through comm->device, which deviceFree
  // keeps until the bridge is idle.
  auto work = [comm, op = std::move(op)](cudaStream_t copy) {
    ErrorContext ctx(comm->prefix);
    return runOnProxy(comm, op, copy);
  };
  return comm->device->bridge->enqueue(reinterpret_cast<cudaStream_t>(stream), std::move(work));
}

}  // namespace attn
