// Internal: the unit of attention work that one ISA kernel runs, and the
// per-thread scratch it uses. Built by attention.cc, run by isa_*.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention.h"

namespace attn::cpu {

constexpr int kAttnKeyTile = 64;       // keys per tile
constexpr int kAttnMaxTileRows = 256;  // stacked (query row, head) pairs per tile

// Constants of one call, shared by its tasks.
struct AttnCall {
  const AttnProblem* p;
  const AttnSegment* segs;
  float* o;
  float* lse;
  bool accumulate;   // start from (o, lse) instead of empty
  float scale_log2;  // scale * log2(e): scores are kept in base 2
  int group;         // query heads per kv head
  int dpad;          // head_dim rounded up to 16: row stride of qr and qr16
  int dv;            // V's and O's head dim (valueDim)
  int dvpad;         // dv rounded up to 16: row stride of acc and vbuf
  // K and V as fp32, head-major ([kv head][key][head_dim], V rows of dv
  // padded to dvpad), when the call packs them; null: tiles read p.k / p.v
  // directly.
  const float* kpack;
  const float* vpack;
  float softcap_log2;  // softcap * log2(e): the cap of the base-2 scores; 0: none
  VisibleSpan span;    // the keys a query sees (causal, window)
};

// Tile rows [m_begin, m_end) of the flattened (row, head-in-group) index
// m = (q_row - q_begin) * group + h % group, for kv heads
// [kv_head, kv_head + kv_heads) of segment seg. Several kv heads share a task
// only when their rows are few (decode): the tile then holds one block of
// rows per head, each rounded up to a vector, and walks the keys of all its
// heads in memory order (THD rows of one head alone are Hkv*D elements apart,
// which the hardware prefetchers follow badly).
struct AttnTask {
  int32_t seg, kv_head, kv_heads, m_begin, m_end;
};

// Per-thread working set, sized for kAttnMaxTileRows x kAttnKeyTile x dpad
// (Q/K) and dvpad (V, O), with K/V tile buffers and row pointers for `heads`
// kv heads.
struct AttnScratch {
  float* qt;     // [head_dim][rows]   scaled Q tile, transposed
  float* qr;     // [rows][dpad]       scaled Q rows (the dot-product score path)
  uint16_t* qr16;  // [rows][dpad]     bf16 Q rows as given (the bf16 dot-product path)
  float* s;      // [key tile][rows]   scores, then probabilities (S^T)
  float* acc;    // [rows][dvpad]      unnormalised output
  float* m;      // [rows]             running max (base 2)
  float* l;      // [rows]             running denominator
  float* alpha;  // [rows]             rescale of acc for the current key tile
  float* kbuf;   // [head][key tile][head_dim]  K converted to fp32
  float* vbuf;   // [head][key tile][dvpad]     V converted / padded
  float* row;    // [dpad]             one converted Q row
  int32_t* qpos;        // [rows]  highest key position the row sees (q + span.hi, saturated)
  int32_t* qlo;         // [rows]  lowest key position the row sees (q - span.lo, saturated)
  const float** krow;   // [head][key tile]
  const float** vrow;   // [head][key tile]
  const uint16_t** krow16;  // [head][key tile]  bf16 K rows in place (bf16 dot products)
  const uint16_t** vrow16;  // [head][key tile]  bf16 V rows in place (bf16 P·V)
};

struct AttnTileStats {
  int64_t full = 0, masked = 0, skipped = 0;
};

// Split-K (flash-decoding): a call with fewer tasks than threads runs every
// task once per chunk of its segment's keys, each chunk into a partial of its
// own, then merges them. Chunk j of segment si is keys [bounds[si * (splits +
// 1) + j], bounds[si * (splits + 1) + j + 1]), cut on the key-tile grid that
// starts at the segment's k_begin (so the tiles are those of one unsplit
// walk). Without a window the chunks cut all the keys evenly. With one, only
// the tiles some query of the segment may reach (the kernel's own skip test
// on the segment's positions) are shared out, the same number of them to each
// chunk; the tiles before the first and after the last such tile go to no
// chunk (`trimmed` counts them per segment: tiles the kernel would skip).
// Positions may be in any order. splits == 1: no split (bounds and trimmed
// empty).
struct AttnKeySplit {
  int splits = 1;
  std::vector<int32_t> bounds;   // [segment][splits + 1]
  std::vector<int32_t> trimmed;  // [segment]
};
AttnKeySplit planKeySplit(const AttnProblem& p, const std::vector<AttnSegment>& segs,
                          const std::vector<AttnTask>& tasks, int threads);

// Per key tile of segment s (on its grid from k_begin): 1 when the tile holds
// a key position within [min q_pos - span.lo, max q_pos + span.hi] of the
// segment's queries (or a key on either side of it), i.e. when a task of the
// segment may compute it; 0 when every task skips it.
std::vector<char> reachableKeyTiles(const AttnProblem& p, const AttnSegment& s, const VisibleSpan& span);

using AttnTaskFn = void (*)(const AttnCall& c, const AttnTask& t, AttnScratch& sc,
                            AttnTileStats& st);

}  // namespace attn::cpu
