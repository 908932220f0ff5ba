#include "perf/report.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace attnperf {

RankInfo localRankInfo(int rank, int device, int group) {
  RankInfo ri;
  ri.rank = rank;
  ri.pid = int32_t(getpid());
  ri.device = device;
  ri.group = group;
  // Emulated hosts (tests/netns) name themselves through ATTN_HOSTID.
  const char* h = getenv("ATTN_HOSTID");
  if (h && *h)
    snprintf(ri.host, sizeof ri.host, "%s", h);
  else if (gethostname(ri.host, sizeof ri.host - 1) != 0)
    snprintf(ri.host, sizeof ri.host, "unknown");
  return ri;
}

std::string nowString() {
  char b[64];
  const time_t now = time(nullptr);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", &tmv);
  return b;
}

Reporter::Reporter(RunInfo info, const Options& opts, FILE* out)
    : info_(std::move(info)), opts_(opts), out_(out) {
  if (info_.startTime.empty()) info_.startTime = nowString();
}

double Reporter::algbw(const Row& r, const Measure& m) const {
  return m.timeUs > 0 ? double(r.bytes) / (m.timeUs * 1e3) : 0.0;
}

void Reporter::header(const std::vector<RankInfo>& ranks) {
  ranks_ = ranks;
  FILE* f = out_;
  const Options& o = opts_;
  fprintf(f, "# %s (%s): collective %s, nranks %d as %s\n", info_.program.c_str(),
          info_.library.c_str(), info_.coll.c_str(), info_.nranks, info_.mode.c_str());
  fprintf(f, "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: ", o.nthreads, o.ngpus,
          o.minBytes, o.maxBytes);
  if (o.stepFactor > 1.0) fprintf(f, "%g(factor)", o.stepFactor);
  else fprintf(f, "%zu(bytes)", o.stepBytes);
  fprintf(f, " warmup iters: %d iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
          o.warmup, o.iters, o.aggIters, o.check, o.graphLaunches, o.unalign);
  fprintf(f, "# transport: %s algo: %s\n",
          info_.transport.empty() ? "default" : info_.transport.c_str(),
          info_.algo.empty() ? "default" : info_.algo.c_str());
  fprintf(f, "# timing: %s; algbw = size/time, busbw = algbw*%.4g; GB = 1e9 B\n",
          timingText(o).c_str(), info_.busFactor);
  static const char* kBlocking[] = {
      "", "wait and barrier after each inner iteration (-m)",
      "wait after each inner iteration (-m), no barrier",
      "wait and barrier after each outer iteration (-n); time excludes barrier"};
  if (o.blocking) fprintf(f, "# Blocking Enabled: %s\n", kBlocking[o.blocking]);
  if (o.perIterTiming) {
    fprintf(f, "# Per-Iteration Report: host clock, waiting for the streams after each "
               "iteration; i_* uses max over ranks");
    if (o.perIterSkip) fprintf(f, "; summary skips first %d iterations", o.perIterSkip);
    fprintf(f, "\n");
  }
  if (o.parallelInit) fprintf(f, "# Parallel Init Enabled: each thread calls attnCommInitRank\n");
  fprintf(f, "#\n# Using devices\n");
  for (const RankInfo& r : ranks) {
    fprintf(f, "#  Rank %2d Group %2d Pid %6d on %10s device ", int(r.rank), int(r.group),
            int(r.pid), r.host);
    if (r.device >= 0) fprintf(f, "%2d [cuda:%d]\n", int(r.device), int(r.device));
    else fprintf(f, "-1 [host memory]\n");
  }
  const char* t = o.reportCpuTime ? "cputime" : "time";
  const char* ts = o.timestamps ? "timestamp" : "";
  const int tsPad = o.timestamps ? 19 : 0;
  fprintf(f, "#\n");
  if (o.perIterTiming) {
    fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %-68s%s\n", "", "", "", "", "",
            "           out-of-place (+ per-iteration)", "        in-place (+ per-iteration)");
    fprintf(f, "# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (int v = 0; v < 2; v++)
      fprintf(f, "  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s", t, "algbw", "busbw", "#wrong",
              "i_min", "i_max", "i_p99", "i_cv%");
    fprintf(f, " %*s\n# %10s  %12s  %8s  %6s  %6s", tsPad, ts, "(B)", "(elements)", "", "", "");
    for (int v = 0; v < 2; v++)
      fprintf(f, "  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s", "(us)", "(GB/s)", "(GB/s)", "",
              "(us)", "(us)", "(us)", "(%)");
  } else {
    fprintf(f, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
               "in-place          \n", "", "", "", "", "");
    fprintf(f, "# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (int v = 0; v < 2; v++) fprintf(f, "  %7s  %6s  %6s  %6s", t, "algbw", "busbw", "#wrong");
    fprintf(f, " %*s\n# %10s  %12s  %8s  %6s  %6s", tsPad, ts, "(B)", "(elements)", "", "", "");
    for (int v = 0; v < 2; v++) fprintf(f, "  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
  }
  fprintf(f, " %*s\n", tsPad, o.timestamps ? "%Y-%m-%d %H:%M:%S" : "");
  fflush(f);
}

namespace {
// A number in `width` columns: fewer decimals as it grows, then exponent.
std::string fit(double v, int width) {
  char b[64];
  for (const char* fmt : {"%*.2f", "%*.1f", "%*.0f"})
    if (snprintf(b, sizeof b, fmt, width, v) <= width) return b;
  snprintf(b, sizeof b, width >= 7 ? "%*.1e" : "%*.0e", width, v);
  return b;
}
}  // namespace

void Reporter::row(const Row& r) {
  rows_.push_back(r);
  FILE* f = out_;
  fprintf(f, "%12zu  %12zu  %8s  %6s  %6d", r.bytes, r.count, r.type, r.op, r.root);
  for (const Measure* m : {&r.outOfPlace, &r.inPlace}) {
    if (!m->ran) {
      fprintf(f, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
      if (opts_.perIterTiming) fprintf(f, "  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    const double a = algbw(r, *m);
    fprintf(f, "  %7s  %6s  %6s", fit(m->timeUs, 7).c_str(), fit(a, 6).c_str(),
            fit(a * info_.busFactor, 6).c_str());
    if (m->wrong < 0) fprintf(f, "  %6s", "N/A");
    else fprintf(f, "  %6" PRId64, m->wrong);
    if (opts_.perIterTiming) {
      const std::vector<double>& t = m->iter.timesUs;
      const IterStats s = iterStats(
          std::vector<double>(t.begin() + std::min<size_t>(t.size(), size_t(opts_.perIterSkip)), t.end()));
      fprintf(f, "  %7s  %7s  %7s  %7s", fit(s.minUs, 7).c_str(), fit(s.maxUs, 7).c_str(),
              fit(s.p99Us, 7).c_str(), fit(s.cvPct(), 7).c_str());
    }
  }
  if (opts_.timestamps) fprintf(f, "  %19s", nowString().c_str());
  fprintf(f, "\n");
  fflush(f);
}

double Reporter::avgBusBw() const {
  double sum = 0;
  int n = 0;
  for (const Row& r : rows_)
    for (const Measure* m : {&r.outOfPlace, &r.inPlace}) {
      if (!m->ran) continue;
      sum += algbw(r, *m) * info_.busFactor;
      n++;
    }
  return n ? sum / n : 0.0;
}

int64_t Reporter::footer() {
  int64_t wrong = 0;
  for (const Row& r : rows_)
    for (const Measure* m : {&r.outOfPlace, &r.inPlace})
      if (m->ran && m->wrong > 0) wrong += m->wrong;
  fprintf(out_, "# %-20s : %" PRId64 " %s\n", "Out of bounds values", wrong, wrong ? "FAILED" : "OK");
  fprintf(out_, "# %-20s : %g\n#\n", "Avg bus bandwidth", avgBusBw());
  fflush(out_);
  return wrong;
}

void Reporter::memoryLine(size_t sendBytes, size_t recvBytes) {
  auto mem = [](size_t b) {
    char s[32];
    const double v = double(b);
    if (b >= (size_t(1) << 30)) snprintf(s, sizeof s, "%.2f GB", v / double(1 << 30));
    else if (b >= (size_t(1) << 20)) snprintf(s, sizeof s, "%.2f MB", v / double(1 << 20));
    else if (b >= 1024) snprintf(s, sizeof s, "%.2f KB", v / 1024.0);
    else snprintf(s, sizeof s, "%zu B", b);
    return std::string(s);
  };
  const char* where = opts_.onDevice() ? "device" : opts_.mem == MemKind::kShareable ? "shareable host" : "host";
  fprintf(out_, "# %-20s : send %s | recv %s | Total %s per rank (%s)\n", "Buffer memory usage",
          mem(sendBytes).c_str(), mem(recvBytes).c_str(), mem(sendBytes + recvBytes).c_str(), where);
  fflush(out_);
}

}  // namespace attnperf
