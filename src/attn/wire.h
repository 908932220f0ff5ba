// Messages of the attention collectives: a block of rows with the metadata
// that makes it self-describing (per-sequence offsets and global positions),
// so a receiver can attend to it without knowing where it came from, and
// no padding to equal sizes is ever needed.
//
//   header | offsets[num_seqs+1] | pos[rows] | pad to 64 B | tensor 0 | tensor 1
//
// KV blocks carry two tensors (K [rows, Hkv, D], V [rows, Hkv, Dv]); Q
// blocks one ([rows, Hq, D]). Partial results going home are plain (O fp32, lse fp32)
// for the owner's rows, in one message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attncomm.h"

namespace attn {

struct BlockHeader {
  uint32_t magic;
  int32_t origin;    // rank whose shard this is
  int32_t num_seqs;
  int32_t rows;
};

// Bytes of one row of each tensor a block carries: Q blocks one,
// KV blocks two, K then V, whose rows differ when V has a head dim of its
// own (MLA).
struct RowBytes {
  size_t t0 = 0, t1 = 0;
  int tensors = 1;
  static RowBytes one(size_t b) { return {b, 0, 1}; }
  static RowBytes two(size_t k, size_t v) { return {k, v, 2}; }
};

// Sizes and offsets of a block with `rows` rows of each tensor.
struct BlockLayout {
  size_t offsetsAt, posAt;
  size_t t0At, t0Bytes;  // tensor 0, 64-byte aligned
  size_t t1At, t1Bytes;  // tensor 1, right after it (t1Bytes 0: none)
  size_t total;
  // For sizes this rank vouches for (its own rows, agreed counts).
  static BlockLayout of(int numSeqs, int64_t rows, RowBytes rowBytes);
  // For any sizes: false when one is negative or a size overflows size_t.
  static bool checked(int64_t numSeqs, int64_t rows, RowBytes rowBytes, BlockLayout* out);
};

// A view of a received (or packed) block.
struct BlockView {
  int origin = -1;
  int numSeqs = 0;
  int32_t rows = 0;
  const int32_t* offsets = nullptr;
  const int32_t* pos = nullptr;
  const void* t0 = nullptr;
  const void* t1 = nullptr;
};

// Packs rows into `out` (resized to fit).
void packBlock(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos, int64_t rows,
               const void* t0, const void* t1, RowBytes rowBytes, std::vector<char>* out);
// The same into `out`, which has room for the layout's `total` bytes.
BlockLayout packBlockInto(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, const void* t0, const void* t1, RowBytes rowBytes, char* out);
// Writes a block's header, offsets and positions into `out` (room for the
// returned layout's `total` bytes); the caller fills the tensors at t0At
// and t1At. For tensors the host cannot read (device memory): copy them in.
BlockLayout packBlockMeta(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, RowBytes rowBytes, char* out);
// What a receiver knows of a block before it reads it: the call's shape and
// what the sender may put in it.
struct BlockExpect {
  int from = -1;          // the peer it came from (errors name it)
  int nranks = 0;         // origins are ranks in [0, nranks)
  int origin = -1;        // the rank whose rows it must carry; -1: any
  int numSeqs = 0;        // the call's sequences: the block has exactly these
  int64_t maxRows = 0;    // at most this many rows
  bool exactRows = false; // ... and exactly that many
  RowBytes rowBytes;      // one row of each tensor: Q, or K and V
  const char* what = "attention block";
};

// Reads a block from `data` of `bytes`. A pure function of its arguments
// (the fuzzing entry point of the attention messages): a block that is
// malformed or other than `want` describes is attnRemoteError naming
// want.from; *v then points into `data` only on success. `data` must be
// 4-byte aligned.
attnResult_t parseBlock(const char* data, size_t bytes, const BlockExpect& want, BlockView* v);

}  // namespace attn
