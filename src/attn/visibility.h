// Which ranks' keys a rank's queries can see at all under a sliding window,
// decided from the cards every rank holds (each card carries the range of
// its rank's query and key positions), so a sender and its receiver always
// agree on whether a message goes: blocks no query can see are not sent.
// Without a window every rank sees every rank (causal calls move what they
// always moved; the kernels skip masked tiles).
#pragma once

#include <cstdint>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/attention.h"

namespace attn {

// The range of one rank's query and key positions over all its sequences
// (min > max: none), as its card carries it.
struct PosRanges {
  int32_t qMin = INT32_MAX, qMax = INT32_MIN, kvMin = INT32_MAX, kvMax = INT32_MIN;
};

class RankVisibility {
 public:
  RankVisibility() = default;  // every rank sees every rank
  // ranges[r]: rank r's, from its card.
  RankVisibility(const attnAttnConfig_t& cfg, std::vector<PosRanges> ranges);

  // Whether a window hides anything here (else sees() is always true).
  bool active() const { return active_; }
  // Some query of rank qRank may see some key of rank kvRank.
  bool sees(int qRank, int kvRank) const;

  // A ring (rank r sends to r + dir, dir +1 or -1) whose blocks start at
  // their origin and travel n - 1 hops; `queries`: blocks of queries
  // (pass-Q: the block of origin o is needed where sees(o, t)), else of keys
  // (pass-KV: where sees(t, o)). Whether rank `from` sends its block at
  // step s: only while a rank further along still needs it. Holding the
  // block at step s is ringMoves(from - dir, s - 1) (always at step 0).
  bool ringMoves(int from, int step, bool queries, int dir = 1) const;

  // The direction in which a ring of such blocks moves least: the fewest
  // moves of the busiest rank, then of all ranks; +1 on a tie (and without
  // a window). Contiguous shards under a causal window: +1 for keys, -1 for
  // queries (they are needed by the ranks before theirs).
  int ringDirection(bool queries) const;

  // For the cost model: the most moves any rank makes in a ring going
  // ringDirection(queries) (n - 1 without a window), and the most peers any
  // rank's queries see.
  int ringMovesMax(bool queries) const;
  int peersSeenMax() const;

  // The key positions the queries of `ranks` may see, [*lo, *hi] (lo > hi:
  // none): what of a KV block bound for them is worth sending.
  void keysSeenBy(const std::vector<int>& ranks, int64_t* lo, int64_t* hi) const;

 private:
  bool active_ = false;
  int n_ = 1;
  cpu::VisibleSpan span_;
  std::vector<PosRanges> ranges_;
  // Moves of the busiest rank and of all ranks, going dir.
  void ringMoveCounts(bool queries, int dir, int* most, int* total) const;
  // ringDirection and ringMovesMax by `queries`, worked out once (O(n^3)):
  // the cost model and the ring both ask.
  struct RingPlan {
    bool known = false;
    int dir = 1, most = 0;
  };
  const RingPlan& ringPlan(bool queries) const;
  mutable RingPlan plans_[2];
};

// The range of positions of `rows` rows (lo > hi: none).
void positionRange(const int32_t* pos, int64_t rows, int32_t* lo, int32_t* hi);

}  // namespace attn
