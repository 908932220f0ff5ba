#include "src/attn/calibrate.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <vector>

#include "kernels/cpu/attention.h"
#include "src/attn/attn_call.h"
#include "src/attn/progress_thread.h"
#include "src/coll/coll.h"
#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"
#if ATTN_HAVE_CUDA
#include "src/device/device_attn_probe.h"
#endif

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

// Every rank ends with the same figures: the worst rank's. A field is
// { value, true if larger is worse }.
struct Figure {
  double* value;
  bool largerIsWorse;
};
attnResult_t agree(attnComm* comm, std::initializer_list<Figure> figures) {
  const int n = comm->nranks, k = static_cast<int>(figures.size());
  std::vector<double> all(static_cast<size_t>(k) * n);
  int i = 0;
  for (const Figure& f : figures) all[k * comm->rank + i++] = *f.value;
  std::vector<Block> blocks(n);
  for (int r = 0; r < n; ++r) blocks[r] = {r * k * sizeof(double), k * sizeof(double)};
  ATTN_CHECK(ringAllGatherv(*comm->engine, Ring::identity(comm->rank, n),
                            reinterpret_cast<char*>(all.data()), blocks, chunkBytes(1)));
  for (int r = 0; r < n; ++r) {
    i = 0;
    for (const Figure& f : figures) {
      const double v = all[k * r + i++];
      *f.value = f.largerIsWorse ? std::max(*f.value, v) : std::min(*f.value, v);
    }
  }
  return attnSuccess;
}

// A fixed attention problem for timing the kernel: nq queries against nk
// keys, all visible. On a device communicator (without a user kernel, which
// AUTO times with host buffers: attncomm.h) it is the CUDA kernel on the
// communicator's GPU, sized there to take about a millisecond.
struct KernelProbe {
  AttnCall c;
  std::vector<char> q, kv;
  std::vector<int32_t> qpos, kpos;
  std::vector<float> o, lse;
  int32_t qoff[2] = {0, 0}, koff[2] = {0, 0};
  int nq = 0, nk = 512;
  size_t kBytes = 0;
#if ATTN_HAVE_CUDA
  std::unique_ptr<DeviceAttnProbe> device;
#endif

  KernelProbe(attnComm* comm, const attnAttnConfig_t& cfg) {
    c.comm = comm;
    c.state = &attnStateOf(comm);
    c.cfg = cfg;
    c.cfg.causal = 0;
    c.numSeqs = 1;
#if ATTN_HAVE_CUDA
    if (comm->device && !c.state->userKernel) {
      device = std::make_unique<DeviceAttnProbe>();
      return;
    }
#endif
    nq = std::max(8, 1024 / cfg.num_q_heads);
    const size_t esz = cfg.dtype == attnFloat32 ? 4 : 2;
    q.assign(esz * nq * cfg.num_q_heads * cfg.head_dim, 0);
    kBytes = esz * nk * cfg.num_kv_heads * cfg.head_dim;
    kv.assign(kBytes + esz * nk * cfg.num_kv_heads * cfg.head_dim_v, 0);  // K then V
    qpos.assign(nq, nk);
    kpos.resize(nk);
    for (int i = 0; i < nk; ++i) kpos[i] = i;
    o.resize(static_cast<size_t>(nq) * cfg.num_q_heads * cfg.head_dim_v);
    lse.resize(static_cast<size_t>(nq) * cfg.num_q_heads);
    qoff[1] = nq;
    koff[1] = nk;
  }
  bool onDevice() const {
#if ATTN_HAVE_CUDA
    return device != nullptr;
#else
    return false;
#endif
  }
  attnResult_t init() {
#if ATTN_HAVE_CUDA
    if (device) return device->init(c.comm, c.cfg);
#endif
    return attnSuccess;
  }
  double flops() const {
#if ATTN_HAVE_CUDA
    if (device) return device->flops();
#endif
    return 2.0 * nq * nk * c.cfg.num_q_heads * (c.cfg.head_dim + c.cfg.head_dim_v);
  }
  // One run; `gpuSeconds` (device only) gets its GPU time.
  attnResult_t run(double* gpuSeconds = nullptr) {
#if ATTN_HAVE_CUDA
    if (device) {
      double s = 0;
      ATTN_CHECK(device->run(&s));
      if (gpuSeconds) *gpuSeconds = s;
      return attnSuccess;
    }
#endif
    (void)gpuSeconds;
    RowsRef qs{q.data(), nullptr, nq, qoff, qpos.data()}, ks{kv.data(), kv.data() + kBytes, nk, koff, kpos.data()};
    return c.partial(qs, ks, o.data(), lse.data());
  }
  // Median seconds of `reps` runs: GPU time on a device, else wall time.
  attnResult_t time(int reps, double* seconds) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      double gpu = 0;
      auto t0 = Clock::now();
      ATTN_CHECK(run(&gpu));
      t.push_back(onDevice() ? gpu : usSince(t0) * 1e-6);
    }
    std::sort(t.begin(), t.end());
    *seconds = std::max(t[t.size() / 2], 1e-9);
    return attnSuccess;
  }
};

// How much a ring exchange running beside the kernel slows the pair down:
// the kernel and an exchange sized to take about as long are timed alone and
// together (every rank at once, as in the ring). Together they take
// max(a, c) + interference * min(a, c). The ring couples the ranks, so the
// figures are the slowest rank's before the share is worked out.
attnResult_t timeInterference(attnComm* comm, KernelProbe& k, double kernelSeconds, double bw,
                              double* interference) {
  Engine& e = *comm->engine;
  const int n = comm->nranks, me = comm->rank, reps = 5;
  const size_t bytes = std::clamp<size_t>(static_cast<size_t>(kernelSeconds * bw * 1e9), 64 << 10, 16 << 20);
  double exchange = 0;
  ATTN_CHECK(timeExchange(e, bytes, reps, &exchange));
  std::vector<char> out(bytes, 1), in(bytes);
  std::vector<double> t;
  {
    ProgressThread driver(e, comm->prefix);
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      Request s, r;
      ATTN_CHECK(e.irecv((me - 1 + n) % n, in.data(), bytes, &r));
      ATTN_CHECK(e.isend((me + 1) % n, out.data(), bytes, &s));
      ATTN_CHECK(driver.kick());
      ATTN_CHECK(k.run());
      ATTN_CHECK(driver.wait(&s));
      ATTN_CHECK(driver.wait(&r));
      t.push_back(usSince(t0) * 1e-6);
    }
  }
  std::sort(t.begin(), t.end());
  double both = t[t.size() / 2];
  ATTN_CHECK(agree(comm, {{&exchange, true}, {&both, true}}));
  const double lo = std::min(kernelSeconds, exchange), hi = std::max(kernelSeconds, exchange);
  *interference = std::clamp((both - hi) / std::max(lo, 1e-9), 0.0, 1.0);
  ATTN_TRACE(kLogAttn, "interference: kernel %.0f us, exchange of %zu bytes %.0f us, together %.0f us -> %.2f",
             kernelSeconds * 1e6, bytes, exchange * 1e6, both * 1e6, *interference);
  return attnSuccess;
}

}  // namespace

bool costModelOverridden(attnComm* comm) {
  return attnStateOf(comm).modelOverridden || settingIsSet(Setting::kModelBwGbps) ||
         settingIsSet(Setting::kModelLatUs) || settingIsSet(Setting::kModelTflops) ||
         settingIsSet(Setting::kModelInterference);
}

attnResult_t costModelOf(attnComm* comm, const attnAttnConfig_t& cfg, attnCostModel_t* model) {
  AttnState& st = attnStateOf(comm);
  if (st.modelOverridden) {
    *model = st.override;
    return attnSuccess;
  }
  const int key = (static_cast<int>(cfg.dtype) * 1000 + cfg.head_dim) * 1000 + cfg.head_dim_v;
  const bool needLink = !st.haveLink, needKernel = !st.kernelTflops.count(key);
  if (needLink || needKernel) {
    double lat = 0, bw = 1e9, tflops = 1e9, interference = 0;
    KernelProbe probe(comm, cfg);
    ATTN_CHECK(probe.init());
    double kernelSeconds = 0;
    ATTN_CHECK(probe.time(3, &kernelSeconds));
    if (needKernel) tflops = probe.flops() / kernelSeconds / 1e12;
    if (needLink && comm->nranks > 1) {
      double tSmall, tLarge;
      const size_t large = 4 << 20;
      ATTN_CHECK(timeExchange(*comm->engine, 64, 9, &tSmall));
      ATTN_CHECK(timeExchange(*comm->engine, large, 5, &tLarge));
      lat = tSmall * 1e6;
      bw = large / std::max(tLarge - tSmall, 1e-9) / 1e9;
    }
    ATTN_CHECK(agree(comm, {{&lat, true}, {&bw, false}, {&tflops, false}, {&kernelSeconds, true}}));
    if (needLink && comm->nranks > 1) {
      // Sized from agreed figures: every rank must exchange the same bytes.
      ATTN_CHECK(timeInterference(comm, probe, kernelSeconds, bw, &interference));
    }
    if (needLink) {
      st.haveLink = true;
      st.linkLatencyUs = lat;
      st.linkGBps = bw;
      st.interference = interference;
    }
    if (needKernel) {
      st.kernelTflops[key] = tflops;
      st.kernelTimedOnDevice[key] = probe.onDevice();
    }
    ATTN_INFO(kLogAttn,
              "cost model: link %.3f GB/s, %.1f us; kernel %.4f TFLOP/s (dtype %d, D %d, %s); interference %.2f",
              st.linkGBps, st.linkLatencyUs, st.kernelTflops[key], (int)cfg.dtype, cfg.head_dim,
              st.kernelTimedOnDevice[key] ? "CUDA kernel on the GPU" : "CPU kernel", st.interference);
  }
  model->link_bandwidth_GBps = st.linkGBps;
  model->link_latency_us = st.linkLatencyUs;
  model->attn_tflops = st.kernelTflops[key];
  model->comm_interference = st.interference;
  // Environment overrides, field by field.
  if (auto v = settingReal<Setting::kModelBwGbps>()) model->link_bandwidth_GBps = *v;
  if (auto v = settingReal<Setting::kModelLatUs>()) model->link_latency_us = *v;
  if (auto v = settingReal<Setting::kModelTflops>()) model->attn_tflops = *v;
  if (auto v = settingReal<Setting::kModelInterference>()) model->comm_interference = *v;
  if (!costModelValid(*model))
    return setError(attnInvalidArgument,
                    "cost model from ATTN_MODEL_* is out of range (bandwidth %g GB/s, latency %g us, "
                    "%g TFLOP/s, interference %g)",
                    model->link_bandwidth_GBps, model->link_latency_us, model->attn_tflops,
                    model->comm_interference);
  return attnSuccess;
}

bool costModelValid(const attnCostModel_t& m) {
  return m.link_bandwidth_GBps > 0 && m.attn_tflops > 0 && m.link_latency_us >= 0 &&
         m.comm_interference >= 0 && m.comm_interference <= 1;
}

}  // namespace attn
