#include "src/device/device_attn_state.h"

#include "src/device/cuda_check.h"

namespace attn {

DeviceAttnState::~DeviceAttnState() {
  if (device < 0) return;
  // Destroyed on whichever thread frees the communicator: make its device
  // current while releasing, then restore the caller's.
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  if (saved != device) (void)cudaSetDevice(device);
  // Freed stream-ordered (device_buffer.h), then that stream is drained:
  // no device-wide wait while other ranks may share the GPU.
  if (compute) {
    for (DeviceBuffer* b : {&block[0], &block[1], &acc, &part, &visit, &meta, &lseOut}) b->reset(compute);
    (void)cudaStreamSynchronize(compute);
  }
  for (cudaEvent_t e : {blockReady[0], blockReady[1], kernelDone[0], kernelDone[1], ownOnHost, finished})
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : timing) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : partialOnHost) (void)cudaEventDestroy(e);
  if (compute) (void)cudaStreamDestroy(compute);
  if (saved >= 0 && saved != device) (void)cudaSetDevice(saved);
}

attnResult_t DeviceAttnState::prepare(size_t timingEvents, size_t peerEvents) {
  if (device < 0) ATTN_CUDA_CHECK(cudaGetDevice(&device));
  // Each object is created once; a failure leaves the others for a retry.
  if (!compute) ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  // Blocking sync: the proxy sleeps in cudaEventSynchronize instead of
  // spinning on a core the ranks' transports need.
  const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
  for (cudaEvent_t* e : {&blockReady[0], &blockReady[1], &kernelDone[0], &kernelDone[1], &ownOnHost,
                         &finished})
    if (!*e) ATTN_CUDA_CHECK(cudaEventCreateWithFlags(e, flags));
  while (timing.size() < timingEvents) {
    cudaEvent_t e;
    ATTN_CUDA_CHECK(cudaEventCreate(&e));
    timing.push_back(e);
  }
  while (partialOnHost.size() < peerEvents) {
    cudaEvent_t e;
    ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    partialOnHost.push_back(e);
  }
  return attnSuccess;
}

}  // namespace attn
