// nvcuda::wmma for kernels run on the SIMT simulator: 16x16x16 fragments
// spread over the 32 lanes of a warp, 8 elements each. The element ->
// (row, column) map is deliberately not the hardware's (which is
// undocumented): kernel code that relies on a layout instead of asking
// for it (see attention_wmma.cuh's rowOf) computes wrong results here.
// Loads and stores are per lane and imply no barrier: what other lanes
// wrote needs a __syncwarp first, as on the GPU. mma_sync exchanges the
// fragments through the warp (one barrier).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "tests/cuda_emu/simt/simt.h"

namespace nvcuda::wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
constexpr int kElems = 8;
// Element i of `lane` is (row, col) of the 16x16 tile.
inline int rowOf(unsigned lane, int i) { return int((lane % 16 + 3u * unsigned(i)) % 16); }
inline int colOf(unsigned lane, int i) { return int(lane / 16) * 8 + i; }
inline float toFloat(float v) { return v; }
inline float toFloat(__half v) { return __half2float(v); }
inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> T fromFloat(float v);
template <> inline float fromFloat<float>(float v) { return v; }
template <> inline __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <class Layout> constexpr bool kRowMajor = std::is_same_v<Layout, row_major>;
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the simulator has 16x16x16 fragments only");
  static constexpr int num_elements = detail::kElems;
  T x[detail::kElems];
};

template <class Use, class T, class Layout, class V>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, V v) {
  for (int i = 0; i < detail::kElems; ++i) f.x[i] = detail::fromFloat<T>(detail::toFloat(v));
}

// matrix_a is rows x k, matrix_b k x columns; Layout says how memory holds them.
template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators take a layout_t");
  const unsigned lane = attn_simt::ids().lane;
  for (int i = 0; i < detail::kElems; ++i) {
    const int r = detail::rowOf(lane, i), c = detail::colOf(lane, i);
    f.x[i] = detail::kRowMajor<Layout> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}

template <class T>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, T, void>& f, const T* p, unsigned ldm,
                      layout_t layout) {
  const unsigned lane = attn_simt::ids().lane;
  for (int i = 0; i < detail::kElems; ++i) {
    const int r = detail::rowOf(lane, i), c = detail::colOf(lane, i);
    f.x[i] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}

template <class T>
void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T, void>& f, unsigned ldm,
                       layout_t layout) {
  const unsigned lane = attn_simt::ids().lane;
  for (int i = 0; i < detail::kElems; ++i) {
    const int r = detail::rowOf(lane, i), c = detail::colOf(lane, i);
    (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[i];
  }
}

// d = a b + c: products of the inputs are exact in fp32 and sum in fp32,
// as on tensor cores (the order of the sum differs).
template <class T, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, 16, 16, 16, TC, void>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, TC, void>& c) {
  const unsigned lane = attn_simt::ids().lane;
  float* shared = reinterpret_cast<float*>(attn_simt::warpExchange());
  float* A = shared;        // 16 x 16, row major
  float* B = shared + 256;  // 16 x 16, row major
  for (int i = 0; i < detail::kElems; ++i) {
    const int r = detail::rowOf(lane, i), cc = detail::colOf(lane, i);
    A[r * 16 + cc] = detail::toFloat(a.x[i]);
    B[r * 16 + cc] = detail::toFloat(b.x[i]);
  }
  attn_simt::warpBarrier();
  TC out[detail::kElems];
  for (int i = 0; i < detail::kElems; ++i) {
    const int r = detail::rowOf(lane, i), cc = detail::colOf(lane, i);
    float s = detail::toFloat(c.x[i]);
    for (int k = 0; k < 16; ++k) s += A[r * 16 + k] * B[k * 16 + cc];
    out[i] = detail::fromFloat<TC>(s);
  }
  for (int i = 0; i < detail::kElems; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
