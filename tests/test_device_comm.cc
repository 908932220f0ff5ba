// Device communicators (config.device >= 0): operations on device buffers,
// enqueued on a CUDA stream. Without a GPU the tests that need one skip,
// and asking for a device communicator must fail cleanly.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attncomm.h"
#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_state.h"
#include "src/device/retained_memory.h"
#include "support/attn_fixtures.h"
#include "support/device_attn.h"
#include "support/device_checks.h"
#include "support/gpu.h"
#include "support/level_fixtures.h"
#include "support/multirank.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"

namespace {

using attn_test::RunOptions;
using attn_test::RunThreads;

using attn_test::GpuCount;
using attn_test::DeviceRun;
using attn_test::ExpectExact;
using attn_test::RunOnDevice;

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
      int device = -5;
      ASSERT_EQ(attnCommDevice(comm, &device), attnSuccess);
      EXPECT_EQ(device, 0);
      cudaFree(send);
      cudaFree(gathered);
      cudaFree(reduced);
      cudaStreamDestroy(s);
    }, OnGpu0(&cfg));
  }
}

// Three sequences (one without new tokens, one without cache), bf16, GQA.
constexpr attnAttnConfig_t kSmallShape = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
attn_test::AttnCase SmallPrefillCase(uint64_t seed) {
  const std::vector<int32_t> newLens = {300, 0, 77}, cachedLens = {100, 50, 0};
  return attn_test::MakeCase("device", attn_test::PrefillSpec(kSmallShape, newLens, cachedLens), seed);
}

TEST(DeviceComm, RingAttentionOnDeviceEqualsExactAttention) {
  REQUIRE_GPU();
  const attnAttnConfig_t acfg = kSmallShape;
  const attn_test::AttnCase c = SmallPrefillCase(7);
  for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto}) {
    attnConfig_t cfg;
    RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 11, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      const DeviceRun r = RunOnDevice(c, sh, comm, mode, true);
      ExpectExact(r, acfg.dtype, attn_test::ModeName(mode));
      EXPECT_EQ(r.stats.nan_rows, 0);
      EXPECT_EQ(r.stats.empty_mismatch, 0);
    }, OnGpu0(&cfg));
  }
}

// Sliding windows, softcap and attention sinks on a device communicator
// (issue 48): every mode runs the CUDA kernels with the window and the cap,
// and the sinks, in device memory, join each row once after the merge
// (kernels/cuda/sinks.cu). Sinks in pageable host memory are refused at the
// call (the GPU reads them when the call runs).
TEST(DeviceComm, WindowsSoftcapAndSinksOnDevice) {
  REQUIRE_GPU();
  const std::vector<int32_t> newLens = {90, 1}, cachedLens = {40, 70};
  std::vector<attn_test::AttnCase> cases;
  uint64_t seed = 81;
  for (attnDataType_t dt : {attnBfloat16, attnFloat32}) {
    attnAttnConfig_t shape = ATTN_ATTN_CONFIG(8, 2, 64, dt, 0.f, 1);
    shape.window_left = 37;
    shape.softcap = 20.0f;
    attn_test::AttnProblemSpec s = attn_test::PrefillSpec(shape, newLens, cachedLens);
    s.sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f, 3.0f, 0.25f};
    cases.push_back(attn_test::MakeCase("device window", s, seed++));
  }
  attnConfig_t cfg;
  RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const attn_test::AttnCase& c = cases[i];
      const attn_test::RankShard sh = attn_test::GatherShard(c, attn_test::RandomPlacement(c, nranks, 90 + i, -1), rank);
      for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAuto}) {
        const DeviceRun r = attn_test::RunShardOnDevice(c, sh, comm, true, c.sinks, [&](const attn_test::DeviceShard& d) {
          attnAttnConfig_t acfg = c.cfg;
          acfg.sinks = d.extra;  // the sinks' device copy
          return attnRingAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &acfg, mode, comm, (attnStream_t)d.stream);
        });
        ExpectExact(r, c.cfg.dtype, attn_test::CfgName(c.cfg) + " window + softcap + sinks " + attn_test::ModeName(mode));
      }
      // Pageable sinks: refused on every rank, nothing enqueued.
      const DeviceRun bad = attn_test::RunShardOnDevice(c, sh, comm, true, {}, [&](const attn_test::DeviceShard& d) {
        attnAttnConfig_t acfg = c.runCfg();  // host vector: pageable
        return attnRingAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &acfg, attnModePassKV, comm,
                                 (attnStream_t)d.stream);
      });
      EXPECT_EQ(bad.rc, attnInvalidArgument) << bad.error;
      EXPECT_NE(bad.error.find("cfg.sinks is pageable"), std::string::npos) << bad.error;
    }
  }, OnGpu0(&cfg));
}

// MLA-shaped heads (issue 48): V and the outputs of head_dim_v on a device
// communicator, every mode and level attention; K of D and V of Dv travel
// in the device ring blocks and head-parallel messages as they are.
TEST(DeviceComm, MlaHeadsOnDevice) {
  REQUIRE_GPU();
  const std::vector<int32_t> newLens = {70, 1}, cachedLens = {30, 50};
  std::vector<attn_test::AttnCase> cases;
  uint64_t seed = 481;
  for (auto [dt, d, dv] : {std::tuple{attnBfloat16, 192, 128}, std::tuple{attnFloat32, 64, 32},
                           std::tuple{attnFloat16, 32, 64}}) {
    attnAttnConfig_t shape = ATTN_ATTN_CONFIG(4, 2, d, dt, 0.f, 1);
    shape.head_dim_v = dv;
    cases.push_back(attn_test::MakeCase("device mla", attn_test::PrefillSpec(shape, newLens, cachedLens), seed++));
  }
  attnConfig_t cfg;
  RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const attn_test::AttnCase& c = cases[i];
      const attn_test::RankShard sh = attn_test::GatherShard(c, attn_test::RandomPlacement(c, nranks, 70 + i, -1), rank);
      for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAuto}) {
        const DeviceRun r = attn_test::RunOnDevice(c, sh, comm, mode, true);
        ExpectExact(r, c.cfg.dtype, attn_test::CfgName(c.cfg) + " " + attn_test::ModeName(mode));
      }
      const DeviceRun level = attn_test::RunShardOnDevice(c, sh, comm, true, {}, [&](const attn_test::DeviceShard& d) {
        return attnLevelAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &c.cfg, nullptr, comm,
                                  (attnStream_t)d.stream);
      });
      ExpectExact(level, c.cfg.dtype, attn_test::CfgName(c.cfg) + " level attention");
    }
  }, OnGpu0(&cfg));
}

// Ranks that are threads of one process pass their ring blocks device to
// device (the next rank copies out of this rank's buffer); without
// cuda_ipc in ATTN_TRANSPORT they go through pinned host memory. Both are
// exact; the counter says which ran.
TEST(DeviceComm, RingBlocksMoveDeviceToDeviceBetweenThreads) {
  REQUIRE_GPU();
  const attnAttnConfig_t acfg = kSmallShape;
  const attn_test::AttnCase c = SmallPrefillCase(9);
  for (const char* transports : {"shm,tcp,cuda_ipc", "shm,tcp"}) {
    for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ}) {
      const uint64_t pulls0 = attn::ipc::ipcCounters().ringPulls.load();
      attnConfig_t cfg;
      RunOptions o = OnGpu0(&cfg);
      o.env = {{"ATTN_TRANSPORT", transports}};
      RunThreads(4, [&](int rank, int nranks, attnComm_t& comm) {
        const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 13, -1);
        const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
        for (int call = 0; call < 2; ++call) {  // the second call reuses the buffers
          const DeviceRun r = RunOnDevice(c, sh, comm, mode, true);
          ExpectExact(r, acfg.dtype, std::string(attn_test::ModeName(mode)) + " over " + transports);
        }
      }, o);
      const uint64_t pulls = attn::ipc::ipcCounters().ringPulls.load() - pulls0;
      const bool direct = std::string(transports).find("cuda_ipc") != std::string::npos;
      // 4 ranks x 3 moves x 2 calls.
      EXPECT_EQ(pulls, direct ? 24u : 0u) << attn_test::ModeName(mode) << " over " << transports;
    }
  }
}

// The same between processes: the next rank opens this rank's ring
// buffers from their IPC handles at the start of each call and closes them
// at its end. n = 2 has one neighbour on both sides.
TEST(DeviceComm, RingBlocksMoveDeviceToDeviceBetweenProcesses) {
  REQUIRE_FORKABLE_CUDA();
  const attnAttnConfig_t acfg = kSmallShape;
  const attn_test::AttnCase c = SmallPrefillCase(10);
  for (int n : {2, 3}) {
    for (const char* transports : {"shm,tcp,cuda_ipc", "shm,tcp"}) {
      attnConfig_t cfg;
      RunOptions o = OnGpu0(&cfg);
      o.env = {{"ATTN_TRANSPORT", transports}};
      const bool direct = std::string(transports).find("cuda_ipc") != std::string::npos;
      attn_test::RunProcesses(n, [&](int rank, int nranks, attnComm_t& comm) {
        const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 17, -1);
        const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
        attn::ipc::IpcCounters& k = attn::ipc::ipcCounters();
        const uint64_t pulls0 = k.ringPulls.load(), opens0 = k.ringOpens.load(), closes0 = k.ringCloses.load();
        for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ})
          for (int call = 0; call < 2; ++call) {  // the second call reuses the buffers
            const DeviceRun r = RunOnDevice(c, sh, comm, mode, true);
            ExpectExact(r, acfg.dtype, std::string(attn_test::ModeName(mode)) + " over " + transports);
          }
        // 2 modes x 2 calls, each with n - 1 moves and the two buffers opened.
        EXPECT_EQ(k.ringPulls.load() - pulls0, direct ? uint64_t(4 * (nranks - 1)) : 0u) << transports;
        EXPECT_EQ(k.ringOpens.load() - opens0, direct ? 8u : 0u) << transports;
        EXPECT_EQ(k.ringCloses.load() - closes0, k.ringOpens.load() - opens0) << transports;
      }, o);
    }
  }
}

// Every mode runs the CUDA kernels on the device while its blocks move
// (src/device: ring_pass_kv_device.cc, ring_pass_q_device.cc,
// ship_q_device.cc, head_parallel_device.cc): 2, 3, 4 ranks sharing GPU 0, every dtype, GQA, head
// dims of both kernels (64: tensor cores for fp16/bf16; 80: SIMT), causal
// and not, uneven random placement with one empty rank, with and without
// lse. Calls follow each other on one communicator, so its device buffers
// are reused and grown between calls, and modes alternate on them.
std::vector<attn_test::AttnCase> DeviceCases() {
  const std::vector<int32_t> newLens = {200, 0, 61, 1}, cachedLens = {90, 40, 0, 130};
  std::vector<attn_test::AttnCase> cases;
  uint64_t seed = 21;
  for (attnDataType_t dt : {attnBfloat16, attnFloat16, attnFloat32})
    for (const attnAttnConfig_t& shape : {attnAttnConfig_t ATTN_ATTN_CONFIG(8, 2, 64, dt, 0.f, 1),
                                          attnAttnConfig_t ATTN_ATTN_CONFIG(4, 4, 80, dt, 0.f, 0),
                                          attnAttnConfig_t ATTN_ATTN_CONFIG(16, 2, 128, dt, 0.1f, 1)})
      cases.push_back(attn_test::MakeCase("device", attn_test::PrefillSpec(shape, newLens, cachedLens),
                                          seed++));
  return cases;
}

void EveryModeOnRank(const std::vector<attn_test::AttnCase>& cases, int rank, int nranks, attnComm_t comm) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const attn_test::AttnCase& c = cases[i];
    // The last rank holds no rows at all.
    const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 100 + i, nranks - 1);
    const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
    for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel}) {
      const std::string what = "n=" + std::to_string(nranks) + " " + attn_test::CfgName(c.cfg) + " " +
                               attn_test::ModeName(mode);
      const DeviceRun r = RunOnDevice(c, sh, comm, mode, (i + static_cast<size_t>(mode)) % 2 == 0);
      ExpectExact(r, c.cfg.dtype, what);
      EXPECT_EQ(r.stats.nan_rows, 0) << what;
      EXPECT_EQ(r.stats.empty_mismatch, 0) << what;
      const attn::AttnCallStats& st = attn::attnStateOf(comm).last;
      EXPECT_EQ(st.mode, mode) << what;
      // Own rows over own keys are a kernel launch in every mode.
      if (!sh.q_pos.empty() && !sh.kv_pos.empty()) EXPECT_GT(st.computeUs, 0.0) << what << ": GPU time not recorded";
    }
  }
}

TEST(DeviceComm, EveryModeOnDeviceEqualsExactAttention) {
  REQUIRE_GPU();
  const std::vector<attn_test::AttnCase> cases = DeviceCases();
  for (int n : {2, 3, 4}) {
    attnConfig_t cfg;
    RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) { EveryModeOnRank(cases, rank, nranks, comm); },
               OnGpu0(&cfg));
  }
}

// The same with ranks as processes sharing GPU 0 (ring blocks move device
// to device through CUDA IPC handles; ship-Q's queries and partials go
// through pinned host buffers and the shm transport).
TEST(DeviceComm, EveryModeOnDeviceEqualsExactAttentionProcesses) {
  REQUIRE_FORKABLE_CUDA();
  const std::vector<attn_test::AttnCase> cases = DeviceCases();
  for (int n : {2, 4}) {
    attnConfig_t cfg;
    attn_test::RunProcesses(
        n, [&](int rank, int nranks, attnComm_t& comm) { EveryModeOnRank(cases, rank, nranks, comm); },
        OnGpu0(&cfg));
  }
}

// A user kernel on a device communicator gets device pointers and the
// library's compute stream. This one runs the library's own CUDA kernel:
// it reads the offsets back (the stream orders it after the uploads), so it
// also proves they are device memory on that stream.
std::atomic<int> gUserKernelCalls{0};

attnResult_t DeviceUserKernel(const attnAttnKernelArgs_t* a, void*, attnStream_t stream) {
  // No stream: host pointers (AUTO's timing run; attncomm.h).
  if (stream == nullptr) return attn_test::LoopAttentionKernel(a, nullptr, nullptr);
  gUserKernelCalls.fetch_add(1);
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const int S = a->num_seqs;
  std::vector<int32_t> qo(S + 1), ko(S + 1);
  if (cudaMemcpyAsync(qo.data(), a->q_offsets, qo.size() * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaMemcpyAsync(ko.data(), a->kv_offsets, ko.size() * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return attnUnhandledCudaError;
  std::vector<attn::cpu::AttnSegment> segs(S);
  for (int i = 0; i < S; ++i) segs[i] = {qo[i], qo[i + 1], ko[i], ko[i + 1]};
  // Stream-ordered: this runs on the proxy while the caller's stream waits
  // for it, and cudaMalloc/cudaFree may wait for the whole device (which
  // attncomm.h forbids a kernel callback).
  attn::cpu::AttnSegment* dsegs = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&dsegs), sizeof(segs[0]) * S + 1, s) != cudaSuccess)
    return attnUnhandledCudaError;
  attnResult_t r = attnUnhandledCudaError;
  if (cudaMemcpyAsync(dsegs, segs.data(), sizeof(segs[0]) * S, cudaMemcpyHostToDevice, s) == cudaSuccess) {
    attn::cpu::AttnProblem p;
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.dtype = a->cfg->dtype;
    p.nq = qo[S];
    p.nk = ko[S];
    p.num_q_heads = a->cfg->num_q_heads;
    p.num_kv_heads = a->cfg->num_kv_heads;
    p.head_dim = a->cfg->head_dim;
    p.scale = a->cfg->softmax_scale;
    p.causal = a->cfg->causal != 0;
    p.q_pos = a->q_pos;
    p.k_pos = a->kv_pos;
    p.segments = dsegs;
    p.num_segments = S;
    attn::cuda::AttnCudaExec ex;
    ex.stream = s;
    r = attn::cuda::attentionPartial(p, a->out, a->lse, ex);
  }
  // Freed after the kernel in stream order; the library folds the partial
  // after this returns, on the same stream.
  if (cudaFreeAsync(dsegs, s) != cudaSuccess) r = attnUnhandledCudaError;
  return r;
}

TEST(DeviceComm, EveryModeOnDeviceWithAUserKernel) {
  REQUIRE_GPU();
  attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
  const std::vector<int32_t> newLens = {150, 33}, cachedLens = {60, 0};
  const attn_test::AttnCase c =
      attn_test::MakeCase("device-user", attn_test::PrefillSpec(acfg, newLens, cachedLens), 5);
  // AUTO too: its calibration must time the kernel on the device as well.
  for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAuto}) {
    gUserKernelCalls = 0;
    attnConfig_t cfg;
    RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
      ASSERT_EQ(attnCommSetAttnKernel(comm, DeviceUserKernel, nullptr), attnSuccess);
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 3, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      const DeviceRun r = RunOnDevice(c, sh, comm, mode, true);
      ExpectExact(r, acfg.dtype, std::string("user kernel, ") + attn_test::ModeName(mode));
      EXPECT_EQ(r.stats.nan_rows, 0);
      EXPECT_EQ(r.stats.empty_mismatch, 0);
    }, OnGpu0(&cfg));
    // Called on the device (with the compute stream) in every mode.
    EXPECT_GT(gUserKernelCalls.load(), 0) << attn_test::ModeName(mode);
  }
}

// AUTO's kernel rate on a device communicator is the CUDA kernel's, timed
// on the GPU (a host communicator's is the CPU kernel's); with a user
// kernel it stays the host timing run attncomm.h describes.
TEST(DeviceComm, CostModelTimesTheCudaKernelOnTheGpu) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(2, [&](int, int, attnComm_t& comm) {
    attnCostModel_t m{};
    ASSERT_EQ(attnCommGetCostModel(comm, &m), attnSuccess);
    EXPECT_GT(m.attn_tflops, 0);
    const attn::AttnState& st = attn::attnStateOf(comm);
    ASSERT_EQ(st.kernelTimedOnDevice.size(), 1u);
    EXPECT_TRUE(st.kernelTimedOnDevice.begin()->second);
  }, OnGpu0(&cfg));
  RunThreads(2, [&](int, int, attnComm_t& comm) {
    ASSERT_EQ(attnCommSetAttnKernel(comm, DeviceUserKernel, nullptr), attnSuccess);
    attnCostModel_t m{};
    ASSERT_EQ(attnCommGetCostModel(comm, &m), attnSuccess);
    EXPECT_FALSE(attn::attnStateOf(comm).kernelTimedOnDevice.begin()->second);
  }, OnGpu0(&cfg));
}

// The next rank's process dies between reading this rank's last block and
// counting its close: no request to it is in flight, so only the process
// watch in DeviceRing::waitReads can tell. The survivor's operation must
// fail with an error naming the dead rank (not sit out the 60 s timeout,
// which the harness deadline would turn into a failure) and release the
// stream.
attnResult_t DieOnSecondBlock(const attnAttnKernelArgs_t* a, void* calls, attnStream_t stream) {
  if (stream != nullptr && ++*static_cast<int*>(calls) == 2) raise(SIGKILL);
  return DeviceUserKernel(a, nullptr, stream);
}

TEST(DeviceComm, RingFailsFastWhenTheNextProcessDies) {
  REQUIRE_FORKABLE_CUDA();
  const attn_test::AttnCase c = SmallPrefillCase(12);
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  cfg.timeout_ms = 60000;
  o.deadline_ms = 30000;
  o.env = {{"ATTN_TRANSPORT", "shm,tcp,cuda_ipc"}};
  const int victim = 1;
  auto results = attn_test::RunProcessesCollect(2, [&](int rank, int nranks, attnComm_t& comm) {
    const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 17, -1);
    const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
    // One good call first: the ring is set up and moves device to device.
    ExpectExact(RunOnDevice(c, sh, comm, attnModePassKV, true), c.cfg.dtype, "before the kill");
    int calls = 0;
    if (rank == victim) ASSERT_EQ(attnCommSetAttnKernel(comm, DieOnSecondBlock, &calls), attnSuccess);
    const DeviceRun r = RunOnDevice(c, sh, comm, attnModePassKV, true);
    ASSERT_NE(rank, victim) << "the victim outlived its kill";
    // Enqueued fine; the failure is asynchronous and the stream was released.
    EXPECT_EQ(r.rc, attnSuccess) << r.error;
    attnResult_t async = attnSuccess;
    ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    EXPECT_EQ(async, attnRemoteError);
    const std::string why = attnGetLastError(comm);
    EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
    EXPECT_NE(why.find("exited"), std::string::npos) << why;
    attn_test::ReportFromChild("rank 0: " + why);
    EXPECT_EQ(attnCommAbort(comm), attnSuccess);
    comm = nullptr;
  }, o);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[victim].signaled && results[victim].signal == SIGKILL) << results[victim].Describe();
  EXPECT_TRUE(results[0].passed()) << results[0].Describe();
}

// Sends and receives inside a group (the staging backend): a ring exchange
// and a self pair, on two streams, as one stream operation.
TEST(DeviceComm, GroupedSendRecvOnTwoStreams) {
  REQUIRE_GPU();
  for (int n : {1, 2, 3}) {
    attnConfig_t cfg;
    RunThreads(n, [](int rank, int nranks, attnComm_t& comm) {
      cudaStream_t s, s2;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
      attn_test::CheckDevGroupedRing(comm, rank, nranks, s, s2);
      attnResult_t async;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
      cudaStreamDestroy(s);
      cudaStreamDestroy(s2);
    }, OnGpu0(&cfg));
  }
}

// attnCommSplit and attnKvPoolCreate run on the calling thread; they must
// wait for what the caller's streams have queued on the proxy. Rank 1's
// stream is held back by a large copy, so its all-reduce reaches the proxy
// after its split has started, while rank 0's has already sent its first
// bytes: were the split not to wait, it would take them for its own.
TEST(DeviceComm, SplitAndKvPoolCreateWaitForTheStreamsQueuedWork) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(2, [](int rank, int nranks, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const size_t count = 1 << 16, hold = size_t(256) << 20;
    float *in, *out;
    char *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), count * sizeof(float)), cudaSuccess);
    if (rank == 1) {
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), hold), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), hold), cudaSuccess);
    }
    std::vector<float> mine(count), got(count);
    for (size_t i = 0; i < count; ++i) mine[i] = float(rank * 1000 + i % 1000);
    ASSERT_EQ(cudaMemcpy(in, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    for (int round = 0; round < 2; ++round) {
      if (rank == 1)
        for (int k = 0; k < 4; ++k) ASSERT_EQ(cudaMemcpyAsync(b, a, hold, cudaMemcpyDeviceToDevice, s), cudaSuccess);
      ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
      if (round == 0) {
        attnComm_t sub = nullptr;
        ASSERT_EQ(attnCommSplit(comm, 0, rank, &sub, nullptr), attnSuccess) << attnGetLastError(comm);
        int sn = 0;
        EXPECT_EQ(attnCommCount(sub, &sn), attnSuccess);
        EXPECT_EQ(sn, nranks);
        EXPECT_EQ(attnCommDestroy(sub), attnSuccess);
      } else {
        const attnKvPoolConfig_t pc{16, 2, 64, attnFloat32, 8};
        attnKvPool_t pool = nullptr;
        ASSERT_EQ(attnKvPoolCreate(comm, &pc, &pool), attnSuccess) << attnGetLastError(comm);
        EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
      }
      ASSERT_EQ(cudaMemcpyAsync(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], float(1000 + 2 * (i % 1000))) << "round " << round;
      attnResult_t async;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
    }
    cudaFree(in);
    cudaFree(out);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}

// attnCommShrink(ATTN_SHRINK_ABORT) on device communicators: rank 2 never
// joins, so ranks 0 and 1 have an all-reduce parked on their proxies (no
// timeout: only the abort ends it). The shrink ends it, and the two go on
// with a device communicator of their own: collectives and ring attention
// on their streams, exact.
TEST(DeviceComm, ShrinkAbortEndsParkedStreamWorkAndTheSurvivorsGoOn) {
  REQUIRE_GPU();
  const attn_test::AttnCase c = SmallPrefillCase(12);
  for (const char* transports : {"shm,tcp,cuda_ipc", "shm,tcp"}) {
    attnConfig_t cfg;
    RunOptions o = OnGpu0(&cfg);
    cfg.timeout_ms = 0;
    o.env = {{"ATTN_TRANSPORT", transports}};
    std::atomic<int> survivorsDone{0};
    RunThreads(3, [&](int rank, int nranks, attnComm_t& comm) {
      const int silent = 2;
      if (rank == silent) return attn_test::IdleUntilThenAbort(survivorsDone, 2, comm);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      const size_t count = 1 << 14;
      float *in, *out;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), count * sizeof(float)), cudaSuccess);
      std::vector<float> mine(count), got(count);
      for (size_t i = 0; i < count; ++i) mine[i] = float(rank * 1000 + i % 1000);
      ASSERT_EQ(cudaMemcpy(in, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      attnComm_t shrunk = nullptr;
      ASSERT_EQ(attnCommShrink(comm, &silent, 1, &shrunk, nullptr, ATTN_SHRINK_ABORT), attnSuccess)
          << attnGetLastError(comm);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess) << "the parked all-reduce still holds the stream";
      attnResult_t async = attnSuccess;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      EXPECT_NE(async, attnSuccess) << "the parked all-reduce must have failed";
      int sn = 0, sr = -1;
      ASSERT_EQ(attnCommCount(shrunk, &sn), attnSuccess);
      ASSERT_EQ(attnCommUserRank(shrunk, &sr), attnSuccess);
      EXPECT_EQ(sn, 2);
      EXPECT_EQ(sr, rank);
      ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, shrunk, (attnStream_t)s), attnSuccess);
      ASSERT_EQ(cudaMemcpyAsync(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], float(1000 + 2 * (i % 1000))) << transports;
      const attn_test::Placement pl = attn_test::RandomPlacement(c, sn, 5, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, sr);
      for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ})
        ExpectExact(RunOnDevice(c, sh, shrunk, mode, true), c.cfg.dtype,
                    std::string("shrunk communicator over ") + transports);
      ASSERT_EQ(attnCommGetAsyncError(shrunk, &async), attnSuccess);
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(shrunk);
      EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
      cudaFree(in);
      cudaFree(out);
      cudaStreamDestroy(s);
      ++survivorsDone;
    }, o);
  }
}

// Freeing a device communicator must not wait for the whole device: rank
// 0's stream is parked on its proxy (its all-reduce on `comm` waits for
// rank 1) when rank 1 frees a split communicator whose collectives and ring
// attention have allocated staging and ring memory. Were that memory given
// back with cudaFreeHost / cudaFree (device-wide waits), rank 1 would wait
// for rank 0's stream, which waits for rank 1: a deadlock.
TEST(DeviceComm, FreeingACommunicatorDoesNotWaitForOtherRanksParkedStreams) {
  REQUIRE_GPU();
  const attn_test::AttnCase c = SmallPrefillCase(5);
  for (const char* transports : {"shm,tcp,cuda_ipc", "shm,tcp"}) {
    attnConfig_t cfg;
    RunOptions o = OnGpu0(&cfg);
    o.env = {{"ATTN_TRANSPORT", transports}};
    std::atomic<bool> rank0Parked{false};
    RunThreads(2, [&](int rank, int nranks, attnComm_t& comm) {
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      const size_t count = 1 << 16;
      float *in, *out;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), count * sizeof(float)), cudaSuccess);
      std::vector<float> mine(count), got(count);
      for (size_t i = 0; i < count; ++i) mine[i] = float(rank * 1000 + i % 1000);
      ASSERT_EQ(cudaMemcpy(in, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);

      attnComm_t sub = nullptr;
      ASSERT_EQ(attnCommSplit(comm, 0, rank, &sub, nullptr), attnSuccess) << attnGetLastError(comm);
      ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, sub, (attnStream_t)s), attnSuccess);
      ASSERT_EQ(attnReduceScatter(in, out, count / nranks, attnFloat32, attnSum, sub, (attnStream_t)s),
                attnSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 3, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ})
        ExpectExact(RunOnDevice(c, sh, sub, mode, true), c.cfg.dtype, "split communicator");

      if (rank == 0) {
        ASSERT_EQ(attnCommDestroy(sub), attnSuccess);
        ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
        rank0Parked = true;  // its stream now waits for rank 1's all-reduce
      } else {
        while (!rank0Parked) std::this_thread::yield();
        ASSERT_EQ(attnCommDestroy(sub), attnSuccess);
        ASSERT_EQ(attnAllReduce(in, out, count, attnFloat32, attnSum, comm, (attnStream_t)s), attnSuccess);
      }
      ASSERT_EQ(cudaMemcpyAsync(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], float(1000 + 2 * (i % 1000))) << transports;
      cudaFree(in);
      cudaFree(out);
      cudaStreamDestroy(s);
    }, o);
  }
}

// The cache behind the last test: blocks are reused by requests they fit
// (at most twice the size), kept while a device communicator exists and
// given back to CUDA when the last one goes.
TEST(DeviceComm, RetainedMemoryIsReusedAndGivenBackWithTheLastCommunicator) {
  REQUIRE_GPU();
  namespace rm = attn::retained;
  ASSERT_EQ(rm::stats().holds, 0) << "a device communicator outlived its test";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t MiB = size_t(1) << 20;
  const rm::Stats before = rm::stats();
  {
    rm::CommHold hold;
    rm::Block big, again, small, dev, dev2;
    ASSERT_EQ(rm::acquire(rm::kHost, 3 * MiB, &big), attnSuccess);
    EXPECT_EQ(big.bytes, 3 * MiB);
    std::memset(big.ptr, 0x5a, big.bytes);  // host memory, writable
    rm::release(rm::kHost, big);
    ASSERT_EQ(rm::acquire(rm::kHost, 2 * MiB, &again), attnSuccess);
    EXPECT_EQ(again.ptr, big.ptr);
    EXPECT_EQ(again.bytes, 3 * MiB);
    ASSERT_EQ(rm::acquire(rm::kHost, MiB, &small), attnSuccess);  // the cache is empty
    EXPECT_NE(small.ptr, big.ptr);
    rm::release(rm::kHost, again);
    rm::release(rm::kHost, small);
    rm::Block tiny;  // 1 MiB fits; 3 MiB is too big for it
    ASSERT_EQ(rm::acquire(rm::kHost, MiB / 2 + 1, &tiny), attnSuccess);
    EXPECT_EQ(tiny.ptr, small.ptr);
    rm::release(rm::kHost, tiny);

    ASSERT_EQ(rm::acquire(0, 1000, &dev), attnSuccess);
    EXPECT_EQ(dev.bytes, 1024u);
    ASSERT_EQ(cudaMemset(dev.ptr, 7, dev.bytes), cudaSuccess);
    rm::release(0, dev);
    ASSERT_EQ(rm::acquire(rm::kHost, 1000, &dev2), attnSuccess);  // host and device never mix
    EXPECT_NE(dev2.ptr, dev.ptr);
    rm::release(rm::kHost, dev2);
    ASSERT_EQ(rm::acquire(0, 600, &dev2), attnSuccess);
    EXPECT_EQ(dev2.ptr, dev.ptr);
    rm::release(0, dev2);

    const rm::Stats during = rm::stats();
    EXPECT_EQ(during.allocated - before.allocated, 4u);
    EXPECT_EQ(during.reused - before.reused, 3u);
    EXPECT_EQ(during.freed, before.freed);
    EXPECT_EQ(during.cachedBytes, 3 * MiB + MiB + 1024 + 1024);
  }
  const rm::Stats after = rm::stats();
  EXPECT_EQ(after.holds, 0);
  EXPECT_EQ(after.cachedBytes, 0u);
  EXPECT_EQ(after.freed - before.freed, 4u);
  // With no communicator, a released block is freed at once.
  rm::Block lone;
  ASSERT_EQ(rm::acquire(rm::kHost, 4096, &lone), attnSuccess);
  rm::release(rm::kHost, lone);
  EXPECT_EQ(rm::stats().freed - after.freed, 1u);
  EXPECT_EQ(rm::stats().cachedBytes, 0u);
  rm::Block none;
  EXPECT_NE(rm::acquire(rm::kHost, 0, &none), attnSuccess);
}

// Past ATTN_RETAINED_CACHE_MB cached, released blocks go back to CUDA, but
// only while no stream of the process is parked on a proxy: with rank 0's
// stream parked on an all-reduce that waits for rank 1, rank 1's release
// over the cap keeps the block cached (a device-wide free there would wait
// forever, as in FreeingACommunicatorDoesNotWaitForOtherRanksParkedStreams);
// once both streams have run, the next release gives back what is over the
// cap. And an allocation that runs out of device memory gives the cache
// back (when safe) and tries once more.
TEST(DeviceComm, RetainedMemoryPastItsCapIsGivenBackOnlyWhileNoStreamIsParked) {
  REQUIRE_GPU();
  namespace rm = attn::retained;
  const size_t MiB = size_t(1) << 20;
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_RETAINED_CACHE_MB", "1"}};  // read when a device communicator is made
  std::atomic<int> parked{0};
  RunThreads(2, [&](int rank, int, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* x = nullptr;
    ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&x), 64 * sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(x, 0, 64 * sizeof(float), s), cudaSuccess);
    if (rank == 0) {
      ASSERT_EQ(attnAllReduce(x, x, 64, attnFloat32, attnSum, comm, attn_test::AsStream(s)), attnSuccess);
      parked.store(1);  // its stream now waits for rank 1's all-reduce
    } else {
      while (parked.load() == 0) std::this_thread::yield();
      const rm::Stats before = rm::stats();
      rm::Block big;
      ASSERT_EQ(rm::acquire(0, 4 * MiB, &big), attnSuccess);
      rm::release(0, big);  // over the cap, but rank 0's stream is parked
      const rm::Stats kept = rm::stats();
      EXPECT_EQ(kept.freed, before.freed) << "freed while a stream was parked";
      EXPECT_GE(kept.cachedBytes, 4 * MiB);
      EXPECT_GT(kept.trimsDeferred, before.trimsDeferred);
      ASSERT_EQ(attnAllReduce(x, x, 64, attnFloat32, attnSum, comm, attn_test::AsStream(s)), attnSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaFreeAsync(x, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(attnBarrier(comm, attn_test::AsStream(s)), attnSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    attnResult_t async = attnInProgress;
    while (async == attnInProgress) ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
    // Both streams have run, and rank 0 queues nothing until rank 1 is done:
    // the next release trims to the cap.
    if (rank == 1) {
      while (parked.load() != 3) std::this_thread::yield();  // rank 0's proxy is idle too
      const rm::Stats before = rm::stats();
      rm::Block small;
      ASSERT_EQ(rm::acquire(0, 1000, &small), attnSuccess);
      rm::release(0, small);
      const rm::Stats after = rm::stats();
      EXPECT_GT(after.freed, before.freed);
      EXPECT_LE(after.cachedBytes, MiB);
      parked.store(2);
    } else {
      parked.store(3);
      while (parked.load() != 2) std::this_thread::yield();
    }
    // Both ranks pass here before either destroys its communicator.
    ASSERT_EQ(attnBarrier(comm, attn_test::AsStream(s)), attnSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
  }, o);
}

// An allocation that runs out of device memory gives what the cache holds
// back to CUDA (no stream is parked) and succeeds on its second try. The
// emulated runtime's device gets 64 MiB (ATTN_CUDA_EMU_DEVICE_MB); a real
// GPU cannot be limited that way, so there the test skips.
TEST(DeviceComm, RetainedMemoryIsGivenBackWhenAnAllocationRunsOutOfMemory) {
  REQUIRE_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (std::string(prop.name).find("emulated") == std::string::npos)
    GTEST_SKIP() << "needs the emulated runtime's device memory limit";
  namespace rm = attn::retained;
  const size_t MiB = size_t(1) << 20;
  attnConfig_t cfg;
  RunOptions o = OnGpu0(&cfg);
  o.env = {{"ATTN_RETAINED_CACHE_MB", "1024"}};
  ASSERT_EQ(setenv("ATTN_CUDA_EMU_DEVICE_MB", "64", 1), 0);  // before any rank thread runs
  RunThreads(1, [&](int, int, attnComm_t&) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    rm::Block a, b, c;
    ASSERT_EQ(rm::acquire(0, 40 * MiB, &a), attnSuccess);
    rm::release(0, a);  // under the cap: kept
    const rm::Stats kept = rm::stats();
    EXPECT_GE(kept.cachedBytes, 40 * MiB);
    // 40 MiB cached + 50 MiB > 64 MiB; 50 MiB is too large for the cached block.
    ASSERT_EQ(rm::acquire(0, 50 * MiB, &b), attnSuccess) << attnGetLastError(nullptr);
    const rm::Stats after = rm::stats();
    EXPECT_EQ(after.freed - kept.freed, 1u);
    EXPECT_EQ(after.cachedBytes, kept.cachedBytes - 40 * MiB);
    // More than the device has fails cleanly, with CUDA's reason.
    EXPECT_EQ(rm::acquire(0, 80 * MiB, &c), attnUnhandledCudaError);
    rm::release(0, b);
  }, o);
  unsetenv("ATTN_CUDA_EMU_DEVICE_MB");
}

// The same checks as the NCCL backend's (test_nccl_bridge), on staging.
TEST(DeviceComm, EveryOperationMatchesHostExpectations) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    RunThreads(n, [](int rank, int nranks, attnComm_t& comm) { attn_test::CheckDevSuite(comm, rank, nranks); },
               OnGpu0(&cfg));
  }
}

// A device call one rank refuses (head_dim 300): its refusal is enqueued on
// its stream like the call, so the peer's call, already on its stream,
// fails there naming the refusing rank (attnCommGetAsyncError), instead of
// waiting for that rank's next call.
TEST(DeviceComm, ArgumentsRefusedOnOneRankFailThePeersCall) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(4, 2, 64, attnBfloat16, 0.f, 1);
    if (rank == 1) acfg.head_dim = 300;
    const attnSeqLayout_t lay{0, nullptr, nullptr, nullptr, nullptr};
    const attnResult_t r = attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &lay, &acfg,
                                             attnModePassKV, comm, (attnStream_t)s);
    EXPECT_EQ(r, rank == 1 ? attnInvalidArgument : attnSuccess) << attnGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    attnResult_t async;
    ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    if (rank == 1) {
      EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
    } else {
      EXPECT_EQ(async, attnRemoteError);
      EXPECT_NE(std::string(attnGetLastError(comm)).find("rank 1 could not take part"), std::string::npos)
          << attnGetLastError(comm);
    }
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}

// All-gather KV has no device run yet: a device communicator refuses it at
// the call (attnNotSupported, naming the mode) on every rank that asks, a
// peer asking for another mode fails that call too instead of waiting, and
// AUTO leaves it out where the host model would take it; the communicator
// stays usable.
TEST(DeviceComm, AllGatherKvIsRefusedAndNeverChosen) {
  REQUIRE_GPU();
  const attnAttnConfig_t gqa = ATTN_ATTN_CONFIG(8, 2, 64, attnFloat32, 0.f, 1);
  const attn_test::AttnCase c = attn_test::MakeCase("device-ag", attn_test::PrefillSpec(gqa, {256}, {0}), 12);
  // Slow compute, per-step latency charged in full: all-gather KV on a host.
  const attnCostModel_t hostWouldGather{1.5, 5.0, 0.04, 1.0};
  for (bool everyRank : {true, false}) {
    attnConfig_t cfg;
    RunThreads(4, [&](int rank, int nranks, attnComm_t& comm) {
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      const attnSeqLayout_t none{0, nullptr, nullptr, nullptr, nullptr};
      const bool asks = everyRank || rank == 1;
      const attnResult_t r = attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &none, &gqa,
                                               asks ? attnModeAllGatherKV : attnModePassKV, comm,
                                               (attnStream_t)s);
      if (asks) {
        EXPECT_EQ(r, attnNotSupported) << attnGetLastError(comm);
        EXPECT_NE(std::string(attnGetLastError(comm)).find("all_gather_kv"), std::string::npos)
            << attnGetLastError(comm);
      } else {
        EXPECT_EQ(r, attnSuccess) << attnGetLastError(comm);
      }
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      attnResult_t async;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      if (!asks) EXPECT_EQ(async, attnRemoteError) << "the peer's call must fail, naming rank 1";
      cudaStreamDestroy(s);
      if (!everyRank) return;  // a failed call leaves the peers' communicators broken
      ASSERT_EQ(attnCommSetCostModel(comm, &hostWouldGather), attnSuccess);
      const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 7, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      attnModeEstimate_t est;
      ASSERT_EQ(attnSelectMode(&sh.layout, &gqa, comm, &est), attnSuccess) << attnGetLastError(comm);
      EXPECT_LT(est.all_gather_kv_us, est.pass_kv_us) << "the host model would gather";
      EXPECT_NE(est.chosen, attnModeAllGatherKV);
      const DeviceRun run = RunOnDevice(c, sh, comm, attnModeAuto, true);
      ExpectExact(run, gqa.dtype, "AUTO after the refusal");
      EXPECT_NE(attn::attnStateOf(comm).last.mode, attnModeAllGatherKV);
    }, OnGpu0(&cfg));
  }
}

// num_seqs 0 with NULL offsets (which the API allows) on the device path:
// nothing to read, nothing to do, in every mode.
TEST(DeviceComm, ZeroSequencesWithNullOffsets) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(2, [](int, int, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(4, 2, 64, attnBfloat16, 0.f, 1);
    const attnSeqLayout_t lay{0, nullptr, nullptr, nullptr, nullptr};
    for (attnAttnMode_t m : {attnModeAuto, attnModePassKV, attnModePassQ, attnModeShipQ})
      EXPECT_EQ(attnRingAttention(nullptr, nullptr, nullptr, nullptr, nullptr, &lay, &acfg, m, comm,
                                  (attnStream_t)s),
                attnSuccess)
          << attnGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    attnResult_t async;
    ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
    cudaStreamDestroy(s);
  }, OnGpu0(&cfg));
}

// Head-parallel on device communicators at its edges: ranks without heads
// (2 query heads over 3 ranks) only send their rows and take their outputs
// back, and one rank alone computes every head; then, where the cost model
// favours it (no GQA, slow links, fast compute), AUTO takes it on a device
// communicator as on a host one.
TEST(DeviceComm, HeadParallelWithIdleRanksAndChosenByAuto) {
  REQUIRE_GPU();
  const attnAttnConfig_t few = ATTN_ATTN_CONFIG(2, 1, 64, attnBfloat16, 0.f, 1);
  const attn_test::AttnCase small =
      attn_test::MakeCase("device-heads", attn_test::PrefillSpec(few, {70, 5, 0}, {30, 0, 9}), 8);
  for (int n : {1, 3}) {
    attnConfig_t cfg;
    RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) {
      const attn_test::Placement pl = attn_test::RandomPlacement(small, nranks, 4, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(small, pl, rank);
      for (bool withLse : {true, false}) {
        const DeviceRun r = RunOnDevice(small, sh, comm, attnModeHeadParallel, withLse);
        ExpectExact(r, few.dtype, "n=" + std::to_string(nranks));
        EXPECT_EQ(r.stats.empty_mismatch, 0);
        EXPECT_EQ(attn::attnStateOf(comm).last.mode, attnModeHeadParallel);
      }
    }, OnGpu0(&cfg));
  }
  const attnAttnConfig_t mha = ATTN_ATTN_CONFIG(8, 8, 64, attnBfloat16, 0.f, 1);
  const attn_test::AttnCase big = attn_test::MakeCase("device-auto-heads", attn_test::PrefillSpec(mha, {384}, {0}), 9);
  const attnCostModel_t slow{0.01, 1.0, 1000.0, 0.0};
  attnConfig_t cfg;
  RunThreads(4, [&](int rank, int nranks, attnComm_t& comm) {
    ASSERT_EQ(attnCommSetCostModel(comm, &slow), attnSuccess);
    const attn_test::Placement pl = attn_test::RandomPlacement(big, nranks, 5, -1);
    const attn_test::RankShard sh = attn_test::GatherShard(big, pl, rank);
    attnModeEstimate_t est;
    ASSERT_EQ(attnSelectMode(&sh.layout, &mha, comm, &est), attnSuccess) << attnGetLastError(comm);
    EXPECT_EQ(est.chosen, attnModeHeadParallel);
    const DeviceRun r = RunOnDevice(big, sh, comm, attnModeAuto, true);
    ExpectExact(r, mha.dtype, "AUTO");
    EXPECT_EQ(attn::attnStateOf(comm).last.mode, attnModeHeadParallel);
  }, OnGpu0(&cfg));
}

// attnLevelAttention on device communicators
// (src/attn/device/level_alltoall_device.cc), importance scores in device
// memory: keeping every key equals exact attention, and dropping keeps
// exactly the documented keys (the reference over them, level_fixtures.h).
// Ranks sharing GPU 0 are one host, so both near tiers get the same keep.
// GQA and MHA, causal and not, a rank with no rows, uneven chunks.
DeviceRun RunLevelOnDevice(const attn_test::AttnCase& c, const attn_test::AttnCase& ref,
                           const attn_test::Placement& pl, int rank, attnComm_t comm,
                           const attnLevelDrop_t* drop, const std::vector<float>* imp) {
  const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
  std::vector<float> localImp;
  if (imp)
    for (int64_t g : pl.kv_rows[rank]) localImp.push_back((*imp)[g]);
  return attn_test::RunShardOnDevice(ref, sh, comm, true, localImp, [&](const attn_test::DeviceShard& d) {
    attnLevelDrop_t onDevice{};
    if (drop) {
      onDevice = *drop;
      onDevice.importance = imp ? d.extra : nullptr;
    }
    return attnLevelAttention(d.q, d.k, d.v, d.out, d.lse, &sh.layout, &c.cfg, drop ? &onDevice : nullptr, comm,
                              (attnStream_t)d.stream);
  });
}

TEST(DeviceComm, LevelAttentionOnDeviceKeepsTheDocumentedKeys) {
  REQUIRE_GPU();
  auto nearTiers = [](int, int) { return int(attnTierDevice); };
  for (int n : {2, 3}) {
    const std::vector<std::shared_ptr<const attn_test::AttnCase>> cases = {
        attn_test::PrefillCase("gqa causal", attnAttnConfig_t ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1), {9 * n + 3, 2 * n}, 31),
        attn_test::PrefillCase("mha", attnAttnConfig_t ATTN_ATTN_CONFIG(4, 4, 32, attnFloat32, 0.f, 0), {5 * n + 1}, 32)};
    for (const auto& c : cases) {
      const std::vector<float> imp = attn_test::RandomImportance(*c, 33);
      for (int empty : {-1, n - 1}) {
        const attn_test::Placement pl = attn_test::ContiguousPlacement(*c, n, empty);
        for (float keep : {1.0f, 0.5f, 0.0f}) {
          const attnLevelDrop_t drop{{keep, keep, 1, 1}, nullptr};
          std::vector<attn_test::AttnCase> refs;
          for (int r = 0; r < n; ++r)
            refs.push_back(attn_test::ReferenceOverKeptKeys(*c, pl, r, drop.keep, imp, nearTiers));
          attnConfig_t cfg;
          RunThreads(n, [&](int rank, int, attnComm_t& comm) {
            const std::string what = c->name + ", n=" + std::to_string(n) + ", keep " + std::to_string(keep) +
                                     ", empty rank " + std::to_string(empty);
            // keep 1 without scores (drop NULL) too: the exact result.
            const DeviceRun r = keep == 1.0f ? RunLevelOnDevice(*c, refs[rank], pl, rank, comm, nullptr, nullptr)
                                             : RunLevelOnDevice(*c, refs[rank], pl, rank, comm, &drop, &imp);
            ExpectExact(r, c->cfg.dtype, what);
            EXPECT_EQ(r.stats.nan_rows, 0) << what;
            EXPECT_EQ(r.stats.empty_mismatch, 0) << what;
          }, OnGpu0(&cfg));
        }
      }
    }
  }
}

// Self pairs that do not match fail at attnGroupEnd, before anything is
// enqueued.
TEST(DeviceComm, UnmatchedSelfSendInAGroupIsRefused) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunThreads(1, [](int, int, attnComm_t& comm) {
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
    ASSERT_EQ(attnGroupStart(), attnSuccess);
    ASSERT_EQ(attnSend(buf, 16, attnFloat32, 0, comm, nullptr), attnSuccess);
    ASSERT_EQ(attnRecv(buf, 8, attnFloat32, 0, comm, nullptr), attnSuccess);
    EXPECT_EQ(attnGroupEnd(), attnInvalidUsage);
    const std::string why = attnGetLastError(comm);
    EXPECT_NE(why.find("send to self of 64 bytes met a receive of 32 bytes"), std::string::npos) << why;
    cudaFree(buf);
  }, OnGpu0(&cfg));
}

}  // namespace
