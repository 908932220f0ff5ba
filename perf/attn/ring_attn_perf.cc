// ring_attn_perf: prefill ring attention over a (T, P) grid at fixed T+P
// (the CP paper's Table 4 / Fig. 9 sweep). For each configuration and mode:
// time, attention compute time, communication time (the same call with the
// kernel off), overlap efficiency = max(compute, comm) / time, the mode
// AUTO chose, and the error against exact attention with -c 1.
//
//   ring_attn_perf -t 4 -L 4096 --miss 1,0.25,0.05 -H 8 --kv-heads 2 --head-dim 64 -d bfloat16
//   ring_attn_perf -t 4 -L 4096 -H 16 --kv-heads 16 --head-dim 192 --head-dim-v 128 -d bfloat16  (MLA-shaped)
#include <cmath>
#include <cstdio>
#include <memory>

#include "perf/attn/attn_bench.h"
#include "perf/attn/attn_cli.h"
#include "perf/attn/attn_plot_out.h"
#include "perf/attn/attn_report.h"
#include "perf/watchdog.h"
#include "perf/launch.h"
#include "perf/rank_device.h"

using namespace attnperf;

namespace {

// This rank's shard from the load-balanced planner.
bool shardOf(const Batch& b, int nranks, int rank, Shard* s) {
  attnBatchSpec_t spec{static_cast<int>(b.newLens.size()), b.newLens.data(), b.cachedLens.data()};
  attnPlan_t plan;
  if (attnPlanPrefill(&spec, nranks, &plan) != attnSuccess) return false;
  attnShard_t sh;
  attnPlanGetShard(plan, rank, &sh);
  const int S = sh.layout.num_seqs;
  s->qOffsets.assign(sh.layout.q_offsets, sh.layout.q_offsets + S + 1);
  s->kvOffsets.assign(sh.layout.kv_offsets, sh.layout.kv_offsets + S + 1);
  s->qPos.assign(sh.layout.q_pos, sh.layout.q_pos + sh.q_rows);
  s->kvPos.assign(sh.layout.kv_pos, sh.layout.kv_pos + sh.kv_rows);
  s->qGlobal.assign(sh.q_index, sh.q_index + sh.q_rows);
  s->kvGlobal.assign(sh.kv_index, sh.kv_index + sh.kv_rows);
  s->finish();
  attnPlanDestroy(plan);
  return true;
}

// --placement contiguous: rank r holds the r-th slice of each sequence's
// new tokens and of its keys (cached then new), as sequence parallelism
// without load balancing does, and as a sliding window favours (a rank's
// queries see only the last keys of the rank before).
void contiguousShardOf(const Batch& b, int nranks, int rank, Shard* s) {
  s->qOffsets = {0};
  s->kvOffsets = {0};
  int64_t qBase = 0, kvBase = 0;
  for (size_t i = 0; i < b.newLens.size(); ++i) {
    const int64_t T = b.newLens[i], P = b.cachedLens[i], L = T + P;
    for (int64_t t = T * rank / nranks; t < T * (rank + 1) / nranks; ++t) {
      s->qGlobal.push_back(qBase + t);
      s->qPos.push_back(static_cast<int32_t>(P + t));
    }
    for (int64_t j = L * rank / nranks; j < L * (rank + 1) / nranks; ++j) {
      s->kvGlobal.push_back(kvBase + j);
      s->kvPos.push_back(static_cast<int32_t>(j));
    }
    s->qOffsets.push_back(static_cast<int32_t>(s->qPos.size()));
    s->kvOffsets.push_back(static_cast<int32_t>(s->kvPos.size()));
    qBase += T;
    kvBase += L;
  }
  s->finish();
}

}  // namespace

int main(int argc, char** argv) {
  AttnOptions o = defaultOptions(AttnProgram::Ring);
  int code;
  if (!parseAttnOptions(argc, argv, AttnProgram::Ring, &o, &code)) return code;
  PlotOutput plot(&o, AttnProgram::Ring);
  if (!plot.ok()) return 2;
  watchdogArm("ring_attn_perf", o.timeoutS);
  const int nranks = o.procs ? o.procs : o.threads;
  RankBody body = abortingOnFailure([&](attnComm_t comm) -> int {
    WatchdogGuard watchdog(comm);
    int me, n;
    attnCommUserRank(comm, &me);
    attnCommCount(comm, &n);
    if (me == 0) {
      printf("# ring_attn_perf: %d ranks (%s), T+P = %lld per sequence, %d sequence(s), heads %d/%d, "
             "%s, %s, causal %d\n",
             n, rankMode(o).c_str(), (long long)o.length, o.seqs, o.cfg.num_q_heads,
             o.cfg.num_kv_heads, headDimText(o.cfg).c_str(),
             o.cfg.dtype == attnFloat32 ? "float" : o.cfg.dtype == attnBfloat16 ? "bfloat16" : "half",
             o.cfg.causal);
      printf("# times are medians over %d iterations of %s (-a %d); comm = the same call with "
             "the kernel off\n", o.iters, averageName(o.average), o.average);
      printf("# placement %s, softcap %g\n", o.contiguous ? "contiguous" : "planner", double(o.cfg.softcap));
      if (o.layers > 1) printf("# each timed step is %d layers (a call per layer, each with its own KV)\n", o.layers);
      printHeader();
    }
    AttnReport report("ring_attn_perf", o.cfg.dtype, n);
    RunOptions ro{o.iters, o.warmup, o.check != 0, o.device, o.procs > 0 || launchedExternally(), o.average,
                  o.breakdown, o.layers};
    for (int window : o.windows)
    for (double miss : o.miss) {
      if (me == 0 && (o.windows.size() > 1 || window >= 0) && miss == o.miss.front())
        printf("# window_left %d%s\n", window, window < 0 ? " (none)" : "");
      Batch b;
      b.cfg = o.cfg;
      b.cfg.window_left = window;
      const int64_t T = std::max<int64_t>(1, std::llround(miss * o.length));
      for (int i = 0; i < o.seqs; ++i) {
        b.newLens.push_back(static_cast<int32_t>(T));
        b.cachedLens.push_back(static_cast<int32_t>(o.length - T));
      }
      Shard s;
      if (o.contiguous) contiguousShardOf(b, n, me, &s);
      else if (!shardOf(b, n, me, &s)) return 1;
      std::vector<ModeResult> rows;
      if (runModes(comm, b, s, o.modes, ro, &rows) != 0) return 1;
      if (me == 0) report.add(T * o.seqs, (o.length - T) * o.seqs, o.seqs, rows);
    }
    if (me != 0) return 0;
    const int rc = report.finish(o.json);
    return plot.draw() ? 1 : rc;
  });
  if (int rc = checkDeviceFlag(o.device, "ring_attn_perf")) return rc;
  if (launchedExternally()) return launchExternal(body, o.device);
  return o.procs ? launchProcesses(nranks, body, o.device) : launchThreads(nranks, body, o.device);
}
