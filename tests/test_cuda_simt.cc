// The SIMT simulator (tests/cuda_emu/simt) that runs kernels/cuda's own
// sources in emulated builds: its warp collectives, barriers, asynchronous
// copies, WMMA and launch checks must behave as a GPU's, or the kernel tests
// that run on it prove nothing. Built only with -DATTN_CUDA_EMULATION=ON;
// compiled like a kernel source (device_prelude.h is force-included).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "tests/cuda_emu/simt/include/cuda_pipeline_primitives.h"
#include "tests/cuda_emu/simt/include/mma.h"

// Kernels sit in attn::cuda itself: their `extern __shared__` declarations
// name the dynamic shared memory the prelude declares there.
namespace attn::cuda {

__global__ void simtShuffles(int* out) {
  const int t = int(threadIdx.x), n = int(blockDim.x);
  out[t] = __shfl_xor_sync(0xffffffffu, t * 10, 5);
  out[n + t] = __shfl_up_sync(0xffffffffu, t * 10, 3);
  out[2 * n + t] = __shfl_down_sync(0xffffffffu, t * 10, 3);
  out[3 * n + t] = __shfl_sync(0xffffffffu, t * 10, 7);
}

// Each thread writes its slot, then reads its neighbour's: right only if the
// barrier holds every thread until all have written.
__global__ void simtNeighbours(int* out) {
  __shared__ int s[256];
  const int t = int(threadIdx.x), n = int(blockDim.x);
  s[t] = t + int(blockIdx.x) * 1000;
  __syncthreads();
  out[blockIdx.x * n + t] = s[(t + 1) % n];
}

// Groups of four lanes synchronise among themselves only.
__global__ void simtQuads(int* out) {
  __shared__ int s[32];
  const unsigned lane = threadIdx.x;
  s[lane] = int(lane) * 3;
  __syncwarp(0xfu << (lane & ~3u));
  out[lane] = s[(lane & ~3u) | ((lane + 1) & 3u)];
}

// Two groups of copies: after wait_prior(1) only the first has landed.
__global__ void simtAsyncCopies(const float* src, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* s = reinterpret_cast<float*>(smem);
  __pipeline_memcpy_async(s, src, 16);
  out[0] = s[0];  // not waited for: garbage on a GPU, NaN here
  __pipeline_commit();
  __pipeline_memcpy_async(s + 4, src + 4, 16);
  __pipeline_commit();
  __pipeline_wait_prior(1);
  out[1] = s[0];
  out[2] = s[4];
  __pipeline_wait_prior(0);
  out[3] = s[4];
}

// D = A B + C on one warp, A row major, B column major, C and D row major.
__global__ void simtOneMma(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

__global__ void simtCount(unsigned long long* n) { atomicAdd(n, 1ull); }

__global__ void simtBigShared(int* out) {
  extern __shared__ unsigned char smem[];
  smem[100 << 10] = 7;
  out[0] = smem[100 << 10];
}

// Lane 0 waits at the block barrier, the others at a warp barrier that
// needs lane 0: a GPU hangs; the simulator reports a deadlock.
__global__ void simtDivergentBarriers() {
  if (threadIdx.x == 0) __syncthreads();
  else __syncwarp();
}

namespace {

template <class T>
struct DevArray {
  T* p = nullptr;
  size_t n;
  explicit DevArray(size_t count, T init = T()) : n(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), cudaSuccess);
    std::vector<T> h(n, init);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DevArray() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(CudaSimt, ShufflesStayInsideTheirWarp) {
  DevArray<int> out(4 * 64);
  ASSERT_EQ(launchKernel("simtShuffles", simtShuffles, 1, 64, 0, nullptr, out.p), attnSuccess);
  const std::vector<int> h = out.get();
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, base = t - lane;
    EXPECT_EQ(h[t], (base + (lane ^ 5)) * 10) << t;
    EXPECT_EQ(h[64 + t], (lane < 3 ? t : t - 3) * 10) << t;
    EXPECT_EQ(h[128 + t], (lane > 28 ? t : t + 3) * 10) << t;
    EXPECT_EQ(h[192 + t], (base + 7) * 10) << t;
  }
}

TEST(CudaSimt, BlockBarrierOrdersSharedMemoryInEveryBlock) {
  DevArray<int> out(3 * 256);
  ASSERT_EQ(launchKernel("simtNeighbours", simtNeighbours, 3, 256, 0, nullptr, out.p), attnSuccess);
  const std::vector<int> h = out.get();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) EXPECT_EQ(h[b * 256 + t], (t + 1) % 256 + b * 1000);
}

TEST(CudaSimt, PartialMaskSyncwarpJoinsOnlyItsLanes) {
  DevArray<int> out(32);
  ASSERT_EQ(launchKernel("simtQuads", simtQuads, 1, 32, 0, nullptr, out.p), attnSuccess);
  const std::vector<int> h = out.get();
  for (unsigned l = 0; l < 32; ++l) EXPECT_EQ(h[l], int((l & ~3u) | ((l + 1) & 3u)) * 3);
}

TEST(CudaSimt, AsyncCopiesLandWhenTheirGroupIsWaitedFor) {
  DevArray<float> src(8, 2.5f), out(4, 0.0f);
  ASSERT_EQ(launchKernel("simtAsyncCopies", simtAsyncCopies, 1, 1, 64, nullptr, src.p, out.p), attnSuccess);
  const std::vector<float> h = out.get();
  EXPECT_TRUE(std::isnan(h[0]));
  EXPECT_EQ(h[1], 2.5f);
  EXPECT_TRUE(std::isnan(h[2]));
  EXPECT_EQ(h[3], 2.5f);
}

TEST(CudaSimt, WmmaComputesTheMatrixProduct) {
  std::vector<__nv_bfloat16> a(256), b(256);
  std::vector<float> c(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16_rn(float((i * 7) % 13) / 4 - 1);
    b[i] = __float2bfloat16_rn(float((i * 5) % 11) / 8 - 0.5f);
    c[i] = float(i % 9) - 4;
  }
  DevArray<__nv_bfloat16> da(256), db(256);
  DevArray<float> dc(256), dd(256);
  ASSERT_EQ(cudaMemcpy(da.p, a.data(), 512, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db.p, b.data(), 512, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dc.p, c.data(), 1024, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(launchKernel("simtOneMma", simtOneMma, 1, 32, 0, nullptr, da.p, db.p, dc.p, dd.p), attnSuccess);
  const std::vector<float> d = dd.get();
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      double want = c[r * 16 + col];
      for (int k = 0; k < 16; ++k)
        want += double(__bfloat162float(a[r * 16 + k])) * __bfloat162float(b[col * 16 + k]);
      EXPECT_NEAR(d[r * 16 + col], want, 1e-4) << r << "," << col;
    }
}

TEST(CudaSimt, AtomicsCountEveryThreadOfEveryBlock) {
  DevArray<unsigned long long> n(1, 0);
  ASSERT_EQ(launchKernel("simtCount", simtCount, dim3(3, 2, 2), dim3(32, 2), 0, nullptr, n.p), attnSuccess);
  EXPECT_EQ(n.get()[0], 3ull * 2 * 2 * 64);
}

TEST(CudaSimt, LaunchesAreCheckedAsOnAGpu) {
  DevArray<int> out(1, 0);
  // More than 48 KiB of dynamic shared memory needs the kernel's opt-in.
  EXPECT_EQ(launchKernel("simtBigShared", simtBigShared, 1, 1, 128 << 10, nullptr, out.p), attnUnhandledCudaError);
  ASSERT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(simtBigShared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 128 << 10),
            cudaSuccess);
  EXPECT_EQ(launchKernel("simtBigShared", simtBigShared, 1, 1, 128 << 10, nullptr, out.p), attnSuccess);
  EXPECT_EQ(out.get()[0], 7);
  EXPECT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(simtBigShared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 300 << 10),
            cudaErrorInvalidValue);
  EXPECT_EQ(launchKernel("simtCount", simtCount, 1, 2048, 0, nullptr, nullptr), attnUnhandledCudaError);
  EXPECT_EQ(launchKernel("simtCount", simtCount, 0, 32, 0, nullptr, nullptr), attnUnhandledCudaError);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // launch errors are not sticky
}

TEST(CudaSimt, ABarrierNotEveryThreadReachesIsAFault) {
  // The fault is sticky: the check runs in a fresh process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // The launch may already see the fault (cudaGetLastError returns a
        // sticky error as soon as it happens); the synchronisation must.
        (void)launchKernel("simtDivergentBarriers", simtDivergentBarriers, 1, 32, 0, nullptr);
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      testing::ExitedWithCode(0), "simtDivergentBarriers: block \\(0,0,0\\): deadlock");
}

}  // namespace
}  // namespace attn::cuda
