// A device pool's K and V: two allocations on the communicator's GPU, made
// and freed on a stream of the pool's own, and the copies of appends
// enqueued on the caller's stream.
#include <cuda_runtime_api.h>

#include "src/core/comm.h"
#include "src/device/cuda_check.h"
#include "src/device/device_buffer.h"
#include "src/device/device_scope.h"
#include "src/device/kv_device.h"

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
    if (lastCopy_) {
      if (copied_) (void)cudaStreamWaitEvent(stream_, lastCopy_, 0);
      (void)cudaEventDestroy(lastCopy_);
    }
    if (stream_) {
      k_.reset(stream_);
      v_.reset(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }

  attnResult_t allocate(size_t bytes) {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ATTN_CUDA_CHECK(cudaEventCreateWithFlags(&lastCopy_, cudaEventDisableTiming));
    ATTN_CHECK(k_.reserve(std::max<size_t>(1, bytes), stream_));
    ATTN_CHECK(v_.reserve(std::max<size_t>(1, bytes), stream_));
    // Usable from every stream once allocated.
    ATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return attnSuccess;
  }

  char* k() override { return k_.get(); }
  char* v() override { return v_.get(); }
  bool onDevice() const override { return true; }

  attnResult_t copyIn(char* dst, const void* src, size_t bytes, attnStream_t stream) override {
    DeviceScope scope;
    ATTN_CHECK(scope.enter(device_));
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)));
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
  DeviceBuffer k_, v_;
};

}  // namespace

attnResult_t makeKvDeviceMemory(attnComm* comm, size_t bytes, std::unique_ptr<KvMemory>* out) {
  auto mem = std::make_unique<DeviceKvMemory>(comm->config.device);
  ATTN_CHECK(mem->allocate(bytes));
  *out = std::move(mem);
  return attnSuccess;
}

}  // namespace attn
