// Helpers shared by the .cu files: element loads/stores as fp32 for the
// three attention dtypes, launch checking, alignment tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace attn::cuda {

// Storage types by attnDataType_t; fp16/bf16 are read and written as bits
// and converted with the device intrinsics (round to nearest even).
template <class T> struct F32;
template <> struct F32<float> {
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <> struct F32<__half> {
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <> struct F32<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

inline bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Blocks for `work` items of `per_block` each, capped for a grid-stride loop.
inline unsigned gridFor(size_t work, unsigned per_block, unsigned cap = 1u << 16) {
  size_t g = (work + per_block - 1) / per_block;
  if (g == 0) g = 1;
  return g > cap ? cap : unsigned(g);
}

// The launch error of the kernel just enqueued (configuration, missing
// device code for this GPU, ...), as a readable attnResult_t.
inline attnResult_t checkLaunch(const char* kernel) { return cudaResult(cudaGetLastError(), kernel); }

// Enqueues kern<<<grid, block, smemBytes, stream>>>(args...) and returns its
// launch error. Built for the SIMT simulator (tests/cuda_emu/simt: the
// kernels' own tests on machines without a GPU), the same kernel runs on
// simulated threads of the emulated runtime instead.
template <class... P, class... A>
attnResult_t launchKernel(const char* name, void (*kern)(P...), dim3 grid, dim3 block, size_t smemBytes,
                          cudaStream_t stream, A... args) {
#if defined(ATTN_CUDA_SIMT)
  attn_simt::launch(reinterpret_cast<const void*>(kern), name, grid, block, smemBytes, stream,
                    [] { return smem; }, [kern, args...] { kern(P(args)...); });
#else
  kern<<<grid, block, smemBytes, stream>>>(P(args)...);
#endif
  return checkLaunch(name);
}

}  // namespace attn::cuda
