// Device communicators (config.device >= 0): operations on device buffers,
// enqueued on a CUDA stream. Without a GPU the tests that need one skip,
// and asking for a device communicator must fail cleanly.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"
#include "support/attn_fixtures.h"
#include "support/multirank.h"

namespace {

using attn_test::RunOptions;
using attn_test::RunThreads;

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define REQUIRE_GPU()                                                              \
  do {                                                                             \
    if (GpuCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";         \
  } while (0)

TEST(DeviceComm, WithoutAGpuInitFailsWithAClearError) {
  if (GpuCount() > 0) GTEST_SKIP() << "this machine has a GPU; the no-GPU path is not reachable";
  attnUniqueId id;
  ASSERT_EQ(attnGetUniqueId(&id), attnSuccess);
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.device = 0;
  attnComm_t comm = nullptr;
  attnResult_t r = attnCommInitRankConfig(&comm, 1, id, 0, &cfg);
  EXPECT_NE(r, attnSuccess);
  EXPECT_EQ(comm, nullptr);
  std::string why = attnGetLastError(nullptr);
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
}

TEST(DeviceComm, InitAllWithoutAGpuFailsWithAClearError) {
  if (GpuCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  attnComm_t comms[2] = {nullptr, nullptr};
  const int devs[2] = {0, 0};
  EXPECT_NE(attnCommInitAll(comms, 2, devs), attnSuccess);
  EXPECT_EQ(comms[0], nullptr);
  EXPECT_EQ(comms[1], nullptr);
}

// Ranks as threads sharing GPU 0 (NCCL refuses this; we allow it).
RunOptions OnGpu0(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  return o;
}

TEST(DeviceComm, CollectivesOnDeviceBuffersAreStreamOrdered) {
  REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    attnConfig_t cfg;
    RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
      const size_t count = 1000 + 7;  // per rank, odd
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      float *send, *gathered, *reduced;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&gathered), nranks * count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&reduced), count * sizeof(float)), cudaSuccess);
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = float(rank * 10000 + i);
      // The upload is itself on the stream: the collectives must see it.
      ASSERT_EQ(cudaMemcpyAsync(send, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, s),
                cudaSuccess);
      ASSERT_EQ(attnAllGather(send, gathered, count, attnFloat32, comm, (attnStream_t)s), attnSuccess);
      ASSERT_EQ(attnAllReduce(send, reduced, count, attnFloat32, attnSum, comm, (attnStream_t)s),
                attnSuccess);
      std::vector<float> all(nranks * count), sum(count);
      ASSERT_EQ(cudaMemcpyAsync(all.data(), gathered, all.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(sum.data(), reduced, sum.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int r = 0; r < nranks; ++r)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], float(r * 10000 + i));
      for (size_t i = 0; i < count; ++i) {
        double expect = 0;
        for (int r = 0; r < nranks; ++r) expect += r * 10000.0 + i;
        ASSERT_EQ(sum[i], float(expect));
      }
      attnResult_t async;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess);
      cudaFree(send);
      cudaFree(gathered);
      cudaFree(reduced);
      cudaStreamDestroy(s);
    }, OnGpu0(&cfg));
  }
}

TEST(DeviceComm, RingAttentionOnDeviceEqualsExactAttention) {
  REQUIRE_GPU();
  attnAttnConfig_t acfg{8, 2, 64, attnBfloat16, 0.f, 1};
  const std::vector<int32_t> newLens = {300, 0, 77}, cachedLens = {100, 50, 0};
  const attn_test::AttnCase c =
      attn_test::MakeCase("device", attn_test::PrefillSpec(acfg, newLens, cachedLens), 7);
  for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto}) {
    attnConfig_t cfg;
    RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 11, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      const size_t outBytes = sh.q.size();
      const size_t lseCount = sh.q_pos.size() * acfg.num_q_heads;
      void *dq, *dk, *dv, *dout;
      float* dlse;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dq), sh.q.size() + 1), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dk), sh.k.size() + 1), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dv), sh.v.size() + 1), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), outBytes + 1), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dlse), lseCount * sizeof(float) + 1), cudaSuccess);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      cudaMemcpyAsync(dq, sh.q.data(), sh.q.size(), cudaMemcpyHostToDevice, s);
      cudaMemcpyAsync(dk, sh.k.data(), sh.k.size(), cudaMemcpyHostToDevice, s);
      cudaMemcpyAsync(dv, sh.v.data(), sh.v.size(), cudaMemcpyHostToDevice, s);
      ASSERT_EQ(attnRingAttention(dq, dk, dv, dout, dlse, &sh.layout, &acfg, mode, comm,
                                  (attnStream_t)s),
                attnSuccess)
          << attnGetLastError(comm);
      std::vector<uint8_t> out(outBytes);
      std::vector<float> lse(lseCount);
      cudaMemcpyAsync(out.data(), dout, outBytes, cudaMemcpyDeviceToHost, s);
      cudaMemcpyAsync(lse.data(), dlse, lseCount * sizeof(float), cudaMemcpyDeviceToHost, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const attn_test::AttnErrorStats e = attn_test::CompareShard(c, sh, out.data(), lse.data());
      EXPECT_LE(e.max_o_rel, attn_test::OutBound(acfg.dtype)) << e.Describe();
      EXPECT_LE(e.max_lse_abs, attn_test::LseBound(acfg.dtype)) << e.Describe();
      EXPECT_EQ(e.nan_rows, 0);
      EXPECT_EQ(e.empty_mismatch, 0);
      cudaFree(dq);
      cudaFree(dk);
      cudaFree(dv);
      cudaFree(dout);
      cudaFree(dlse);
      cudaStreamDestroy(s);
    }, OnGpu0(&cfg));
  }
}

}  // namespace
