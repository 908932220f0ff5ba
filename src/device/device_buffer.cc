#include "src/device/device_buffer.h"

#include "src/device/cuda_check.h"

namespace attn {

DeviceBuffer::~DeviceBuffer() = default;

void DeviceBuffer::reset(cudaStream_t stream) {
  if (base_) (void)cudaFreeAsync(base_, stream);
  base_ = nullptr;
  bytes_ = 0;
}

attnResult_t DeviceBuffer::reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_) return attnSuccess;
  // Grow by half again at least, rounded to 1 MiB: a slowly growing
  // workload should not reallocate on every call.
  size_t want = bytes_ + bytes_ / 2;
  if (want < bytes) want = bytes;
  want = (want + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);
  reset(stream);
  void* p = nullptr;
  ATTN_CUDA_CHECK(cudaMallocAsync(&p, want, stream));
  base_ = static_cast<char*>(p);
  bytes_ = want;
  return attnSuccess;
}

}  // namespace attn
