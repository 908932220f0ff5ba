#include "src/attn/visibility.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace attn {

RankVisibility::RankVisibility(const attnAttnConfig_t& cfg, std::vector<PosRanges> ranges)
    : n_(static_cast<int>(ranges.size())), span_(cpu::visibleSpan(cfg.causal != 0, cfg.window_left, cfg.window_right)) {
  active_ = cfg.window_left >= 0 || cfg.window_right >= 0;
  if (active_) ranges_ = std::move(ranges);
}

bool RankVisibility::sees(int qRank, int kvRank) const {
  if (!active_) return true;
  const PosRanges& q = ranges_[size_t(qRank)];
  const PosRanges& k = ranges_[size_t(kvRank)];
  if (q.qMin > q.qMax || k.kvMin > k.kvMax) return false;  // no rows on one side
  // Some key in [kvMin, kvMax] lies within [qPos - lo, qPos + hi] of some
  // query in [qMin, qMax] (positions of different sequences are
  // pooled: a conservative answer, never a wrong "no").
  return int64_t(k.kvMax) >= int64_t(q.qMin) - span_.lo && int64_t(k.kvMin) <= int64_t(q.qMax) + span_.hi;
}

bool RankVisibility::ringMoves(int from, int step, bool queries, int dir) const {
  if (!active_) return true;
  const int origin = ((from - dir * step) % n_ + n_) % n_;
  for (int k = step + 1; k < n_; ++k) {
    const int t = ((origin + dir * k) % n_ + n_) % n_;
    if (queries ? sees(origin, t) : sees(t, origin)) return true;
  }
  return false;
}

void RankVisibility::ringMoveCounts(bool queries, int dir, int* most, int* total) const {
  *most = *total = 0;
  for (int r = 0; r < n_; ++r) {
    int moves = 0;
    for (int s = 0; s + 1 < n_; ++s) moves += ringMoves(r, s, queries, dir);
    *most = std::max(*most, moves);
    *total += moves;
  }
}

const RankVisibility::RingPlan& RankVisibility::ringPlan(bool queries) const {
  RingPlan& p = plans_[queries ? 1 : 0];
  if (p.known) return p;
  int mostUp, totalUp, mostDown, totalDown;
  ringMoveCounts(queries, 1, &mostUp, &totalUp);
  ringMoveCounts(queries, -1, &mostDown, &totalDown);
  // Two ranks: one neighbour either way, so forward.
  const bool down = n_ > 2 && (mostDown < mostUp || (mostDown == mostUp && totalDown < totalUp));
  p = {true, down ? -1 : 1, down ? mostDown : mostUp};
  return p;
}

int RankVisibility::ringDirection(bool queries) const { return active_ ? ringPlan(queries).dir : 1; }

int RankVisibility::ringMovesMax(bool queries) const { return active_ ? ringPlan(queries).most : n_ - 1; }

int RankVisibility::peersSeenMax() const {
  if (!active_) return n_ - 1;
  int most = 0;
  for (int r = 0; r < n_; ++r) {
    int peers = 0;
    for (int p = 0; p < n_; ++p) peers += p != r && sees(r, p);
    most = peers > most ? peers : most;
  }
  return most;
}

void RankVisibility::keysSeenBy(const std::vector<int>& ranks, int64_t* lo, int64_t* hi) const {
  *lo = INT64_MAX;
  *hi = INT64_MIN;
  for (int r : ranks) {
    const PosRanges& q = ranges_[size_t(r)];
    if (q.qMin > q.qMax) continue;
    *lo = std::min(*lo, int64_t(q.qMin) - span_.lo);
    *hi = std::max(*hi, int64_t(q.qMax) + span_.hi);
  }
}

void positionRange(const int32_t* pos, int64_t rows, int32_t* lo, int32_t* hi) {
  *lo = INT32_MAX;
  *hi = INT32_MIN;
  for (int64_t i = 0; i < rows; ++i) {
    *lo = pos[i] < *lo ? pos[i] : *lo;
    *hi = pos[i] > *hi ? pos[i] : *hi;
  }
}

}  // namespace attn
