// The distributed KV cache on a device communicator: the pool's K and V in
// the GPU's memory, the kernels of kvAttention on the GPU, and migration's
// bytes as device sends and receives (pulled GPU to GPU where cuda_ipc
// reaches the peer). Plain C++ (no CUDA headers), so
// src/attn can call it; defined only in CUDA builds.
#pragma once

#include <memory>
#include <vector>

#include "src/attn/kv_attention.h"
#include "src/attn/kv_migrate.h"
#include "src/attn/kv_pool.h"
#include "src/core/error.h"

struct attnComm;

namespace attn {

#if ATTN_HAVE_CUDA
// `bytes` each of K and V, and `posBytes` for the mirror of the positions,
// on comm's device, allocated and freed on a stream of the pool's own (no
// device-wide synchronisation: ranks may share the GPU). Appends copy in on
// the caller's stream.
attnResult_t makeKvDeviceMemory(attnComm* comm, size_t bytes, size_t posBytes, std::unique_ptr<KvMemory>* out);
// On the proxy thread of a device pool's communicator:
attnResult_t makeKvAttnComputeDevice(KvPool& pool, const KvAttnArgs& a, std::unique_ptr<KvAttnCompute>* out);
std::unique_ptr<KvBlockIo> makeKvBlockIoDevice(KvPool& pool);
// `bytes` at device address `src` into `host`.
attnResult_t kvDeviceDownload(KvPool& pool, const void* src, size_t bytes, std::vector<char>* host);
#else
inline attnResult_t makeKvDeviceMemory(attnComm*, size_t, size_t, std::unique_ptr<KvMemory>*) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
#endif

}  // namespace attn
