#include "src/attn/calibrate.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/attention.h"
#include "src/attn/attn_call.h"
#include "src/coll/coll.h"
#include "src/core/env.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {
namespace {

// Seconds for one ring exchange (send to next, receive from prev) of bytes.
attnResult_t timeExchange(Engine& e, size_t bytes, int reps, double* seconds) {
  const int n = e.nranks(), me = e.rank();
  std::vector<char> out(bytes, 1), in(bytes);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    Request s, r;
    ATTN_CHECK(e.irecv((me - 1 + n) % n, in.data(), bytes, &r));
    ATTN_CHECK(e.isend((me + 1) % n, out.data(), bytes, &s));
    ATTN_CHECK(e.wait(&s));
    ATTN_CHECK(e.wait(&r));
    t.push_back(usSince(t0) * 1e-6);
  }
  std::sort(t.begin(), t.end());
  *seconds = t[t.size() / 2];
  return attnSuccess;
}

// Everyone takes the slowest rank's figures.
attnResult_t agree(attnComm* comm, double* lat, double* bw, double* tflops) {
  const int n = comm->nranks;
  std::vector<double> all(3 * n);
  all[3 * comm->rank] = *lat;
  all[3 * comm->rank + 1] = *bw;
  all[3 * comm->rank + 2] = *tflops;
  std::vector<Block> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = {i * 3 * sizeof(double), 3 * sizeof(double)};
  ATTN_CHECK(ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n),
                            reinterpret_cast<char*>(all.data()), blocks, chunkBytes(1)));
  for (int r = 0; r < n; ++r) {
    *lat = std::max(*lat, all[3 * r]);
    *bw = std::min(*bw, all[3 * r + 1]);
    *tflops = std::min(*tflops, all[3 * r + 2]);
  }
  return attnSuccess;
}

attnResult_t timeKernel(attnComm* comm, const attnAttnConfig_t& cfg, double* tflops) {
  AttnState& st = attnStateOf(comm);
  const int nq = std::max(8, 1024 / cfg.num_q_heads), nk = 512;
  const size_t esz = cfg.dtype == attnFloat32 ? 4 : 2;
  std::vector<char> q(esz * nq * cfg.num_q_heads * cfg.head_dim, 0),
      kv(esz * nk * cfg.num_kv_heads * cfg.head_dim, 0);
  std::vector<int32_t> qpos(nq, nk), kpos(nk);
  for (int i = 0; i < nk; ++i) kpos[i] = i;
  std::vector<float> o(static_cast<size_t>(nq) * cfg.num_q_heads * cfg.head_dim), lse(nq * cfg.num_q_heads);
  AttnCall c;
  c.comm = comm;
  c.state = &st;
  c.cfg = cfg;
  c.cfg.causal = 0;
  c.numSeqs = 1;
  int32_t qoff[2] = {0, nq}, koff[2] = {0, nk};
  RowsRef qs{q.data(), nullptr, nq, qoff, qpos.data()}, ks{kv.data(), kv.data(), nk, koff, kpos.data()};
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    ATTN_CHECK(c.partial(qs, ks, o.data(), lse.data()));
    t.push_back(usSince(t0) * 1e-6);
  }
  std::sort(t.begin(), t.end());
  *tflops = 4.0 * nq * nk * cfg.num_q_heads * cfg.head_dim / std::max(t[1], 1e-9) / 1e12;
  return attnSuccess;
}

}  // namespace

bool costModelOverridden(attnComm* comm) {
  return attnStateOf(comm).modelOverridden || envString("ATTN_MODEL_BW_GBPS") ||
         envString("ATTN_MODEL_LAT_US") || envString("ATTN_MODEL_TFLOPS");
}

attnResult_t costModelOf(attnComm* comm, const attnAttnConfig_t& cfg, attnCostModel_t* model) {
  AttnState& st = attnStateOf(comm);
  if (st.modelOverridden) {
    *model = st.override;
    return attnSuccess;
  }
  const int key = static_cast<int>(cfg.dtype) * 1000 + cfg.head_dim;
  const bool needLink = !st.haveLink, needKernel = !st.kernelTflops.count(key);
  if (needLink || needKernel) {
    double lat = 0, bw = 1e9, tflops = 1e9;
    if (needLink && comm->nranks > 1) {
      double tSmall, tLarge;
      const size_t large = 4 << 20;
      ATTN_CHECK(timeExchange(*comm->engine, 64, 9, &tSmall));
      ATTN_CHECK(timeExchange(*comm->engine, large, 5, &tLarge));
      lat = tSmall * 1e6;
      bw = large / std::max(tLarge - tSmall, 1e-9) / 1e9;
    }
    if (needKernel) ATTN_CHECK(timeKernel(comm, cfg, &tflops));
    ATTN_CHECK(agree(comm, &lat, &bw, &tflops));
    if (needLink) {
      st.haveLink = true;
      st.linkLatencyUs = lat;
      st.linkGBps = bw;
    }
    if (needKernel) st.kernelTflops[key] = tflops;
    ATTN_INFO(kLogAttn, "cost model: link %.3f GB/s, %.1f us; kernel %.4f TFLOP/s (dtype %d, D %d)",
              st.linkGBps, st.linkLatencyUs, st.kernelTflops[key], (int)cfg.dtype, cfg.head_dim);
  }
  model->link_bandwidth_GBps = st.linkGBps;
  model->link_latency_us = st.linkLatencyUs;
  model->attn_tflops = st.kernelTflops[key];
  // Environment overrides, field by field.
  if (auto v = envString("ATTN_MODEL_BW_GBPS")) model->link_bandwidth_GBps = atof(v->c_str());
  if (auto v = envString("ATTN_MODEL_LAT_US")) model->link_latency_us = atof(v->c_str());
  if (auto v = envString("ATTN_MODEL_TFLOPS")) model->attn_tflops = atof(v->c_str());
  return attnSuccess;
}

}  // namespace attn
