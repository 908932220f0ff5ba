// The rotating block of a ring on the GPU (pass-KV's KV blocks, pass-Q's
// query blocks). Block j is held twice: in pinned host buffer j % 2, which
// the transports send and receive, and in device buffer j % 2, which the
// kernels read. blockReady[i] says device buffer i holds its block;
// kernelDone[i], recorded by the caller after the last kernel that read
// device buffer i, says it may be overwritten. A host buffer is received
// into only after its block was sent (the previous step waited for that)
// and uploaded (post() synchronises blockReady).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "src/attn/progress_thread.h"
#include "src/core/engine.h"
#include "src/device/device_attn_state.h"

namespace attn {

class DeviceRing {
 public:
  // Block 0 (this rank's own, `bytes` long) is on its way into host buffer 0
  // (R.ownOnHost) and device buffer 0 (R.blockReady[0]).
  DeviceRing(Engine& e, DeviceAttnState& R, cudaStream_t copy, int next, int prev, size_t capacity,
             size_t bytes)
      : e_(e), R_(R), copy_(copy), next_(next), prev_(prev), capacity_(capacity), bytes_(bytes) {}

  // Both host and device buffers hold at least `capacity` bytes (device
  // ones grown on the compute stream: synchronise it before use).
  static attnResult_t reserve(DeviceAttnState& R, size_t capacity);

  int cur() const { return cur_; }
  const char* host() const { return R_.hostBlock[cur_].base(); }
  char* device() const { return R_.block[cur_].get(); }
  size_t bytes() const { return bytes_; }

  // Step s: sends the current block to `next` and receives the next one
  // from `prev` into the other host buffer.
  attnResult_t post(int s, Request* sendReq, Request* recvReq);
  // Waits for both, uploads the received block into the other device
  // buffer once kernelDone says its last reader finished, and makes it
  // current. Adds the time blocked on the network to *waitUs.
  attnResult_t advance(ProgressThread& driver, Request* sendReq, Request* recvReq, double* waitUs);

 private:
  Engine& e_;
  DeviceAttnState& R_;
  cudaStream_t copy_;
  int next_, prev_;
  size_t capacity_, bytes_;
  int cur_ = 0;
};

}  // namespace attn
