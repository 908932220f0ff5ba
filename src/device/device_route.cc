#include "src/device/device_route.h"

#include <memory>

#include "src/core/comm.h"
#include "src/core/proxy_thread.h"
#include "src/device/cuda_check.h"
#include "src/device/device_signature.h"
#include "src/device/device_state.h"
#include "src/device/stage_pipeline.h"
#include "src/device/cuda_ipc/ipc_backend.h"

namespace attn {
namespace {

constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

bool deviceRoute(const attnComm* comm) {
  return comm->device && !StreamBridge::onProxyThread();
}

bool onDeviceProxy(const attnComm* comm) { return comm->device && StreamBridge::onProxyThread(); }

bool onAnyDeviceProxy() { return onDeviceProxyThread(); }

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

// The staging backend: pinned host copies around the host-memory operation,
// on the proxy thread.
attnResult_t stageAround(DeviceState& st, cudaStream_t copy, const std::vector<DeviceSpan>& spans,
                         const HostOp& op) {
  size_t total = 0;
  for (const DeviceSpan& s : spans) total += alignUp(s.bytes);
  ATTN_CHECK(st.arena.reserve(total));
  std::vector<char*> host(spans.size(), nullptr);
  size_t off = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].bytes == 0) continue;
    host[i] = st.arena.base() + off;
    off += alignUp(spans[i].bytes);
    if (spans[i].in)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(host[i], spans[i].ptr, spans[i].bytes, cudaMemcpyDefault, copy));
  }
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  ATTN_CHECK(op(host.data()));
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].out && spans[i].bytes)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(spans[i].ptr), host[i], spans[i].bytes,
                                      cudaMemcpyDefault, copy));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  return attnSuccess;
}

// Over the host transports: device buffers straight to them where every
// rank's transports take device memory (transport_direct.h), else staged,
// pipelined when the operation can be sliced and is larger than a slice
// (stage_pipeline.h), else in one piece.
attnResult_t runViaTransport(attnComm* comm, DeviceState& st, cudaStream_t copy, const DeviceOp& op,
                             size_t chunkBytes) {
  if (TransportDirect::implements(op.kind)) {
    if (!st.direct) st.direct = std::make_unique<TransportDirect>(comm->config.device);
    ATTN_CHECK(st.direct->agree(comm));
    if (st.direct->enabled()) return st.direct->run(comm, op, copy);
  }
  if (const size_t slice = stageSliceCount(op, chunkBytes))
    return runStagePipeline(op, comm->rank, comm->nranks, slice, st.arena, st.sliceEvents, copy);
  return stageAround(st, copy, op.spans, op.hostOp);
}

attnResult_t enqueueStaged(attnComm* comm, attnStream_t stream, DeviceOp op) {
  std::shared_ptr<DeviceState> st = comm->device;
  // Read here, on the caller's thread, like every per-call setting.
  const size_t chunk = stageChunkBytes();
  auto work = [comm, st, op = std::move(op), chunk](cudaStream_t copy) {
    ErrorContext ctx(comm->prefix);
    ATTN_CHECK(checkDeviceSignature(comm, op));
    return runViaTransport(comm, *st, copy, op, chunk);
  };
  return st->bridge->enqueue(reinterpret_cast<cudaStream_t>(stream), std::move(work));
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

attnResult_t deviceRunViaTransport(attnComm* comm, const DeviceOp& op) {
  if (!comm->device || !StreamBridge::onProxyThread())
    return setError(attnInternalError, "deviceRunViaTransport outside a device communicator's proxy thread");
  return runViaTransport(comm, *comm->device, comm->device->bridge->copyStream(), op, stageChunkBytes());
}

attnResult_t deviceRefuse(attnComm* comm, attnStream_t stream, const CollSignature& refused) {
  if (comm->device->nccl) return ncclRefuse(comm, refused);
  return deviceEnqueueWork(comm, stream, [comm, refused] {
    ErrorContext ctx(comm->prefix);
    return sendRefusedSignature(comm, refused);
  });
}

attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op) {
  if (comm->device->nccl && op.kind != DeviceOpKind::kOther)
    return ncclEnqueue(comm, comm->device->nccl.get(), stream, op);
  if (ipcSelected(comm, op)) return ipcEnqueue(comm, stream, std::move(op));
  return enqueueStaged(comm, stream, std::move(op));
}

}  // namespace attn
