// The merges on device memory: attnMergeAttnStates on a CUDA stream equals
// the host merge; the merge collectives on a device communicator equal the
// same collectives on host memory; host pointers on a stream are refused.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "support/gpu.h"
#include "support/multirank.h"

namespace {

constexpr int64_t kRows = 9;
constexpr int kHeads = 6, kD = 16;
constexpr size_t kCells = size_t(kRows) * kHeads;

void Fill(int seed, std::vector<float>* o, std::vector<float>* lse) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  o->resize(kCells * kD);
  lse->resize(kCells);
  for (float& x : *o) x = u(g);
  for (size_t c = 0; c < kCells; ++c) (*lse)[c] = c % 7 == 0 ? -INFINITY : u(g) * 3;
}

template <class T>
T* ToDevice(const std::vector<T>& h, cudaStream_t s) {
  T* d = nullptr;
  EXPECT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&d), h.size() * sizeof(T), s), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s), cudaSuccess);
  return d;
}

template <class T>
std::vector<T> ToHost(const T* d, size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  return h;
}

void ExpectSame(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_TRUE(std::isinf(got[i])) << what << " " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], 1e-5f) << what << " " << i;
  }
}

TEST(DeviceMerge, MergeStatesOnAStreamEqualsTheHostMerge) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int n = 3;
  std::vector<std::vector<float>> o(n), l(n);
  std::vector<const void*> ho, dO;
  std::vector<const float*> hl, dl;
  for (int j = 0; j < n; ++j) {
    Fill(j, &o[j], &l[j]);
    ho.push_back(o[j].data());
    hl.push_back(l[j].data());
    dO.push_back(ToDevice(o[j], s));
    dl.push_back(ToDevice(l[j], s));
  }
  std::vector<float> wantO(kCells * kD), wantL(kCells);
  ASSERT_EQ(attnMergeAttnStates(n, ho.data(), hl.data(), wantO.data(), wantL.data(), kRows, kHeads, kD, attnFloat32,
                                nullptr),
            attnSuccess);
  float *outD = nullptr, *lseD = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&outD), wantO.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&lseD), wantL.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(attnMergeAttnStates(n, dO.data(), dl.data(), outD, lseD, kRows, kHeads, kD, attnFloat32,
                                reinterpret_cast<attnStream_t>(s)),
            attnSuccess);
  ExpectSame(ToHost(outD, wantO.size(), s), wantO, "out");
  ExpectSame(ToHost(lseD, wantL.size(), s), wantL, "lse");
  // Host buffers on a stream: refused, naming the buffer.
  EXPECT_EQ(attnMergeAttnStates(n, ho.data(), hl.data(), wantO.data(), wantL.data(), kRows, kHeads, kD,
                                attnFloat32, reinterpret_cast<attnStream_t>(s)),
            attnInvalidArgument);
  for (int j = 0; j < n; ++j) {
    cudaFree(const_cast<void*>(dO[j]));
    cudaFree(const_cast<float*>(dl[j]));
  }
  cudaFree(outD);
  cudaFree(lseD);
  cudaStreamDestroy(s);
}

TEST(DeviceMerge, CollectivesOnADeviceCommunicatorEqualTheHostOnes) {
  REQUIRE_GPU();
  const int n = 3;
  // The host answer first, on host communicators.
  std::vector<std::vector<float>> wantRs(n), wantAg(n);
  attn_test::RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    std::vector<float> o, l;
    Fill(rank, &o, &l);
    const int h = int((rank + 1) * kHeads / n) - int(rank * kHeads / n);
    wantRs[size_t(rank)].resize(size_t(kRows) * h * kD);
    ASSERT_EQ(attnMergeAttnReduceScatter(o.data(), l.data(), wantRs[size_t(rank)].data(), nullptr, kRows, kHeads, kD,
                                         attnFloat32, comm, nullptr),
              attnSuccess);
    wantAg[size_t(rank)].resize(o.size());
    ASSERT_EQ(attnMergeAttnAllGather(o.data(), l.data(), wantAg[size_t(rank)].data(), nullptr, kRows, kHeads, kD,
                                     attnFloat32, comm, nullptr),
              attnSuccess);
  });
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.device = 0;
  attn_test::RunOptions opts;
  opts.config = &cfg;
  attn_test::RunThreads(n, [&](int rank, int, attnComm_t& comm) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    std::vector<float> o, l;
    Fill(rank, &o, &l);
    float* dO = ToDevice(o, s);
    float* dl = ToDevice(l, s);
    float* rs = nullptr;
    float* ag = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&rs), wantRs[size_t(rank)].size() * sizeof(float) + 4),
              cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ag), o.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(attnMergeAttnReduceScatter(dO, dl, rs, nullptr, kRows, kHeads, kD, attnFloat32, comm,
                                         reinterpret_cast<attnStream_t>(s)),
              attnSuccess)
        << attnGetLastError(comm);
    ASSERT_EQ(attnMergeAttnAllGather(dO, dl, ag, nullptr, kRows, kHeads, kD, attnFloat32, comm,
                                     reinterpret_cast<attnStream_t>(s)),
              attnSuccess)
        << attnGetLastError(comm);
    ExpectSame(ToHost(rs, wantRs[size_t(rank)].size(), s), wantRs[size_t(rank)], "reduce-scatter");
    ExpectSame(ToHost(ag, o.size(), s), wantAg[size_t(rank)], "all-gather");
    cudaFree(dO);
    cudaFree(dl);
    cudaFree(rs);
    cudaFree(ag);
    cudaStreamDestroy(s);
  }, opts);
}

}  // namespace
