// Messages of the attention collectives: a block of rows with the metadata
// that makes it self-describing (per-sequence offsets and global positions),
// so a receiver can attend to it without knowing where it came from, and
// no padding to equal sizes is ever needed.
//
//   header | offsets[num_seqs+1] | pos[rows] | pad to 64 B | tensor 0 | tensor 1
//
// KV blocks carry two tensors (K, V: [rows, Hkv, D]); Q blocks one
// ([rows, Hq, D]). Partial results going home are plain (O fp32, lse fp32)
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

// Sizes and offsets of a block with `rows` rows of `tensors` tensors of
// rowBytes each.
struct BlockLayout {
  size_t offsetsAt, posAt, tensorAt, tensorBytes, total;
  // For sizes this rank vouches for (its own rows, agreed counts).
  static BlockLayout of(int numSeqs, int64_t rows, size_t rowBytes, int tensors);
  // For any sizes: false when one is negative or a size overflows size_t.
  static bool checked(int64_t numSeqs, int64_t rows, size_t rowBytes, int tensors, BlockLayout* out);
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
               const void* t0, const void* t1, size_t rowBytes, std::vector<char>* out);
// The same into `out`, which has room for the layout's `total` bytes.
BlockLayout packBlockInto(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, const void* t0, const void* t1, size_t rowBytes, char* out);
// Writes a block's header, offsets and positions into `out` (room for the
// returned layout's `total` bytes); the caller fills the tensors at
// tensorAt. For tensors the host cannot read (device memory): copy them in.
BlockLayout packBlockMeta(int origin, int numSeqs, const int32_t* offsets, const int32_t* pos,
                          int64_t rows, size_t rowBytes, int tensors, char* out);
// What a receiver knows of a block before it reads it: the call's shape and
// what the sender may put in it.
struct BlockExpect {
  int from = -1;          // the peer it came from (errors name it)
  int nranks = 0;         // origins are ranks in [0, nranks)
  int origin = -1;        // the rank whose rows it must carry; -1: any
  int numSeqs = 0;        // the call's sequences: the block has exactly these
  int64_t maxRows = 0;    // at most this many rows
  bool exactRows = false; // ... and exactly that many
  size_t rowBytes = 0;    // one row of one tensor
  int tensors = 1;        // 1 (Q) or 2 (K, V)
  const char* what = "attention block";
};

// Reads a block from `data` of `bytes`. A pure function of its arguments
// (the fuzzing entry point of the attention messages): a block that is
// malformed or other than `want` describes is attnRemoteError naming
// want.from; *v then points into `data` only on success. `data` must be
// 4-byte aligned.
attnResult_t parseBlock(const char* data, size_t bytes, const BlockExpect& want, BlockView* v);

}  // namespace attn
