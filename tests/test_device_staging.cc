// The staging backend of device communicators, pipelined
// (src/device/backends/staging/stage_pipeline.h): collectives larger than a slice run slice
// by slice through pinned host memory. ATTN_TRANSPORT=shm,tcp keeps
// cuda_ipc out, so every collective here is staged; a small
// ATTN_DEVICE_STAGE_CHUNK cuts each into several slices with a shorter last
// one. Results must be exact and the slice counter must show the cut.
// Grouped sends and receives go the same way (src/device/backends/staging/staged_p2p.h).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/backends/staging/staged_p2p.h"
#include "support/device_checks.h"
#include "support/device_p2p.h"
#include "support/gpu.h"
#include "support/multirank.h"

namespace {

using attn_test::AsStream;
using attn_test::RunOptions;

constexpr size_t kChunk = 4096;  // bytes of each rank block per slice

size_t Slices(size_t count, attnDataType_t t) {
  const size_t per = kChunk / attn_test::TypedBuf(t, 1).bytes();
  return (count + per - 1) / per;
}

RunOptions Staged(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  RunOptions o;
  o.config = cfg;
  o.env = {{"ATTN_TRANSPORT", "shm,tcp"}, {"ATTN_DEVICE_STAGE_CHUNK", std::to_string(kChunk)}};
  return o;
}

// In place: all-reduce with send == recv, all-gather with send at this
// rank's block of recv.
void CheckInPlace(attnComm_t comm, int rank, int n, size_t count, cudaStream_t s) {
  SCOPED_TRACE("in place on rank " + std::to_string(rank));
  std::vector<float> host(count * n);
  for (size_t i = 0; i < count; ++i) host[i] = float(rank * 100000 + i);
  float* d = nullptr;
  ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&d), host.size() * sizeof(float), s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(attnAllReduce(d, d, count, attnFloat32, attnSum, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += r * 100000.0 + i;
    ASSERT_EQ(host[i], float(want)) << "all-reduce element " << i;
  }
  for (size_t i = 0; i < count; ++i) host[rank * count + i] = float(rank * 100000 + i);
  ASSERT_EQ(cudaMemcpyAsync(d + rank * count, host.data() + rank * count, count * sizeof(float),
                            cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(attnAllGather(d + rank * count, d, count, attnFloat32, comm, AsStream(s)), attnSuccess)
      << attnGetLastError(comm);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), d, host.size() * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(d, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(host[r * count + i], float(r * 100000 + i)) << "all-gather block " << r << " element " << i;
}

// Every sliceable collective, counts that leave a short last slice; returns
// the slices this rank should have run.
size_t RunSuite(attnComm_t comm, int rank, int n) {
  cudaStream_t s;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  size_t slices = 0;
  for (attnDataType_t t : {attnFloat32, attnBfloat16}) {
    attn_test::CheckDevAllGather(comm, rank, n, t, 5001, s);
    slices += Slices(5001, t);
    for (attnRedOp_t op : {attnSum, attnAvg}) {
      attn_test::CheckDevAllReduce(comm, rank, n, t, op, 3001, s);
      attn_test::CheckDevReduceScatter(comm, rank, n, t, op, 2051, s);
      slices += Slices(3001, t) + Slices(2051, t);
    }
  }
  attn_test::CheckDevBroadcast(comm, rank, n, attnFloat32, 4099, n - 1, s);
  attn_test::CheckDevReduce(comm, rank, n, attnFloat32, attnSum, 4099, 1 % n, s);  // non-roots copy nothing up
  attn_test::CheckDevAllToAll(comm, rank, n, attnFloat32, 1500, s);
  CheckInPlace(comm, rank, n, 2500, s);
  slices += 2 * Slices(4099, attnFloat32) + Slices(1500, attnFloat32) + 2 * Slices(2500, attnFloat32);
  // One slice or less: unpipelined, as before.
  attn_test::CheckDevAllReduce(comm, rank, n, attnFloat32, attnSum, 1024, s);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  attnResult_t async = attnInternalError;
  EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
  EXPECT_EQ(async, attnSuccess) << attnGetLastError(comm);
  cudaStreamDestroy(s);
  return slices;
}

TEST(DeviceStaging, LargeCollectivesRunInSlicesBetweenThreads) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    const RunOptions o = Staged(&cfg);
    // Read at every call: keep it set while the ranks run.
    attn_test::ScopedEnv env(o.env);
    std::atomic<size_t> expected{0};
    const uint64_t before = attn::stagedSlices().load();
    attn_test::RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) {
      expected += RunSuite(comm, rank, nranks);
    }, o);
    EXPECT_EQ(attn::stagedSlices().load() - before, expected.load()) << n << " ranks";
  }
}

TEST(DeviceStaging, LargeCollectivesRunInSlicesBetweenProcesses) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  attn_test::RunProcesses(3, [](int rank, int nranks, attnComm_t& comm) {
    const uint64_t before = attn::stagedSlices().load();
    const size_t expected = RunSuite(comm, rank, nranks);
    EXPECT_EQ(attn::stagedSlices().load() - before, expected);
  }, Staged(&cfg));
}

// ATTN_DEVICE_STAGE_CHUNK=0: every collective in one piece, still exact.
TEST(DeviceStaging, ChunkZeroTurnsSlicingOff) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  RunOptions o = Staged(&cfg);
  o.env[1].second = "0";
  attn_test::ScopedEnv env(o.env);
  const uint64_t before = attn::stagedSlices().load();
  attn_test::RunThreads(2, [](int rank, int nranks, attnComm_t& comm) { RunSuite(comm, rank, nranks); }, o);
  EXPECT_EQ(attn::stagedSlices().load(), before);
}

// ---------------------------------------------------------------------------
// Sends and receives

TEST(DeviceStaging, LargeSendsAndReceivesMoveInSlicesBetweenThreads) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    attnConfig_t cfg;
    const RunOptions o = Staged(&cfg);
    attn_test::ScopedEnv env(o.env);
    std::atomic<size_t> expected{0};
    const uint64_t before = attn::stagedP2pSlices().load();
    attn_test::RunThreads(n, [&](int rank, int nranks, attnComm_t& comm) {
      for (int call = 0; call < 2; ++call) expected += attn_test::CheckDevSlicedP2p(comm, rank, nranks, kChunk);  // the arena is reused
    }, o);
    EXPECT_EQ(attn::stagedP2pSlices().load() - before, expected.load()) << n << " ranks";
  }
}

// Processes on emulated hosts of their own (ATTN_HOSTID): no pair is on
// one host, so nothing is described or pulled, only staged over tcp.
RunOptions StagedAcrossHosts(attnConfig_t* cfg) {
  RunOptions o = Staged(cfg);
  o.child_setup = [](int rank) { setenv("ATTN_HOSTID", ("staged-host-" + std::to_string(rank)).c_str(), 1); };
  return o;
}

TEST(DeviceStaging, LargeSendsAndReceivesMoveInSlicesAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  attnConfig_t cfg;
  attn_test::RunProcesses(3, [](int rank, int nranks, attnComm_t& comm) {
    const uint64_t before = attn::stagedP2pSlices().load();
    const size_t expected = attn_test::CheckDevSlicedP2p(comm, rank, nranks, kChunk);
    EXPECT_GT(expected, 0u);
    EXPECT_EQ(attn::stagedP2pSlices().load() - before, expected);
  }, StagedAcrossHosts(&cfg));
}

// A receive of another size than its send fails (attnInvalidUsage, on the
// stream's communicator) instead of taking the first slices as the whole
// message. Across hosts, where no descriptor exchange compares the sizes
// first: sizes cut into slices of the same lengths (only the header tells),
// and a whole receive meeting a sliced send (the lengths tell).
TEST(DeviceStaging, SlicedSendMeetingAReceiveOfAnotherSizeFailsAcrossHosts) {
  REQUIRE_FORKABLE_CUDA();
  for (size_t recvBytes : {2 * kChunk, kChunk / 2}) {
    attnConfig_t cfg;
    attn_test::RunProcesses(2, [&](int rank, int, attnComm_t& comm) {
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      const size_t sendBytes = 3 * kChunk;
      void* d = nullptr;
      ASSERT_EQ(cudaMallocAsync(&d, sendBytes, s), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(d, rank, sendBytes, s), cudaSuccess);
      const attnResult_t r = rank == 0 ? attnSend(d, sendBytes, attnUint8, 1, comm, AsStream(s))
                                       : attnRecv(d, recvBytes, attnUint8, 0, comm, AsStream(s));
      EXPECT_EQ(r, attnSuccess) << "enqueued; the failure is asynchronous";
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << "a failed operation still releases the stream";
      attnResult_t async = attnSuccess;
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      if (rank == 1) {
        const std::string why = attnGetLastError(comm);
        EXPECT_EQ(async, attnInvalidUsage) << recvBytes << ": " << why;
        EXPECT_TRUE(why.find("rank 0") != std::string::npos || why.find("peer 0") != std::string::npos) << why;
        attn_test::ReportFromChild(why);
      }
      // The sender may finish (its slices were buffered) or see the link break.
      EXPECT_EQ(cudaFreeAsync(d, s), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaStreamDestroy(s);
    }, StagedAcrossHosts(&cfg));
  }
}

}  // namespace
