// Ring attention on device buffers for the device tests: one rank's shard
// copied to the GPU, attnRingAttention on a stream, the result against the
// exact reference (attn_fixtures.h).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "attn_fixtures.h"

namespace attn_test {

// Device copies of one rank's shard; attnRingAttention on `stream` with the
// caller's stream ordering (uploads before, downloads after, one sync at
// the end); the result against the exact reference.
struct DeviceRun {
  attnResult_t rc = attnSuccess;
  std::string error;
  attn_test::AttnErrorStats stats;
};

inline DeviceRun RunOnDevice(const attn_test::AttnCase& c, const attn_test::RankShard& sh, attnComm_t comm,
                      attnAttnMode_t mode, bool withLse) {
  DeviceRun run;
  const attnAttnConfig_t& acfg = c.cfg;
  const size_t outBytes = sh.q.size();
  const size_t lseCount = sh.q_pos.size() * acfg.num_q_heads;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  // Stream-ordered, never cudaMalloc/cudaFree: those may wait for the whole
  // device, and a peer thread's stream may already wait there for this
  // rank's next call (a deadlock). +1: a valid pointer for an empty shard.
  EXPECT_EQ(cudaMallocAsync(&dq, sh.q.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&dk, sh.k.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&dv, sh.v.size() + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(&dout, outBytes + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&dlse), lseCount * sizeof(float) + 1, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dq, sh.q.data(), sh.q.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dk, sh.k.data(), sh.k.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dv, sh.v.data(), sh.v.size(), cudaMemcpyHostToDevice, s), cudaSuccess);
  run.rc = attnRingAttention(dq, dk, dv, dout, withLse ? dlse : nullptr, &sh.layout, &acfg, mode, comm,
                             (attnStream_t)s);
  if (run.rc != attnSuccess) run.error = attnGetLastError(comm);
  std::vector<uint8_t> out(outBytes);
  std::vector<float> lse(lseCount);
  EXPECT_EQ(cudaMemcpyAsync(out.data(), dout, outBytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(lse.data(), dlse, lseCount * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  if (run.rc == attnSuccess)
    run.stats = attn_test::CompareShard(c, sh, out.data(), withLse ? lse.data() : nullptr);
  for (void* p : {dq, dk, dv, dout, static_cast<void*>(dlse)}) cudaFreeAsync(p, s);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  return run;
}

inline void ExpectExact(const DeviceRun& r, attnDataType_t t, const std::string& what) {
  ASSERT_EQ(r.rc, attnSuccess) << what << ": " << r.error;
  EXPECT_TRUE(attn_test::WithinBounds(r.stats, t, what));
}

}  // namespace attn_test
