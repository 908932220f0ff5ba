// kv_attn_perf: DistAttention decode over the distributed KV cache.
// Rank 0 owns one long request (-L tokens); the other ranks are creditors.
// For each lent fraction (--lend), rank 0 lends that share of the request's
// blocks evenly to the creditors (attnKvMigrate, timed: the cost of moving
// KV), then decodes: attnKvAttention of one query row ships the query to
// the holders, which attend over their blocks in parallel and return
// (O, LSE) to merge. Reported per fraction, medians over iterations of
// rank 0's time: the decode step and its speed-up over f = 0 (all blocks at
// home: one rank attends alone, the baseline), the bytes a step ships
// (queries out, partials back) against the KV bytes that stay put, and the
// migration's time and GB/s (what moving the KV to the query instead would
// cost per step). Each output is checked against the f = 0 output; the run
// fails when they differ beyond rounding.
//
// With --requests N rank 0's pool holds N requests appended block by block in
// turn, as N sequences decoding together fill a pool, so the measured
// request's blocks are scattered (every N-th block) instead of one run.
//
// With --device DEV the pools are on CUDA device DEV (device communicators): the
// K and V appended, the query and the outputs are device buffers, every
// call is enqueued on the rank's stream, and a timed call runs from its
// enqueue until its stream is idle.
//
// -J writes the rows as JSON, --plot draws them; -a takes 0 only (rank 0
// times the step), -c 0 reports differences without failing.
//
//   kv_attn_perf --procs 2 -L 32768 --lend 0,0.25,0.5,0.75
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"
#include "kernels/cpu/convert.h"
#include "perf/attn/attn_cli.h"
#include "perf/attn/attn_plot_out.h"
#include "perf/watchdog.h"
#include "perf/launch.h"
#include "perf/rank_device.h"
#include "perf/timing.h"

using namespace attnperf;

namespace {

bool ok(attnResult_t r, attnComm_t comm, const char* what) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "%s failed: %s (%s)\n", what, attnGetErrorString(r), attnGetLastError(comm));
  return false;
}

float valueOf(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x5bd1e995u;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return static_cast<float>((z >> 40) / 8388608.0 - 1.0);
}

std::vector<char> values(attnDataType_t t, size_t count, uint64_t seed) {
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = valueOf(seed + i);
  std::vector<char> out(count * (t == attnFloat32 ? 4 : 2));
  if (attn::cpu::convertFromFloat(out.data(), t, f.data(), count) != attnSuccess) out.clear();
  return out;
}

struct Row {
  double f = 0;
  int64_t lent = 0;
  double stepUs = 0, migrateUs = 0;
  double maxDiff = 0;
};

}  // namespace

int main(int argc, char** argv) {
  AttnOptions opts = defaultOptions(AttnProgram::Kv);
  int code;
  if (!parseAttnOptions(argc, argv, AttnProgram::Kv, &opts, &code)) return code;
  if (opts.cfg.head_dim > 256) {
    fprintf(stderr, "kv_attn_perf: --head-dim %d: at most 256\n", opts.cfg.head_dim);
    return 2;
  }
  PlotOutput plot(&opts, AttnProgram::Kv);
  if (!plot.ok()) return 2;
  watchdogArm("kv_attn_perf", opts.timeoutS);
  // The names the measuring code below was written with.
  struct {
    int procs, threads;
    int64_t length;
    int blockTokens, hq, hkv, d;
    attnDataType_t dtype;
    int iters, warmup, interleave, device;
    std::vector<double> fractions;
  } o{opts.procs, opts.threads, opts.length, opts.blockTokens, opts.cfg.num_q_heads, opts.cfg.num_kv_heads,
      opts.cfg.head_dim, opts.cfg.dtype, opts.iters, opts.warmup, opts.requests, opts.device, opts.lend};
  const int nranks = o.procs ? o.procs : o.threads;
  if (int rc = checkDeviceFlag(o.device, "kv_attn_perf")) return rc;
  const size_t es = o.dtype == attnFloat32 ? 4 : 2;
  const int64_t blocks = (o.length + o.blockTokens - 1) / o.blockTokens;
  RankBody body = abortingOnFailure([&](attnComm_t comm) -> int {
    WatchdogGuard watchdog(comm);
    int me, n;
    attnCommUserRank(comm, &me);
    attnCommCount(comm, &n);
    attnKvPoolConfig_t pc{};
    pc.block_tokens = o.blockTokens;
    pc.num_kv_heads = o.hkv;
    pc.head_dim = o.d;
    pc.dtype = o.dtype;
    pc.capacity_blocks = me == 0 ? blocks * o.interleave : blocks / (n - 1) + 1;
    attnKvPool_t pool = nullptr;
    if (!ok(attnKvPoolCreate(comm, &pc, &pool), comm, "attnKvPoolCreate")) return 1;
    RankDevice dev;
    if (!dev.open(o.device, /*exportable=*/false)) return 1;
    const attnStream_t stream = dev.stream();
    const int64_t req = 1;
    if (me == 0) {
      // Appended in pieces, as decoding would (positions 0 .. L-1); with
      // --requests, a block at a time, each followed by a block of every other
      // request.
      const int64_t piece = o.interleave > 1 ? o.blockTokens : 4096;
      const size_t row = size_t(o.hkv) * size_t(o.d);
      for (int64_t at = 0; at < o.length; at += piece) {
        const int64_t m = std::min(piece, o.length - at);
        std::vector<char> k = values(o.dtype, size_t(m) * row, uint64_t(at) * row * 2);
        std::vector<char> v = values(o.dtype, size_t(m) * row, uint64_t(at) * row * 2 + 7777777);
        std::vector<int32_t> pos(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t(at + i);
        void* dk = dev.place(k.data(), k.size());
        void* dv = dev.place(v.data(), v.size());
        if (!dk || !dv || !dev.upload(dk, k.data(), k.size()) || !dev.upload(dv, v.data(), v.size()) ||
            !ok(attnKvAppend(pool, req, dk, dv, pos.data(), int(m), stream), comm, "attnKvAppend"))
          return 1;
        for (int64_t other = 2; other <= o.interleave; ++other)
          if (!ok(attnKvAppend(pool, other, dk, dv, pos.data(), int(m), stream), comm, "attnKvAppend")) return 1;
        if (!dev.finish(comm, "attnKvAppend")) return 1;
      }
    }
    attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
    cfg.num_q_heads = o.hq;
    cfg.num_kv_heads = o.hkv;
    cfg.head_dim = o.d;
    cfg.dtype = o.dtype;
    cfg.causal = 1;
    const std::vector<char> q = values(o.dtype, size_t(o.hq) * o.d, 12345);
    std::vector<char> out(q.size()), home(q.size());
    std::vector<float> lse(size_t(o.hq));
    void* dq = dev.place(const_cast<char*>(q.data()), q.size());
    void* dout = dev.place(out.data(), out.size());
    auto* dlse = static_cast<float*>(dev.place(lse.data(), lse.size() * sizeof(float)));
    if (!dq || !dout || !dlse || !dev.upload(dq, q.data(), q.size())) return 1;
    const int32_t offs[2] = {0, 1};
    const int32_t qpos = int32_t(o.length);
    auto step = [&]() {
      return (me == 0 ? attnKvAttention(pool, 1, &req, offs, dq, &qpos, dout, dlse, &cfg, stream)
                      : attnKvAttention(pool, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &cfg, stream)) ==
                     attnSuccess &&
             dev.finish(comm, "attnKvAttention");
    };
    // The blocks held by each creditor (rank 0 knows; the others learn by
    // being told nothing: they return what they hold of request 1).
    auto returnAll = [&]() -> bool {
      std::vector<attnKvMove_t> moves;
      attnKvPoolStats_t st{};
      attnKvPoolGetStats(pool, &st);
      if (me != 0 && st.lent_in_blocks > 0) moves.push_back({me, 0, 0, req, st.lent_in_blocks});
      return ok(attnKvMigrate(pool, moves.data(), int(moves.size()), nullptr, stream), comm,
                "attnKvMigrate (return)") &&
             dev.finish(comm, "attnKvMigrate (return)");
    };
    std::vector<Row> rows;
    for (double f : o.fractions) {
      Row r;
      r.f = f;
      const int64_t movable = blocks - 1;
      const int64_t lend = std::min<int64_t>(movable, int64_t(std::floor(f * double(movable))));
      std::vector<double> mig, steps;
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        if (!returnAll()) return 1;
        std::vector<attnKvMove_t> moves;
        if (me == 0)
          for (int c = 1; c < n; ++c) {
            const int64_t share = lend * c / (n - 1) - lend * (c - 1) / (n - 1);
            if (share > 0) moves.push_back({0, c, 0, req, share});
          }
        std::vector<int64_t> granted(moves.size());
        if (!ok(attnBarrier(comm, stream), comm, "attnBarrier") || !dev.finish(comm, "attnBarrier")) return 1;
        const double t0 = nowUs();
        if (!ok(attnKvMigrate(pool, moves.data(), int(moves.size()), granted.data(), stream), comm,
                "attnKvMigrate") ||
            !dev.finish(comm, "attnKvMigrate"))
          return 1;
        const double t1 = nowUs();
        for (size_t i = 0; i < moves.size(); ++i)
          if (granted[i] != moves[i].num_blocks) {
            fprintf(stderr, "rank %d: move %zu refused\n", me, i);
            return 1;
          }
        if (!ok(attnBarrier(comm, stream), comm, "attnBarrier") || !dev.finish(comm, "attnBarrier")) return 1;
        const double t2 = nowUs();
        if (!step()) {
          fprintf(stderr, "attnKvAttention failed: %s\n", attnGetLastError(comm));
          return 1;
        }
        const double t3 = nowUs();
        if (it >= o.warmup) {
          mig.push_back(t1 - t0);
          steps.push_back(t3 - t2);
        }
      }
      r.lent = lend;
      r.migrateUs = summarize(mig).medianUs;
      r.stepUs = summarize(steps).medianUs;
      if (me == 0) {
        if (!dev.download(out.data(), dout, out.size())) return 1;
        if (rows.empty()) home = out;
        std::vector<float> a(q.size() / es), b(q.size() / es);
        if (attn::cpu::convertToFloat(a.data(), out.data(), o.dtype, a.size()) != attnSuccess ||
            attn::cpu::convertToFloat(b.data(), home.data(), o.dtype, b.size()) != attnSuccess)
          return 1;
        for (size_t i = 0; i < a.size(); ++i) r.maxDiff = std::max(r.maxDiff, double(std::fabs(a[i] - b[i])));
      }
      rows.push_back(r);
    }
    int rc = 0;
    if (me == 0) {
      const double kvBlockBytes = 2.0 * o.blockTokens * o.hkv * o.d * double(es);
      const double bound = o.dtype == attnFloat32 ? 1e-5 : 1e-2;
      printf("# kv_attn_perf: %d ranks, one request of %lld tokens on rank 0, blocks of %d, heads %d/%d x %d, %s, "
             "%s\n",
             n, (long long)o.length, o.blockTokens, o.hq, o.hkv, o.d,
             o.dtype == attnFloat32 ? "fp32" : o.dtype == attnBfloat16 ? "bf16" : "fp16",
             dev.onDevice() ? "pools on the GPU" : "pools in host memory");
      if (o.interleave > 1)
        printf("# rank 0's pool filled by %d requests a block at a time: the request's blocks are every %d-th\n",
               o.interleave, o.interleave);
      printf("# medians of %d iterations (rank 0's time); baseline: f = %g, the owner attends alone\n", o.iters,
             rows.front().f);
      FILE* json = opts.json.empty() ? nullptr : fopen(opts.json.c_str(), "w");
      if (!opts.json.empty() && !json) {
        fprintf(stderr, "kv_attn_perf: -J %s: cannot write the file\n", opts.json.c_str());
        rc = 1;
      }
      if (json) fprintf(json, "{\"program\": \"kv_attn_perf\", \"nranks\": %d, \"tokens\": %lld, \"results\": [\n", n,
                        (long long)o.length);
      printf("%6s %8s %12s %8s %12s %12s %12s %10s %10s\n", "lent", "blocks", "step_us", "speedup",
             "shipped_B", "kv_lent_B", "migrate_us", "mig_GB/s", "max|diff|");
      for (const Row& r : rows) {
        const int holders = r.lent > 0 ? std::min<int64_t>(n - 1, r.lent) : 0;
        const double shipped = holders * (double(q.size()) + double(o.hq) * (o.d + 1) * 4.0);
        const double lentBytes = double(r.lent) * kvBlockBytes;
        printf("%6.2f %8lld %12.1f %7.2fx %12.0f %12.0f %12.1f %10.2f %10.2e%s\n", r.f, (long long)r.lent,
               r.stepUs, rows.front().stepUs / r.stepUs, shipped, lentBytes, r.migrateUs,
               r.migrateUs > 0 ? lentBytes / r.migrateUs / 1e3 : 0.0, r.maxDiff, r.maxDiff > bound ? "  FAIL" : "");
        if (r.maxDiff > bound && opts.check) rc = 1;
        if (json)
          fprintf(json,
                  "  {\"lent_fraction\": %g, \"lent_blocks\": %lld, \"step_us\": %.3f, \"speedup\": %.4f, "
                  "\"shipped_bytes\": %.0f, \"kv_lent_bytes\": %.0f, \"migrate_us\": %.3f, \"max_diff\": %.3e}%s\n",
                  r.f, (long long)r.lent, r.stepUs, rows.front().stepUs / r.stepUs, shipped, lentBytes, r.migrateUs,
                  r.maxDiff, &r == &rows.back() ? "" : ",");
      }
      if (json) {
        fprintf(json, "]}\n");
        fclose(json);
      }
      fflush(stdout);
    }
    attnKvPoolDestroy(pool);
    if (me == 0 && rc == 0) rc = plot.draw();
    return rc;
  });
  return o.procs ? launchProcesses(nranks, body, o.device) : launchThreads(nranks, body, o.device);
}
