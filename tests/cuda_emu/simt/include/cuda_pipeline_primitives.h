// The toolkit's cp.async primitives for kernels run on the SIMT simulator:
// a copy's destination reads as NaN bytes until its thread waits for it.
#pragma once

#include <cstddef>

#include "tests/cuda_emu/simt/simt.h"

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes, size_t zfill = 0) {
  if (bytes != 4 && bytes != 8 && bytes != 16) attn_simt::trap("__pipeline_memcpy_async: size not 4, 8 or 16");
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % bytes)
    attn_simt::trap("__pipeline_memcpy_async: misaligned address");
  if (zfill > bytes) attn_simt::trap("__pipeline_memcpy_async: zero fill beyond the copy");
  attn_simt::copyAsync(dst, src, bytes - zfill);
  if (zfill) std::memset(static_cast<char*>(dst) + (bytes - zfill), 0, zfill);
}
inline void __pipeline_commit() { attn_simt::commitCopies(); }
inline void __pipeline_wait_prior(size_t prior) { attn_simt::waitCopiesPrior(unsigned(prior)); }
