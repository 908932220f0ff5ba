// Planning one attention collective: see plan_call.h.
#include "src/attn/plan_call.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/sinks.h"
#include "src/attn/attn_config.h"
#include "src/attn/calibrate.h"
#include "src/coll/coll.h"
#include "src/core/api_call.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/device_route.h"

namespace attn {

AttnCard cardOf(attnComm* comm, int64_t qRows, int64_t kvRows, int numSeqs, int32_t mode,
                const attnAttnConfig_t& cfg, const float* keep) {
  AttnCard c{};
  c.qRows = qRows;
  c.kvRows = kvRows;
  c.numSeqs = numSeqs;
  c.mode = mode;
  c.hq = cfg.num_q_heads;
  c.hkv = cfg.num_kv_heads;
  c.d = cfg.head_dim;
  c.dv = attnValueDim(cfg);
  c.dtype = cfg.dtype;
  c.causal = cfg.causal ? 1 : 0;
  c.scale = cfg.softmax_scale;
  c.overridesRates = costModelOverridden(comm) ? 1 : 0;
  for (int t = 0; t < 4; ++t) c.keep[t] = keep ? keep[t] : 1.0f;
  c.windowLeft = cfg.window_left;
  c.windowRight = cfg.window_right;
  c.softcap = cfg.softcap;
  c.sinks = cfg.sinks != nullptr ? 1 : 0;
  c.pos = PosRanges{};
  return c;
}

attnResult_t checkConfig(const attnAttnConfig_t* user) {
  attnAttnConfig_t c;
  ATTN_CHECK(readAttnConfig(user, &c));
  const attnAttnConfig_t* cfg = &c;
  ATTN_REQUIRE(cfg->num_q_heads > 0 && cfg->num_kv_heads > 0,
               "num_q_heads (%d) and num_kv_heads (%d) must be positive", cfg->num_q_heads,
               cfg->num_kv_heads);
  ATTN_REQUIRE(cfg->num_q_heads % cfg->num_kv_heads == 0,
               "num_q_heads (%d) must be a multiple of num_kv_heads (%d)", cfg->num_q_heads,
               cfg->num_kv_heads);
  ATTN_REQUIRE(cfg->head_dim >= 1 && cfg->head_dim <= cpu::kAttnMaxHeadDim,
               "head_dim %d is outside [1, %d]", cfg->head_dim, cpu::kAttnMaxHeadDim);
  ATTN_REQUIRE(cfg->head_dim_v >= 1 && cfg->head_dim_v <= cpu::kAttnMaxHeadDim,
               "head_dim_v %d is outside [1, %d] (0: head_dim)", cfg->head_dim_v, cpu::kAttnMaxHeadDim);
  ATTN_REQUIRE(cfg->dtype == attnFloat32 || cfg->dtype == attnFloat16 || cfg->dtype == attnBfloat16,
               "attention dtype must be attnFloat32, attnFloat16 or attnBfloat16, got %s",
               dataTypeName(cfg->dtype));
  ATTN_REQUIRE(std::isfinite(cfg->softmax_scale) && cfg->softmax_scale >= 0,
               "softmax_scale must be finite and >= 0");
  return attnSuccess;
}

attnResult_t checkOffsets(const char* what, int numSeqs, const int32_t* offs, int64_t* rows) {
  *rows = 0;
  if (numSeqs == 0) return attnSuccess;
  ATTN_REQUIRE(offs != nullptr, "layout.%s is NULL", what);
  ATTN_REQUIRE(offs[0] == 0, "layout.%s[0] must be 0, got %d", what, offs[0]);
  for (int i = 0; i < numSeqs; ++i)
    ATTN_REQUIRE(offs[i + 1] >= offs[i], "layout.%s decreases at sequence %d (%d -> %d)", what, i,
                 offs[i], offs[i + 1]);
  *rows = offs[numSeqs];
  return attnSuccess;
}

// The rates AUTO decides with: calibrated (already agreed), then local
// overrides; when any rank overrides, every rank takes the slowest figures
// so all of them still choose the same mode.
attnResult_t agreedModel(attnComm* comm, const attnAttnConfig_t& cfg,
                         const std::vector<AttnCard>& cards, attnCostModel_t* model) {
  ATTN_CHECK(costModelOf(comm, cfg, model));
  bool any = false;
  for (const auto& c : cards) any |= c.overridesRates != 0;
  if (!any || comm->nranks == 1) return attnSuccess;
  const int n = comm->nranks;
  std::vector<attnCostModel_t> all(n);
  all[comm->rank] = *model;
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * sizeof(attnCostModel_t), sizeof(attnCostModel_t)};
  ATTN_CHECK(ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n),
                            reinterpret_cast<char*>(all.data()), blocks, chunkBytes(1)));
  for (const auto& m : all) {
    model->link_bandwidth_GBps = std::min(model->link_bandwidth_GBps, m.link_bandwidth_GBps);
    model->link_latency_us = std::max(model->link_latency_us, m.link_latency_us);
    model->attn_tflops = std::min(model->attn_tflops, m.attn_tflops);
    model->comm_interference = std::max(model->comm_interference, m.comm_interference);
  }
  return attnSuccess;
}

namespace {
const char* callName(const AttnCard& c) {
  return c.mode == kLevelCallMode ? "level attention" : "ring attention";
}
}  // namespace

attnResult_t checkPeerCard(const AttnCard& mine, const AttnCard& o, int peer) {
  const size_t esz = dataTypeSize(attnDataType_t(mine.dtype));
  const size_t qRowBytes = esz * size_t(mine.hq) * size_t(mine.d);
  const RowBytes kvRow = RowBytes::two(esz * size_t(mine.hkv) * size_t(mine.d), esz * size_t(mine.hkv) * size_t(mine.dv));
  BlockLayout q, kv;
  size_t partial = 0;
  if (o.qRows < 0 || o.qRows > INT32_MAX || o.kvRows < 0 || o.kvRows > INT32_MAX ||
      !BlockLayout::checked(mine.numSeqs, o.qRows, RowBytes::one(qRowBytes), &q) ||
      !BlockLayout::checked(mine.numSeqs, o.kvRows, kvRow, &kv) ||
      __builtin_mul_overflow(size_t(o.qRows), size_t(mine.hq) * (size_t(mine.dv) + 1) * sizeof(float), &partial))
    return setError(attnRemoteError,
                    "%s: rank %d announced %lld query and %lld key rows (a rank holds 0 .. 2^31 - 1 of each, "
                    "whose blocks fit in memory)", callName(mine), peer, static_cast<long long>(o.qRows),
                    static_cast<long long>(o.kvRows));
  return attnSuccess;
}

attnResult_t exchangeCards(attnComm* comm, const AttnCard& mine, std::vector<AttnCard>* all) {
  const int n = comm->nranks, me = comm->rank;
  all->assign(n, AttnCard{});
  (*all)[me] = mine;
  // Every card straight to every peer, all at once: one message time, where
  // a ring took n - 1 in a row (a decode step's planning, measured with 4
  // processes on 2 cores: perf/RESULTS.md section 15).
  Engine& e = *comm->engine;
  std::unique_ptr<Request[]> req(new Request[2 * size_t(n)]);
  req[2 * me].complete(sizeof(AttnCard));  // no messages to ourselves
  req[2 * me + 1].complete(0);
  for (int p = 0; p < n; ++p)
    if (p != me) ATTN_CHECK(e.irecv(p, &(*all)[p], sizeof(AttnCard), &req[2 * p]));
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    ATTN_CHECK(e.isend(p, &(*all)[me], sizeof(AttnCard), &req[2 * p + 1]));
  }
  ATTN_CHECK(e.waitAll(req.get(), 2 * size_t(n)));
  for (int p = 0; p < n; ++p)
    if (req[2 * p].bytes != sizeof(AttnCard))
      return setError(attnRemoteError, "%s: rank %d sent a %zu-byte card, %zu expected", callName(mine), p,
                      req[2 * p].bytes, sizeof(AttnCard));
  if (mine.status != attnSuccess) return attnResult_t(mine.status);  // its own text stands
  for (int r = 0; r < n; ++r)
    if ((*all)[r].status != attnSuccess)
      return setError(attnRemoteError, "%s: rank %d could not take part (%s; its own error says why)",
                      callName(mine), r, attnGetErrorString(attnResult_t((*all)[r].status)));
  for (int r = 0; r < n; ++r) {
    const AttnCard& o = (*all)[r];
    if (o.numSeqs != mine.numSeqs || o.mode != mine.mode || o.hq != mine.hq || o.hkv != mine.hkv ||
        o.d != mine.d || o.dv != mine.dv || o.dtype != mine.dtype || o.causal != mine.causal ||
        o.scale != mine.scale)
      return setError(attnInvalidUsage,
                      "%s: rank %d called with (num_seqs %d, mode %d, heads %d/%d, "
                      "head_dim %d/%d, dtype %d, causal %d) but rank %d with (%d, %d, %d/%d, %d/%d, %d, %d)",
                      callName(mine), comm->rank, mine.numSeqs, mine.mode, mine.hq, mine.hkv, mine.d, mine.dv,
                      mine.dtype, mine.causal, r, o.numSeqs, o.mode, o.hq, o.hkv, o.d, o.dv, o.dtype,
                      o.causal);
    if (o.windowLeft != mine.windowLeft || o.windowRight != mine.windowRight || o.softcap != mine.softcap ||
        o.sinks != mine.sinks)
      return setError(attnInvalidUsage,
                      "%s: rank %d called with (window %d/%d, softcap %g, sinks %s) but rank %d with "
                      "(%d/%d, %g, %s): every rank must pass the same window, softcap and whether sinks are set",
                      callName(mine), comm->rank, mine.windowLeft, mine.windowRight, double(mine.softcap),
                      mine.sinks ? "set" : "none", r, o.windowLeft, o.windowRight, double(o.softcap),
                      o.sinks ? "set" : "none");
    if (std::memcmp(o.keep, mine.keep, sizeof(mine.keep)) != 0)
      return setError(attnInvalidUsage,
                      "%s: rank %d keeps (%g, %g, %g, %g) of the keys by tier but rank %d keeps "
                      "(%g, %g, %g, %g): every rank must pass the same keep fractions",
                      callName(mine), comm->rank, mine.keep[0], mine.keep[1], mine.keep[2],
                      mine.keep[3], r, o.keep[0], o.keep[1], o.keep[2], o.keep[3]);
    ATTN_CHECK(checkPeerCard(mine, o, r));
  }
  return attnSuccess;
}

namespace {
// The refused card's exchange; a failure of the exchange itself is new.
attnResult_t sendRefusal(attnComm* comm, int32_t cardMode, attnResult_t status) {
  AttnCard mine{};
  mine.mode = cardMode;
  mine.status = status;
  std::vector<AttnCard> all;
  const attnResult_t r = exchangeCards(comm, mine, &all);
  return r == status ? attnSuccess : r;
}
}  // namespace

attnResult_t refuseCall(attnComm* comm, attnStream_t stream, attnResult_t status, int32_t cardMode) {
  const std::string why = threadLastError();
  if (deviceRoute(comm)) {
    (void)deviceEnqueueWork(comm, stream, [comm, cardMode, status]() -> attnResult_t {
      ErrorContext ctx(comm->prefix);
      return sendRefusal(comm, cardMode, status);
    });
  } else {
    (void)dispatch(comm, "refused attention call",
                   [comm, cardMode, status] { return sendRefusal(comm, cardMode, status); });
  }
  return restoreError(status, why);
}

attnResult_t refuseCallHere(attnComm* comm, attnResult_t status, int32_t cardMode) {
  const std::string why = threadLastError();
  (void)sendRefusal(comm, cardMode, status);
  return restoreError(status, why);
}

ModelInput modelInputOf(attnComm* comm, const std::vector<AttnCard>& cards, int numSeqs) {
  ModelInput in;
  in.allGatherKv = !deviceRoute(comm);
  in.nranks = static_cast<int>(cards.size());
  in.numSeqs = numSeqs;
  int64_t kvTotal = 0;
  for (const auto& c : cards) {
    in.newTokens += c.qRows;
    kvTotal += c.kvRows;
    in.maxQRows = std::max(in.maxQRows, c.qRows);
    in.maxKvRows = std::max(in.maxKvRows, c.kvRows);
  }
  in.cachedTokens = std::max<int64_t>(0, kvTotal - in.newTokens);
  return in;
}

// Plans one call on host-side metadata: checks the layout, rebases the
// offsets, learns every rank's row counts and agrees on the mode (AUTO
// resolved). Collective. The tensors are only recorded: host pointers on a
// host communicator, device pointers on a device one.
attnResult_t planCall(attnComm* comm, const void* q, const void* k, const void* v,
                      const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg,
                      attnAttnMode_t* mode, AttnCall* out, const float* keep) {
  const auto t0 = Clock::now();
  AttnCall& c = *out;
  c.comm = comm;
  c.state = &attnStateOf(comm);
  c.cfg = cfg;
  c.numSeqs = layout.num_seqs;
  int64_t qRows, kvRows;
  ATTN_CHECK(checkOffsets("q_offsets", layout.num_seqs, layout.q_offsets, &qRows));
  ATTN_CHECK(checkOffsets("kv_offsets", layout.num_seqs, layout.kv_offsets, &kvRows));
  if (layout.num_seqs == 0) {
    c.qOffsets = c.kvOffsets = {0};
  } else {
    c.qOffsets.assign(layout.q_offsets, layout.q_offsets + layout.num_seqs + 1);
    c.kvOffsets.assign(layout.kv_offsets, layout.kv_offsets + layout.num_seqs + 1);
  }
  // Positions only matter for the causal mask; without one, zeros will do.
  const int32_t* qpos = layout.q_pos;
  const int32_t* kvpos = layout.kv_pos;
  if (!qpos || !kvpos) c.zeroPos.assign(std::max<int64_t>({qRows, kvRows, 1}), 0);
  if (!qpos) qpos = c.zeroPos.data();
  if (!kvpos) kvpos = c.zeroPos.data();
  c.q = {q, nullptr, static_cast<int32_t>(qRows), c.qOffsets.data(), qpos};
  c.kv = {k, v, static_cast<int32_t>(kvRows), c.kvOffsets.data(), kvpos};
  const size_t esz = dataTypeSize(cfg.dtype);
  c.qRowBytes = esz * cfg.num_q_heads * cfg.head_dim;
  c.kRowBytes = esz * cfg.num_kv_heads * cfg.head_dim;
  c.vRowBytes = esz * cfg.num_kv_heads * cfg.head_dim_v;

  const int32_t cardMode = keep ? kLevelCallMode : static_cast<int32_t>(*mode);
  AttnCard mine = cardOf(comm, qRows, kvRows, layout.num_seqs, cardMode, cfg, keep);
  const bool windowed = cfg.window_left >= 0 || cfg.window_right >= 0;
  if (windowed) {
    positionRange(qpos, qRows, &mine.pos.qMin, &mine.pos.qMax);
    positionRange(kvpos, kvRows, &mine.pos.kvMin, &mine.pos.kvMax);
  }
  std::vector<AttnCard> cards;
  ATTN_CHECK(exchangeCards(comm, mine, &cards));
  std::vector<PosRanges> ranges;
  for (const auto& card : cards) {
    c.qRowsOf.push_back(card.qRows);
    c.kvRowsOf.push_back(card.kvRows);
    ranges.push_back(card.pos);
  }
  // Host communicators skip what a window hides; device ones move every
  // block (their kernels skip the masked tiles).
  if (windowed && !deviceRoute(comm)) c.vis = RankVisibility(cfg, std::move(ranges));
  if (!keep && *mode == attnModeAuto) {
    attnCostModel_t model;
    ATTN_CHECK(agreedModel(comm, cfg, cards, &model));
    attnModeEstimate_t est;
    ModelInput in = modelInputOf(comm, cards, layout.num_seqs);
    if (c.vis.active()) {
      in.kvMoves = c.vis.ringMovesMax(false);
      in.qMoves = c.vis.ringMovesMax(true);
      in.peersSeen = c.vis.peersSeenMax();
    }
    estimateModes(model, cfg, in, &est);
    *mode = est.chosen;
    ATTN_TRACE(kLogAttn,
               "auto: pass-KV %.0f us, pass-Q %.0f us, ship-Q %.0f us, heads %.0f us, all-gather KV %.0f us -> "
               "mode %d",
               est.pass_kv_us, est.pass_q_us, est.ship_q_us, est.head_parallel_us, est.all_gather_kv_us,
               (int)*mode);
  }
  c.stats.planUs = usSince(t0);
  return attnSuccess;
}

attnResult_t runHostCall(AttnCall& c, const std::function<attnResult_t(AttnCall&)>& algo,
                         void* out, float* lse) {
  const attnAttnConfig_t& cfg = c.cfg;
  auto t0 = Clock::now();
  c.accO.resize(static_cast<size_t>(c.q.rows) * cfg.num_q_heads * cfg.head_dim_v);
  c.accLse.resize(static_cast<size_t>(c.q.rows) * cfg.num_q_heads);
  cpu::initAccumulator(c.accO.data(), c.accLse.data(), c.q.rows, cfg.num_q_heads, cfg.head_dim_v);
  c.stats.setupUs += usSince(t0);
  ATTN_CHECK(algo(c));
  t0 = Clock::now();
  // Sinks join the denominator once, after every rank's keys are merged.
  if (cfg.sinks) cpu::applySinks(c.accO.data(), c.accLse.data(), c.q.rows, cfg.num_q_heads, cfg.head_dim_v, cfg.sinks);
  ATTN_CHECK(cpu::convertFromFloat(out, cfg.dtype, c.accO.data(), c.accO.size()));
  if (lse) writeLse(cfg, c.accLse.data(), lse, c.q.rows, cfg.num_q_heads);
  c.stats.outputUs += usSince(t0);
  return attnSuccess;
}

attnResult_t checkCallShape(const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg) {
  ATTN_CHECK(checkConfig(cfg));
  ATTN_REQUIRE(layout != nullptr, "layout is NULL");
  ATTN_REQUIRE(layout->num_seqs >= 0, "layout.num_seqs %d < 0", layout->num_seqs);
  return attnSuccess;
}

attnResult_t checkLayoutRows(const void* q, const void* k, const void* v, const void* out,
                             const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg, int64_t* qRows,
                             int64_t* kvRows) {
  ATTN_CHECK(checkOffsets("q_offsets", layout.num_seqs, layout.q_offsets, qRows));
  ATTN_CHECK(checkOffsets("kv_offsets", layout.num_seqs, layout.kv_offsets, kvRows));
  ATTN_REQUIRE(*qRows == 0 || (q && out), "q or out is NULL with %lld query rows", (long long)*qRows);
  ATTN_REQUIRE(*kvRows == 0 || (k && v), "k or v is NULL with %lld key rows", (long long)*kvRows);
  ATTN_REQUIRE(!attnNeedsPositions(cfg) || ((*qRows == 0 || layout.q_pos) && (*kvRows == 0 || layout.kv_pos)),
               "causal or windowed attention needs layout.q_pos and layout.kv_pos");
  ATTN_REQUIRE(*qRows <= INT32_MAX && *kvRows <= INT32_MAX, "more than 2^31 rows on one rank");
  return attnSuccess;
}

attnResult_t checkCallArgs(const void* q, const void* k, const void* v, const void* out,
                           const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                           int64_t* qRows, int64_t* kvRows) {
  ATTN_CHECK(checkCallShape(layout, cfg));
  return checkLayoutRows(q, k, v, out, *layout, *cfg, qRows, kvRows);
}

void recordStats(AttnCall& c, attnAttnMode_t mode, Clock::time_point t0) {
  c.stats.mode = mode;
  c.stats.totalUs = usSince(t0);
  c.state->last = c.stats;
}


std::shared_ptr<const LayoutCopy> copyLayout(const attnSeqLayout_t& lay, int64_t qRows, int64_t kvRows) {
  auto lc = std::make_shared<LayoutCopy>();
  const int S = lay.num_seqs;
  // With no sequence the offsets may be NULL (checkOffsets allows it).
  lc->qOff = S > 0 ? std::vector<int32_t>(lay.q_offsets, lay.q_offsets + S + 1) : std::vector<int32_t>{0};
  lc->kvOff = S > 0 ? std::vector<int32_t>(lay.kv_offsets, lay.kv_offsets + S + 1) : std::vector<int32_t>{0};
  if (lay.q_pos) lc->qPos.assign(lay.q_pos, lay.q_pos + qRows);
  if (lay.kv_pos) lc->kvPos.assign(lay.kv_pos, lay.kv_pos + kvRows);
  lc->layout = {S, lc->qOff.data(), lay.q_pos ? lc->qPos.data() : nullptr, lc->kvOff.data(),
                lay.kv_pos ? lc->kvPos.data() : nullptr};
  return lc;
}

}  // namespace attn
