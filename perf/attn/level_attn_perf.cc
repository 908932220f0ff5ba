// level_attn_perf: attnLevelAttention (CSPS's communication-efficient sparse
// attention) against exact ring pass-KV in the same run. Full prefill; each
// sequence is cut into N contiguous chunks placed on the ranks in proximity
// order (attnCommTopoRank: near tokens on near ranks). For each set of keep
// fractions (-k host:rack:cluster): time (median over iterations of the
// slowest rank, or as -a combines the ranks), attention compute, waiting, the bytes the busiest rank
// sent, the speed-up over pass-KV, and with -c 1 the error against exact
// attention (zero drop must be exact; with drops it is the approximation,
// not a failure). Key importance is a fixed random score per token.
//
// With --device DEV every rank's tensors and scores are on CUDA device DEV and
// both calls run on its stream (timed to the stream's completion).
//
//   level_attn_perf --procs 4 -L 8192 -k 1,1:0.5:0.25,0.5:0.25:0.125
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "perf/attn/attn_bench.h"
#include "perf/attn/attn_cli.h"
#include "perf/attn/attn_plot_out.h"
#include "perf/watchdog.h"
#include "perf/launch.h"
#include "perf/rank_device.h"
#include "perf/timing.h"
#include "src/attn/attn_state.h"

using namespace attnperf;

namespace {

bool ok(attnResult_t r, attnComm_t comm, const char* what) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "%s failed: %s (%s)\n", what, attnGetErrorString(r), attnGetLastError(comm));
  return false;
}

// Chunk `slot` of N of every sequence (full prefill: q rows = kv rows).
Shard contiguousShard(const Batch& b, int slot, int n) {
  Shard s;
  s.qOffsets.push_back(0);
  s.kvOffsets.push_back(0);
  int64_t base = 0;
  for (int32_t len : b.newLens) {
    const int64_t lo = len * static_cast<int64_t>(slot) / n, hi = len * static_cast<int64_t>(slot + 1) / n;
    for (int64_t i = lo; i < hi; ++i) {
      s.qPos.push_back(static_cast<int32_t>(i));
      s.qGlobal.push_back(base + i);
    }
    s.qOffsets.push_back(static_cast<int32_t>(s.qPos.size()));
    base += len;
  }
  s.kvOffsets = s.qOffsets;
  s.kvPos = s.qPos;
  s.kvGlobal = s.qGlobal;
  s.finish();
  return s;
}

// A fixed score in [0, 1) per token: every rank derives its own.
float importanceOf(int64_t row) {
  uint64_t z = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull + 0x5bd1e995u;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return static_cast<float>((z >> 40) / 16777216.0);
}

struct Variant {
  std::string name;
  bool ring = false;            // exact pass-KV baseline
  attnLevelDrop_t drop{};
  std::vector<double> t, compute, wait;
  double sentMax = 0;
  double err = -1;
};

}  // namespace

int main(int argc, char** argv) {
  AttnOptions o = defaultOptions(AttnProgram::Level);
  int code;
  if (!parseAttnOptions(argc, argv, AttnProgram::Level, &o, &code)) return code;
  PlotOutput plot(&o, AttnProgram::Level);
  if (!plot.ok()) return 2;
  watchdogArm("level_attn_perf", o.timeoutS);
  if (int rc = checkDeviceFlag(o.device, "level_attn_perf")) return rc;
  const int nranks = o.procs ? o.procs : o.threads;
  RankBody body = abortingOnFailure([&](attnComm_t comm) -> int {
    WatchdogGuard watchdog(comm);
    int me, n, slot;
    attnCommUserRank(comm, &me);
    attnCommCount(comm, &n);
    if (!ok(attnCommTopoRank(comm, &slot), comm, "attnCommTopoRank")) return 1;
    Batch b;
    b.cfg = o.cfg;
    for (int i = 0; i < o.seqs; ++i) {
      b.newLens.push_back(static_cast<int32_t>(o.length));
      b.cachedLens.push_back(0);
    }
    const Shard s = contiguousShard(b, slot, n);
    const size_t es = b.cfg.dtype == attnFloat32 ? 4 : 2;
    const size_t nq = s.qPos.size();
    // Q and K rows of head_dim, V and O rows of the V head dim (--head-dim-v).
    const size_t D = static_cast<size_t>(b.cfg.head_dim), Dv = static_cast<size_t>(valueHeadDim(b.cfg));
    std::vector<char> q(es * nq * b.cfg.num_q_heads * D), out(es * nq * b.cfg.num_q_heads * Dv);
    std::vector<char> k(es * nq * b.cfg.num_kv_heads * D), v(es * nq * b.cfg.num_kv_heads * Dv);
    std::vector<float> lse(nq * b.cfg.num_q_heads), imp(nq);
    b.fillQ(s.qGlobal, q.data());
    b.fillKV(s.kvGlobal, k.data(), v.data());
    for (size_t i = 0; i < nq; ++i) imp[i] = importanceOf(s.kvGlobal[i]);
    // With --device every buffer, the scores included, has a device twin.
    RankDevice dev;
    if (!dev.open(o.device, /*exportable=*/false)) return 1;
    void* dq = dev.place(q.data(), q.size());
    void* dk = dev.place(k.data(), k.size());
    void* dv = dev.place(v.data(), v.size());
    void* dout = dev.place(out.data(), out.size());
    auto* dlse = static_cast<float*>(dev.place(lse.data(), sizeof(float) * lse.size()));
    auto* dimp = static_cast<float*>(dev.place(imp.data(), sizeof(float) * imp.size()));
    if (!dq || !dk || !dv || !dout || !dlse || !dimp || !dev.upload(dq, q.data(), q.size()) ||
        !dev.upload(dk, k.data(), k.size()) || !dev.upload(dv, v.data(), v.size()) ||
        !dev.upload(dimp, imp.data(), sizeof(float) * imp.size())) {
      fprintf(stderr, "level_attn_perf: rank %d could not place its tensors\n", me);
      return 1;
    }

    std::vector<Variant> vars(1);
    vars[0].name = "pass-kv";
    vars[0].ring = true;
    for (const auto& kp : o.keeps) {
      Variant x;
      char name[64];
      snprintf(name, sizeof(name), "level %g:%g:%g", kp[0], kp[1], kp[2]);
      x.name = name;
      x.drop = {{kp[0], kp[0], kp[1], kp[2]}, dimp};
      vars.push_back(x);
    }
    attn::AttnState& st = attn::attnStateOf(comm);
    auto once = [&](Variant& x) -> bool {
      if (x.ring)
        return ok(attnRingAttention(dq, dk, dv, dout, dlse, &s.layout, &b.cfg, attnModePassKV, comm, dev.stream()),
                  comm, "attnRingAttention") &&
               dev.finish(comm, "attnRingAttention");
      return ok(attnLevelAttention(dq, dk, dv, dout, dlse, &s.layout, &b.cfg, &x.drop, comm, dev.stream()),
                comm, "attnLevelAttention") &&
             dev.finish(comm, "attnLevelAttention");
    };
    // Iterations outer, variants inner: background load hits all alike.
    for (int i = 0; i < o.warmup + o.iters; ++i)
      for (Variant& x : vars) {
        if (!ok(attnBarrier(comm, dev.stream()), comm, "attnBarrier") || !dev.finish(comm, "attnBarrier")) return 1;
        const double t0 = nowUs();
        if (!once(x)) return 1;
        const double t = nowUs() - t0;
        if (i < o.warmup) continue;
        x.t.push_back(t);
        x.compute.push_back(st.last.computeUs);
        x.wait.push_back(st.last.waitUs);
        x.sentMax = static_cast<double>(st.last.bytesSent);
      }
    for (Variant& x : vars) {
      for (auto* series : {&x.t, &x.compute, &x.wait})
        if (!combineOverRanks(comm, dev, series, o.average)) return 1;
      std::vector<double> sent{x.sentMax};
      if (!maxOverRanks(comm, dev, &sent)) return 1;
      x.sentMax = sent[0];
      if (o.check) {
        double lseErr;
        if (!once(x) || !dev.download(out.data(), dout, out.size()) ||
            !dev.download(lse.data(), dlse, sizeof(float) * lse.size()) ||
            !checkAgainstReference(comm, dev, b, s, q.data(), out.data(), lse.data(), &x.err, &lseErr))
          return 1;
      }
    }
    if (me != 0) return 0;
    printf("# level_attn_perf: %d ranks (%s), %d sequence(s) of %" PRId64 " tokens, heads %d/%d, %s, "
           "%s, causal %d\n",
           n, rankMode(o).c_str(), o.seqs, o.length, o.cfg.num_q_heads, o.cfg.num_kv_heads,
           headDimText(o.cfg).c_str(),
           o.cfg.dtype == attnFloat32 ? "float" : o.cfg.dtype == attnBfloat16 ? "bfloat16" : "half",
           o.cfg.causal);
    printf("# medians over %d iterations of %s (-a %d); sent = bytes the busiest rank sent "
           "(level calls); err = max |O - exact| / max |O_row|\n", o.iters, averageName(o.average), o.average);
    printf("# %-24s %10s %10s %10s %10s %9s %10s\n", "variant", "time(ms)", "attn(ms)", "wait(ms)",
           "sent(MB)", "vs pass-kv", "max_err");
    const double base = summarize(vars[0].t).medianUs;
    // DESIGN.md §4's bounds: the exact variants (pass-KV, keep all) must meet them.
    const double bound = o.cfg.dtype == attnFloat32 ? 1e-5 : 1e-2;
    int status = 0;
    FILE* json = o.json.empty() ? nullptr : fopen(o.json.c_str(), "w");
    if (!o.json.empty() && !json) {
      fprintf(stderr, "level_attn_perf: -J %s: cannot write the file\n", o.json.c_str());
      return 1;
    }
    if (json) fprintf(json, "{\"program\": \"level_attn_perf\", \"results\": [\n");
    for (size_t j = 0; j < vars.size(); ++j) {
      const Variant& x = vars[j];
      const double t = summarize(x.t).medianUs, c = summarize(x.compute).medianUs,
                   w = summarize(x.wait).medianUs;
      char sent[32] = "-", err[32] = "-";
      if (!x.ring) snprintf(sent, sizeof(sent), "%.2f", x.sentMax / 1e6);
      if (x.err >= 0) snprintf(err, sizeof(err), "%.2e", x.err);
      const bool exact = x.ring || (x.drop.keep[1] == 1 && x.drop.keep[2] == 1 && x.drop.keep[3] == 1);
      const bool failed = exact && x.err > bound;
      printf("  %-24s %10.3f %10.3f %10.3f %10s %8.2fx %10s%s\n", x.name.c_str(), t / 1e3, c / 1e3, w / 1e3,
             sent, t > 0 ? base / t : 0.0, err, failed ? "  FAILED: exact variant over the bound" : "");
      if (failed) status = 1;
      if (json)
        fprintf(json,
                "  {\"variant\": \"%s\", \"nranks\": %d, \"tokens\": %" PRId64 ", \"time_us\": %.3f, "
                "\"compute_us\": %.3f, \"wait_us\": %.3f, \"sent_bytes\": %.0f, \"speedup_vs_pass_kv\": %.4f, "
                "\"max_err\": %.3e, \"keep\": [%g, %g, %g]}%s\n",
                x.name.c_str(), n, o.length, t, c, w, x.ring ? 0.0 : x.sentMax, t > 0 ? base / t : 0.0, x.err,
                x.ring ? 1.0 : x.drop.keep[1], x.ring ? 1.0 : x.drop.keep[2], x.ring ? 1.0 : x.drop.keep[3],
                j + 1 < vars.size() ? "," : "");
    }
    if (json) {
      fprintf(json, "]}\n");
      fclose(json);
    }
    return plot.draw() ? 1 : status;
  });
  if (launchedExternally()) return launchExternal(body, o.device);
  return o.procs ? launchProcesses(nranks, body, o.device) : launchThreads(nranks, body, o.device);
}
