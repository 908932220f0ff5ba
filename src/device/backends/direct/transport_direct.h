// The device backend for transports that move CUDA device memory
// themselves (Connection::takesDeviceMemory: UCX built with CUDA). Where no
// GPU-to-GPU path of our own applies (peers on other hosts, cuda_ipc off
// or unable), collectives hand the device buffers to the transport as they
// are, with no staging through pinned host memory; UCX then moves them by
// GPUDirect RDMA, CUDA IPC or its own pipelined staging, whichever its
// fabric has. Reductions run on the GPU (kernels/cuda) on the copy stream.
//
// Every rank must run the same algorithm, so whether it applies is agreed
// by all ranks together, once per communicator, at the first collective
// that could use it: every rank's connection to every peer must take
// device memory. Otherwise every rank stages (stage_pipeline.h).
//
// Algorithms, on the proxy thread, pairwise over the progress engine:
//  - all-gather, all-to-all(v): every block straight to its owner, all
//    posted at once;
//  - broadcast: a chain from the root in ring order, pipelined in chunks;
//  - reduce-scatter: each rank receives the peers' blocks for it into a
//    device scratch and reduces them there, in slices bounded by
//    ATTN_DEVICE_DIRECT_SCRATCH;
//  - all-reduce: reduce-scatter of even slices, then all-gather of them;
//  - reduce: a reduce-scatter in which the root's block is everything (the
//    others only send).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "attncomm.h"
#include "src/device/device_buffer.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

class TransportDirect {
 public:
  // Reads ATTN_DEVICE_DIRECT_SCRATCH.
  explicit TransportDirect(int device);
  ~TransportDirect();  // frees the scratch stream-ordered on `device`
  TransportDirect(const TransportDirect&) = delete;
  TransportDirect& operator=(const TransportDirect&) = delete;

  // The operation kinds run here.
  static bool implements(DeviceOpKind kind);
  // Collective: on the first call, every rank tells whether all its
  // connections take device memory; later calls return at once.
  attnResult_t agree(attnComm* comm);
  bool enabled() const { return enabled_; }
  // Runs `op` (implements(op.kind), enabled()) on the proxy thread; returns
  // once its outputs are complete and its inputs may be reused.
  attnResult_t run(attnComm* comm, const DeviceOp& op, cudaStream_t copy);

 private:
  int device_;
  bool decided_ = false;
  bool enabled_ = false;
  size_t scratchBudget_;  // bytes of scratch at most
  DeviceBuffer scratch_;  // reduce-scatter: the peers' blocks for this rank
};

// Process-wide counters (tests): what ran without staging.
struct DirectCounters {
  std::atomic<uint64_t> ops{0};       // collectives run by TransportDirect
  std::atomic<uint64_t> p2p{0};       // group sends and receives handed over as device memory
  std::atomic<uint64_t> ringSteps{0}; // ring-attention blocks received as device memory
};
DirectCounters& directCounters();

}  // namespace attn
