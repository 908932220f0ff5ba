// C API of the attention collectives: attnRingAttention and its selector,
// cost model and kernel hooks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "src/attn/attn_call.h"
#include "src/attn/calibrate.h"
#include "src/attn/selector.h"
#include "src/coll/coll.h"
#include "src/core/api_call.h"
#include "src/device/device_route.h"
#include "src/device/ring_attn_device.h"
#include "src/core/datatype.h"
#include "src/core/log.h"

using namespace attn;

namespace {

attnResult_t checkConfig(const attnAttnConfig_t* cfg) {
  ATTN_REQUIRE(cfg != nullptr, "attention config is NULL");
  ATTN_REQUIRE(cfg->num_q_heads > 0 && cfg->num_kv_heads > 0,
               "num_q_heads (%d) and num_kv_heads (%d) must be positive", cfg->num_q_heads,
               cfg->num_kv_heads);
  ATTN_REQUIRE(cfg->num_q_heads % cfg->num_kv_heads == 0,
               "num_q_heads (%d) must be a multiple of num_kv_heads (%d)", cfg->num_q_heads,
               cfg->num_kv_heads);
  ATTN_REQUIRE(cfg->head_dim >= 1 && cfg->head_dim <= cpu::kAttnMaxHeadDim,
               "head_dim %d is outside [1, %d]", cfg->head_dim, cpu::kAttnMaxHeadDim);
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

// What ranks exchange before running: their sizes, and the call's shape,
// which must agree.
struct AttnCard {
  int64_t qRows, kvRows;
  int32_t numSeqs, mode, hq, hkv, d, dtype, causal;
  float scale;
  int32_t overridesRates;  // ATTN_MODEL_* or attnCommSetCostModel on this rank
  int32_t pad;
};

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

attnResult_t exchangeCards(attnComm* comm, const AttnCard& mine, std::vector<AttnCard>* all) {
  const int n = comm->nranks;
  all->assign(n, AttnCard{});
  (*all)[comm->rank] = mine;
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * sizeof(AttnCard), sizeof(AttnCard)};
  ATTN_CHECK(ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n),
                            reinterpret_cast<char*>(all->data()), blocks, chunkBytes(1)));
  for (int r = 0; r < n; ++r) {
    const AttnCard& o = (*all)[r];
    if (o.numSeqs != mine.numSeqs || o.mode != mine.mode || o.hq != mine.hq || o.hkv != mine.hkv ||
        o.d != mine.d || o.dtype != mine.dtype || o.causal != mine.causal || o.scale != mine.scale)
      return setError(attnInvalidUsage,
                      "ring attention: rank %d called with (num_seqs %d, mode %d, heads %d/%d, "
                      "head_dim %d, dtype %d, causal %d) but rank %d with (%d, %d, %d/%d, %d, %d, %d)",
                      comm->rank, mine.numSeqs, mine.mode, mine.hq, mine.hkv, mine.d, mine.dtype,
                      mine.causal, r, o.numSeqs, o.mode, o.hq, o.hkv, o.d, o.dtype, o.causal);
  }
  return attnSuccess;
}

ModelInput modelInputOf(const std::vector<AttnCard>& cards, int numSeqs) {
  ModelInput in;
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
                      attnAttnMode_t* mode, AttnCall* out) {
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
  c.kvRowBytes = esz * cfg.num_kv_heads * cfg.head_dim;

  AttnCard mine{qRows, kvRows, layout.num_seqs, *mode, cfg.num_q_heads, cfg.num_kv_heads,
                cfg.head_dim, cfg.dtype, cfg.causal ? 1 : 0, cfg.softmax_scale,
                costModelOverridden(comm) ? 1 : 0, 0};
  std::vector<AttnCard> cards;
  ATTN_CHECK(exchangeCards(comm, mine, &cards));
  for (const auto& card : cards) {
    c.qRowsOf.push_back(card.qRows);
    c.kvRowsOf.push_back(card.kvRows);
  }
  if (*mode == attnModeAuto) {
    attnCostModel_t model;
    ATTN_CHECK(agreedModel(comm, cfg, cards, &model));
    attnModeEstimate_t est;
    estimateModes(model, cfg, modelInputOf(cards, layout.num_seqs), &est);
    *mode = est.chosen;
    ATTN_TRACE(kLogAttn, "auto: pass-KV %.0f us, pass-Q %.0f us, ship-Q %.0f us -> mode %d",
               est.pass_kv_us, est.pass_q_us, est.ship_q_us, (int)*mode);
  }
  return attnSuccess;
}

// Runs a planned call on host memory (c.q, c.kv host pointers) with the
// host algorithms, and writes out / lse (host).
attnResult_t runHostCall(AttnCall& c, attnAttnMode_t mode, void* out, float* lse) {
  const attnAttnConfig_t& cfg = c.cfg;
  c.accO.resize(static_cast<size_t>(c.q.rows) * cfg.num_q_heads * cfg.head_dim);
  c.accLse.resize(static_cast<size_t>(c.q.rows) * cfg.num_q_heads);
  cpu::initAccumulator(c.accO.data(), c.accLse.data(), c.q.rows, cfg.num_q_heads, cfg.head_dim);
  switch (mode) {
    case attnModePassKV: ATTN_CHECK(runPassKv(c)); break;
    case attnModePassQ: ATTN_CHECK(runPassQ(c)); break;
    case attnModeShipQ: ATTN_CHECK(runShipQ(c)); break;
    default: return setError(attnInternalError, "no algorithm for mode %d", (int)mode);
  }
  ATTN_CHECK(cpu::convertFromFloat(out, cfg.dtype, c.accO.data(), c.accO.size()));
  if (lse) std::memcpy(lse, c.accLse.data(), c.accLse.size() * sizeof(float));
  return attnSuccess;
}

void recordStats(AttnCall& c, attnAttnMode_t mode, Clock::time_point t0) {
  c.stats.mode = mode;
  c.stats.totalUs = usSince(t0);
  c.state->last = c.stats;
}

attnResult_t ringAttention(attnComm* comm, const void* q, const void* k, const void* v, void* out,
                           float* lse, const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg,
                           attnAttnMode_t mode) {
  auto t0 = Clock::now();
  AttnCall c;
  ATTN_CHECK(planCall(comm, q, k, v, layout, cfg, &mode, &c));
  ATTN_CHECK(runHostCall(c, mode, out, lse));
  recordStats(c, mode, t0);
  return attnSuccess;
}

// Device communicator: the layout (host memory) is copied now; the call
// runs on the communicator's proxy thread when its turn comes on the
// stream. Every mode runs the CUDA kernels on the device while its blocks
// move (src/device: ring_pass_kv_device.cc, ring_pass_q_device.cc,
// ship_q_device.cc).
attnResult_t enqueueOnDevice(const void* q, const void* k, const void* v, void* out, float* lse,
                             const attnSeqLayout_t& lay, const attnAttnConfig_t& cfg, attnAttnMode_t mode,
                             attnComm* comm, attnStream_t stream, int64_t qRows, int64_t kvRows) {
#if ATTN_HAVE_CUDA
  struct LayoutCopy {
    std::vector<int32_t> qOff, qPos, kvOff, kvPos;
    attnSeqLayout_t layout{};
  };
  auto lc = std::make_shared<LayoutCopy>();
  const int S = lay.num_seqs;
  // With no sequence the offsets may be NULL (checkOffsets allows it).
  lc->qOff = S > 0 ? std::vector<int32_t>(lay.q_offsets, lay.q_offsets + S + 1) : std::vector<int32_t>{0};
  lc->kvOff = S > 0 ? std::vector<int32_t>(lay.kv_offsets, lay.kv_offsets + S + 1) : std::vector<int32_t>{0};
  if (lay.q_pos) lc->qPos.assign(lay.q_pos, lay.q_pos + qRows);
  if (lay.kv_pos) lc->kvPos.assign(lay.kv_pos, lay.kv_pos + kvRows);
  lc->layout = {S, lc->qOff.data(), lay.q_pos ? lc->qPos.data() : nullptr, lc->kvOff.data(),
                lay.kv_pos ? lc->kvPos.data() : nullptr};
  return deviceEnqueueWork(comm, stream, [=]() -> attnResult_t {
    // Not an ApiCall: attnCommAbort must not wait for the proxy's work (it
    // breaks the engine that work may be blocked on).
    ErrorContext ctx(comm->prefix);
    ATTN_CHECK(checkCommUsable(comm));
    auto t0 = Clock::now();
    AttnCall c;
    attnAttnMode_t m = mode;
    ATTN_CHECK(planCall(comm, q, k, v, lc->layout, cfg, &m, &c));
    const DeviceAttnBuffers io{out, lse};
    switch (m) {
      case attnModePassKV: ATTN_CHECK(runPassKvDevice(c, io)); break;
      case attnModePassQ: ATTN_CHECK(runPassQDevice(c, io)); break;
      case attnModeShipQ: ATTN_CHECK(runShipQDevice(c, io)); break;
      default: return setError(attnInternalError, "no device algorithm for mode %d", (int)m);
    }
    recordStats(c, m, t0);
    return attnSuccess;
  });
#else
  (void)q, (void)k, (void)v, (void)out, (void)lse, (void)lay, (void)cfg, (void)mode, (void)stream;
  (void)qRows, (void)kvRows;
  return setError(attnInternalError, "rank %d: a device communicator in a build without CUDA", comm->rank);
#endif
}

}  // namespace

extern "C" {

attnResult_t attnRingAttention(const void* q, const void* k, const void* v, void* out, float* lse,
                               const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                               attnAttnMode_t mode, attnComm_t comm, attnStream_t stream) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  ATTN_CHECK(call.finish(checkConfig(cfg)));
  if (stream != nullptr && !deviceRoute(comm))
    return call.finish(setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream"));
  if (layout == nullptr) return call.finish(setError(attnInvalidArgument, "layout is NULL"));
  if (layout->num_seqs < 0)
    return call.finish(setError(attnInvalidArgument, "layout.num_seqs %d < 0", layout->num_seqs));
  if (mode < attnModeAuto || mode > attnModeShipQ)
    return call.finish(setError(attnInvalidArgument, "unknown attention mode %d", (int)mode));
  int64_t qRows, kvRows;
  ATTN_CHECK(call.finish(checkOffsets("q_offsets", layout->num_seqs, layout->q_offsets, &qRows)));
  ATTN_CHECK(call.finish(checkOffsets("kv_offsets", layout->num_seqs, layout->kv_offsets, &kvRows)));
  if (qRows > 0 && (!q || !out))
    return call.finish(setError(attnInvalidArgument, "q or out is NULL with %lld query rows", (long long)qRows));
  if (kvRows > 0 && (!k || !v))
    return call.finish(setError(attnInvalidArgument, "k or v is NULL with %lld key rows", (long long)kvRows));
  if (cfg->causal && ((qRows > 0 && !layout->q_pos) || (kvRows > 0 && !layout->kv_pos)))
    return call.finish(setError(attnInvalidArgument, "causal attention needs layout.q_pos and layout.kv_pos"));
  if (qRows > INT32_MAX || kvRows > INT32_MAX)
    return call.finish(setError(attnInvalidArgument, "more than 2^31 rows on one rank"));
  attnSeqLayout_t lay = *layout;
  attnAttnConfig_t c = *cfg;
  if (deviceRoute(comm))
    return call.finish(enqueueOnDevice(q, k, v, out, lse, lay, c, mode, comm, stream, qRows, kvRows));
  return call.finish(dispatch(comm, "RingAttention", [=] {
    return ringAttention(comm, q, k, v, out, lse, lay, c, mode);
  }));
}

attnResult_t attnSelectMode(const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                            attnComm_t comm, attnModeEstimate_t* estimate) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  ATTN_CHECK(call.finish(checkConfig(cfg)));
  if (!layout || !estimate)
    return call.finish(setError(attnInvalidArgument, "layout and estimate must not be NULL"));
  int64_t qRows, kvRows;
  ATTN_CHECK(call.finish(checkOffsets("q_offsets", layout->num_seqs, layout->q_offsets, &qRows)));
  ATTN_CHECK(call.finish(checkOffsets("kv_offsets", layout->num_seqs, layout->kv_offsets, &kvRows)));
  AttnCard mine{qRows, kvRows, layout->num_seqs, attnModeAuto, cfg->num_q_heads, cfg->num_kv_heads,
                cfg->head_dim, cfg->dtype, cfg->causal ? 1 : 0, cfg->softmax_scale,
                costModelOverridden(comm) ? 1 : 0, 0};
  std::vector<AttnCard> cards;
  ATTN_CHECK(call.finish(exchangeCards(comm, mine, &cards)));
  attnCostModel_t model;
  ATTN_CHECK(call.finish(agreedModel(comm, *cfg, cards, &model)));
  estimateModes(model, *cfg, modelInputOf(cards, layout->num_seqs), estimate);
  return attnSuccess;
}

attnResult_t attnEstimateModes(const attnCostModel_t* model, const attnAttnConfig_t* cfg, int nranks,
                               int64_t newTokens, int64_t cachedTokens, attnModeEstimate_t* estimate) {
  ErrorContext ctx("-");
  clearThreadLastError();
  ATTN_CHECK(checkConfig(cfg));
  ATTN_REQUIRE(model && estimate, "model and estimate must not be NULL");
  ATTN_REQUIRE(nranks >= 1, "nranks must be >= 1");
  ATTN_REQUIRE(newTokens >= 0 && cachedTokens >= 0, "token counts must be >= 0");
  ATTN_REQUIRE(costModelValid(*model),
               "cost model rates must be positive and comm_interference within [0, 1]");
  ModelInput in;
  in.nranks = nranks;
  in.numSeqs = 1;
  in.newTokens = newTokens;
  in.cachedTokens = cachedTokens;
  in.maxQRows = (newTokens + nranks - 1) / nranks;
  in.maxKvRows = (newTokens + cachedTokens + nranks - 1) / nranks;
  estimateModes(*model, *cfg, in, estimate);
  return attnSuccess;
}

attnResult_t attnCommGetCostModel(attnComm_t comm, attnCostModel_t* model) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  if (!model) return call.finish(setError(attnInvalidArgument, "model is NULL"));
  attnAttnConfig_t cfg{8, 8, 128, attnFloat32, 0.0f, 1};
  return call.finish(costModelOf(comm, cfg, model));
}

attnResult_t attnCommSetCostModel(attnComm_t comm, const attnCostModel_t* model) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  AttnState& st = attnStateOf(comm);
  if (model == nullptr) {
    st.modelOverridden = false;
    return attnSuccess;
  }
  if (!costModelValid(*model))
    return call.finish(setError(attnInvalidArgument,
                                "cost model rates must be positive and comm_interference within [0, 1]"));
  st.override = *model;
  st.modelOverridden = true;
  return attnSuccess;
}

attnResult_t attnCommSetAttnKernel(attnComm_t comm, attnAttnKernelFn fn, void* userData) {
  ApiCall call(comm);
  ATTN_CHECK(call.finish(checkCommUsable(comm)));
  AttnState& st = attnStateOf(comm);
  st.userKernel = fn;
  st.userData = userData;
  st.kernelTflops.clear();  // the new kernel has its own rate
  return attnSuccess;
}

}  // extern "C"
