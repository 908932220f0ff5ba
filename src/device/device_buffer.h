// A grow-only device allocation, reused across calls. Used by one thread
// (a device communicator's proxy), and grown only while no stream is using
// it (ring attention waits for its streams before it returns).
//
// Allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync):
// cudaFree may wait for the whole device, and the proxy runs while its
// caller's stream, and those of other ranks sharing the GPU, are parked
// until proxies finish; a device-wide wait there would never end.
//
// Exportable buffers (makeExportable) are cudaMalloc'd instead, because
// pool memory has no cudaIpcMemHandle_t. For the same reason as above an
// outgrown one is not freed but retired, and freed with the rest by
// reset() (cudaFree: only when nothing is parked, i.e. when the
// communicator is freed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "attncomm.h"

namespace attn {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();  // leaks rather than waits for the device: call reset() first
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` of device memory (current device) at get(), allocated
  // on `stream`: other streams may use it once that work has completed
  // (synchronise `stream`). Earlier contents are lost when it grows.
  attnResult_t reserve(size_t bytes, cudaStream_t stream);
  char* get() const { return base_; }
  size_t capacity() const { return bytes_; }
  // Frees the memory: on `stream`, or (exportable) with cudaFree.
  void reset(cudaStream_t stream);
  // From now on (for good), allocations can be exported to other
  // processes; pool memory held is freed on `stream` first.
  void makeExportable(cudaStream_t stream);
  bool exportable() const { return exportable_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  bool exportable_ = false;
  std::vector<void*> retired_;  // outgrown exportable allocations
};

}  // namespace attn
