// Element-wise reductions on host memory for every public type and op.
// fp16 and bf16 are widened to fp32, combined, and rounded back (round to
// nearest even), so each step of a reduction is computed in fp32 (as NCCL).
// attnAvg combines as attnSum; the caller finishes with divideInPlace.
#pragma once

#include <cstddef>

#include "attncomm.h"

namespace attn::cpu {

// dst[i] = dst[i] op src[i]
void reduceInto(void* dst, const void* src, size_t count, attnDataType_t type,
                attnRedOp_t op);
// dst[i] = a[i] op b[i]; dst may alias a or b.
void reduce2(void* dst, const void* a, const void* b, size_t count,
             attnDataType_t type, attnRedOp_t op);
// dst[i] = dst[i] / n (integer types: truncating division).
void divideInPlace(void* dst, size_t count, attnDataType_t type, int n);

}  // namespace attn::cpu
