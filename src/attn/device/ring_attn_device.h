// Attention collectives on the GPU for device communicators: the algorithms of
// src/attn with the CUDA kernels, run on the communicator's proxy thread
// (one stream-bridge work item per call). Plain C++ (no CUDA headers), so
// src/attn can call it; defined only in CUDA builds.
#pragma once

#include "src/attn/attn_call.h"
#include "src/attn/level_alltoall.h"

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
// Pass-Q: the query blocks move while the kernels run, partials go home
// from the device as each is computed and fold on the device as each
// arrives. Same contract as runPassKvDevice.
attnResult_t runPassQDevice(AttnCall& c, const DeviceAttnBuffers& io);
// Ship-Q: the query block goes to every peer at once; each peer's partial
// is computed on the device and sent back; ours fold on the device. Same
// contract as runPassKvDevice.
attnResult_t runShipQDevice(AttnCall& c, const DeviceAttnBuffers& io);
// Head-parallel: every rank's rows for this rank's heads come to the
// device, each (queries, keys) pair folds there as soon as both are here,
// and the outputs go home as each rank's are complete. Same contract as
// runPassKvDevice.
attnResult_t runHeadParallelDevice(AttnCall& c, const DeviceAttnBuffers& io);
// attnLevelAttention: the level all-to-all of src/attn/level_alltoall.h
// with the kept rows gathered and every block folded on the device.
// drop.importance is a device pointer here ([c.kv.rows] fp32).
attnResult_t runLevelAllToAllDevice(AttnCall& c, const LevelDrop& drop, const DeviceAttnBuffers& io);
#endif

}  // namespace attn
