// The SIMT simulator's device side: what CUDA kernel code compiled for the
// host (see device_prelude.h) calls for its thread indices, barriers, warp
// collectives and asynchronous copies. One block runs at a time per host
// thread, its GPU threads as fibers (fiber.h) scheduled by simt_block.cc.
//
// What it is faithful to, because that is where kernel bugs hide:
//  - a thread runs until it reaches a barrier or a warp collective, so a
//    missing __syncthreads / __syncwarp lets other threads read what was
//    not written yet;
//  - a barrier that not every live thread of its block (or warp) reaches is
//    a deadlock, reported as a kernel fault;
//  - an asynchronous copy (cp.async) fills its destination with NaN bytes
//    until the issuing thread waits for its group;
//  - dynamic shared memory starts as NaN bytes.
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include <cuda_runtime_api.h>

namespace attn_simt {

struct ThreadIds {
  uint3 threadIdx, blockIdx;
  dim3 blockDim, gridDim;
  unsigned lane, warp;
};
// The running simulated thread's indices.
const ThreadIds& ids();

// __syncthreads: every live thread of the block.
void blockBarrier();
// __syncwarp(mask): every live lane of `mask`, which must hold the caller.
void warpBarrier(unsigned mask = 0xffffffffu);
// This warp's exchange buffer for the next warp collective (4 KiB): write
// your part, warpBarrier(), read the others'. Buffers alternate, so a lane
// that runs ahead into the following collective cannot overwrite it.
unsigned char* warpExchange();

// A full-warp shuffle of a value of up to 8 bytes: `v` from lane `src`
// (this lane's own value when `src` is outside the warp).
template <class T>
T shuffle(T v, int src) {
  static_assert(sizeof(T) <= 8, "values of up to 8 bytes");
  unsigned char* buf = warpExchange();
  std::memcpy(buf + ids().lane * 8, &v, sizeof(T));
  warpBarrier();
  if (src < 0 || src >= 32) return v;
  T r;
  std::memcpy(&r, buf + unsigned(src) * 8, sizeof(T));
  return r;
}

// ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16, a warp collective:
// lanes 8i..8i+7 give the row addresses of 8x8 matrix i (16 bytes each,
// 16-byte aligned; count <= 4); r[i] of lane l receives row l / 4, elements
// 2 (l % 4) and 2 (l % 4) + 1 of matrix i (of its transpose with `trans`),
// the first in the low 16 bits.
void loadMatrices(uint32_t* r, int count, bool trans, const void* row);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, a warp
// collective: d += a b with the PTX ISA's fragment layouts (lane l, g = l / 4,
// t = l % 4; pairs of 16-bit elements, the first in the low half):
//   a[0] (g, 2t..2t+1)  a[1] (g+8, 2t..)  a[2] (g, 2t+8..)  a[3] (g+8, 2t+8..)
//   b[0] (k 2t..2t+1, n g)  b[1] (k 2t+8.., n g)
//   d[0], d[1] (g, 2t), (g, 2t+1)  d[2], d[3] (g+8, 2t), (g+8, 2t+1)
// Products are exact in fp32 and summed in fp32 (in an order of its own).
void mmaM16N8K16(float* d, const uint32_t* a, const uint32_t* b, bool bf16);

// cp.async: `dst` reads as NaN bytes until this thread waits for the group.
void copyAsync(void* dst, const void* src, size_t bytes);
void commitCopies();
void waitCopiesPrior(unsigned newest);  // all but the `newest` committed groups

// __trap and faults detected in device code: ends the kernel with a
// cudaErrorLaunchFailure naming `why`.
[[noreturn]] void trap(const char* why);

// The dynamic shared memory of blocks run by the calling host thread (the
// kernels' `extern __shared__` array, thread-local: blocks of kernels on
// other streams run on other host threads).
using SharedMemoryOf = unsigned char* (*)();

// Runs `body` on every thread of every block of grid x block, block after
// block, with `dynamicSmem` bytes of dynamic shared memory. Returns an
// empty string, or why the kernel failed.
std::string runGrid(dim3 grid, dim3 block, SharedMemoryOf smem, size_t dynamicSmem,
                    const std::function<void()>& body);

// Enqueues the grid on `stream` (the emulated runtime's), after checking the
// configuration as cudaLaunchKernel does: the launch error becomes the
// calling thread's last error, a failure while running a sticky fault.
void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t dynamicSmem,
            cudaStream_t stream, SharedMemoryOf smem, std::function<void()> body);

}  // namespace attn_simt
