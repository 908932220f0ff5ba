// A grow-only device allocation, reused across calls. Used by one thread
// (a device communicator's proxy), and grown only while no stream is using
// it (ring attention waits for its streams before it returns).
//
// Allocated and freed stream-ordered (cudaMallocAsync / cudaFreeAsync):
// cudaFree may wait for the whole device, and the proxy runs while its
// caller's stream, and those of other ranks sharing the GPU, are parked
// until proxies finish; a device-wide wait there would never end.
//
// Exportable buffers (makeExportable) are plain cudaMalloc memory instead,
// because pool memory has no cudaIpcMemHandle_t (and a transport may not
// register it for RDMA). They come from the process's cache of such blocks
// (retained_memory.h) and go back there, never to cudaFree, for the same
// reason as above. An outgrown one is retired until reset(): a peer may
// still read it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "attncomm.h"
#include "src/device/retained_memory.h"

namespace attn {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Exportable blocks go back to the cache; pool memory needs a stream to be
  // freed on, so it leaks unless reset() ran first.
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` of device memory (current device) at get(), allocated
  // on `stream`: other streams may use it once that work has completed
  // (synchronise `stream`). Earlier contents are lost when it grows.
  attnResult_t reserve(size_t bytes, cudaStream_t stream);
  char* get() const { return base_; }
  size_t capacity() const { return bytes_; }
  // Frees the memory on `stream`, or (exportable) returns it to the cache:
  // every use of it must be over then.
  void reset(cudaStream_t stream);
  // From now on (for good), allocations can be exported to other
  // processes; pool memory held is freed on `stream` first.
  void makeExportable(cudaStream_t stream);
  bool exportable() const { return exportable_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  bool exportable_ = false;
  int device_ = -1;  // of the exportable blocks
  std::vector<retained::Block> retired_;  // outgrown exportable blocks
};

}  // namespace attn
