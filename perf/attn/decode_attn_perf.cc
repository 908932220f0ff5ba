// decode_attn_perf: context-parallel decode (CP paper Alg. 4, §3.6) over a
// grid of batch sizes at a fixed context length. Each sequence has one new
// query; its cached keys are spread over the ranks by the load-balanced
// plan, the new token's key goes to the rank attnDecodePlacement names, and
// its query lives on rank s % N. No query is padded. Same columns as
// ring_attn_perf.
//
//   decode_attn_perf -t 4 -L 8192 --batches 1,8,32 --modes q,ship,auto
#include <cstdio>

#include "perf/attn/attn_bench.h"
#include "perf/attn/attn_cli.h"
#include "perf/attn/attn_plot_out.h"
#include "perf/attn/attn_report.h"
#include "perf/watchdog.h"
#include "perf/launch.h"
#include "perf/rank_device.h"

using namespace attnperf;

namespace {

bool decodeShard(const Batch& b, int nranks, int rank, int64_t step, Shard* s) {
  const int S = static_cast<int>(b.newLens.size());
  std::vector<int32_t> zeros(S, 0);
  attnBatchSpec_t spec{S, zeros.data(), b.cachedLens.data()};  // where the cache already lives
  attnPlan_t plan;
  if (attnPlanPrefill(&spec, nranks, &plan) != attnSuccess) return false;
  attnShard_t sh;
  attnPlanGetShard(plan, rank, &sh);
  std::vector<int32_t> kvRank(S), qRank(S);
  attnDecodePlacement(S, step, nranks, kvRank.data(), qRank.data());
  s->qOffsets = {0};
  s->kvOffsets = {0};
  int64_t newBase = 0, fullBase = 0;
  for (int i = 0; i < S; ++i) {
    const int32_t P = b.cachedLens[i];
    for (int32_t r = sh.layout.kv_offsets[i]; r < sh.layout.kv_offsets[i + 1]; ++r) {
      s->kvPos.push_back(sh.layout.kv_pos[r]);
      s->kvGlobal.push_back(fullBase + sh.layout.kv_pos[r]);
    }
    if (kvRank[i] == rank) {  // this step's new key
      s->kvPos.push_back(P);
      s->kvGlobal.push_back(fullBase + P);
    }
    if (qRank[i] == rank) {
      s->qPos.push_back(P);
      s->qGlobal.push_back(newBase);
    }
    s->qOffsets.push_back(static_cast<int32_t>(s->qPos.size()));
    s->kvOffsets.push_back(static_cast<int32_t>(s->kvPos.size()));
    newBase += 1;
    fullBase += P + 1;
  }
  s->finish();
  attnPlanDestroy(plan);
  return true;
}

bool succeeded(attnResult_t r, attnComm_t comm, const char* what) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "%s failed: %s (%s)\n", what, attnGetErrorString(r), attnGetLastError(comm));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  AttnOptions o = defaultOptions(AttnProgram::Decode);
  int code;
  if (!parseAttnOptions(argc, argv, AttnProgram::Decode, &o, &code)) return code;
  PlotOutput plot(&o, AttnProgram::Decode);
  if (!plot.ok()) return 2;
  watchdogArm("decode_attn_perf", o.timeoutS);
  const int nranks = o.procs ? o.procs : o.threads;
  RankBody body = abortingOnFailure([&](attnComm_t comm) -> int {
    WatchdogGuard watchdog(comm);
    int me, n;
    attnCommUserRank(comm, &me);
    attnCommCount(comm, &n);
    if (me == 0) {
      printf("# decode_attn_perf: %d ranks (%s), context %lld, heads %d/%d, %s\n", n,
             rankMode(o).c_str(), (long long)o.length, o.cfg.num_q_heads,
             o.cfg.num_kv_heads, headDimText(o.cfg).c_str());
      printf("# times are medians over %d iterations of %s (-a %d)\n", o.iters, averageName(o.average), o.average);
      if (o.layers > 1)
        printf("# each timed step is %d layers (a call per layer, each with its own KV): time per token\n",
               o.layers);
      printHeader();
    }
    AttnReport report("decode_attn_perf", o.cfg.dtype, n);
    // --modes one: the same step on rank 0 alone, through a one-rank
    // communicator of its own (the library's call, its whole KV local),
    // after the other modes of each batch.
    std::vector<int> modes;
    bool oneRank = false;
    for (int m : o.modes) {
      if (m == kOneRankMode)
        oneRank = true;
      else
        modes.push_back(m);
    }
    attnComm_t alone = nullptr;
    if (oneRank && !succeeded(attnCommSplit(comm, me == 0 ? 0 : ATTN_SPLIT_NOCOLOR, 0, &alone, nullptr), comm,
                              "attnCommSplit"))
      return 1;
    RunOptions ro{o.iters, o.warmup, o.check != 0, o.device, o.procs > 0 || launchedExternally(), o.average,
                  o.breakdown, o.layers};
    for (int B : o.batches) {
      Batch b;
      b.cfg = o.cfg;
      b.newLens.assign(B, 1);
      b.cachedLens.assign(B, static_cast<int32_t>(o.length - 1));
      Shard s;
      if (!decodeShard(b, n, me, /*step=*/B, &s)) return 1;
      std::vector<ModeResult> rows;
      if (!modes.empty() && runModes(comm, b, s, modes, ro, &rows) != 0) return 1;
      if (oneRank) {
        if (me == 0) {
          Shard whole;
          std::vector<ModeResult> one;
          if (!decodeShard(b, 1, 0, /*step=*/B, &whole) || runModes(alone, b, whole, {attnModeShipQ}, ro, &one) != 0)
            return 1;
          one[0].mode = "one-rank";
          rows.push_back(one[0]);
        }
        if (!succeeded(attnBarrier(comm, nullptr), comm, "attnBarrier")) return 1;
      }
      if (me == 0) report.add(B, static_cast<int64_t>(B) * (o.length - 1), B, rows);
    }
    if (alone) attnCommDestroy(alone);
    if (me != 0) return 0;
    const int rc = report.finish(o.json);
    return plot.draw() ? 1 : rc;
  });
  if (int rc = checkDeviceFlag(o.device, "decode_attn_perf")) return rc;
  if (launchedExternally()) return launchExternal(body, o.device);
  return o.procs ? launchProcesses(nranks, body, o.device) : launchThreads(nranks, body, o.device);
}
