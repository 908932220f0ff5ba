// Which of this rank's keys go to a peer in attnLevelAttention: per
// sequence, the round(keep * n) keys with the highest importance (at least
// one when keep > 0), ties by the earlier row, NaN lowest. The kept rows
// stay in their original order, so a block keeps its positions ascending
// wherever the shard had them so.
#pragma once

#include <cstdint>
#include <vector>

namespace attn {

// How many of n keys a peer gets at `keep`.
int64_t keptCount(int64_t n, float keep);
// An upper bound on the rows of a block of `rows` keys over `numSeqs`
// sequences at `keep` (what a receiver reserves before the block arrives).
int64_t keptBound(int64_t rows, int numSeqs, float keep);

struct KeptRows {
  std::vector<int32_t> offsets;  // [numSeqs+1] into rows
  std::vector<int32_t> rows;     // local key rows, ascending within a sequence
};

// offsets: [numSeqs+1] key rows per sequence (offsets[0] == 0);
// importance: [offsets[numSeqs]] or NULL (then keep must be 1).
KeptRows selectKept(int numSeqs, const int32_t* offsets, const float* importance, float keep);

}  // namespace attn
