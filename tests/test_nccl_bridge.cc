// attnCommInitFromNccl and the NCCL backend of device communicators. The
// argument checks run in every build; the rest needs NCCL at build time and
// a GPU, and skips with the reason otherwise. On the emulated CUDA runtime
// (tests/cuda_emu) NCCL is emulated too, so all of it runs there.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "attncomm.h"

#if ATTN_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "src/device/backends/nccl/nccl_bridge.h"
#include "support/attn_fixtures.h"
#include "support/device_attn.h"
#include "support/device_checks.h"
#include "support/gpu.h"
#include "support/multirank.h"
#endif

namespace {

TEST(NcclBridge, NullCommPointerIsRefused) {
  int standIn = 0;  // never read: the NULL output pointer is refused first
  EXPECT_EQ(attnCommInitFromNccl(nullptr, &standIn, nullptr), attnInvalidArgument);
  const std::string why = attnGetLastError(nullptr);
  EXPECT_NE(why.find("comm output pointer is NULL"), std::string::npos) << why;
}

TEST(NcclBridge, NullNcclCommIsRefused) {
  attnComm_t comm = reinterpret_cast<attnComm_t>(&comm);  // must come back NULL
  EXPECT_EQ(attnCommInitFromNccl(&comm, nullptr, nullptr), attnInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  const std::string why = attnGetLastError(nullptr);
  EXPECT_NE(why.find("nccl_comm is NULL"), std::string::npos) << why;
}

TEST(NcclBridge, ABuildWithoutNcclSaysSo) {
#if ATTN_HAVE_NCCL
  GTEST_SKIP() << "this build has NCCL";
#else
  int standIn = 0;  // never read without NCCL
  attnComm_t comm = nullptr;
  EXPECT_EQ(attnCommInitFromNccl(&comm, &standIn, nullptr), attnNotSupported);
  EXPECT_EQ(comm, nullptr);
  const std::string why = attnGetLastError(nullptr);
  EXPECT_NE(why.find("no NCCL"), std::string::npos) << why;
#endif
}

#if ATTN_HAVE_NCCL

using attn_test::GpuCount;

// n NCCL ranks on GPU 0 (one process). Empty, with the reason, when NCCL
// refuses: several ranks on one GPU is "Duplicate GPU detected" in NCCL 2.x.
std::vector<ncclComm_t> NcclOnGpu0(int n, std::string* why) {
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<int> devs(n, 0);
  ncclResult_t r = ncclCommInitAll(comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    *why = "ncclCommInitAll of " + std::to_string(n) + " rank(s) on GPU 0 failed: " +
           ncclGetErrorString(r) + (last && *last ? std::string(": ") + last : std::string());
    return {};
  }
  return comms;
}

// A body that destroys its attncomm communicator sets comm = nullptr.
using NcclBody = std::function<void(int rank, attnComm_t& comm, ncclComm_t nccl)>;

// Runs body on n threads, each with rank `rank` of an NCCL communicator and
// the attncomm communicator made from it. Returns "" or why NCCL refused.
std::string RunOnNccl(int n, const NcclBody& body, const attnConfig_t* config = nullptr) {
  std::string why;
  std::vector<ncclComm_t> nccl = NcclOnGpu0(n, &why);
  if (nccl.empty()) return why;
  attn_test::RunThreadsRaw(n, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    attnComm_t comm = nullptr;
    attnResult_t r = attnCommInitFromNccl(&comm, nccl[rank], config);
    EXPECT_EQ(r, attnSuccess) << attnGetLastError(nullptr);
    if (r == attnSuccess) {
      int me = -1, count = 0;
      EXPECT_EQ(attnCommUserRank(comm, &me), attnSuccess);
      EXPECT_EQ(attnCommCount(comm, &count), attnSuccess);
      EXPECT_EQ(me, rank);
      EXPECT_EQ(count, n);
      body(rank, comm, nccl[rank]);
      if (comm) EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
    }
    // Each rank's thread destroys its own: the attncomm one never does.
    EXPECT_EQ(ncclCommDestroy(nccl[rank]), ncclSuccess);
  });
  return "";
}

TEST(NcclBridge, OneRankRunsEveryOperationAsNcclCalls) {
  REQUIRE_GPU();
  const std::string why = RunOnNccl(1, [](int rank, attnComm_t& comm, ncclComm_t) {
    attn_test::CheckDevSuite(comm, rank, 1);
  });
  if (!why.empty()) FAIL() << why;  // one rank per GPU: NCCL must accept it
}

TEST(NcclBridge, RanksSharingGpu0RunEveryOperation) {
  REQUIRE_GPU();
  std::string skipped;
  for (int n : {2, 3, 4}) {
    // Signature checks (ATTN_CHECK) on the NCCL path, for one size.
    attn_test::ScopedEnv env(n == 2 ? std::vector<std::pair<std::string, std::string>>{{"ATTN_CHECK", "1"}}
                                    : std::vector<std::pair<std::string, std::string>>{});
    const std::string why = RunOnNccl(n, [n](int rank, attnComm_t& comm, ncclComm_t) {
      attn_test::CheckDevSuite(comm, rank, n);
    });
    if (!why.empty()) skipped += (skipped.empty() ? "" : "; ") + why;
  }
  if (!skipped.empty()) GTEST_SKIP() << "NCCL refused ranks sharing one GPU: " << skipped;
}

TEST(NcclBridge, ConfigDeviceMustBeTheNcclDevice) {
  REQUIRE_GPU();
  std::string why;
  std::vector<ncclComm_t> nccl = NcclOnGpu0(1, &why);
  ASSERT_FALSE(nccl.empty()) << why;
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.device = 1;  // NCCL's is 0
  attnComm_t comm = reinterpret_cast<attnComm_t>(&comm);
  EXPECT_EQ(attnCommInitFromNccl(&comm, nccl[0], &cfg), attnInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  const std::string text = attnGetLastError(nullptr);
  EXPECT_NE(text.find("device 0"), std::string::npos) << text;
  cfg.device = 0;  // matching: fine
  ASSERT_EQ(attnCommInitFromNccl(&comm, nccl[0], &cfg), attnSuccess) << attnGetLastError(nullptr);
  EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
  EXPECT_EQ(ncclCommDestroy(nccl[0]), ncclSuccess);
}

TEST(NcclBridge, DestroyLeavesTheNcclCommunicatorWorking) {
  REQUIRE_GPU();
  const std::string why = RunOnNccl(1, [](int, attnComm_t& comm, ncclComm_t nccl) {
    ASSERT_EQ(attnCommDestroy(comm), attnSuccess);
    comm = nullptr;
    float* buf = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), sizeof(float)), cudaSuccess);
    const float one = 1.f;
    ASSERT_EQ(cudaMemcpy(buf, &one, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, nccl, nullptr), ncclSuccess);
    float back = 0;
    EXPECT_EQ(cudaMemcpy(&back, buf, sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, 1.f);
    cudaFree(buf);
  });
  ASSERT_TRUE(why.empty()) << why;
}

// Collectives and sends/receives in one attn group become one NCCL group,
// launched by attnGroupEnd.
TEST(NcclBridge, AGroupBecomesOneNcclGroup) {
  REQUIRE_GPU();
  const std::string why = RunOnNccl(1, [](int, attnComm_t& comm, ncclComm_t) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const size_t count = 777;
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = float(i);
    float *in, *sum, *copy;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&sum), count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&copy), count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(in, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, s),
              cudaSuccess);
    ASSERT_EQ(attnGroupStart(), attnSuccess);
    ASSERT_EQ(attnAllReduce(in, sum, count, attnFloat32, attnSum, comm, attn_test::AsStream(s)), attnSuccess);
    ASSERT_EQ(attnSend(in, count, attnFloat32, 0, comm, attn_test::AsStream(s)), attnSuccess);
    ASSERT_EQ(attnRecv(copy, count, attnFloat32, 0, comm, attn_test::AsStream(s)), attnSuccess);
    ASSERT_EQ(attnGroupEnd(), attnSuccess) << attnGetLastError(comm);
    std::vector<float> a(count), b(count);
    ASSERT_EQ(cudaMemcpyAsync(a.data(), sum, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b.data(), copy, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(a, host);
    EXPECT_EQ(b, host);
    cudaFree(in);
    cudaFree(sum);
    cudaFree(copy);
    cudaStreamDestroy(s);
  });
  ASSERT_TRUE(why.empty()) << why;
}

// Split and shrink of an NCCL-backed communicator keep the NCCL backend:
// the child gets its own NCCL communicator (ncclCommSplit, ncclCommShrink),
// and every operation on it still matches.
TEST(NcclBridge, SplitAndShrinkKeepTheNcclBackend) {
  REQUIRE_GPU();
  std::string skipped;
  for (int n : {1, 2, 3}) {
    const std::string why = RunOnNccl(n, [n](int rank, attnComm_t& comm, ncclComm_t) {
      EXPECT_TRUE(attn::ncclBacked(comm));
      // Two colors (rank 0 alone in color 0 when n > 1), reversed keys.
      const int color = n > 1 && rank == 0 ? 0 : 1;
      attnComm_t child = nullptr;
      ASSERT_EQ(attnCommSplit(comm, color, n - rank, &child, nullptr), attnSuccess) << attnGetLastError(comm);
      ASSERT_NE(child, nullptr);
      EXPECT_TRUE(attn::ncclBacked(child));
      int childRank = -1, childSize = 0;
      ASSERT_EQ(attnCommUserRank(child, &childRank), attnSuccess);
      ASSERT_EQ(attnCommCount(child, &childSize), attnSuccess);
      attn_test::CheckDevSuite(child, childRank, childSize);
      EXPECT_EQ(attnCommDestroy(child), attnSuccess);
      // With several ranks, the last one leaves and the others shrink.
      if (n == 1 || rank == n - 1) return;
      const int gone = n - 1;
      attnComm_t shrunk = nullptr;
      ASSERT_EQ(attnCommShrink(comm, &gone, 1, &shrunk, nullptr, ATTN_SHRINK_DEFAULT), attnSuccess)
          << attnGetLastError(comm);
      EXPECT_TRUE(attn::ncclBacked(shrunk));
      attn_test::CheckDevSuite(shrunk, rank, n - 1);
      EXPECT_EQ(attnCommDestroy(shrunk), attnSuccess);
    });
    if (!why.empty()) {
      if (n == 1) FAIL() << why;
      skipped += (skipped.empty() ? "" : "; ") + why;
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << "NCCL refused ranks sharing one GPU: " << skipped;
}

// Attention collectives are not NCCL calls: they run on attncomm's staged
// device path (the proxy thread and the host engine) of the same
// communicator, between NCCL collectives on the caller's stream.
TEST(NcclBridge, RingAttentionRunsBesideNcclCollectives) {
  REQUIRE_GPU();
  const attnAttnConfig_t shape = ATTN_ATTN_CONFIG(8, 2, 64, attnBfloat16, 0.f, 1);
  const attn_test::AttnCase c = attn_test::MakeCase(
      "nccl", attn_test::PrefillSpec(shape, {300, 0, 77}, {100, 50, 0}), 17);
  std::string skipped;
  for (int n : {1, 3}) {
    const std::string why = RunOnNccl(n, [&](int rank, attnComm_t& comm, ncclComm_t) {
      const attn_test::Placement pl = attn_test::RandomPlacement(c, n, 19, -1);
      const attn_test::RankShard sh = attn_test::GatherShard(c, pl, rank);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      for (attnAttnMode_t mode : {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto}) {
        attn_test::CheckDevAllReduce(comm, rank, n, attnFloat32, attnSum, 513, s);
        const attn_test::DeviceRun r = attn_test::RunOnDevice(c, sh, comm, mode, true);
        attn_test::ExpectExact(r, shape.dtype, "NCCL-backed, mode " + std::to_string(int(mode)));
      }
      attn_test::CheckDevAllGather(comm, rank, n, attnBfloat16, 129, s);
      cudaStreamDestroy(s);
    });
    if (!why.empty()) {
      if (n == 1) FAIL() << why;
      skipped += why;
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << "NCCL refused ranks sharing one GPU: " << skipped;
}

// A peer that aborts its NCCL communicator: the collective waiting for it
// ends with NCCL's asynchronous error, which attnCommGetAsyncError reports
// with NCCL's text.
TEST(NcclBridge, APeerAbortingItsNcclCommIsAnAsyncError) {
  REQUIRE_GPU();
  std::string why;
  std::vector<ncclComm_t> nccl = NcclOnGpu0(2, &why);
  if (nccl.empty()) GTEST_SKIP() << why;
  attn_test::RunThreadsRaw(2, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    attnComm_t comm = nullptr;
    ASSERT_EQ(attnCommInitFromNccl(&comm, nccl[rank], nullptr), attnSuccess) << attnGetLastError(nullptr);
    if (rank == 1) {
      EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
      EXPECT_EQ(ncclCommAbort(nccl[rank]), ncclSuccess);
      return;
    }
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float* buf = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 64 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(attnAllReduce(buf, buf, 64, attnFloat32, attnSum, comm, attn_test::AsStream(s)), attnSuccess);
    attnResult_t async = attnSuccess;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (async == attnSuccess && std::chrono::steady_clock::now() < until) {
      ASSERT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(async, attnRemoteError);
    const std::string text = attnGetLastError(comm);
    EXPECT_NE(text.find("NCCL"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1"), std::string::npos) << text;  // the peer, named by NCCL's text
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // NCCL's kernel ended; the stream goes on
    cudaFree(buf);
    cudaStreamDestroy(s);
    EXPECT_EQ(attnCommDestroy(comm), attnSuccess);
    EXPECT_EQ(ncclCommAbort(nccl[rank]), ncclSuccess);  // a communicator with an error is aborted
  });
}

// ATTN_CHECK=1 on the NCCL backend: the signatures meet over the host
// transports before the NCCL call, on the caller's thread, so a mismatch
// or one rank's refused arguments fail the call itself on every rank,
// before NCCL is called, and nothing is written; the next call works.
TEST(NcclBridge, WithAttnCheckMismatchesAndRefusalsFailEveryRankBeforeNccl) {
  REQUIRE_GPU();
  attn_test::ScopedEnv env(std::vector<std::pair<std::string, std::string>>{{"ATTN_CHECK", "1"}});
  const int n = 3;
  const std::string why = RunOnNccl(n, [](int rank, attnComm_t& comm, ncclComm_t) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const attnStream_t st = attn_test::AsStream(s);
    attn_test::DevInOut b(attnFloat32, 64, 64 * n, [](size_t) { return 1.0; }, s);
    ASSERT_TRUE(b.ok());
    float* src = static_cast<float*>(b.din.data());
    float* dst = static_cast<float*>(b.dout.data());
    const std::string me = "rank " + std::to_string(rank) + ": ";
    // The last rank asks for another reduction.
    EXPECT_EQ(attnAllReduce(src, dst, 64, attnFloat32, rank == n - 1 ? attnMax : attnSum, comm, st),
              attnInvalidUsage) << me;
    EXPECT_NE(std::string(attnGetLastError(comm)).find("mismatch"), std::string::npos) << me << attnGetLastError(comm);
    // Rank 1 passes a root out of range.
    const attnResult_t r = attnBroadcast(src, dst, 16, attnFloat32, rank == 1 ? n : 0, comm, st);
    if (rank == 1) {
      EXPECT_EQ(r, attnInvalidArgument) << me << attnGetLastError(comm);
    } else {
      EXPECT_EQ(r, attnRemoteError) << me;
      EXPECT_NE(std::string(attnGetLastError(comm)).find("rank 1 could not take part"), std::string::npos)
          << me << attnGetLastError(comm);
    }
    b.dout.Download(&b.out, s);
    EXPECT_TRUE(b.out.GuardsIntact()) << me;
    EXPECT_TRUE(attn_test::BufEquals(b.out, 0, 64 * n, [](size_t) { return attn_test::Sentinel(attnFloat32); }))
        << me << "data moved although the calls failed";
    attn_test::CheckDevAllReduce(comm, rank, n, attnFloat32, attnSum, 100, s);
    attnResult_t async = attnInternalError;
    EXPECT_EQ(attnCommGetAsyncError(comm, &async), attnSuccess);
    EXPECT_EQ(async, attnSuccess) << me << attnGetLastError(comm);
    cudaStreamDestroy(s);
  });
  if (!why.empty()) GTEST_SKIP() << "NCCL refused ranks sharing one GPU: " << why;
}

#endif  // ATTN_HAVE_NCCL

}  // namespace
