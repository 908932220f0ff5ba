#include "src/device/device_buffer.h"

#include "src/device/cuda_check.h"

namespace attn {

DeviceBuffer::~DeviceBuffer() = default;

void DeviceBuffer::reset(cudaStream_t stream) {
  if (exportable_) {
    for (void* p : retired_) (void)cudaFree(p);
    retired_.clear();
    if (base_) (void)cudaFree(base_);
  } else if (base_) {
    (void)cudaFreeAsync(base_, stream);
  }
  base_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::makeExportable(cudaStream_t stream) {
  if (exportable_) return;
  reset(stream);
  exportable_ = true;
}

attnResult_t DeviceBuffer::reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_) return attnSuccess;
  // Grow by half again at least, rounded to 1 MiB: a slowly growing
  // workload should not reallocate on every call.
  size_t want = bytes_ + bytes_ / 2;
  if (want < bytes) want = bytes;
  want = (want + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);
  void* p = nullptr;
  if (exportable_) {
    ATTN_CUDA_CHECK(cudaMalloc(&p, want));
    if (base_) retired_.push_back(base_);
  } else {
    reset(stream);
    ATTN_CUDA_CHECK(cudaMallocAsync(&p, want, stream));
  }
  base_ = static_cast<char*>(p);
  bytes_ = want;
  return attnSuccess;
}

}  // namespace attn
