// The device backends behind one interface (src/device/backends/
// device_backend.h): the route's order, what each says it can do, and that
// an operation no specialised backend takes reaches staging, which runs
// the library's internal collective with the settings read at the call.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/device/backends/device_backend.h"
#include "src/device/backends/cuda_ipc/ipc_stats.h"
#include "support/gpu.h"
#include "support/multirank.h"

namespace {

using attn::BackendCaps;
using attn::DeviceBackend;
using attn::DeviceOpKind;

constexpr DeviceOpKind kAllKinds[] = {
    DeviceOpKind::kAllGather, DeviceOpKind::kReduceScatter, DeviceOpKind::kAllReduce,
    DeviceOpKind::kBroadcast, DeviceOpKind::kReduce,        DeviceOpKind::kAllToAll,
    DeviceOpKind::kAllToAllv, DeviceOpKind::kP2pGroup,      DeviceOpKind::kBarrier};

TEST(DeviceBackends, TheRouteTriesTheMostSpecificFirstAndStagingLast) {
  std::vector<std::string> names;
  for (const DeviceBackend* b : attn::deviceBackends()) names.push_back(b->name());
  EXPECT_EQ(names, (std::vector<std::string>{"nccl", "cuda_ipc", "direct", "staging"}));
  for (const std::string& n : names) {
    const DeviceBackend* b = attn::findDeviceBackend(n.c_str());
    ASSERT_NE(b, nullptr) << n;
    EXPECT_STREQ(b->name(), n.c_str());
  }
  EXPECT_EQ(attn::findDeviceBackend("gloo"), nullptr);
}

TEST(DeviceBackends, CapabilitiesSayWhichMemoryPeersAndOperations) {
  const BackendCaps nccl = attn::ncclBackend().caps();
  const BackendCaps ipc = attn::cudaIpcBackend().caps();
  const BackendCaps direct = attn::directBackend().caps();
  const BackendCaps staging = attn::stagingBackend().caps();
  // Where each runs.
  EXPECT_TRUE(nccl.onCallerStream);
  EXPECT_FALSE(ipc.onCallerStream);
  EXPECT_FALSE(direct.onCallerStream);
  EXPECT_FALSE(staging.onCallerStream);
  // Which memory moves as it is, which peers.
  EXPECT_TRUE(ipc.movesDeviceMemory);
  EXPECT_FALSE(ipc.crossesHosts);
  EXPECT_TRUE(direct.movesDeviceMemory && direct.crossesHosts);
  EXPECT_FALSE(staging.movesDeviceMemory);
  EXPECT_TRUE(staging.crossesHosts);
  // Staging runs every collective and the barrier; groups go pair by pair.
  for (DeviceOpKind k : kAllKinds) {
    SCOPED_TRACE(attn::deviceOpName(k));
    EXPECT_EQ(staging.runs(k), k != DeviceOpKind::kP2pGroup);
    EXPECT_TRUE(nccl.runs(k));
    bool someone = false;
    for (const DeviceBackend* b : attn::deviceBackends())
      if (!b->caps().onCallerStream && b->caps().runs(k)) someone = true;
    EXPECT_TRUE(someone) << "no proxy-thread backend runs it";
  }
  EXPECT_TRUE(ipc.runs(DeviceOpKind::kP2pGroup));
  EXPECT_FALSE(direct.runs(DeviceOpKind::kBarrier));
}

// Device communicators on GPU 0 whose transports take host memory only.
attn_test::RunOptions WithoutCudaIpc(attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  cfg->device = 0;
  attn_test::RunOptions o;
  o.config = cfg;
  o.env = {{"ATTN_TRANSPORT", "shm,tcp"}};
  return o;
}

// With cuda_ipc left out and no transport taking device memory, cuda_ipc
// and direct decline and staging runs the collective: exact results, the
// decline counted once per collective.
TEST(DeviceBackends, DeclinedCollectivesReachStaging) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  const attn_test::RunOptions o = WithoutCudaIpc(&cfg);
  const uint64_t declinedBefore = attn::ipc::ipcCounters().stagedOps.load();
  attn_test::RunThreads(2, [](int rank, int n, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const size_t count = 1000;
    std::vector<float> host(count * n);
    for (size_t i = 0; i < count; ++i) host[i] = float(rank * 10000 + int(i));
    float *send = nullptr, *recv = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(send, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(attnAllGather(send, recv, count, attnFloat32, comm, reinterpret_cast<attnStream_t>(s)), attnSuccess)
        << attnGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), recv, host.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(host[size_t(r) * count + i], float(r * 10000 + int(i))) << "block " << r << " element " << i;
    cudaFree(send);
    cudaFree(recv);
    cudaStreamDestroy(s);
  }, o);
  EXPECT_EQ(attn::ipc::ipcCounters().stagedOps.load() - declinedBefore, 2u) << "one decline per rank";
}

// The staging backend's host collective takes its algorithm settings from
// the call: a bad ATTN_ALGO fails the call itself, on the caller's thread,
// with the setting named, instead of failing later on the proxy thread.
TEST(DeviceBackends, SettingsAreReadAtTheCall) {
  REQUIRE_GPU();
  attnConfig_t cfg;
  const attn_test::RunOptions o = WithoutCudaIpc(&cfg);
  // Both ranks (threads) see it, so both refuse and neither waits.
  setenv("ATTN_ALGO", "bogus", 1);
  attn_test::RunThreads(2, [](int, int, attnComm_t& comm) {
    float* buf = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 64 * sizeof(float)), cudaSuccess);
    const attnResult_t r = attnAllReduce(buf, buf, 64, attnFloat32, attnSum, comm, nullptr);
    EXPECT_EQ(r, attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("ATTN_ALGO"), std::string::npos) << attnGetLastError(comm);
    cudaFree(buf);
  }, o);
  unsetenv("ATTN_ALGO");
}

}  // namespace
