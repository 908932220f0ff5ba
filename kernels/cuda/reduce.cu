// Element-wise reductions and fp32 conversions on device memory (contracts
// of kernels/cpu/reduce.h and convert.h): all 8 types x 5 ops; integers wrap
// (done unsigned), floating max/min propagate NaN, fp16/bf16 combine in fp32
// and round to nearest even. Grid-stride loops over 16-byte vectors when
// every pointer allows, elements otherwise.
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kernel_status.h"

namespace attn::cuda {
namespace {

struct Fp16Tag {};
struct Bf16Tag {};

// Storage type, and the type the operation is computed in.
template <class T> struct Elem { using S = T; using C = T; };
template <> struct Elem<Fp16Tag> { using S = uint16_t; using C = float; };
template <> struct Elem<Bf16Tag> { using S = uint16_t; using C = float; };

template <class T> __device__ inline typename Elem<T>::C widen(typename Elem<T>::S v) { return v; }
template <> __device__ inline float widen<Fp16Tag>(uint16_t v) { return __half2float(__ushort_as_half(v)); }
template <> __device__ inline float widen<Bf16Tag>(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
template <class T> __device__ inline typename Elem<T>::S narrow(typename Elem<T>::C v) { return v; }
template <> __device__ inline uint16_t narrow<Fp16Tag>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <> __device__ inline uint16_t narrow<Bf16Tag>(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <class C> __device__ inline C wrapAdd(C a, C b) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(a) + std::make_unsigned_t<C>(b));
  else return a + b;
}
template <class C> __device__ inline C wrapMul(C a, C b) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(a) * std::make_unsigned_t<C>(b));
  else return a * b;
}

template <class C> __device__ inline C combine(C a, C b, attnRedOp_t op) {
  switch (op) {
    case attnProd: return wrapMul(a, b);
    case attnMax: return (a > b) | (a != a) ? a : b;  // NaN on either side wins (a != a: NaN)
    case attnMin: return (a < b) | (a != a) ? a : b;
    default: return wrapAdd(a, b);  // attnSum, attnAvg
  }
}

template <class T, attnRedOp_t Op>
__device__ inline typename Elem<T>::S apply(typename Elem<T>::S x, typename Elem<T>::S y) {
  return narrow<T>(combine(widen<T>(x), widen<T>(y), Op));
}

// d = a op b; d may alias a or b (each element is read before it is written).
template <class T, attnRedOp_t Op, bool kVec>
__global__ void reduceKernel(typename Elem<T>::S* d, const typename Elem<T>::S* a,
                             const typename Elem<T>::S* b, size_t n) {
  using S = typename Elem<T>::S;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if constexpr (kVec) {
    constexpr int kW = 16 / sizeof(S);
    union V { uint4 u; S e[kW]; };
    for (; i < n / kW; i += stride) {
      V x, y;
      x.u = reinterpret_cast<const uint4*>(a)[i];
      y.u = reinterpret_cast<const uint4*>(b)[i];
#pragma unroll
      for (int j = 0; j < kW; ++j) x.e[j] = apply<T, Op>(x.e[j], y.e[j]);
      reinterpret_cast<uint4*>(d)[i] = x.u;
    }
    // Tail: the last n % kW elements, one per thread of the first block.
    const size_t t = (n / kW) * kW + threadIdx.x;
    if (blockIdx.x == 0 && t < n) d[t] = apply<T, Op>(a[t], b[t]);
  } else {
    for (; i < n; i += stride) d[i] = apply<T, Op>(a[i], b[i]);
  }
}

template <class T>
__global__ void divideKernel(typename Elem<T>::S* d, size_t n, int by) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral_v<typename Elem<T>::C>) d[i] = typename Elem<T>::S(int64_t(d[i]) / by);
    else d[i] = narrow<T>(widen<T>(d[i]) / typename Elem<T>::C(by));
  }
}

template <class T, attnRedOp_t Op>
attnResult_t launchReduce(void* d, const void* a, const void* b, size_t n, cudaStream_t s) {
  using S = typename Elem<T>::S;
  const bool vec = aligned(d, 16) && aligned(a, 16) && aligned(b, 16);
  // Vector path: 16 bytes per thread per step; grid capped, the loop strides.
  const size_t units = vec ? n / (16 / sizeof(S)) + 1 : n;
  const unsigned grid = gridFor(units, 256, 4096);
  return launchKernel("reduce launch", vec ? reduceKernel<T, Op, true> : reduceKernel<T, Op, false>, grid,
                      256, 0, s, static_cast<S*>(d), static_cast<const S*>(a), static_cast<const S*>(b), n);
}

template <class T>
attnResult_t reduceT(void* d, const void* a, const void* b, size_t n, attnRedOp_t op, cudaStream_t s) {
  switch (op) {
    case attnProd: return launchReduce<T, attnProd>(d, a, b, n, s);
    case attnMax: return launchReduce<T, attnMax>(d, a, b, n, s);
    case attnMin: return launchReduce<T, attnMin>(d, a, b, n, s);
    default: return launchReduce<T, attnSum>(d, a, b, n, s);
  }
}

template <class F>
attnResult_t byType(attnDataType_t t, F&& f) {
  switch (t) {
    case attnInt8: return f(int8_t{});
    case attnUint8: return f(uint8_t{});
    case attnInt32: return f(int32_t{});
    case attnInt64: return f(int64_t{});
    case attnFloat16: return f(Fp16Tag{});
    case attnFloat32: return f(float{});
    case attnFloat64: return f(double{});
    case attnBfloat16: return f(Bf16Tag{});
    default: return attnInvalidArgument;
  }
}

template <class T, bool kToFloat>
__global__ void convertKernel(void* dst, const void* src, size_t n) {
  using S = typename Elem<T>::S;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (kToFloat) static_cast<float*>(dst)[i] = widen<T>(static_cast<const S*>(src)[i]);
    else static_cast<S*>(dst)[i] = narrow<T>(static_cast<const float*>(src)[i]);
  }
}

template <bool kToFloat>
attnResult_t convert(void* dst, const void* src, attnDataType_t type, size_t count, cudaStream_t s) {
  KERNEL_REQUIRE(type == attnFloat32 || type == attnFloat16 || type == attnBfloat16,
               "cuda convert: dtype %d is not fp32, fp16 or bf16", int(type));
  if (count == 0) return attnSuccess;
  KERNEL_REQUIRE(dst && src, "cuda convert: null pointer");
  if (type == attnFloat32) {
    if (dst == src) return attnSuccess;
    return cudaResult(cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyDeviceToDevice, s),
                      "cudaMemcpyAsync (convert)");
  }
  const unsigned grid = gridFor(count, 256, 4096);
  return launchKernel("convert launch",
                      type == attnFloat16 ? convertKernel<Fp16Tag, kToFloat> : convertKernel<Bf16Tag, kToFloat>,
                      grid, 256, 0, s, dst, src, count);
}

}  // namespace

attnResult_t reduce2(void* dst, const void* a, const void* b, size_t count, attnDataType_t type,
                     attnRedOp_t op, cudaStream_t stream) {
  KERNEL_REQUIRE(kernels::validType(type), "cuda reduce: bad data type %d", int(type));
  KERNEL_REQUIRE(kernels::validOp(op), "cuda reduce: bad op %d", int(op));
  if (count == 0) return attnSuccess;
  KERNEL_REQUIRE(dst && a && b, "cuda reduce: null pointer");
  return byType(type, [&](auto tag) { return reduceT<decltype(tag)>(dst, a, b, count, op, stream); });
}

attnResult_t reduceInto(void* dst, const void* src, size_t count, attnDataType_t type,
                        attnRedOp_t op, cudaStream_t stream) {
  return reduce2(dst, dst, src, count, type, op, stream);
}

attnResult_t divideInPlace(void* dst, size_t count, attnDataType_t type, int n,
                           cudaStream_t stream) {
  KERNEL_REQUIRE(kernels::validType(type), "cuda divide: bad data type %d", int(type));
  KERNEL_REQUIRE(n != 0, "cuda divide: division by zero");
  if (count == 0) return attnSuccess;
  KERNEL_REQUIRE(dst, "cuda divide: null pointer");
  return byType(type, [&](auto tag) {
    using T = decltype(tag);
    return launchKernel("divide launch", divideKernel<T>, gridFor(count, 256, 4096), 256, 0, stream,
                        static_cast<typename Elem<T>::S*>(dst), count, n);
  });
}

attnResult_t convertToFloat(float* dst, const void* src, attnDataType_t type, size_t count,
                            cudaStream_t stream) {
  return convert<true>(dst, src, type, count, stream);
}

attnResult_t convertFromFloat(void* dst, attnDataType_t type, const float* src, size_t count,
                              cudaStream_t stream) {
  return convert<false>(dst, src, type, count, stream);
}

}  // namespace attn::cuda
