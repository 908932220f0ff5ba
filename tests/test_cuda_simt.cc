// The SIMT simulator (tests/cuda_emu/simt) that runs kernels/cuda's own
// sources in emulated builds: its warp collectives, barriers, asynchronous
// copies, WMMA and launch checks must behave as a GPU's, or the kernel tests
// that run on it prove nothing. Built only with -DATTN_CUDA_EMULATION=ON;
// compiled like a kernel source (device_prelude.h is force-included).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mma_ptx.cuh"
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

// The PTX ISA's m16n8k16 layouts, written out here apart from the simulator:
// element e (0..7) of lane l's A fragment, (0..3) of its B fragment and
// (0..3) of its accumulator, as (row, column).
__host__ __device__ inline void ptxA(int l, int e, int& r, int& c) {
  r = l / 4 + ((e / 2) % 2) * 8;
  c = (l % 4) * 2 + e % 2 + (e / 4) * 8;
}
__host__ __device__ inline void ptxB(int l, int e, int& k, int& n) {
  k = (l % 4) * 2 + e % 2 + (e / 2) * 8;
  n = l / 4;
}
__host__ __device__ inline void ptxD(int l, int e, int& r, int& c) {
  r = l / 4 + (e / 2) * 8;
  c = (l % 4) * 2 + e % 2;
}

// One mma.sync m16n8k16 on fragments built by the layouts above (A 16x16 and
// B 8x16, both row major: B is stored by column, as K is); D written back
// by its layout. Then ldmatrix: A through an x4 load from shared memory,
// and the same 16x16 block transposed (.trans), each lane's registers
// written out as they land.
__global__ void simtPtxMma(const uint16_t* a, const uint16_t* bt, float* d, uint32_t* lds) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int l = int(threadIdx.x);
  uint32_t fa[4], fb[2];
  for (int i = 0; i < 4; ++i) {
    int r0, c0, r1, c1;
    ptxA(l, 2 * i, r0, c0);
    ptxA(l, 2 * i + 1, r1, c1);
    fa[i] = uint32_t(a[r0 * 16 + c0]) | uint32_t(a[r1 * 16 + c1]) << 16;
  }
  for (int i = 0; i < 2; ++i) {
    int k0, n0, k1, n1;
    ptxB(l, 2 * i, k0, n0);
    ptxB(l, 2 * i + 1, k1, n1);
    fb[i] = uint32_t(bt[n0 * 16 + k0]) | uint32_t(bt[n1 * 16 + k1]) << 16;
  }
  float acc[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  ptx::mma16816<__nv_bfloat16>(acc, fa, fb[0], fb[1]);
  for (int e = 0; e < 4; ++e) {
    int r, c;
    ptxD(l, e, r, c);
    d[r * 8 + c] = acc[e];
  }
  // A into shared memory with a padded row stride of 24 elements.
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  for (int i = l; i < 256; i += 32) s[(i / 16) * 24 + i % 16] = a[i];
  __syncwarp();
  uint32_t r[4], rt[4];
  const uint16_t* row = s + (l % 16) * 24 + (l / 16) * 8;
  ptx::ldmatrixX4(r, row);
  ptx::ldmatrixX4Trans(rt, row);
  for (int i = 0; i < 4; ++i) lds[l * 8 + i] = r[i], lds[l * 8 + 4 + i] = rt[i];
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

// mma.sync and ldmatrix (kernels/cuda/mma_ptx.cuh) on the simulator follow
// the PTX ISA's layouts: the product lands where the accumulator layout
// says, an x4 ldmatrix of a 16x16 block gives the A fragment, and the
// transposed load gives the B fragments of that block read as V is (rows
// = k): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
TEST(CudaSimt, PtxMmaAndLdmatrixFollowTheDocumentedLayouts) {
  std::vector<uint16_t> a(256), bt(128);
  auto bits = [](float f) {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    return u;
  };
  auto val = [](uint16_t u) {
    const uint32_t w = uint32_t(u) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
  };
  for (int i = 0; i < 256; ++i) a[i] = bits(float((i * 7) % 13) / 4 - 1);
  for (int i = 0; i < 128; ++i) bt[i] = bits(float((i * 5) % 11) / 8 - 0.5f);
  DevArray<uint16_t> da(256), db(128);
  DevArray<float> dd(128, std::nanf(""));
  DevArray<uint32_t> dl(32 * 8);
  ASSERT_EQ(cudaMemcpy(da.p, a.data(), 512, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db.p, bt.data(), 256, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(launchKernel("simtPtxMma", simtPtxMma, 1, 32, 16 * 24 * 2, nullptr, da.p, db.p, dd.p, dl.p),
            attnSuccess);
  const std::vector<float> d = dd.get();
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double want = 0.5;
      for (int k = 0; k < 16; ++k) want += double(val(a[r * 16 + k])) * val(bt[n * 16 + k]);
      EXPECT_NEAR(d[r * 8 + n], want, 1e-4) << r << "," << n;
    }
  const std::vector<uint32_t> got = dl.get();
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      int r0, c0, r1, c1;
      ptxA(l, 2 * i, r0, c0);
      ptxA(l, 2 * i + 1, r1, c1);
      EXPECT_EQ(got[l * 8 + i], uint32_t(a[r0 * 16 + c0]) | uint32_t(a[r1 * 16 + c1]) << 16)
          << "ldmatrix lane " << l << " register " << i;
      // Transposed: register i is B fragment register i % 2 of column block i / 2,
      // with B (k, n) = stored (row k, column n).
      int k0, n0, k1, n1;
      ptxB(l, 2 * (i % 2), k0, n0);
      ptxB(l, 2 * (i % 2) + 1, k1, n1);
      n0 += 8 * (i / 2), n1 += 8 * (i / 2);
      EXPECT_EQ(got[l * 8 + 4 + i], uint32_t(a[k0 * 16 + n0]) | uint32_t(a[k1 * 16 + n1]) << 16)
          << "ldmatrix.trans lane " << l << " register " << i;
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
