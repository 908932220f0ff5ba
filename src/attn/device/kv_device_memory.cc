// A device pool's K and V: two allocations on the communicator's GPU, and
// the copies of appends enqueued on the caller's stream (or, for an append
// a CUDA graph launched, on the pool's own stream). And the mirror of
// the pool's positions, which kvAttention keeps up to date
// (kv_attention_device.cc).
//
// Stream-ordered (made and freed on a stream of the pool's own) unless a
// peer runs in another process on this host: then plain cudaMalloc memory,
// which CUDA IPC can export, so that migration copies blocks GPU to GPU
// (kv_block_io_device.cc). That memory comes from and goes back to the
// process's cache (retained_memory.h), as cudaFree could wait for the whole
// device while other ranks' streams are parked.
#include <cuda_runtime_api.h>

#include "src/core/comm.h"
#include "src/device/cuda_check.h"
#include "src/device/device_buffer.h"
#include "src/device/device_scope.h"
#include "src/attn/device/kv_device.h"

namespace attn {
namespace {

class DeviceKvMemory : public KvMemory {
 public:
  explicit DeviceKvMemory(int device) : device_(device) {}

  ~DeviceKvMemory() override {
    DeviceScope scope;
    if (scope.enter(device_) != attnSuccess) return;
    // Freed after the last append's copies, on our stream: no device-wide
    // wait, which could hang while other ranks' streams are parked.
    // Exportable memory goes back to the cache once they are done (they
    // are when the callers' streams have run the pool's calls, as
    // attnKvPoolDestroy asks).
    if (lastCopy_) {
      if (copied_ && k_.exportable()) (void)cudaEventSynchronize(lastCopy_);
      else if (copied_) (void)cudaStreamWaitEvent(stream_, lastCopy_, 0);
      (void)cudaEventDestroy(lastCopy_);
    }
    if (stream_) {
      k_.reset(stream_);
      v_.reset(stream_);
      pos_.reset(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }

  attnResult_t allocate(size_t bytes, size_t posBytes, bool exportable) {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&lastCopy_, cudaEventDisableTiming));
    if (exportable) {
      k_.makeExportable(stream_);
      v_.makeExportable(stream_);
    }
    ATTN_CHECK(k_.reserve(std::max<size_t>(1, bytes), stream_));
    ATTN_CHECK(v_.reserve(std::max<size_t>(1, bytes), stream_));
    ATTN_CHECK(pos_.reserve(std::max<size_t>(1, posBytes), stream_));
    // Usable from every stream once allocated.
    ATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return attnSuccess;
  }

  char* k() override { return k_.get(); }
  char* v() override { return v_.get(); }
  bool onDevice() const override { return true; }
  int32_t* positions() override { return reinterpret_cast<int32_t*>(pos_.get()); }

  attnResult_t copyIn(char* dst, const void* src, size_t bytes, attnStream_t stream) override {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)));
    return attnSuccess;
  }

  attnResult_t capturing(attnStream_t stream, bool* yes) override {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ATTN_CUDA_CHECK(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture));
    *yes = capture != cudaStreamCaptureStatusNone;
    return attnSuccess;
  }

  attnStream_t ownStream() override { return reinterpret_cast<attnStream_t>(stream_); }

  attnResult_t waitOwnStream() override {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return attnSuccess;
  }

  attnResult_t copiesDone(attnStream_t stream) override {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaEventRecord(lastCopy_, reinterpret_cast<cudaStream_t>(stream)));
    copied_ = true;
    return attnSuccess;
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t lastCopy_ = nullptr;
  bool copied_ = false;
  DeviceBuffer k_, v_, pos_;
};

// Some peer is another process on this host.
bool peerProcessOnThisHost(const attnComm* comm) {
  const PeerInfo& me = comm->peers[comm->rank];
  for (const PeerInfo& p : comm->peers)
    if (p.hostHash == me.hostHash && p.pid != me.pid) return true;
  return false;
}

}  // namespace

attnResult_t makeKvDeviceMemory(attnComm* comm, size_t bytes, size_t posBytes, std::unique_ptr<KvMemory>* out) {
  auto mem = std::make_unique<DeviceKvMemory>(comm->config.device);
  ATTN_CHECK(mem->allocate(bytes, posBytes, peerProcessOnThisHost(comm)));
  *out = std::move(mem);
  return attnSuccess;
}

}  // namespace attn
