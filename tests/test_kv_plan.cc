// attnKvPlan, Infinite-LLM's DistAttention scheduler (Alg. 1, Eq. 5-7):
//   - the paper's case: a long-context debtor with a small batch and waiting
//     requests lends blocks to an idle creditor, and the modelled cluster
//     throughput rises; no move when moving cannot help;
//   - creditors' free blocks and the debtor's Block_max are respected, an
//     instance is never both debtor and creditor, debtors go by batch and
//     creditors by utilisation;
//   - every move raises the modelled cluster throughput; same input, same
//     plan; the plan equals a brute-force reference (every k scanned) on
//     random small clusters, and the "best k" equals a brute-force scan;
//   - bad input and a short move buffer fail with a message, no crash.
// The reference model here is written from the header's comment, not from
// src/attn/kv_plan.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_plan.h"

namespace {

using Insts = std::vector<attnKvInstance_t>;

attnKvInstance_t Inst(int batch, int64_t cap, int64_t used, int64_t req = -1,
                      int64_t reqBlocks = 0, int pending = 0, int64_t pendingBlocks = 0) {
  attnKvInstance_t x{};
  x.batch_size = batch;
  x.pending_requests = pending;
  x.pending_blocks = pendingBlocks;
  x.capacity_blocks = cap;
  x.used_blocks = used;
  x.longest_req = req;
  x.longest_req_blocks = reqBlocks;
  return x;
}

attnKvModel_t Model(double base, double perReq, double perBlock, int maxBatch, double maxUtil) {
  attnKvModel_t m{};
  m.nonattn_us_base = base;
  m.nonattn_us_per_req = perReq;
  m.attn_us_per_block = perBlock;
  m.num_layers = 32;
  m.debtor_max_batch = maxBatch;
  m.creditor_max_util = maxUtil;
  return m;
}

// --- Reference model, from the header: T = base + per_req*b + per_block*a,
// TPS = b / (L*T). State: lent (debtor side) / borrowed (creditor side).
double RefTps(const attnKvModel_t& m, int64_t b, double a) {
  if (b == 0) return 0.0;
  const double bd = static_cast<double>(b);
  const double t = m.nonattn_us_base + m.nonattn_us_per_req * bd + m.attn_us_per_block * a;
  return bd / (static_cast<double>(m.num_layers) * t);
}
int64_t RefJoin(const attnKvInstance_t& x, int64_t lent) {
  if (x.pending_requests == 0 || x.pending_blocks <= 0) return 0;
  int64_t j = 0;  // count admissions one by one, not by division
  int64_t freeBlocks = x.capacity_blocks - x.used_blocks + lent;
  while (j < x.pending_requests && freeBlocks >= x.pending_blocks) {
    freeBlocks -= x.pending_blocks;
    ++j;
  }
  return j;
}
// A debtor admits waiting requests into free memory, moves or not.
double RefDebtorTps(const attnKvInstance_t& x, const attnKvModel_t& m, int64_t lent) {
  const int64_t j = RefJoin(x, lent);
  return RefTps(m, x.batch_size + j,
                static_cast<double>(x.used_blocks - lent) + static_cast<double>(j * x.pending_blocks));
}
double RefCreditorTps(const attnKvInstance_t& x, const attnKvModel_t& m, int64_t borrowed) {
  return RefTps(m, x.batch_size, static_cast<double>(x.used_blocks + borrowed));
}

// Brute force: every k in [0, hi], smallest maximiser.
int64_t BruteBestK(const attnKvInstance_t& d, int64_t lent, const attnKvInstance_t& c,
                   int64_t borrowed, int64_t hi, const attnKvModel_t& m, double* bestVal = nullptr) {
  int64_t best = 0;
  double v0 = RefDebtorTps(d, m, lent) + RefCreditorTps(c, m, borrowed);
  for (int64_t k = 1; k <= hi; ++k) {
    const double v = RefDebtorTps(d, m, lent + k) + RefCreditorTps(c, m, borrowed + k);
    if (v > v0) {
      v0 = v;
      best = k;
    }
  }
  if (bestVal) *bestVal = v0;
  return best;
}

// Reference Alg. 1: recompute roles and the least-utilised untried creditor
// by linear scans, scan every k.
std::vector<attnKvMove_t> RefPlan(const Insts& in, const attnKvModel_t& m) {
  const int n = static_cast<int>(in.size());
  auto debtor = [&](int i) {
    return in[i].batch_size <= m.debtor_max_batch && in[i].longest_req >= 0 &&
           in[i].longest_req_blocks > 0;
  };
  std::vector<int> ds;
  for (int b = 0; b <= 1000; ++b)  // by batch, then index
    for (int i = 0; i < n; ++i)
      if (debtor(i) && in[i].batch_size == b) ds.push_back(i);
  std::vector<bool> cred(n, false);
  for (int i = 0; i < n; ++i)
    cred[i] = !debtor(i) && in[i].capacity_blocks > 0 &&
              static_cast<double>(in[i].used_blocks) <=
                  m.creditor_max_util * static_cast<double>(in[i].capacity_blocks);
  std::vector<int64_t> lent(n, 0), borrowed(n, 0);
  std::vector<attnKvMove_t> out;
  for (int d : ds) {
    int64_t blockMax = in[d].longest_req_blocks;
    std::vector<bool> tried(n, false);
    for (;;) {
      int c = -1;  // least (used/cap), then lowest index, among untried creditors
      for (int i = 0; i < n; ++i) {
        if (!cred[i] || tried[i]) continue;
        if (c < 0) {
          c = i;
          continue;
        }
        const long double ui = static_cast<long double>(in[i].used_blocks + borrowed[i]) /
                               in[i].capacity_blocks;
        const long double uc = static_cast<long double>(in[c].used_blocks + borrowed[c]) /
                               in[c].capacity_blocks;
        if (ui < uc) c = i;
      }
      if (c < 0) break;
      const int64_t hi =
          std::min(blockMax, in[c].capacity_blocks - in[c].used_blocks - borrowed[c]);
      const int64_t k = BruteBestK(in[d], lent[d], in[c], borrowed[c], hi, m);
      if (k <= 0) break;
      out.push_back({d, c, d, in[d].longest_req, k});
      tried[c] = true;
      lent[d] += k;
      borrowed[c] += k;
      blockMax -= k;
    }
  }
  return out;
}

std::vector<attnKvMove_t> Plan(const Insts& in, const attnKvModel_t& m) {
  int count = 0;
  EXPECT_EQ(attnKvPlan(in.data(), static_cast<int>(in.size()), &m, nullptr, &count), attnSuccess)
      << attnGetLastError(nullptr);
  if (count == 0) return {};
  std::vector<attnKvMove_t> moves(count);
  EXPECT_EQ(attnKvPlan(in.data(), static_cast<int>(in.size()), &m, moves.data(), &count),
            attnSuccess)
      << attnGetLastError(nullptr);
  EXPECT_EQ(count, static_cast<int>(moves.size()));
  return moves;
}

// Cluster throughput (Eq. 7) after applying moves[0, upto); the sources of
// any move of the plan count as debtors throughout.
double ClusterTps(const Insts& in, const attnKvModel_t& m, const std::vector<attnKvMove_t>& mv,
                  size_t upto) {
  std::vector<int64_t> lent(in.size(), 0), borrowed(in.size(), 0);
  std::vector<bool> debtor(in.size(), false);
  for (size_t i = 0; i < mv.size(); ++i) {
    debtor[mv[i].src] = true;
    if (i >= upto) continue;
    lent[mv[i].src] += mv[i].num_blocks;
    borrowed[mv[i].dst] += mv[i].num_blocks;
  }
  double s = 0;
  for (size_t i = 0; i < in.size(); ++i)
    s += debtor[i] ? RefDebtorTps(in[i], m, lent[i]) : RefCreditorTps(in[i], m, borrowed[i]);
  return s;
}

std::string Str(const std::vector<attnKvMove_t>& mv) {
  std::string s;
  for (const auto& x : mv) {
    char buf[96];
    snprintf(buf, sizeof buf, "{%d->%d req %lld k %lld} ", x.src, x.dst, (long long)x.req,
             (long long)x.num_blocks);
    s += buf;
  }
  return s;
}

bool Same(const std::vector<attnKvMove_t>& a, const std::vector<attnKvMove_t>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].src != b[i].src || a[i].dst != b[i].dst || a[i].owner != b[i].owner ||
        a[i].req != b[i].req || a[i].num_blocks != b[i].num_blocks)
      return false;
  return true;
}

// A random small cluster and model (small ints: exact block arithmetic).
void RandomCase(std::mt19937_64& rng, Insts* in, attnKvModel_t* m) {
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const double perBlock[] = {0.0, 0.05, 0.5, 1.0, 3.0};
  *m = Model(static_cast<double>(U(0, 400)), static_cast<double>(U(1, 40)),
             perBlock[U(0, 4)], static_cast<int>(U(0, 6)), static_cast<double>(U(2, 10)) / 10.0);
  in->clear();
  const int n = static_cast<int>(U(1, 7));
  for (int i = 0; i < n; ++i) {
    const int64_t cap = U(0, 60);
    const int64_t used = U(0, cap);
    const int64_t rb = U(0, used);
    in->push_back(Inst(static_cast<int>(U(0, 8)), cap, used, U(0, 3) == 0 ? -1 : 100 + i, rb,
                       static_cast<int>(U(0, 5)), U(0, 12)));
  }
}

TEST(KvPlan, PaperScenarioLendsAndRaisesThroughput) {
  // Instance 0: one long request fills its memory, 4 requests wait.
  // Instance 1: normal load, mostly free.
  const Insts in = {Inst(1, 1000, 1000, 7, 990, 4, 10), Inst(8, 1000, 100)};
  const attnKvModel_t m = Model(1000, 20, 1.0, 2, 0.5);
  const auto mv = Plan(in, m);
  ASSERT_EQ(mv.size(), 1u) << Str(mv);
  EXPECT_EQ(mv[0].src, 0);
  EXPECT_EQ(mv[0].owner, 0);
  EXPECT_EQ(mv[0].dst, 1);
  EXPECT_EQ(mv[0].req, 7);
  EXPECT_GT(mv[0].num_blocks, 0);
  EXPECT_LE(mv[0].num_blocks, 900);
  EXPECT_GT(ClusterTps(in, m, mv, 1), ClusterTps(in, m, mv, 0));
  // The chosen k is the brute-force best.
  EXPECT_EQ(mv[0].num_blocks, BruteBestK(in[0], 0, in[1], 0, 900, m));
}

TEST(KvPlan, NoMoveWhenItCannotHelp) {
  // Attention is free and nothing waits: lending changes nobody's time.
  const Insts in = {Inst(1, 1000, 1000, 7, 990), Inst(8, 1000, 100)};
  EXPECT_TRUE(Plan(in, Model(1000, 20, 0.0, 2, 0.5)).empty());
  // No creditor under the threshold.
  const Insts busy = {Inst(1, 1000, 1000, 7, 990, 4, 10), Inst(8, 1000, 900)};
  EXPECT_TRUE(Plan(busy, Model(1000, 20, 1.0, 2, 0.5)).empty());
  // No debtor: batch above the threshold.
  const Insts big = {Inst(3, 1000, 1000, 7, 990, 4, 10), Inst(8, 1000, 100)};
  EXPECT_TRUE(Plan(big, Model(1000, 20, 1.0, 2, 0.5)).empty());
}

TEST(KvPlan, CreditorFreeBlocksRespected) {
  // Moving helps a lot (idle creditors cost nothing), but each has 5 free.
  const Insts in = {Inst(1, 100, 100, 3, 90), Inst(0, 10, 5), Inst(0, 20, 15)};
  const attnKvModel_t m = Model(100, 1, 5.0, 1, 0.8);
  const auto mv = Plan(in, m);
  ASSERT_EQ(mv.size(), 2u) << Str(mv);
  EXPECT_EQ(mv[0].dst, 1);  // 0.5 < 0.75
  EXPECT_EQ(mv[0].num_blocks, 5);
  EXPECT_EQ(mv[1].dst, 2);
  EXPECT_EQ(mv[1].num_blocks, 5);
}

TEST(KvPlan, BlockMaxRespectedAcrossCreditors) {
  const Insts in = {Inst(1, 100, 100, 3, 30), Inst(0, 10, 0), Inst(0, 10, 0), Inst(0, 10, 0),
                    Inst(0, 10, 0)};
  const attnKvModel_t m = Model(100, 1, 5.0, 1, 0.5);
  const auto mv = Plan(in, m);
  ASSERT_EQ(mv.size(), 3u) << Str(mv);
  int64_t total = 0;
  for (size_t i = 0; i < mv.size(); ++i) {
    EXPECT_EQ(mv[i].dst, static_cast<int>(i) + 1);  // equal use: lower index first
    EXPECT_EQ(mv[i].num_blocks, 10);
    total += mv[i].num_blocks;
  }
  EXPECT_EQ(total, 30);
}

TEST(KvPlan, DebtorsByBatchCreditorsByUtilisation) {
  // Debtors 0 (batch 2) and 1 (batch 1); creditors 2 (30%), 3 (10%), 4 (20%).
  const Insts in = {Inst(2, 100, 100, 10, 50), Inst(1, 100, 100, 11, 50), Inst(0, 100, 30),
                    Inst(0, 100, 10), Inst(0, 100, 20)};
  const attnKvModel_t m = Model(100, 1, 5.0, 2, 0.5);
  const auto mv = Plan(in, m);
  ASSERT_GE(mv.size(), 2u) << Str(mv);
  EXPECT_EQ(mv[0].src, 1);
  EXPECT_EQ(mv[0].req, 11);
  EXPECT_EQ(mv[0].dst, 3);
  EXPECT_TRUE(Same(mv, RefPlan(in, m))) << Str(mv) << " vs " << Str(RefPlan(in, m));
  // After taking 50 blocks creditor 3 is at 60%: debtor 0 starts at 4 (20%).
  bool seen = false;
  for (const auto& x : mv)
    if (x.src == 0 && !seen) {
      EXPECT_EQ(x.dst, 4) << Str(mv);
      seen = true;
    }
  EXPECT_TRUE(seen) << Str(mv);
}

TEST(KvPlan, NeverBothDebtorAndCreditor) {
  // Instance 1 would be a creditor by use, but it is a debtor (small batch).
  const Insts in = {Inst(1, 100, 100, 3, 90, 2, 10), Inst(1, 100, 20, 4, 10),
                    Inst(6, 100, 10)};
  const attnKvModel_t m = Model(1000, 10, 1.0, 2, 0.5);
  const auto mv = Plan(in, m);
  ASSERT_FALSE(mv.empty());
  for (const auto& x : mv) EXPECT_NE(x.dst, 1) << Str(mv);
  std::mt19937_64 rng(7);
  for (int it = 0; it < 500; ++it) {
    Insts r;
    attnKvModel_t rm;
    RandomCase(rng, &r, &rm);
    const auto p = Plan(r, rm);
    for (const auto& a : p)
      for (const auto& b : p) ASSERT_NE(a.src, b.dst) << Str(p);
  }
}

TEST(KvPlan, RandomPlansMatchBruteForceReference) {
  std::mt19937_64 rng(12345);
  int withMoves = 0;
  for (int it = 0; it < 3000; ++it) {
    Insts in;
    attnKvModel_t m;
    RandomCase(rng, &in, &m);
    const auto mv = Plan(in, m);
    const auto ref = RefPlan(in, m);
    ASSERT_TRUE(Same(mv, ref)) << "case " << it << ": " << Str(mv) << " vs " << Str(ref);
    // Invariants: bounds per creditor / request, and every move helps.
    std::vector<int64_t> lent(in.size(), 0), borrowed(in.size(), 0);
    for (size_t i = 0; i < mv.size(); ++i) {
      const auto& x = mv[i];
      ASSERT_GT(x.num_blocks, 0);
      ASSERT_EQ(x.owner, x.src);
      ASSERT_EQ(x.req, in[x.src].longest_req);
      lent[x.src] += x.num_blocks;
      borrowed[x.dst] += x.num_blocks;
      ASSERT_LE(lent[x.src], in[x.src].longest_req_blocks);
      ASSERT_LE(in[x.dst].used_blocks + borrowed[x.dst], in[x.dst].capacity_blocks);
      ASSERT_GT(ClusterTps(in, m, mv, i + 1), ClusterTps(in, m, mv, i) - 1e-15)
          << "case " << it << " move " << i;
    }
    withMoves += !mv.empty();
  }
  EXPECT_GT(withMoves, 300);  // the random cases do exercise moves
}

TEST(KvPlan, BestBlocksMatchesBruteForceScan) {
  std::mt19937_64 rng(99);
  auto U = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const double perBlock[] = {0.0, 0.01, 0.3, 1.0, 7.0};
  for (int it = 0; it < 20000; ++it) {
    const attnKvModel_t m = Model(static_cast<double>(U(0, 300)), static_cast<double>(U(1, 30)),
                                  perBlock[U(0, 4)], 8, 1.0);
    const int64_t dcap = U(1, 200), dused = U(0, dcap);
    const attnKvInstance_t d = Inst(static_cast<int>(U(0, 6)), dcap, dused, 1, U(0, dused),
                                    static_cast<int>(U(0, 8)), U(0, 25));
    const int64_t lent = U(0, d.longest_req_blocks);
    const int64_t ccap = U(1, 200), cused = U(0, ccap);
    const attnKvInstance_t c = Inst(static_cast<int>(U(0, 6)), ccap, cused);
    const int64_t borrowed = U(0, ccap - cused);
    const int64_t hi = std::min(d.longest_req_blocks - lent, ccap - cused - borrowed);
    double bestVal = 0;
    const int64_t want = BruteBestK(d, lent, c, borrowed, hi, m, &bestVal);
    const int64_t got = attn::kvBestBlocks(d, lent, c, borrowed, hi, m);
    ASSERT_EQ(got, want) << "case " << it;
    // The helper's model agrees with the reference one.
    ASSERT_EQ(attn::kvDebtorTps(d, m, lent + got) + attn::kvCreditorTps(c, m, borrowed + got),
              bestVal);
  }
}

TEST(KvPlan, HugeBlockCountsStayCheap) {
  // 1e15 blocks: only the joiner steps and the ends are evaluated.
  const int64_t cap = 1000000000000000LL;
  const Insts in = {Inst(1, cap, cap, 5, cap - 1, 3, cap / 10), Inst(0, cap, 0),
                    Inst(4, cap, cap / 4)};
  const attnKvModel_t m = Model(100, 1, 1e-9, 2, 0.5);
  const auto mv = Plan(in, m);
  ASSERT_FALSE(mv.empty());
  int64_t total = 0;
  for (const auto& x : mv) {
    EXPECT_EQ(x.src, 0);
    total += x.num_blocks;
  }
  EXPECT_LE(total, cap - 1);
  EXPECT_GT(ClusterTps(in, m, mv, mv.size()), ClusterTps(in, m, mv, 0));
}

TEST(KvPlan, Deterministic) {
  std::mt19937_64 rng(5);
  for (int it = 0; it < 200; ++it) {
    Insts in;
    attnKvModel_t m;
    RandomCase(rng, &in, &m);
    const auto a = Plan(in, m), b = Plan(in, m);
    ASSERT_TRUE(Same(a, b)) << Str(a) << " vs " << Str(b);
  }
}

TEST(KvPlan, BadInputFailsWithMessage) {
  const Insts good = {Inst(1, 100, 100, 3, 90, 2, 10), Inst(0, 100, 10), Inst(0, 100, 10)};
  const attnKvModel_t gm = Model(100, 1, 5.0, 1, 0.5);
  attnKvMove_t buf[8];
  auto expectBad = [&](const Insts& in, const attnKvModel_t* m, int n, const char* what,
                       const char* mention) {
    int count = 8;
    EXPECT_EQ(attnKvPlan(in.data(), n, m, buf, &count), attnInvalidArgument) << what;
    const std::string msg = attnGetLastError(nullptr);
    EXPECT_FALSE(msg.empty()) << what;
    if (mention) {
      EXPECT_NE(msg.find(mention), std::string::npos) << what << ": " << msg;
    }
  };
  int count = 8;
  ASSERT_EQ(attnKvPlan(good.data(), 3, &gm, buf, &count), attnSuccess)
      << attnGetLastError(nullptr);
  EXPECT_GT(count, 0);

  expectBad(good, nullptr, 3, "model NULL", "model");
  EXPECT_EQ(attnKvPlan(nullptr, 3, &gm, buf, &count), attnInvalidArgument);
  EXPECT_FALSE(std::string(attnGetLastError(nullptr)).empty());
  EXPECT_EQ(attnKvPlan(good.data(), 3, &gm, buf, nullptr), attnInvalidArgument);
  count = 4;
  EXPECT_EQ(attnKvPlan(good.data(), 3, &gm, nullptr, &count), attnInvalidArgument);
  count = -1;
  EXPECT_EQ(attnKvPlan(good.data(), 3, &gm, buf, &count), attnInvalidArgument);
  expectBad(good, &gm, 0, "no instances", "num_instances");
  expectBad(good, &gm, -2, "negative instances", "num_instances");

  struct Bad {
    const char* what;
    std::function<void(attnKvInstance_t&)> f;
  };
  const Bad bads[] = {
      {"batch < 0", [](attnKvInstance_t& x) { x.batch_size = -1; }},
      {"pending < 0", [](attnKvInstance_t& x) { x.pending_requests = -3; }},
      {"pending_blocks < 0", [](attnKvInstance_t& x) { x.pending_blocks = -1; }},
      {"capacity < 0", [](attnKvInstance_t& x) { x.capacity_blocks = -1; }},
      {"used < 0", [](attnKvInstance_t& x) { x.used_blocks = -5; }},
      {"used > capacity", [](attnKvInstance_t& x) { x.used_blocks = x.capacity_blocks + 1; }},
      {"longest > used", [](attnKvInstance_t& x) { x.longest_req_blocks = x.used_blocks + 1; }},
      {"longest < 0", [](attnKvInstance_t& x) { x.longest_req_blocks = -1; }},
  };
  for (const Bad& b : bads) {
    Insts in = good;
    b.f(in[2]);
    expectBad(in, &gm, 3, b.what, "instance 2");
  }

  struct BadModel {
    const char* what;
    std::function<void(attnKvModel_t&)> f;
  };
  const BadModel badModels[] = {
      {"base NaN", [](attnKvModel_t& m) { m.nonattn_us_base = NAN; }},
      {"base < 0", [](attnKvModel_t& m) { m.nonattn_us_base = -1; }},
      {"per_req inf", [](attnKvModel_t& m) { m.nonattn_us_per_req = INFINITY; }},
      {"per_block < 0", [](attnKvModel_t& m) { m.attn_us_per_block = -0.5; }},
      {"per_block NaN", [](attnKvModel_t& m) { m.attn_us_per_block = NAN; }},
      {"zero time", [](attnKvModel_t& m) { m.nonattn_us_base = m.nonattn_us_per_req = 0; }},
      {"layers 0", [](attnKvModel_t& m) { m.num_layers = 0; }},
      {"util > 1", [](attnKvModel_t& m) { m.creditor_max_util = 1.5; }},
      {"util < 0", [](attnKvModel_t& m) { m.creditor_max_util = -0.1; }},
      {"util NaN", [](attnKvModel_t& m) { m.creditor_max_util = NAN; }},
  };
  for (const BadModel& b : badModels) {
    attnKvModel_t m = gm;
    b.f(m);
    expectBad(good, &m, 3, b.what, "model");
  }
}

TEST(KvPlan, ShortMoveBufferReportsNeededCount) {
  const Insts in = {Inst(1, 100, 100, 3, 30), Inst(0, 10, 0), Inst(0, 10, 0), Inst(0, 10, 0)};
  const attnKvModel_t m = Model(100, 1, 5.0, 1, 0.5);
  attnKvMove_t buf[8];
  const attnKvMove_t sentinel{-7, -7, -7, -7, -7};
  std::fill(buf, buf + 8, sentinel);

  int count = 0;  // the count query: no buffer, succeeds
  EXPECT_EQ(attnKvPlan(in.data(), 4, &m, nullptr, &count), attnSuccess);
  EXPECT_EQ(count, 3);

  count = 2;
  EXPECT_EQ(attnKvPlan(in.data(), 4, &m, buf, &count), attnInvalidArgument);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(buf[0].src, -7);  // nothing written on failure

  count = 3;
  ASSERT_EQ(attnKvPlan(in.data(), 4, &m, buf, &count), attnSuccess) << attnGetLastError(nullptr);
  EXPECT_EQ(count, 3);
  count = 8;
  ASSERT_EQ(attnKvPlan(in.data(), 4, &m, buf, &count), attnSuccess);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(buf[2].dst, 3);
  EXPECT_EQ(buf[3].src, -7);  // nothing past the plan

  // No moves needed: success with a zero-capacity query.
  const Insts idle = {Inst(5, 10, 1), Inst(5, 10, 1)};
  count = 0;
  EXPECT_EQ(attnKvPlan(idle.data(), 2, &m, nullptr, &count), attnSuccess);
  EXPECT_EQ(count, 0);
}

}  // namespace
