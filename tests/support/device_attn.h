// Attention collectives on device buffers for the device tests: one rank's
// shard copied to the GPU, the call on a stream, the result against the
// reference (attn_fixtures.h).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "attn_fixtures.h"

namespace attn_test {

struct DeviceRun {
  attnResult_t rc = attnSuccess;
  std::string error;
  attn_test::AttnErrorStats stats;
};

// The device copies one call works on.
struct DeviceShard {
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;    // NULL unless asked for
  float* extra = nullptr;  // a device copy of `extra` (e.g. importance scores)
  cudaStream_t stream = nullptr;
};

// Device copies of one rank's shard (and of `extra`); `call` on them on a
// stream, with the caller's stream ordering (uploads before, downloads
// after, one sync at the end); the result against `ref`'s rows.
template <class Call>
DeviceRun RunShardOnDevice(const attn_test::AttnCase& ref, const attn_test::RankShard& sh, attnComm_t comm,
                           bool withLse, const std::vector<float>& extra, Call call) {
  DeviceRun run;
  const attnAttnConfig_t& acfg = ref.cfg;
  const size_t outBytes = sh.q.size() / size_t(acfg.head_dim) * size_t(attn_test::ValueDim(acfg));  // Dv
  const size_t lseCount = sh.q_pos.size() * acfg.num_q_heads;
  DeviceShard d;
  void* lse = nullptr;
  void* ex = nullptr;
  EXPECT_EQ(cudaStreamCreate(&d.stream), cudaSuccess);
  const cudaStream_t s = d.stream;
  // Stream-ordered, never cudaMalloc/cudaFree: those may wait for the whole
  // device, and a peer thread's stream may already wait there for this
  // rank's next call (a deadlock). +1: a valid pointer for an empty shard.
  EXPECT_EQ(cudaMallocAsync(&d.q, sh.q.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&d.k, sh.k.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&d.v, sh.v.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&d.out, outBytes + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&lse, lseCount * sizeof(float) + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&ex, extra.size() * sizeof(float) + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d.q, sh.q.data(), sh.q.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d.k, sh.k.data(), sh.k.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d.v, sh.v.data(), sh.v.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(ex, extra.data(), extra.size() * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  d.lse = withLse ? static_cast<float*>(lse) : nullptr;
  d.extra = static_cast<float*>(ex);
  run.rc = call(d);
  if (run.rc != attnSuccess) run.error = attnGetLastError(comm);
  std::vector<uint8_t> out(outBytes);
  std::vector<float> hostLse(lseCount);
  EXPECT_EQ(cudaMemcpyAsync(out.data(), d.out, outBytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(hostLse.data(), lse, lseCount * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  if (run.rc == attnSuccess)
    run.stats = attn_test::CompareShard(ref, sh, out.data(), withLse ? hostLse.data() : nullptr);
  for (void* p : {d.q, d.k, d.v, d.out, lse, ex}) cudaFreeAsync(p, s);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  return run;
}

// attnRingAttention in `mode` on device copies of the shard.
inline DeviceRun RunOnDevice(const attn_test::AttnCase& c, const attn_test::RankShard& sh, attnComm_t comm,
                             attnAttnMode_t mode, bool withLse) {
  return RunShardOnDevice(c, sh, comm, withLse, {}, [&](const DeviceShard& d) {
    return attnRingAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &c.cfg, mode, comm,
                             (attnStream_t)d.stream);
  });
}

inline void ExpectExact(const DeviceRun& r, attnDataType_t t, const std::string& what) {
  ASSERT_EQ(r.rc, attnSuccess) << what << ": " << r.error;
  EXPECT_TRUE(attn_test::WithinBounds(r.stats, t, what));
}

}  // namespace attn_test
