#include "src/device/device_buffer.h"

#include "src/core/error.h"
#include "src/device/cuda_check.h"

namespace attn {

DeviceBuffer::~DeviceBuffer() {
  if (exportable_) reset(nullptr);
}

void DeviceBuffer::reset(cudaStream_t stream) {
  if (exportable_) {
    for (const retained::Block& b : retired_) retained::release(device_, b);
    retired_.clear();
    retained::release(device_, retained::Block{base_, bytes_});
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
  if (exportable_) {
    int device = -1;
    ATTN_CUDA_CHECK(cudaGetDevice(&device));
    if (base_ && device != device_)
      return setError(attnInternalError, "device buffer on device %d grown on device %d", device_, device);
    retained::Block b;
    ATTN_CHECK(retained::acquire(device, want, &b));
    if (base_) retired_.push_back(retained::Block{base_, bytes_});
    device_ = device;
    base_ = static_cast<char*>(b.ptr);
    bytes_ = b.bytes;
    return attnSuccess;
  }
  reset(stream);
  void* p = nullptr;
  ATTN_CUDA_CHECK(cudaMallocAsync(&p, want, stream));
  base_ = static_cast<char*>(p);
  bytes_ = want;
  return attnSuccess;
}

}  // namespace attn
