// Attention entry points: check the problem, cut it into tasks (segment x kv
// head x tile of stacked query rows), run them on the active ISA's kernel.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/attention_task.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kv_pack.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/worker_pool.h"
#include "kernels/kernel_status.h"

namespace attn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

attnResult_t validate(const AttnProblem& p, const float* o, const float* lse,
                      const std::vector<AttnSegment>& segs) {
  KERNEL_REQUIRE(p.dtype == attnFloat32 || p.dtype == attnFloat16 || p.dtype == attnBfloat16,
               "attention: dtype %d is not fp32/fp16/bf16", int(p.dtype));
  KERNEL_REQUIRE(p.nq >= 0 && p.nk >= 0, "attention: negative row count");
  KERNEL_REQUIRE(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
               "attention: %d query heads do not group over %d kv heads", p.num_q_heads,
               p.num_kv_heads);
  KERNEL_REQUIRE(p.head_dim > 0 && p.head_dim <= kAttnMaxHeadDim,
               "attention: head_dim %d outside 1..%d", p.head_dim, kAttnMaxHeadDim);
  KERNEL_REQUIRE(p.head_dim_v >= 0 && p.head_dim_v <= kAttnMaxHeadDim,
               "attention: head_dim_v %d outside 1..%d (0: head_dim)", p.head_dim_v, kAttnMaxHeadDim);
  KERNEL_REQUIRE(p.nq == 0 || (p.q && o && lse), "attention: null q or output");
  KERNEL_REQUIRE(p.nk == 0 || (p.k && p.v), "attention: null k or v");
  KERNEL_REQUIRE(p.window_left >= -1 && p.window_right >= -1,
               "attention: window (%d, %d) below -1 (-1 leaves a side unbounded)", p.window_left,
               p.window_right);
  KERNEL_REQUIRE(std::isfinite(p.softcap) && p.softcap >= 0.0f,
               "attention: softcap %g is not a finite value >= 0 (0: none)", double(p.softcap));
  KERNEL_REQUIRE(!visibleSpan(p).bounded || ((p.nq == 0 || p.q_pos) && (p.nk == 0 || p.k_pos)),
               "attention: %s needs q_pos and k_pos", p.causal ? "causal" : "a sliding window");
  KERNEL_REQUIRE(p.num_segments >= 0 && (p.num_segments == 0 || p.segments),
               "attention: bad segment list");
  std::vector<std::pair<int32_t, int32_t>> qr;
  for (const auto& s : segs) {
    KERNEL_REQUIRE(0 <= s.q_begin && s.q_begin <= s.q_end && s.q_end <= p.nq && 0 <= s.k_begin &&
                     s.k_begin <= s.k_end && s.k_end <= p.nk,
                 "attention: segment q[%d,%d) k[%d,%d) outside %d x %d rows", s.q_begin,
                 s.q_end, s.k_begin, s.k_end, p.nq, p.nk);
    if (s.q_begin < s.q_end) qr.emplace_back(s.q_begin, s.q_end);
  }
  std::sort(qr.begin(), qr.end());
  for (size_t i = 1; i < qr.size(); ++i)
    KERNEL_REQUIRE(qr[i].first >= qr[i - 1].second, "attention: segments overlap in query rows");
  return attnSuccess;
}

// The segments that have tasks, ascending.
std::vector<int32_t> busySegmentsOf(const std::vector<AttnTask>& tasks) {
  std::vector<int32_t> out;
  for (const AttnTask& t : tasks) out.push_back(t.seg);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t nonEmptySegments(const std::vector<AttnSegment>& segs) {
  int64_t n = 0;
  for (const auto& s : segs) n += s.q_begin < s.q_end && s.k_begin < s.k_end;
  return n;
}

// kv heads per task for a segment of `stacked` (row, head-in-group) pairs:
// one, unless a tile holds the rows of several heads (each block rounded up
// to a vector of `align` rows); then as many as fit, but no more than leave
// each thread a task when the call has fewer busy segments than threads.
int headsPerTask(int32_t stacked, int kv_heads, int tile, int align, int threads, int64_t busy) {
  const int block = (stacked + align - 1) / align * align;
  int heads = std::min(kv_heads, tile / std::max(block, 1));
  if (heads <= 1) return 1;
  if (busy < threads) {
    const int64_t per_segment = (threads + busy - 1) / std::max<int64_t>(busy, 1);
    heads = std::min<int64_t>(heads, std::max<int64_t>(1, kv_heads / per_segment));
  }
  return heads;
}

// Split-K (flash-decoding, AttnKeySplit): a call with fewer tasks than
// threads (a decode step of one sequence over few kv heads, as tensor
// parallelism leaves each rank) cuts every segment's keys into this many
// chunks, so every thread has work. A chunk keeps at least kMinSplitKeys
// keys (those a window leaves reachable, when there is one): below that the
// merge costs more than the thread saves.
constexpr int32_t kMinSplitKeys = 8 * kAttnKeyTile;

int splitsFor(size_t ntasks, int threads, int64_t longest) {
  const int want = int((size_t(threads) + ntasks - 1) / ntasks);
  return int(std::max<int64_t>(1, std::min<int64_t>(want, longest / kMinSplitKeys)));
}

// Chunk j of every segment's keys under `plan` (planKeySplit).
std::vector<AttnSegment> keyChunk(const std::vector<AttnSegment>& segs, const AttnKeySplit& plan, int j) {
  std::vector<AttnSegment> out = segs;
  const size_t stride = size_t(plan.splits) + 1;
  for (size_t si = 0; si < out.size(); ++si) {
    out[si].k_begin = plan.bounds[si * stride + size_t(j)];
    out[si].k_end = plan.bounds[si * stride + size_t(j) + 1];
  }
  return out;
}

void fillEmptyRows(float* o, float* lse, int32_t begin, int32_t end, int heads, int d) {
  const size_t n = size_t(end - begin) * heads;
  std::fill_n(o + size_t(begin) * heads * d, n * d, 0.0f);
  std::fill_n(lse + size_t(begin) * heads, n, kNegInf);
}

// Scratch for one thread, kept across calls (grows, never shrinks).
class ScratchArena {
 public:
  AttnScratch& get(int head_dim, int dpad, int dvpad, int heads) {
    const size_t R = kAttnMaxTileRows, K = kAttnKeyTile, D = size_t(head_dim), H = size_t(heads);
    const size_t floats = D * R + K * R + R * (dpad + dvpad) + 3 * R + H * K * (D + dvpad) + dpad;
    const size_t bytes = floats * sizeof(float) + R * dpad * sizeof(uint16_t) +
                         2 * R * sizeof(int32_t) + 4 * H * K * sizeof(const void*) +
                         20 * 64;  // + alignment slack
    if (bytes > cap_) {
      mem_.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      cap_ = bytes;
    }
    unsigned char* at = mem_.get();
    auto take = [&](size_t n) {
      unsigned char* p = at;
      at += (n + 63) / 64 * 64;  // each array on its own cache lines
      return p;
    };
    sc_.qt = reinterpret_cast<float*>(take(D * R * sizeof(float)));
    sc_.qr = reinterpret_cast<float*>(take(R * dpad * sizeof(float)));
    sc_.qr16 = reinterpret_cast<uint16_t*>(take(R * dpad * sizeof(uint16_t)));
    sc_.s = reinterpret_cast<float*>(take(K * R * sizeof(float)));
    sc_.acc = reinterpret_cast<float*>(take(R * dvpad * sizeof(float)));
    sc_.m = reinterpret_cast<float*>(take(R * sizeof(float)));
    sc_.l = reinterpret_cast<float*>(take(R * sizeof(float)));
    sc_.alpha = reinterpret_cast<float*>(take(R * sizeof(float)));
    sc_.kbuf = reinterpret_cast<float*>(take(H * K * D * sizeof(float)));
    sc_.vbuf = reinterpret_cast<float*>(take(H * K * dvpad * sizeof(float)));
    sc_.row = reinterpret_cast<float*>(take(dpad * sizeof(float)));
    sc_.qpos = reinterpret_cast<int32_t*>(take(R * sizeof(int32_t)));
    sc_.qlo = reinterpret_cast<int32_t*>(take(R * sizeof(int32_t)));
    sc_.krow = reinterpret_cast<const float**>(take(H * K * sizeof(const float*)));
    sc_.vrow = reinterpret_cast<const float**>(take(H * K * sizeof(const float*)));
    sc_.krow16 = reinterpret_cast<const uint16_t**>(take(H * K * sizeof(const uint16_t*)));
    sc_.vrow16 = reinterpret_cast<const uint16_t**>(take(H * K * sizeof(const uint16_t*)));
    return sc_;
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> mem_;
  size_t cap_ = 0;
  AttnScratch sc_{};
};

// This thread's scratch, one arena for every call and path.
AttnScratch& threadScratch(const AttnCall& c, int heads) {
  thread_local ScratchArena arena;
  return arena.get(c.p->head_dim, c.dpad, c.dvpad, heads);
}

attnResult_t run(const AttnProblem& p, float* o, float* lse, const AttnExec& ex,
                 bool accumulate) {
  std::vector<AttnSegment> segs;
  if (p.segments == nullptr) segs.push_back({0, p.nq, 0, p.nk});
  else segs.assign(p.segments, p.segments + p.num_segments);
  KERNEL_CHECK(validate(p, o, lse, segs));

  const KernelTable& kt = activeKernels();
  const int group = p.num_q_heads / p.num_kv_heads;
  const int tile = kt.attn_tile_rows;
  const int threads = std::max(1, ex.threads);
  const int64_t busy = nonEmptySegments(segs);
  const int dv = valueDim(p);  // O's head dim
  std::vector<AttnTask> tasks;
  std::vector<char> covered(accumulate ? 0 : size_t(p.nq), 0);
  for (int32_t si = 0; si < int32_t(segs.size()); ++si) {
    const AttnSegment& s = segs[si];
    if (!accumulate) std::fill(covered.begin() + s.q_begin, covered.begin() + s.q_end, 1);
    if (s.q_begin == s.q_end) continue;
    if (s.k_begin == s.k_end) {  // no keys: empty rows, or nothing to fold
      if (!accumulate) fillEmptyRows(o, lse, s.q_begin, s.q_end, p.num_q_heads, dv);
      continue;
    }
    const int32_t stacked = (s.q_end - s.q_begin) * group;
    const int heads = headsPerTask(stacked, p.num_kv_heads, tile, kt.attn_row_align, threads, busy);
    for (int32_t g = 0; g < p.num_kv_heads; g += heads)
      for (int32_t m = 0; m < stacked; m += tile)
        tasks.push_back({si, g, std::min(heads, p.num_kv_heads - g), m, std::min(stacked, m + tile)});
  }
  for (int32_t r = 0; r < int32_t(covered.size()); ++r)  // rows outside every segment
    if (!covered[r]) fillEmptyRows(o, lse, r, r + 1, p.num_q_heads, dv);

  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim));
  const int dpad = (p.head_dim + 15) / 16 * 16, dvpad = (dv + 15) / 16 * 16;
  // Pack K/V head-major when tiles would read each key row at least twice
  // (several query tiles per segment and kv head); decode-like calls read
  // every key once and go straight to the input.
  std::unique_ptr<PackedKV> packed;
  if (!tasks.empty() && tasks.size() >= 2 * size_t(busy) * size_t(p.num_kv_heads))
    packed = std::make_unique<PackedKV>(p, dvpad, threads, ex.pool);
  int max_heads = 1;
  for (const auto& t : tasks) max_heads = std::max(max_heads, int(t.kv_heads));
  const float scale_log2 = scale * 1.4426950408889634f;
  // A cap beyond fp32's range in base 2 caps nothing a score can reach.
  float softcap_log2 = p.softcap * 1.4426950408889634f;
  if (!std::isfinite(softcap_log2)) softcap_log2 = 0.0f;
  const VisibleSpan span = visibleSpan(p);
  const AttnKeySplit plan = packed ? AttnKeySplit{} : planKeySplit(p, segs, tasks, threads);
  const int splits = plan.splits;
  std::vector<AttnTileStats> stats(static_cast<size_t>(threads));
  if (splits == 1) {
    const AttnCall call{&p, segs.data(), o, lse, accumulate, scale_log2, group, dpad, dv, dvpad,
                        packed ? packed->k() : nullptr, packed ? packed->v() : nullptr,
                        softcap_log2, span};
    parallelFor(threads, ex.pool, int64_t(tasks.size()), [&](int worker, int64_t t) {
      kt.attention(call, tasks[size_t(t)], threadScratch(call, max_heads), stats[worker]);
    });
  } else {
    // Every task once per key chunk, each chunk into a partial of its own
    // (rows no chunk reaches stay O = 0, LSE = -inf there), then merged.
    const size_t rows = size_t(p.nq) * p.num_q_heads;
    std::vector<std::vector<AttnSegment>> chunk(static_cast<size_t>(splits));
    std::vector<std::vector<float>> po(static_cast<size_t>(splits)), plse(static_cast<size_t>(splits));
    std::vector<AttnCall> calls;
    for (int j = 0; j < splits; ++j) {
      chunk[size_t(j)] = keyChunk(segs, plan, j);
      po[size_t(j)].assign(rows * size_t(dv), 0.0f);
      plse[size_t(j)].assign(rows, kNegInf);
      calls.push_back({&p, chunk[size_t(j)].data(), po[size_t(j)].data(), plse[size_t(j)].data(), false,
                       scale_log2, group, dpad, dv, dvpad, nullptr, nullptr, softcap_log2, span});
    }
    const int64_t n = int64_t(tasks.size());
    parallelFor(threads, ex.pool, n * splits, [&](int worker, int64_t i) {
      const AttnCall& call = calls[size_t(i / n)];
      const AttnTask& t = tasks[size_t(i % n)];
      const AttnSegment& s = call.segs[t.seg];
      if (s.k_begin == s.k_end) return;
      kt.attention(call, t, threadScratch(call, max_heads), stats[worker]);
    });
    for (const AttnTask& t : tasks)  // the tiles no chunk holds, as the kernel would count them
      stats[0].skipped += int64_t(plan.trimmed[size_t(t.seg)]) * t.kv_heads;
    std::vector<AttnPartialRef> parts(static_cast<size_t>(splits));
    for (int32_t si : busySegmentsOf(tasks)) {
      const AttnSegment& s = segs[size_t(si)];
      const size_t r0 = size_t(s.q_begin) * p.num_q_heads, r1 = size_t(s.q_end) * p.num_q_heads;
      if (!accumulate) initAccumulator(o + r0 * dv, lse + r0, s.q_end - s.q_begin, p.num_q_heads, dv);
      for (size_t r = r0; r < r1; ++r) {
        int np = 0;  // a row no chunk reached is left as it is (accumulate: untouched)
        for (int j = 0; j < splits; ++j)
          if (plse[size_t(j)][r] != kNegInf)
            parts[size_t(np++)] = {po[size_t(j)].data() + r * dv, attnFloat32, plse[size_t(j)].data() + r};
        if (np) KERNEL_CHECK(mergePartials(o + r * dv, lse + r, parts.data(), np, 1, dv));
      }
    }
  }
  if (ex.stats != nullptr) {
    for (const auto& s : stats) {
      ex.stats->tiles_full += s.full;
      ex.stats->tiles_masked += s.masked;
      ex.stats->tiles_skipped += s.skipped;
    }
  }
  return attnSuccess;
}

}  // namespace

std::vector<char> reachableKeyTiles(const AttnProblem& p, const AttnSegment& s, const VisibleSpan& span) {
  const int32_t n = s.k_end - s.k_begin;
  std::vector<char> out(size_t((n + kAttnKeyTile - 1) / kAttnKeyTile), 1);
  if (!span.bounded || s.q_begin == s.q_end) return out;
  int32_t qmin = std::numeric_limits<int32_t>::max(), qmax = std::numeric_limits<int32_t>::min();
  for (int32_t i = s.q_begin; i < s.q_end; ++i) {
    qmin = std::min(qmin, p.q_pos[i]);
    qmax = std::max(qmax, p.q_pos[i]);
  }
  // The kernel's test (skip when every key lies above every row's upper
  // bound or below every lower bound) on the loosest bounds of the segment's
  // rows, saturated as the kernel's are. Counted rather than min / max: it
  // vectorises without SSE4.1 (2.5x faster at the baseline ISA).
  const int32_t lo = int32_t(std::max<int64_t>(int64_t(qmin) - span.lo, std::numeric_limits<int32_t>::min()));
  const int32_t hi = int32_t(std::min<int64_t>(int64_t(qmax) + span.hi, std::numeric_limits<int32_t>::max()));
  auto reachable = [lo, hi](const int32_t* kp, int32_t m) {
    int32_t above = 0, below = 0;
    for (int32_t j = 0; j < m; ++j) {
      above += kp[j] > hi;
      below += kp[j] < lo;
    }
    return char(above < m && below < m);
  };
  const int32_t full = n / kAttnKeyTile;
  for (int32_t t = 0; t < full; ++t)  // a constant trip count: unrolled, vectorised
    out[size_t(t)] = reachable(p.k_pos + s.k_begin + int64_t(t) * kAttnKeyTile, kAttnKeyTile);
  if (full * kAttnKeyTile < n)
    out[size_t(full)] = reachable(p.k_pos + s.k_begin + int64_t(full) * kAttnKeyTile, n - full * kAttnKeyTile);
  return out;
}

AttnKeySplit planKeySplit(const AttnProblem& p, const std::vector<AttnSegment>& segs,
                          const std::vector<AttnTask>& tasks, int threads) {
  AttnKeySplit plan;
  if (tasks.empty() || tasks.size() >= size_t(std::max(1, threads))) return plan;  // every thread has a task
  std::vector<char> busy(segs.size(), 0);
  for (const AttnTask& t : tasks) busy[size_t(t.seg)] = 1;
  const bool windowed = p.window_left >= 0 || p.window_right >= 0;
  // Reachable tiles per busy segment (windowed only).
  std::vector<std::vector<char>> reach(windowed ? segs.size() : 0);
  int64_t longest = 0;
  for (size_t si = 0; si < segs.size(); ++si) {
    if (!busy[si]) continue;
    if (reach.empty()) {
      longest = std::max<int64_t>(longest, segs[si].k_end - segs[si].k_begin);
    } else {
      reach[si] = reachableKeyTiles(p, segs[si], visibleSpan(p));
      longest = std::max<int64_t>(longest, kAttnKeyTile * std::count(reach[si].begin(), reach[si].end(), 1));
    }
  }
  plan.splits = splitsFor(tasks.size(), threads, longest);
  if (plan.splits == 1) return plan;
  const int S = plan.splits;
  plan.bounds.resize(segs.size() * (size_t(S) + 1));
  plan.trimmed.assign(segs.size(), 0);
  for (size_t si = 0; si < segs.size(); ++si) {
    const AttnSegment& s = segs[si];
    int32_t* b = plan.bounds.data() + si * (size_t(S) + 1);
    const int32_t n = s.k_end - s.k_begin;
    if (reach.empty() || !busy[si]) {  // every key, cut evenly
      const int32_t step = (n / S + kAttnKeyTile - 1) / kAttnKeyTile * kAttnKeyTile;
      for (int j = 0; j <= S; ++j) b[j] = s.k_begin + (j == S ? n : std::min(n, j * step));
      continue;
    }
    // The reachable tiles, the same number (to one) to each chunk; a chunk
    // ends after its last one (unreachable tiles between them, which the
    // kernel skips, go to the chunk before).
    const std::vector<char>& r = reach[si];
    const int64_t ntiles = int64_t(r.size());
    const int64_t total = std::count(r.begin(), r.end(), 1);
    auto keyOf = [&](int64_t tile) { return s.k_begin + int32_t(std::min<int64_t>(n, tile * kAttnKeyTile)); };
    if (total == 0) {  // nothing reachable: empty chunks
      std::fill_n(b, S + 1, s.k_begin);
      plan.trimmed[si] = int32_t(ntiles);
      continue;
    }
    int64_t first = 0, last = ntiles;
    while (!r[size_t(first)]) ++first;
    while (!r[size_t(last - 1)]) --last;
    b[0] = keyOf(first);
    b[S] = keyOf(last);
    int64_t seen = 0, tile = first;
    for (int j = 1; j < S; ++j) {
      const int64_t target = total * j / S;  // reachable tiles in chunks 0..j-1
      while (seen < target) seen += r[size_t(tile++)];
      b[j] = keyOf(tile);
    }
    plan.trimmed[si] = int32_t(first + (ntiles - last));
  }
  return plan;
}

attnResult_t attentionPartial(const AttnProblem& p, float* o, float* lse, const AttnExec& ex) {
  return run(p, o, lse, ex, false);
}

attnResult_t attentionAccumulate(const AttnProblem& p, float* o_acc, float* lse_acc,
                                 const AttnExec& ex) {
  return run(p, o_acc, lse_acc, ex, true);
}

void initAccumulator(float* o, float* lse, int64_t rows, int heads, int head_dim) {
  std::fill_n(o, size_t(rows) * heads * head_dim, 0.0f);
  std::fill_n(lse, size_t(rows) * heads, kNegInf);
}

}  // namespace attn::cpu
