// Ring attention on the GPU for device communicators: the algorithms of
// src/attn with the CUDA kernels, run on the communicator's proxy thread
// (one stream-bridge work item per call). Plain C++ (no CUDA headers), so
// src/attn can call it; defined only in CUDA builds.
#pragma once

#include "src/attn/attn_call.h"

namespace attn {

// The call's outputs, in device memory: out [q rows, Hq, D] in cfg.dtype,
// lse [q rows, Hq] fp32 or NULL.
struct DeviceAttnBuffers {
  void* out = nullptr;
  float* lse = nullptr;
};

#if ATTN_HAVE_CUDA
// Pass-KV with the KV blocks moving while the kernels run. `c` is planned
// (every rank's row counts); c.q.t0, c.kv.t0/t1 are device pointers, its
// offsets and positions host copies. Returns once `io` is written; fills
// c.stats (computeUs: GPU time of the kernels; waitUs: host waits on the
// network).
attnResult_t runPassKvDevice(AttnCall& c, const DeviceAttnBuffers& io);
#endif

}  // namespace attn
