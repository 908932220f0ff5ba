// Predicted time of each mode, step by step as the algorithms run. A step
// that computes for a while moving data for c takes
//   step(a, c) = max(a, c) + beta * min(a, c)
// where beta (comm_interference) is the share of the transfer that also holds
// the kernel up: 0 on GPUs and NICs (the CP paper's max), about 1 for
// host-memory copies on oversubscribed cores, measured at calibration.
//   pass-KV: t_attn + (N-1) * step(t_attn, t_kv)
//   pass-Q:  t_attn + (N-1) * step(t_attn, t_q + t_ret) + t_ret
//            (each step forwards a query block and sends one partial home;
//            the last partial is exposed)
//   ship-Q:  step(t_attn, Q to all) + step((N-1) t_attn, returns leaving) + t_ret
//            (all queries go out at once, one latency; the N-1 partials
//            leave as they are computed and share the link)
//   head-parallel: step(N t_attn' - t_last, t_rows) + t_last + t_out
//            (rows out on the pairwise schedule while the grid of arrived
//            pairs is computed; t_attn' = t_attn scaled by the largest head
//            group's share, t_last the pairs the last arrival brings,
//            t_out the outputs going home in the model's dtype)
//   all-gather KV: step(t_attn, t_kv) + (N-2) step(t_attn, t_kv - lat) + t_attn
//            (every block leaves at once, one latency; they share the
//            link and land one after another, each merged on arrival
//            while the next comes in: the last block's attention is
//            exposed. A ring pays the latency, and a neighbour's pace, at
//            each of its N-1 steps)
// with t_attn one step's attention (the largest shard against one rank's
// keys), t_kv / t_q a KV / Q block on the link, t_ret one partial (fp32 O
// and lse) coming home. Ship-Q is a candidate only for decode-like shapes
// (at most one new token per sequence and rank), where its single hop pays.
// Alg. 1's threshold (Eq. 2) and Alg. 5's choice (App. C) are reported too,
// with the paper's rates and no interference.
#include "src/attn/selector.h"

#include <algorithm>
#include <cmath>

#include "src/attn/attn_config.h"
#include "src/attn/head_groups.h"
#include "src/core/datatype.h"

namespace attn {

void estimateModes(const attnCostModel_t& m, const attnAttnConfig_t& cfg, const ModelInput& in,
                   attnModeEstimate_t* out) {
  const double N = in.nranks, T = static_cast<double>(in.newTokens),
               P = static_cast<double>(in.cachedTokens);
  const double e = static_cast<double>(dataTypeSize(cfg.dtype));
  const double Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  const double Dv = attnValueDim(cfg);  // of V and the outputs
  const double bw = std::max(m.link_bandwidth_GBps, 1e-9) * 1e9;  // bytes/s
  const double lat = m.link_latency_us * 1e-6;
  const double C = std::max(m.attn_tflops, 1e-9) * 1e12;
  const double qRows = std::max<double>(in.maxQRows, T / N);
  const double kvRows = std::max<double>(in.maxKvRows, (T + P) / N);
  // Causal: new tokens see all cached keys and about half of the new ones;
  // a window caps the keys each query sees.
  double seen = cfg.causal ? P + 0.5 * T : T + P;
  if (cfg.window_left >= 0 || cfg.window_right >= 0) {
    const double right = cfg.causal ? 0.0 : cfg.window_right < 0 ? T + P : cfg.window_right;
    const double left = cfg.window_left < 0 ? T + P : cfg.window_left;
    seen = std::min(seen, left + right + 1.0);
  }
  const double visible = T + P > 0 ? std::clamp(seen / (T + P), 0.0, 1.0) : 1.0;
  const double tAttn = 2.0 * qRows * kvRows * visible * Hq * (D + Dv) / C;  // QK^T and PV
  const double tKv = lat + kvRows * Hkv * (D + Dv) * e / bw;
  const double tQ = lat + qRows * Hq * D * e / bw;
  const double tRet = lat + qRows * Hq * (Dv + 1) * 4.0 / bw;
  const double steps = N - 1;
  // Moves a window leaves (visibility.h); the kernels skip what it hides.
  const double kvSteps = in.kvMoves < 0 ? steps : in.kvMoves;
  const double qSteps = in.qMoves < 0 ? steps : in.qMoves;
  const double peers = in.peersSeen < 0 ? steps : in.peersSeen;
  const double beta = std::clamp(m.comm_interference, 0.0, 1.0);
  auto step = [beta](double a, double c) { return std::max(a, c) + beta * std::min(a, c); };
  out->pass_kv_us = 1e6 * (tAttn + kvSteps * step(tAttn, tKv));
  out->pass_q_us = 1e6 * (tAttn + qSteps * step(tAttn, tQ + tRet) + (qSteps > 0 ? tRet : 0));
  out->ship_q_us = 1e6 * (step(tAttn, peers * (tQ - lat) + lat) +
                          step(peers * tAttn, peers * (tRet - lat)) + (peers > 0 ? tRet : 0));
  // Head-parallel: each rank sends (N-1)/N of its Q, K and V (a KV head
  // goes to every group that reads it) and of the outputs coming home, and
  // computes the whole sequence for its heads.
  int maxGroup = 0, kvSent = 0;
  for (const HeadGroup& g : headGroups(cfg.num_q_heads, cfg.num_kv_heads, in.nranks)) {
    maxGroup = std::max(maxGroup, g.q());
    kvSent += g.kv();
  }
  const double share = (N - 1) / N;
  const double tRows = steps * lat + share * (qRows * Hq * D + kvRows * kvSent * (D + Dv)) * e / bw;
  const double tOut = steps * lat + share * qRows * Hq * (Dv * e + 4.0) / bw;
  const double tAll = N * N * tAttn * maxGroup / Hq;
  const double tLast = (2.0 * N - 1.0) / (N * N) * tAll;
  out->head_parallel_us = 1e6 * (step(tAll - tLast, tRows) + tLast + tOut);
  out->all_gather_kv_us =
      1e6 * (step(tAttn, tKv) + std::max(0.0, peers - 1) * step(tAttn, tKv - lat) + (peers > 0 ? tAttn : 0));
  if (N == 1) out->pass_q_us = out->ship_q_us = out->head_parallel_us = out->all_gather_kv_us = out->pass_kv_us;

  const bool decodeLike = in.newTokens <= static_cast<int64_t>(in.numSeqs) * in.nranks;
  out->chosen = out->pass_kv_us <= out->pass_q_us ? attnModePassKV : attnModePassQ;
  double best = std::min(out->pass_kv_us, out->pass_q_us);
  if (N > 1 && out->head_parallel_us < best) {
    out->chosen = attnModeHeadParallel;
    best = out->head_parallel_us;
  }
  // Strictly cheaper: at N = 2 it moves what pass-KV moves, the same way.
  // And only while every rank can hold every rank's keys and values at
  // once (a ring holds two blocks): a million-token cache cannot.
  const double gathered =
      N * double(in.maxKvRows) * cfg.num_kv_heads * (D + Dv) * double(dataTypeSize(cfg.dtype));
  if (N > 1 && in.allGatherKv && gathered <= kAutoMaxHeldBytes && out->all_gather_kv_us < best) {
    out->chosen = attnModeAllGatherKV;
    best = out->all_gather_kv_us;
  }
  // Ship-Q holds every peer's query block and partial at once: beyond
  // decode, only while those fit as all-gather KV's keys must.
  const double shipHeld = (N - 1) * qRows * Hq * (D * e + (Dv + 1) * 4.0);
  if ((decodeLike || shipHeld <= kAutoMaxHeldBytes) && out->ship_q_us < best) out->chosen = attnModeShipQ;

  // Alg. 1 / Alg. 5 with the same rates (per-head normalised, as the paper).
  out->alg1_threshold_tokens = N * C * Hkv * e / (2.0 * Hq * bw);
  const double miss = T + P > 0 ? T / (T + P) : 1.0;
  const bool kv = T >= out->alg1_threshold_tokens ||
                  miss >= 2.0 * Hkv / Hq - 4.0 * T * bw / (N * C * e);
  out->alg1_choice = kv ? attnModePassKV : attnModePassQ;
}

}  // namespace attn
