// The rotating block of a ring on the GPU (pass-KV's KV blocks, pass-Q's
// query blocks). Block j sits in device buffer j % 2, which the kernels
// read; blockReady[i] says device buffer i holds its block; kernelDone[i],
// recorded by the caller after the last kernel that read device buffer i,
// says it may be overwritten. The host sees block j's header, offsets and
// positions in pinned host buffer j % 2. How the block reaches the next
// rank depends on the mode:
//  - staged: the whole block goes through host buffer j % 2, which the
//    transports send and receive, and is uploaded. A host buffer is
//    received into only after its block was sent (the previous step
//    waited for that) and uploaded (post() synchronises blockReady);
//  - direct (RingLink::direct): only the metadata goes over the
//    transport, as the signal that the block is ready. The next rank copies
//    the block itself device to device out of this rank's buffer, then
//    counts the read in this rank's control word. A device buffer is
//    copied into only after the next rank has finished reading what it
//    held. A neighbour in this process reads by address; one in another
//    process opens this rank's buffers' IPC handles at the start of the
//    call, closes them at its end and counts that too, so no mapping
//    outlives the call (memory a peer has open must not be freed);
//  - via the transport (RingLink::viaTransport: it takes device memory):
//    the metadata goes as in direct mode, then the whole device block as
//    a second message, received straight into the other device buffer
//    once the kernel that read that buffer has finished. No staging, no
//    peer mapping; the transport (UCX) picks GPUDirect RDMA or its own
//    pipeline.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>

#include "src/attn/attn_call.h"
#include "src/attn/progress_thread.h"
#include "src/attn/ring_steps.h"
#include "src/core/engine.h"
#include "src/device/device_attn_state.h"
#include "src/device/ring_link.h"
#include "src/device/backends/cuda_ipc/ipc_handles.h"

namespace attn {

class DeviceRing final : public RingMover {
 public:
  // link: null or not direct() for the staged mode.
  DeviceRing(Engine& e, DeviceAttnState& R, cudaStream_t copy, int me, int next, int prev, size_t capacity,
             RingLink* link)
      : e_(e), R_(R), copy_(copy), me_(me), next_(next), prev_(prev), capacity_(capacity),
        link_(link && link->direct() && next != me ? link : nullptr), direct_(link_ != nullptr),
        viaTransport_(link && !link->direct() && link->viaTransport() && next != me) {}
  ~DeviceRing();  // closes the previous rank's buffers if an error left them open
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  // Block 0, this rank's own: `rows` (device tensors t0 and, for KV, t1;
  // host offsets and positions) packed into host buffer 0 (metadata on the
  // host; staged, the tensors are copied down too when there are peers to
  // send to; then R.ownOnHost) and copied into device buffer 0 (then
  // R.blockReady[0]), on the copy stream. Direct: also trades buffer
  // addresses with the neighbours.
  attnResult_t loadOwn(int numSeqs, const RowsRef& rows, RowBytes rowBytes);

  // Both host and device buffers hold at least `capacity` bytes (device
  // ones grown on the compute stream: synchronise it before use). The
  // device ones are exportable (cudaMalloc'd) when the next rank reads them
  // through IPC handles (link direct and nextByHandle) or the transport
  // moves them (it may register them for RDMA).
  static attnResult_t reserve(DeviceAttnState& R, size_t capacity, const RingLink* link);

  int cur() const { return cur_; }
  const char* host() const { return R_.hostBlock[cur_].base(); }
  char* device() const { return R_.block[cur_].get(); }
  size_t bytes() const { return bytes_; }

  // Step s: sends the current block (staged) or its metadata (direct; via
  // the transport, then the device block too) to `next` and receives the
  // next one's from `prev` into the other host buffer.
  attnResult_t post(int s, Request* sendReq, Request* recvReq) override;
  // Waits for both, brings the next block into the other device buffer
  // (upload, copy out of prev's buffer, or receive from the transport)
  // once kernelDone says its last reader here finished, and makes it
  // current. Adds the time blocked on peers to *waitUs. Via the transport
  // the device block is received here, so a caller posting other receives
  // from `prev` must post them after the last advance.
  attnResult_t advance(ProgressThread& driver, Request* sendReq, Request* recvReq, double* waitUs) override;
  // Direct: closes the previous rank's buffers (through handles), then
  // returns once the next rank has read this rank's blocks of all `moves`
  // steps (and closed them), so the next call may overwrite or free them.
  // Staged: nothing.
  attnResult_t finish(int moves, double* waitUs);

 private:
  // What a rank tells its next rank in direct mode: its two device buffers.
  struct Peek {
    ipc::IpcBuffer block[2];
  };
  attnResult_t tradePeeks();
  attnResult_t waitReads(uint64_t count, double* waitUs);
  attnResult_t receiveDevice(ProgressThread& driver, Request* recvReq, double* waitUs);
  attnResult_t checkMeta(int nb, size_t got, BlockLayout* out) const;
  void closePrev();

  Engine& e_;
  DeviceAttnState& R_;
  cudaStream_t copy_;
  int me_, next_, prev_;
  size_t capacity_, bytes_ = 0, metaBytes_ = 0;
  RowBytes rowBytes_;
  int cur_ = 0;
  int steps_ = 0;  // advances so far
  RingLink* link_;
  bool direct_;
  bool viaTransport_;
  std::deque<Request> deviceReq_;  // via the transport: the device blocks' sends and receives
  Peek prevPeek_{};
  const char* prevBlock_[2] = {nullptr, nullptr};  // prev's buffers, in this address space
  void* prevOpened_[2] = {nullptr, nullptr};       // their mappings, when opened from handles
  uint64_t readsBase_ = 0;  // this rank's word at the start of this call
};

}  // namespace attn
