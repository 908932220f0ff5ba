// The cost model's kernel figure on a device communicator: the library's
// CUDA attention timed on the communicator's GPU (a host communicator times
// the CPU kernel, src/attn/calibrate.cc). Without it AUTO would weigh GPU
// communication against CPU compute rates.
#pragma once

#include <cuda_runtime_api.h>

#include "attncomm.h"

struct attnComm;

namespace attn {

// One partial-attention problem on the GPU: nq queries against nk keys, all
// visible, in buffers of its own on a stream of its own (nothing shared
// with the communicator's proxy, so it may run on any thread). Memory is
// stream-ordered: cudaMalloc / cudaFree may wait for the whole device,
// where ranks sharing it have work parked.
class DeviceAttnProbe {
 public:
  DeviceAttnProbe() = default;
  ~DeviceAttnProbe();
  DeviceAttnProbe(const DeviceAttnProbe&) = delete;
  DeviceAttnProbe& operator=(const DeviceAttnProbe&) = delete;

  // Chooses the size: it grows nq and nk (from 128) until one launch takes
  // at least a millisecond, so launch overhead does not hide a fast GPU.
  attnResult_t init(const attnComm* comm, const attnAttnConfig_t& cfg);
  // GPU seconds of one launch (events around it); waits for it.
  attnResult_t run(double* seconds);
  double flops() const;

 private:
  attnResult_t allocate(int tokens);
  void release();

  int device_ = -1;
  attnAttnConfig_t cfg_ = ATTN_ATTN_CONFIG_INITIALIZER;
  int tokens_ = 0;  // nq = nk
  cudaStream_t stream_ = nullptr;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
  void* q_ = nullptr;
  void* kv_ = nullptr;  // K then V
  float* o_ = nullptr;
  float* lse_ = nullptr;
};

}  // namespace attn
