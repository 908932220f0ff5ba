#include "perf/report.h"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

namespace attnperf {

RankInfo localRankInfo(int rank) {
  RankInfo ri;
  ri.rank = rank;
  ri.pid = int32_t(getpid());
  // Emulated hosts (tests/netns) name themselves through ATTN_HOSTID.
  const char* h = getenv("ATTN_HOSTID");
  if (h && *h)
    snprintf(ri.host, sizeof ri.host, "%s", h);
  else if (gethostname(ri.host, sizeof ri.host - 1) != 0)
    snprintf(ri.host, sizeof ri.host, "unknown");
  return ri;
}

Reporter::Reporter(RunInfo info, const Options& opts, FILE* out)
    : info_(std::move(info)), opts_(opts), out_(out) {}

double Reporter::algbw(const Row& r, const Measure& m) const {
  return m.t.medianUs > 0 ? double(r.bytes) / (m.t.medianUs * 1e3) : 0.0;
}

void Reporter::header(const std::vector<RankInfo>& ranks) {
  FILE* f = out_;
  fprintf(f, "# %s (%s): collective %s, nranks %d as %s\n", info_.program.c_str(),
          info_.library.c_str(), info_.coll.c_str(), info_.nranks, info_.mode.c_str());
  if (opts_.stepBytes)
    fprintf(f, "# minBytes %zu maxBytes %zu step: %zu(bytes)", opts_.minBytes,
            opts_.maxBytes, opts_.stepBytes);
  else
    fprintf(f, "# minBytes %zu maxBytes %zu step: %g(factor)", opts_.minBytes,
            opts_.maxBytes, opts_.stepFactor);
  fprintf(f, " warmup iters: %d iters: %d validation: %d transport: %s algo: %s\n",
          opts_.warmup, opts_.iters, opts_.check,
          info_.transport.empty() ? "default" : info_.transport.c_str(),
          info_.algo.empty() ? "default" : info_.algo.c_str());
  fprintf(f, "# time = median over iterations of (max over ranks of one call's "
             "time), barrier before each call; algbw = size/time, "
             "busbw = algbw*%.4g; GB = 1e9 B\n#\n", info_.busFactor);
  for (const RankInfo& r : ranks)
    fprintf(f, "#  Rank %3d Pid %7d on %20s\n", int(r.rank), int(r.pid), r.host);
  fprintf(f, "#\n");
  fprintf(f, "#%73s%32s\n", "out-of-place", "in-place");
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
          "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
          "#wrong", "time", "algbw", "busbw", "#wrong");
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
          "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
          "(GB/s)", "(GB/s)", "");
  fflush(f);
}

namespace {
// nccl-tests keeps the time column 7 wide by dropping decimals as it grows.
void printTime(FILE* f, double us) {
  if (us >= 10000.0) fprintf(f, "  %7.0f", us);
  else if (us >= 100.0) fprintf(f, "  %7.1f", us);
  else fprintf(f, "  %7.2f", us);
}
}  // namespace

void Reporter::row(const Row& r) {
  rows_.push_back(r);
  FILE* f = out_;
  fprintf(f, "  %10zu  %12zu  %8s  %6s  %6d", r.bytes, r.count, r.type, r.op, r.root);
  for (const Measure* m : {&r.outOfPlace, &r.inPlace}) {
    if (!m->ran) {
      fprintf(f, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    const double a = algbw(r, *m);
    printTime(f, m->t.medianUs);
    fprintf(f, "  %6.2f  %6.2f", a, a * info_.busFactor);
    if (m->wrong < 0) fprintf(f, "  %6s", "N/A");
    else fprintf(f, "  %6" PRId64, m->wrong);
  }
  fprintf(f, "\n");
  fflush(f);
}

int64_t Reporter::footer() {
  int64_t wrong = 0;
  double sum = 0;
  int n = 0;
  for (const Row& r : rows_)
    for (const Measure* m : {&r.outOfPlace, &r.inPlace}) {
      if (!m->ran) continue;
      if (m->wrong > 0) wrong += m->wrong;
      sum += algbw(r, *m) * info_.busFactor;
      n++;
    }
  fprintf(out_, "# Out of bounds values : %" PRId64 " %s\n", wrong,
          wrong ? "FAILED" : "OK");
  fprintf(out_, "# Avg bus bandwidth    : %g\n#\n", n ? sum / n : 0.0);
  fflush(out_);
  return wrong;
}

namespace {
std::string jsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o + "\"";
}
}  // namespace

bool Reporter::writeJson(const std::string& path) const {
  FILE* f = fopen(path.c_str(), "w");
  if (!f) {
    fprintf(stderr, "cannot write %s: %s\n", path.c_str(), strerror(errno));
    return false;
  }
  fprintf(f, "{\n  \"program\": %s,\n  \"library\": %s,\n  \"collective\": %s,\n",
          jsonString(info_.program).c_str(), jsonString(info_.library).c_str(),
          jsonString(info_.coll).c_str());
  fprintf(f, "  \"nranks\": %d,\n  \"mode\": %s,\n  \"transport\": %s,\n  \"algo\": %s,\n",
          info_.nranks, jsonString(info_.mode).c_str(),
          jsonString(info_.transport).c_str(), jsonString(info_.algo).c_str());
  fprintf(f, "  \"iters\": %d,\n  \"warmup\": %d,\n  \"check\": %d,\n  \"bus_factor\": %.17g,\n",
          opts_.iters, opts_.warmup, opts_.check, info_.busFactor);
  fprintf(f, "  \"timing\": \"median over iterations of max over ranks; barrier before each call\",\n");
  fprintf(f, "  \"rows\": [");
  for (size_t i = 0; i < rows_.size(); i++) {
    const Row& r = rows_[i];
    fprintf(f, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": %s, \"redop\": %s, \"root\": %d",
            i ? "," : "", r.bytes, r.count, jsonString(r.type).c_str(),
            jsonString(r.op).c_str(), r.root);
    const struct { const char* name; const Measure* m; } vs[] = {
        {"out_of_place", &r.outOfPlace}, {"in_place", &r.inPlace}};
    for (const auto& v : vs) {
      if (!v.m->ran) continue;
      const double a = algbw(r, *v.m);
      fprintf(f, ",\n     \"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, "
                 "\"wrong\": %" PRId64 ", \"time_min_us\": %.3f, \"time_mean_us\": %.3f, "
                 "\"time_max_us\": %.3f}",
              v.name, v.m->t.medianUs, a, a * info_.busFactor, v.m->wrong,
              v.m->t.minUs, v.m->t.meanUs, v.m->t.maxUs);
    }
    fprintf(f, "}");
  }
  fprintf(f, "\n  ]\n}\n");
  const bool ok = fclose(f) == 0;
  if (!ok) fprintf(stderr, "error writing %s\n", path.c_str());
  return ok;
}

}  // namespace attnperf
