// ring_attn_perf's all-gather-then-compute baseline (--modes seq) on a device
// (--device): every rank's KV, padded to the largest shard, is all-gathered on the
// device communicator, then attended to with the CUDA kernels, rank block by
// rank block into one accumulator. The same algorithm as the host baseline
// (attn_bench.cc), so the ring modes on a GPU have their baseline in the
// same run.
#pragma once

#include "attncomm.h"
#include "perf/attn/attn_bench.h"
#include "perf/rank_device.h"

namespace attnperf {

// Device buffers of the baseline, grown on demand, kept between calls.
// Ranks that are processes get cudaMalloc'd buffers, which cuda_ipc can
// export, so the all-gather goes GPU to GPU; ranks that are threads of one
// process get stream-ordered ones (cudaMalloc may wait for the whole
// device, where a peer thread's stream may wait for this rank), which
// cuda_ipc reads within the process anyway.
class SeqDevice {
 public:
  SeqDevice(RankDevice& dev, bool processes) : dev_(dev), processes_(processes) {}
  ~SeqDevice();
  SeqDevice(const SeqDevice&) = delete;
  SeqDevice& operator=(const SeqDevice&) = delete;

  // One call: q, k, v, out and lse are this rank's device tensors; out in
  // the batch's dtype, lse fp32 [rows, heads]. *computeUs: the kernels'
  // GPU time. Collective. False (with a message) on failure or in a build
  // without CUDA.
  bool once(attnComm_t comm, const Batch& b, const Shard& s, const void* q, const void* k, const void* v,
            void* out, float* lse, double* computeUs);

 private:
  bool grow(void** p, size_t* have, size_t want);
  RankDevice& dev_;
  bool processes_;
  void *mine_ = nullptr, *all_ = nullptr, *acc_ = nullptr, *qpos_ = nullptr, *segs_ = nullptr;
  size_t mineBytes_ = 0, allBytes_ = 0, accBytes_ = 0, qposBytes_ = 0, segsBytes_ = 0;
};

}  // namespace attnperf
