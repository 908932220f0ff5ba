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

#include "src/attn/attn_call.h"
#include "src/attn/progress_thread.h"
#include "src/core/engine.h"
#include "src/device/device_attn_state.h"

namespace attn {

class DeviceRing {
 public:
  DeviceRing(Engine& e, DeviceAttnState& R, cudaStream_t copy, int me, int next, int prev, size_t capacity)
      : e_(e), R_(R), copy_(copy), me_(me), next_(next), prev_(prev), capacity_(capacity) {}

  // Block 0, this rank's own: `rows` (device tensors t0 and, for KV, t1;
  // host offsets and positions) packed into host buffer 0 (metadata on the
  // host, tensors copied down when there are peers to send to; then
  // R.ownOnHost) and copied into device buffer 0 (then R.blockReady[0]),
  // on the copy stream.
  attnResult_t loadOwn(int numSeqs, const RowsRef& rows, size_t rowBytes);

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
  int me_, next_, prev_;
  size_t capacity_, bytes_ = 0;
  int cur_ = 0;
};

}  // namespace attn
