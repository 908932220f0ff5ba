// Device communicators over a transport that moves device memory itself
// (src/device/backends/direct/transport_direct.h): UCX built with CUDA. The collectives and
// send/recv hand the device buffers to UCX with no staging through pinned
// host memory. Results must be exact, and the counters must show the
// direct path ran (and nothing was staged); ATTN_UCX_CUDA=0 must stage.
//
// Debian's UCX has no CUDA support, so on a real GPU these skip unless
// the installed UCX has it. On the emulated CUDA runtime (tests/cuda_emu)
// "device" memory is host memory, which every UCX moves, so they run there.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/backends/staging/staged_p2p.h"
#include "src/device/backends/direct/transport_direct.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"
#include "support/attn_fixtures.h"
#include "support/device_attn.h"
#include "support/device_checks.h"
#include "support/device_p2p.h"
#include "support/gpu.h"
#include "support/multirank.h"
#include "support/ucx_cuda.h"

namespace {

using attn_test::AsStream;
using attn_test::RunOptions;


// A small scratch budget: reduce-scatters here run in several slices.
constexpr const char* kScratch = "65536";

RunOptions OverUcx(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  // No cuda_ipc: the same-host ranks of the threads tests go over UCX too.
  o.env = {{"ATTN_TRANSPORT", "ucx"}, {"ATTN_DEVICE_DIRECT_SCRATCH", kScratch}, {"ATTN_DEVICE_STAGE_CHUNK", "4096"}};
  return o;
}

// Every collective the direct path runs; returns how many.
uint64_t RunCollectives(attnComm_t comm, int rank, int n) {
  cudaStream_t s;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  uint64_t ops = 0;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    attn_test::CheckDevAllGather(comm, rank, n, t, 5001, s);
    ++ops;
    for (attnRedOp_t op : {attnSum, attnAvg, attnMax}) {
      // Counts that leave uneven all-reduce slices and several scratch
      // slices with a short last one.
      attn_test::CheckDevAllReduce(comm, rank, n, t, op, 30011, s);
      attn_test::CheckDevReduceScatter(comm, rank, n, t, op, 20483, s);
      ops += 2;
    }
  }
  attn_test::CheckDevAllReduce(comm, rank, n, attnFloat32, attnSum, 1, s);  // fewer elements than ranks
  // More than one 4 MiB chunk of the broadcast chain, from every root.
  for (int root = 0; root < n; ++root) attn_test::CheckDevBroadcast(comm, rank, n, attnFloat32, (5 << 20) / 4 + 3, root, s);
  // Reduce to every root, over several scratch slices with a short last one.
  for (int root = 0; root < n; ++root)
    attn_test::CheckDevReduce(comm, rank, n, attnFloat32, root % 2 ? attnMax : attnSum, 30011, root, s);
  attn_test::CheckDevReduce(comm, rank, n, attnBfloat16, attnAvg, 20483, n - 1, s);
  attn_test::CheckDevAllToAll(comm, rank, n, attnFloat32, 1500, s);
  attn_test::CheckDevAllToAllv(comm, rank, n, attnFloat32, s);
  ops += 1 + n + n + 1 + 2;
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  attnResult_t async = attnInternalError;
  EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  cudaStreamDestroy(s);
  return ops;
}

// Reductions on pageable host buffers: UCX moves them as they are, and
// the GPU kernels, which cannot read them, reduce through device scratch.
void RunOnHostBuffers(attnComm_t comm, int rank, int n) {
  SCOPED_TRACE("pageable host buffers on rank " + std::to_string(rank));
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const size_t count = 20011;
  std::vector<float> in(count * n), out(count * n, -1.f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float((rank + 1) * 1000 + i % 997);
  ASSERT_EQ(attnAllReduce(in.data(), out.data(), count, attnFloat32, attnSum, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += (r + 1) * 1000.0 + i % 997;
    ASSERT_EQ(out[i], float(want)) << "all-reduce element " << i;
  }
  // In place: this rank's block of the input is the output.
  ASSERT_EQ(attnReduceScatter(in.data(), in.data() + rank * count, count, attnFloat32, attnMax, comm, AsStream(s)),
            attnSuccess) << attnGetLastError(comm);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(in[rank * count + i], float(n * 1000 + (rank * count + i) % 997)) << "reduce-scatter element " << i;
  // Reduce into the last rank's pageable buffer.
  for (size_t i = 0; i < count; ++i) in[i] = float((rank + 1) * 1000 + i % 997);
  std::fill(out.begin(), out.end(), -1.f);
  ASSERT_EQ(attnReduce(in.data(), rank == n - 1 ? out.data() : nullptr, count, attnFloat32, attnSum, n - 1, comm,
                       AsStream(s)),
            attnSuccess) << attnGetLastError(comm);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t i = 0; i < count && rank == n - 1; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += (r + 1) * 1000.0 + i % 997;
    ASSERT_EQ(out[i], float(want)) << "reduce element " << i;
  }
  cudaStreamDestroy(s);
}

// A grouped ring exchange and a self pair: the ring pair goes over UCX as
// device memory, the self pair is a local copy.
void RunGroup(attnComm_t comm, int rank, int n) {
  cudaStream_t s, s2;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  attn_test::CheckDevGroupedRing(comm, rank, n, s, s2);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

TEST(DeviceDirect, CollectivesHandDeviceBuffersToUcxBetweenThreads) {
  REQUIRE_GPU();
  REQUIRE_UCX_CUDA();
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    const RunOptions o = OverUcx(&cfg);
    attn_test::ScopedEnv env(o.env);  // read after init: keep it set
    std::atomic<uint64_t> expected{0};
    const uint64_t ops = attn::directCounters().ops.load(), p2p = attn::directCounters().p2p.load();
    const uint64_t slices = attn::stagedSlices().load();
    attn_test::RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) {
      expected += RunCollectives(comm, rank, nranks);
      RunOnHostBuffers(comm, rank, nranks);
      expected += 3;
      RunGroup(comm, rank, nranks);
    }, o);
    EXPECT_EQ(attn::directCounters().ops.load() - ops, expected.load()) << n << " ranks";
    // One send and one receive per rank.
    EXPECT_EQ(attn::directCounters().p2p.load() - p2p, uint64_t(2 * n)) << n << " ranks";
    EXPECT_EQ(attn::stagedSlices().load(), slices) << "nothing may be staged";
  }
}

// Ranks on different (emulated) hosts: no cuda_ipc path exists, so the
// collectives go straight to the transport.
TEST(DeviceDirect, CollectivesHandDeviceBuffersToUcxAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  REQUIRE_UCX_CUDA();
  attnConfig_t cfg;
  RunOptions o = OverUcx(&cfg);
  o.env[0].second = "ucx,cuda_ipc";
  o.child_setup = [](int rank) { setenv("ATTN_HOSTID", ("direct-host-" + std::to_string(rank)).c_str(), 1); };
  attn_test::RunProcesses(3, [](int rank, int nranks, attnComm_t& comm) {
    const uint64_t ops = attn::directCounters().ops.load(), p2p = attn::directCounters().p2p.load();
    const uint64_t viaHost = attn::ipc::ipcCounters().p2pViaHost.load();
    const uint64_t slices = attn::stagedSlices().load();
    const uint64_t expected = RunCollectives(comm, rank, nranks);
    RunGroup(comm, rank, nranks);
    EXPECT_EQ(attn::directCounters().ops.load() - ops, expected);
    EXPECT_EQ(attn::directCounters().p2p.load() - p2p, 2u);
    EXPECT_EQ(attn::ipc::ipcCounters().p2pViaHost.load(), viaHost);
    EXPECT_EQ(attn::stagedSlices().load(), slices);
  }, o);
}

// ATTN_UCX_CUDA=0: UCX takes host memory only, so everything is staged,
// and still exact.
TEST(DeviceDirect, UcxCudaOffStages) {
  REQUIRE_GPU();
  REQUIRE_UCX_CUDA();
  attnConfig_t cfg;
  RunOptions o = OverUcx(&cfg);
  o.env.push_back({"ATTN_UCX_CUDA", "0"});
  attn_test::ScopedEnv env(o.env);
  const uint64_t ops = attn::directCounters().ops.load(), p2p = attn::directCounters().p2p.load();
  const uint64_t slices = attn::stagedSlices().load();
  attn_test::RunThreads(2, [&](int rank, int nranks, attnComm_t& comm) {
    RunCollectives(comm, rank, nranks);
    RunGroup(comm, rank, nranks);
  }, o);
  EXPECT_EQ(attn::directCounters().ops.load(), ops);
  EXPECT_EQ(attn::directCounters().p2p.load(), p2p);
  EXPECT_GT(attn::stagedSlices().load(), slices);
}

// ATTN_UCX_CUDA differs between the two ends of a pair: UCX's connections
// exchange it, so both ends stage (a whole device message on one side
// would never meet the other side's slices), and large messages are
// sliced on both.
TEST(DeviceDirect, MixedUcxCudaSettingsStageBothEnds) {
  REQUIRE_FORKABLE_CUDA();
  REQUIRE_UCX_CUDA();
  attnConfig_t cfg;
  RunOptions o = OverUcx(&cfg);
  o.child_setup = [](int rank) {
    setenv("ATTN_HOSTID", ("mixed-host-" + std::to_string(rank)).c_str(), 1);
    setenv("ATTN_UCX_CUDA", rank == 0 ? "0" : "1", 1);
  };
  attn_test::RunProcesses(2, [](int rank, int nranks, attnComm_t& comm) {
    const uint64_t p2p = attn::directCounters().p2p.load(), slices = attn::stagedP2pSlices().load();
    const size_t expected = attn_test::CheckDevSlicedP2p(comm, rank, nranks, 4096);
    EXPECT_EQ(attn::directCounters().p2p.load(), p2p) << "no pair may go direct";
    EXPECT_EQ(attn::stagedP2pSlices().load() - slices, expected);
  }, o);
}

// Ring attention: each block's metadata and then the device block itself
// go to UCX; the next rank receives the block straight into its device
// buffer. Exact, on every call (the second reuses the buffers), and the
// counter says every move went that way.
constexpr attnAttnConfig_t kShape = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
attn_test::AttnCase RingCase(uint64_t seed) {
  const std::vector<int32_t> newLens = {300, 0, 77}, cachedLens = {100, 50, 0};
  return attn_test::MakeCase("direct", attn_test::PrefillSpec(kShape, newLens, cachedLens), seed);
}

void RingCalls(const attn_test::AttnCase& c, int rank, int nranks, attnComm_t comm) {
  const attn_test::Placement pl = attn_test::RandomPlacement(c, nranks, 19, -1);
  const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
  for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ})
    for (int call = 0; call < 2; ++call) {
      const attn_test::DeviceRun r = attn_test::RunOnDevice(c, sh, comm, mode, true);
      attn_test::ExpectExact(r, kShape.dtype, std::string(attn_test::ModeName(mode)) + " over ucx");
    }
}

TEST(DeviceDirect, RingBlocksGoToUcxAsDeviceMemoryBetweenThreads) {
  REQUIRE_GPU();
  REQUIRE_UCX_CUDA();
  const attn_test::AttnCase c = RingCase(21);
  attnConfig_t cfg;
  const RunOptions o = OverUcx(&cfg);
  const uint64_t steps = attn::directCounters().ringSteps.load();
  const uint64_t pulls = attn::ipc::ipcCounters().ringPulls.load();
  const int n = 3;
  attn_test::RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) { RingCalls(c, rank, nranks, comm); }, o);
  // 3 ranks x 2 modes x 2 calls x 2 moves.
  EXPECT_EQ(attn::directCounters().ringSteps.load() - steps, uint64_t(n * 2 * 2 * (n - 1)));
  EXPECT_EQ(attn::ipc::ipcCounters().ringPulls.load(), pulls);
}

TEST(DeviceDirect, RingBlocksGoToUcxAsDeviceMemoryAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  REQUIRE_UCX_CUDA();
  const attn_test::AttnCase c = RingCase(22);
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    // Without cuda_ipc: the emulated hosts share one real GPU, which the
    // cuda_ipc agreement (by GPU UUID) would rightly find reachable.
    RunOptions o = OverUcx(&cfg);
    o.child_setup = [](int rank) { setenv("ATTN_HOSTID", ("direct-host-" + std::to_string(rank)).c_str(), 1); };
    attn_test::RunProcesses(n, [&](int rank, int nranks, attnComm_t& comm) {
      const uint64_t steps = attn::directCounters().ringSteps.load();
      RingCalls(c, rank, nranks, comm);
      EXPECT_EQ(attn::directCounters().ringSteps.load() - steps, uint64_t(2 * 2 * (nranks - 1)));
    }, o);
  }
}

}  // namespace
