// Infinite-LLM Alg. 1, cluster-level DistAttention scheduling (§5.2-5.3).
//
// Model (Eq. 5-7): one layer on an instance with batch b reading a blocks
// takes T = base + per_req*b + attn_us_per_block*a; its throughput is
// TPS = b / (num_layers*T) (0 when b == 0). A debtor that lent k blocks in
// total admits j(k) = min(pending, floor((capacity - used + k) / pending_blocks))
// waiting requests into the memory then free, so it runs batch + j(k) and
// reads used - k + j(k)*pending_blocks; a creditor that took k blocks keeps
// its batch and reads used + k.
//
// Plan: debtors are the instances with batch <= debtor_max_batch and a
// longest request with movable blocks, by increasing batch (then index);
// creditors the other ones with used/capacity <= creditor_max_util, by
// increasing utilisation (then index). Per debtor, Block_max = the blocks of
// its longest request; repeatedly take the least-utilised creditor not yet
// tried for this debtor, pick the k in [0, min(Block_max, its free blocks)]
// that maximises TPS_D(lent + k) + TPS_C(borrowed + k) (smallest on ties);
// k == 0 ends this debtor (the paper's break), else record the move, update
// both, Block_max -= k and put the creditor back in the order at its new
// utilisation (update_and_sort_mem_util). Tried creditors leave the order
// while their debtor is served, so "least-utilised untried" is its head.
//
// Why only a few k need evaluating: between two consecutive k where j(k)
// changes, b is constant on both sides and each side's T is affine in k and
// positive (T >= base + per_req*b > 0 for b > 0), so each TPS is b/(L*T(k)),
// a convex function of k (1/x is convex for x > 0, composed with an affine
// map, scaled by b >= 0), and the pair's sum is convex. A convex f on [l, h]
// has f(m) <= max(f(l), f(h)), and if f(l) < f(h) then f(m) < f(h) for every
// interior m, so the smallest maximiser on [l, h] is l or h. Hence the
// smallest global maximiser is among 0, hi and c-1, c for every change
// point c of j in (0, hi]: at most 2*min(pending, hi/pending_blocks + 1) + 2
// evaluations, independent of the block counts themselves.
//
// Determinism: every value is computed by the same expression in the same
// order on every rank; orders are total (ties by index), utilisations are
// compared exactly in 128-bit integers.
#include "src/attn/kv_plan.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <set>

#include "src/core/error.h"

namespace attn {

double kvModelTps(const attnKvModel_t& m, int64_t batch, double blocks_read) {
  if (batch <= 0) return 0.0;
  const double b = static_cast<double>(batch);
  const double t = m.nonattn_us_base + m.nonattn_us_per_req * b + m.attn_us_per_block * blocks_read;
  return b / (static_cast<double>(m.num_layers) * t);
}

int64_t kvJoiners(const attnKvInstance_t& d, int64_t lent) {
  if (d.pending_requests <= 0 || d.pending_blocks <= 0) return 0;
  // capacity - used >= 0 and lent <= used, so free <= capacity: no overflow.
  const int64_t freeBlocks = d.capacity_blocks - d.used_blocks + lent;
  return std::min<int64_t>(d.pending_requests, freeBlocks / d.pending_blocks);
}

double kvDebtorTps(const attnKvInstance_t& d, const attnKvModel_t& m, int64_t lent) {
  const int64_t j = kvJoiners(d, lent);
  // j*pending_blocks <= free <= capacity; the sum may pass int64 for absurd
  // capacities, so it is formed in double.
  const double read = static_cast<double>(d.used_blocks - lent) +
                      static_cast<double>(j * d.pending_blocks);
  return kvModelTps(m, static_cast<int64_t>(d.batch_size) + j, read);
}

double kvCreditorTps(const attnKvInstance_t& c, const attnKvModel_t& m, int64_t borrowed) {
  return kvModelTps(m, c.batch_size, static_cast<double>(c.used_blocks + borrowed));
}

int64_t kvBestBlocks(const attnKvInstance_t& d, int64_t lent, const attnKvInstance_t& c,
                     int64_t borrowed, int64_t hi, const attnKvModel_t& m) {
  if (hi <= 0) return 0;
  int64_t best = 0;
  double bestVal = kvDebtorTps(d, m, lent) + kvCreditorTps(c, m, borrowed);
  // Candidates in increasing k with a strict > keep the smallest maximiser.
  auto consider = [&](int64_t k) {
    if (k <= best || k > hi) return;
    const double v = kvDebtorTps(d, m, lent + k) + kvCreditorTps(c, m, borrowed + k);
    if (v > bestVal) {
      bestVal = v;
      best = k;
    }
  };
  if (d.pending_requests > 0 && d.pending_blocks > 0) {
    const int64_t pb = d.pending_blocks;
    const int64_t free0 = d.capacity_blocks - d.used_blocks + lent;
    // j rises by one at each k where free0 + k is a multiple of pb, until
    // it reaches pending_requests.
    int64_t rises = static_cast<int64_t>(d.pending_requests) - free0 / pb;
    int64_t k = pb - free0 % pb;
    while (rises > 0 && k <= hi) {
      consider(k - 1);
      consider(k);
      --rises;
      if (pb > hi - k) break;
      k += pb;
    }
  }
  consider(hi);
  return best;
}

attnResult_t checkKvPlanInput(const attnKvInstance_t* inst, int n, const attnKvModel_t& m) {
  auto finiteNonNeg = [](double x) { return std::isfinite(x) && x >= 0.0; };
  ATTN_REQUIRE(finiteNonNeg(m.nonattn_us_base), "model: nonattn_us_base must be finite and >= 0, got %g",
               m.nonattn_us_base);
  ATTN_REQUIRE(finiteNonNeg(m.nonattn_us_per_req),
               "model: nonattn_us_per_req must be finite and >= 0, got %g", m.nonattn_us_per_req);
  ATTN_REQUIRE(finiteNonNeg(m.attn_us_per_block),
               "model: attn_us_per_block must be finite and >= 0, got %g", m.attn_us_per_block);
  ATTN_REQUIRE(m.nonattn_us_base + m.nonattn_us_per_req > 0.0,
               "model: nonattn_us_base + nonattn_us_per_req must be > 0 (a layer takes time)");
  ATTN_REQUIRE(m.num_layers >= 1, "model: num_layers must be >= 1, got %d", m.num_layers);
  ATTN_REQUIRE(std::isfinite(m.creditor_max_util) && m.creditor_max_util >= 0.0 &&
                   m.creditor_max_util <= 1.0,
               "model: creditor_max_util must be in [0, 1], got %g", m.creditor_max_util);
  for (int i = 0; i < n; ++i) {
    const attnKvInstance_t& x = inst[i];
    ATTN_REQUIRE(x.batch_size >= 0, "instance %d: batch_size %d < 0", i, x.batch_size);
    ATTN_REQUIRE(x.pending_requests >= 0, "instance %d: pending_requests %d < 0", i,
                 x.pending_requests);
    ATTN_REQUIRE(x.pending_blocks >= 0, "instance %d: pending_blocks %lld < 0", i,
                 (long long)x.pending_blocks);
    ATTN_REQUIRE(x.capacity_blocks >= 0, "instance %d: capacity_blocks %lld < 0", i,
                 (long long)x.capacity_blocks);
    ATTN_REQUIRE(x.used_blocks >= 0 && x.used_blocks <= x.capacity_blocks,
                 "instance %d: used_blocks %lld outside [0, capacity_blocks %lld]", i,
                 (long long)x.used_blocks, (long long)x.capacity_blocks);
    ATTN_REQUIRE(x.longest_req_blocks >= 0 && x.longest_req_blocks <= x.used_blocks,
                 "instance %d: longest_req_blocks %lld outside [0, used_blocks %lld]", i,
                 (long long)x.longest_req_blocks, (long long)x.used_blocks);
  }
  return attnSuccess;
}

namespace {

bool isDebtor(const attnKvInstance_t& x, const attnKvModel_t& m) {
  return x.batch_size <= m.debtor_max_batch && x.longest_req >= 0 && x.longest_req_blocks > 0;
}

bool isCreditor(const attnKvInstance_t& x, const attnKvModel_t& m) {
  return x.capacity_blocks > 0 && !isDebtor(x, m) &&
         static_cast<double>(x.used_blocks) <=
             m.creditor_max_util * static_cast<double>(x.capacity_blocks);
}

}  // namespace

attnResult_t planKvMoves(const attnKvInstance_t* inst, int n, const attnKvModel_t& m,
                         std::vector<attnKvMove_t>* moves) {
  ATTN_REQUIRE(inst != nullptr && n >= 1, "need at least one instance");
  ATTN_REQUIRE(moves != nullptr, "moves is NULL");
  ATTN_CHECK(checkKvPlanInput(inst, n, m));

  std::vector<int64_t> lent(n, 0), borrowed(n, 0);
  auto used = [&](int i) { return inst[i].used_blocks + borrowed[i]; };
  // Utilisation order, exact: used_a/cap_a < used_b/cap_b by cross products.
  auto lessUtil = [&](int a, int b) {
    const __int128 l = static_cast<__int128>(used(a)) * inst[b].capacity_blocks;
    const __int128 r = static_cast<__int128>(used(b)) * inst[a].capacity_blocks;
    return l != r ? l < r : a < b;
  };

  std::vector<int> debtors;
  for (int i = 0; i < n; ++i)
    if (isDebtor(inst[i], m)) debtors.push_back(i);
  std::sort(debtors.begin(), debtors.end(), [&](int a, int b) {
    return inst[a].batch_size != inst[b].batch_size ? inst[a].batch_size < inst[b].batch_size
                                                    : a < b;
  });
  // Keys change only while an element is out of the set (see below).
  std::set<int, decltype(lessUtil)> creditors(lessUtil);
  for (int i = 0; i < n; ++i)
    if (isCreditor(inst[i], m)) creditors.insert(i);

  std::vector<int> tried;
  for (int d : debtors) {
    int64_t blockMax = inst[d].longest_req_blocks;
    tried.clear();
    while (!creditors.empty()) {
      const int c = *creditors.begin();
      const int64_t hi = std::min(blockMax, inst[c].capacity_blocks - used(c));
      const int64_t k = kvBestBlocks(inst[d], lent[d], inst[c], borrowed[c], hi, m);
      if (k <= 0) break;
      ATTN_REQUIRE(moves->size() < static_cast<size_t>(INT_MAX), "more than INT_MAX moves");
      creditors.erase(creditors.begin());
      borrowed[c] += k;
      lent[d] += k;
      blockMax -= k;
      moves->push_back(attnKvMove_t{d, c, d, inst[d].longest_req, k});
      tried.push_back(c);
    }
    for (int c : tried) creditors.insert(c);  // back at their new utilisation
  }
  return attnSuccess;
}

}  // namespace attn
