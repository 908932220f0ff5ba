// The emulated NCCL (tests/cuda_emu/nccl) that test_nccl_bridge runs the
// NCCL backend on without a GPU: its results, its matching of sends and
// receives, and the errors NCCL gives must hold, or those tests prove
// nothing. Built only on the emulated runtime, where nccl.h is found.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "support/multirank.h"

namespace {

std::vector<ncclComm_t> Comms(int n) {
  std::vector<ncclComm_t> c(size_t(n), nullptr);
  std::vector<int> devs(size_t(n), 0);
  EXPECT_EQ(ncclCommInitAll(c.data(), n, devs.data()), ncclSuccess) << ncclGetLastError(nullptr);
  return c;
}

// A device buffer with `host`'s contents; Back() copies it out.
template <typename T>
struct Dev {
  Dev(const std::vector<T>& host, cudaStream_t s) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, s), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> Back(cudaStream_t s) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return h;
  }
  size_t n;
  T* p = nullptr;
};

ncclResult_t AsyncErrorOf(ncclComm_t c) {
  ncclResult_t e = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(c, &e), ncclSuccess);
  return e;
}

// In-place all-gather and reduce-scatter, and an all-reduce, of types
// attncomm does not have (uint32, uint64): the results NCCL defines.
TEST(NcclEmu, CollectivesInPlaceEqualTheirDefinition) {
  const int n = 3;
  const size_t count = 37;
  std::vector<ncclComm_t> comms = Comms(n);
  attn_test::RunThreadsRaw(n, [&](int r) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    std::vector<uint32_t> gather(count * n, 0);
    for (size_t i = 0; i < count; ++i) gather[r * count + i] = uint32_t(1000 * r + i);
    Dev<uint32_t> g(gather, s);
    ASSERT_EQ(ncclAllGather(g.p + r * count, g.p, count, ncclUint32, comms[r], s), ncclSuccess);
    std::vector<uint32_t> got = g.Back(s);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(got[q * count + i], uint32_t(1000 * q + i));

    std::vector<uint64_t> scatter(count * n);
    for (size_t i = 0; i < scatter.size(); ++i) scatter[i] = (uint64_t(r + 1) << 33) + i;
    Dev<uint64_t> rs(scatter, s);
    ASSERT_EQ(ncclReduceScatter(rs.p, rs.p + r * count, count, ncclUint64, ncclSum, comms[r], s), ncclSuccess);
    std::vector<uint64_t> sum = rs.Back(s);
    for (size_t i = 0; i < count; ++i)
      EXPECT_EQ(sum[r * count + i], (uint64_t(1 + 2 + 3) << 33) + 3 * (r * count + i));

    Dev<int32_t> m(std::vector<int32_t>(count, 10 * r - 7), s);
    ASSERT_EQ(ncclAllReduce(m.p, m.p, count, ncclInt32, ncclMax, comms[r], s), ncclSuccess);
    EXPECT_EQ(m.Back(s), std::vector<int32_t>(count, 10 * (n - 1) - 7));
    EXPECT_EQ(AsyncErrorOf(comms[r]), ncclSuccess);
    cudaStreamDestroy(s);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Sends and receives in one group complete whatever order each rank posts
// them in (both ring directions and self, reversed on odd ranks), matched
// per pair in posting order.
TEST(NcclEmu, GroupedSendsAndReceivesMatchInPostingOrder) {
  const int n = 3;
  std::vector<ncclComm_t> comms = Comms(n);
  attn_test::RunThreadsRaw(n, [&](int r) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    // Two messages to each peer and self; message k to p holds 100 r + 10 p + k.
    std::vector<std::vector<float>> out;
    for (int p : {next, prev, r})
      for (int k = 0; k < 2; ++k) out.push_back(std::vector<float>(5, float(100 * r + 10 * p + k)));
    std::vector<Dev<float>*> sbuf, rbuf;
    for (auto& o : out) sbuf.push_back(new Dev<float>(o, s));
    for (size_t i = 0; i < out.size(); ++i) rbuf.push_back(new Dev<float>(std::vector<float>(5, -1.f), s));
    const int peers[3] = {next, prev, r};
    std::vector<int> order(6);
    std::iota(order.begin(), order.end(), 0);
    if (r % 2) std::reverse(order.begin(), order.end());
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int i : order) {  // i = 2 * peer index + message
      const int p = peers[i / 2];
      ASSERT_EQ(ncclRecv(rbuf[i]->p, 5, ncclFloat32, p, comms[r], s), ncclSuccess);
      ASSERT_EQ(ncclSend(sbuf[i]->p, 5, ncclFloat32, p, comms[r], s), ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int i : order) {
      const int p = peers[i / 2];
      // Messages from p arrive in p's posting order, which may be reversed.
      const int k = (r % 2) == (p % 2) ? i % 2 : 1 - i % 2;
      EXPECT_EQ(rbuf[i]->Back(s), std::vector<float>(5, float(100 * p + 10 * r + k))) << "from " << p;
    }
    for (auto* d : sbuf) delete d;
    for (auto* d : rbuf) delete d;
    EXPECT_EQ(AsyncErrorOf(comms[r]), ncclSuccess);
    cudaStreamDestroy(s);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// What NCCL refuses when called: host memory, a bad peer; a group with a
// refused call is dropped and its end returns the error.
TEST(NcclEmu, BadCallsAreRefusedWhenIssued) {
  std::vector<ncclComm_t> comms = Comms(1);
  std::vector<float> host(4);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comms[0], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("not device memory"), std::string::npos);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 16), cudaSuccess);
  EXPECT_EQ(ncclSend(d, 4, ncclFloat32, 1, comms[0], nullptr), ncclInvalidArgument);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(d, 4, ncclFloat32, 0, comms[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(host.data(), 4, ncclFloat32, 0, comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group open
  // The dropped send took no issue number: a new pair matches.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(d, 2, ncclFloat32, 0, comms[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclRecv(d + 2, 2, ncclFloat32, 0, comms[0], nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(AsyncErrorOf(comms[0]), ncclSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, comms[0], s), ncclInvalidUsage);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cudaFree(d);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
}

// Ranks that disagree on a collective, or on a message's size, get
// ncclInvalidUsage asynchronously, naming both calls; nobody hangs.
TEST(NcclEmu, MismatchesAreAsyncErrorsOnEveryRank) {
  std::vector<ncclComm_t> comms = Comms(2);
  attn_test::RunThreadsRaw(2, [&](int r) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    Dev<float> d(std::vector<float>(8, 1.f), s);
    ASSERT_EQ(ncclAllReduce(d.p, d.p, r == 0 ? 8 : 4, ncclFloat32, ncclSum, comms[r], s), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(AsyncErrorOf(comms[r]), ncclInvalidUsage);
    const std::string text = ncclGetLastError(comms[r]);
    EXPECT_NE(text.find("count 8"), std::string::npos) << text;
    EXPECT_NE(text.find("count 4"), std::string::npos) << text;
    cudaStreamDestroy(s);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);

  comms = Comms(2);
  attn_test::RunThreadsRaw(2, [&](int r) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    Dev<float> d(std::vector<float>(8, 1.f), s);
    ASSERT_EQ(r == 0 ? ncclSend(d.p, 8, ncclFloat32, 1, comms[r], s) : ncclRecv(d.p, 6, ncclFloat32, 0, comms[r], s),
              ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (r == 1) {
      EXPECT_EQ(AsyncErrorOf(comms[r]), ncclInvalidUsage);
      EXPECT_NE(std::string(ncclGetLastError(comms[r])).find("met a send of 32"), std::string::npos);
    }
    cudaStreamDestroy(s);
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

// ncclCommInitRank joins threads by id; ncclCommSplit orders a color's
// ranks by key; ncclCommShrink keeps the survivors in order.
TEST(NcclEmu, InitRankSplitAndShrink) {
  const int n = 4;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  attn_test::RunThreadsRaw(n, [&](int r) {
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
    int rank = -1, count = 0;
    EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(count, n);
    // Odd ranks in color 1 with reversed keys; rank 0 in no color.
    ncclComm_t half = nullptr;
    ASSERT_EQ(ncclCommSplit(comm, r == 0 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &half, nullptr), ncclSuccess);
    if (r == 0) {
      EXPECT_EQ(half, nullptr);
    } else {
      ASSERT_NE(half, nullptr);
      EXPECT_EQ(ncclCommUserRank(half, &rank), ncclSuccess);
      EXPECT_EQ(ncclCommCount(half, &count), ncclSuccess);
      EXPECT_EQ(count, r % 2 ? 2 : 1);
      EXPECT_EQ(rank, r == 1 ? 1 : 0);  // color 1: rank 3 (key -3) first, then rank 1
      EXPECT_EQ(ncclCommDestroy(half), ncclSuccess);
    }
    if (r != 2) {
      int gone = 2;
      ncclComm_t shrunk = nullptr;
      ASSERT_EQ(ncclCommShrink(comm, &gone, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess)
          << ncclGetLastError(nullptr);
      EXPECT_EQ(ncclCommUserRank(shrunk, &rank), ncclSuccess);
      EXPECT_EQ(rank, r < 2 ? r : r - 1);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      Dev<int64_t> d(std::vector<int64_t>(3, r), s);
      ASSERT_EQ(ncclAllReduce(d.p, d.p, 3, ncclInt64, ncclSum, shrunk, s), ncclSuccess);
      EXPECT_EQ(d.Back(s), std::vector<int64_t>(3, 0 + 1 + 3));
      cudaStreamDestroy(s);
      EXPECT_EQ(ncclCommDestroy(shrunk), ncclSuccess);
    }
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
}

}  // namespace
