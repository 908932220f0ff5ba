// Force-included (-include) before each kernels/cuda source when it is
// compiled as host C++ for the SIMT simulator: the toolkit's headers first
// (their host side: types, fp16/bf16 conversions), then what nvcc would
// provide to device code, mapped onto the simulator (simt.h). The kernels'
// `#if __CUDA_ARCH__ >= 800` paths are the ones compiled (a Hopper part).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tests/cuda_emu/simt/simt.h"

#define ATTN_CUDA_SIMT 1
#define __CUDA_ARCH__ 900

// Shared memory is per block; a host thread runs one block at a time, so a
// thread_local is one block's. Dynamic shared memory is the kernels'
// `extern __shared__ ... smem[]` (kernels/cuda names it so), defined in
// simt_shared.cc with the opt-in limit's size.
#undef __shared__
#define __shared__ thread_local
#define __launch_bounds__(...)
namespace attn::cuda {
extern thread_local unsigned char smem[];
}

#define threadIdx (::attn_simt::ids().threadIdx)
#define blockIdx (::attn_simt::ids().blockIdx)
#define blockDim (::attn_simt::ids().blockDim)
#define gridDim (::attn_simt::ids().gridDim)

inline void __syncthreads() { attn_simt::blockBarrier(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) { attn_simt::warpBarrier(mask); }

namespace attn_simt {
inline int shuffleSource(unsigned mask, int width, int src) {
  if (mask != 0xffffffffu || width != 32) trap("warp shuffle: only full-warp shuffles are simulated");
  return src;
}
}  // namespace attn_simt

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return attn_simt::shuffle(v, attn_simt::shuffleSource(mask, width, src & 31));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  return attn_simt::shuffle(v, attn_simt::shuffleSource(mask, width, int(attn_simt::ids().lane) ^ laneMask));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = int(attn_simt::ids().lane), src = lane - int(delta);
  return attn_simt::shuffle(v, attn_simt::shuffleSource(mask, width, src < 0 ? lane : src));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = int(attn_simt::ids().lane), src = lane + int(delta);
  return attn_simt::shuffle(v, attn_simt::shuffleSource(mask, width, src > 31 ? lane : src));
}

// Blocks of one kernel run one after another on one host thread, but
// kernels on other streams run on other host threads: atomics are atomic.
template <class T>
T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    T old = *p, desired = old + v;
    while (!__atomic_compare_exchange(p, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      desired = old + v;
    return old;
  }
}

template <class T>
T __ldcs(const T* p) {
  return *p;
}

inline void __trap() { attn_simt::trap("__trap()"); }

inline float __log2f(float x) { return log2f(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }

// The integer and float min / max that CUDA puts in the global namespace.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
