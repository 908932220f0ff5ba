#include "src/device/device_route.h"

#include <memory>

#include "src/core/comm.h"
#include "src/device/cuda_check.h"
#include "src/device/pinned_arena.h"
#include "src/device/stream_bridge.h"

namespace attn {

// Per device communicator. The arena outlives the bridge (declared first):
// the proxy thread uses it until the bridge joins it.
struct DeviceState {
  PinnedArena arena;
  std::unique_ptr<StreamBridge> bridge;
};

namespace {

constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

bool deviceRoute(const attnComm* comm) {
  return comm->device && !StreamBridge::onProxyThread();
}

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

void deviceFree(attnComm* comm) { comm->device.reset(); }

bool deviceBusy(const attnComm* comm) { return comm->device && comm->device->bridge->busy(); }

namespace {

// The staging backend: pinned host copies around the host-memory operation.
attnResult_t enqueueStaged(attnComm* comm, attnStream_t stream, std::vector<DeviceSpan> spans,
                           HostOp op) {
  std::shared_ptr<DeviceState> st = comm->device;
  auto work = [st, spans = std::move(spans), op = std::move(op)](cudaStream_t copy) -> attnResult_t {
    size_t total = 0;
    for (const DeviceSpan& s : spans) total += alignUp(s.bytes);
    ATTN_CHECK(st->arena.reserve(total));
    std::vector<char*> host(spans.size(), nullptr);
    size_t off = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].bytes == 0) continue;
      host[i] = st->arena.base() + off;
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
  };
  return st->bridge->enqueue(reinterpret_cast<cudaStream_t>(stream), std::move(work));
}

}  // namespace

attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, DeviceOp op) {
  return enqueueStaged(comm, stream, std::move(op.spans), std::move(op.hostOp));
}

}  // namespace attn
