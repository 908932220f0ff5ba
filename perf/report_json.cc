// Reporter::writeJson: nccl-tests' JSON schema (JSON_FILE_VERSION 3), so its
// readers (tools/analyze_perf_json.py and friends) read our files. attncomm's
// own facts go in an "attncomm" object that those readers ignore.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "perf/json_writer.h"
#include "perf/report.h"

extern char** environ;

namespace attnperf {

namespace {

// nccl-tests writes its booleans as the strings "true" / "false"; readers
// written against it expect that.
void ncclBool(JsonWriter& j, bool v) { j.str(v ? "true" : "false"); }

// Creates `path` exclusively, else path.0, path.1, ...: never overwrites a
// result file. Returns the stream and the name it got.
FILE* createExclusive(const std::string& path, std::string* name) {
  for (int i = -1; i < 10000; i++) {
    const std::string p = i < 0 ? path : path + "." + std::to_string(i);
    const int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      *name = p;
      return fdopen(fd, "w");
    }
    if (errno != EEXIST) {
      fprintf(stderr, "cannot write %s: %s\n", p.c_str(), strerror(errno));
      return nullptr;
    }
  }
  fprintf(stderr, "cannot write %s: 10000 numbered copies exist\n", path.c_str());
  return nullptr;
}

void perIter(JsonWriter& j, const char* key, const IterSeries& s, int skip) {
  const std::vector<double>& t = s.timesUs;
  const size_t k = std::min(t.size(), size_t(skip));
  const IterStats st = iterStats(std::vector<double>(t.begin() + long(k), t.end()));
  j.key(key);
  j.beginObject();
  j.key("skipped_iterations"); j.integer(skip);
  j.key("min_us"); j.num(st.minUs);
  j.key("max_us"); j.num(st.maxUs);
  j.key("avg_us"); j.num(st.avgUs);
  j.key("p50_us"); j.num(st.p50Us);
  j.key("p95_us"); j.num(st.p95Us);
  j.key("p99_us"); j.num(st.p99Us);
  j.key("stdev_us"); j.num(st.stdevUs);
  j.key("cv_pct"); j.num(st.cvPct());
  j.key("times_us");
  j.beginList();
  for (double v : t) j.num(v);
  j.endList();
  if (s.perProcessUs.size() > 1) {
    j.key("per_process_max_times_us");
    j.beginList();
    for (const auto& row : s.perProcessUs) {
      j.beginList();
      for (double v : row) j.num(v);
      j.endList();
    }
    j.endList();
  }
  j.endObject();
}

}  // namespace

bool Reporter::writeJson(const std::string& path, std::string* written) const {
  std::string name;
  FILE* f = createExclusive(path, &name);
  if (!f) return false;
  if (written) *written = name;
  const Options& o = opts_;
  JsonWriter j(f);
  j.beginObject();
  j.key("version"); j.integer(3);
  j.key("start_time"); j.str(info_.startTime);
  j.key("args");
  j.beginList();
  for (const std::string& a : o.args) j.str(a);
  j.endList();
  j.key("env");
  j.beginList();
  for (char** e = environ; e && *e; e++) j.str(*e);
  j.endList();
  j.key("nccl_version"); j.integer(info_.versionCode);
  j.key("attncomm_version"); j.str(info_.library);

  j.key("config");
  j.beginObject();
  j.key("nthreads"); j.integer(o.nthreads);
  j.key("ngpus"); j.integer(o.ngpus);
  j.key("minimum_bytes"); j.integer((long long)o.minBytes);
  j.key("maximum_bytes"); j.integer((long long)o.maxBytes);
  if (o.stepFactor > 1.0) {
    j.key("step_factor"); j.integer((long long)o.stepFactor);
  } else {
    j.key("step_bytes"); j.integer((long long)o.stepBytes);
  }
  j.key("warmup_iters"); j.integer(o.warmup);
  j.key("iterations"); j.integer(o.iters);
  j.key("aggregated_iterations"); j.integer(o.aggIters);
  j.key("validation"); j.integer(o.check);
  j.key("graph"); j.integer(o.graphLaunches);
  j.key("blocking_collectives"); ncclBool(j, o.blocking != 0);
  j.key("per_iter_timing"); ncclBool(j, o.perIterTiming != 0);
  j.key("per_iter_skip"); j.integer(o.perIterSkip);
  j.key("parallel_init"); ncclBool(j, o.parallelInit != 0);
  j.key("devices");
  j.beginList();
  for (const RankInfo& r : ranks_) {
    j.beginObject();
    j.key("rank"); j.integer(r.rank);
    j.key("group"); j.integer(r.group);
    j.key("pid"); j.integer(r.pid);
    j.key("hostname"); j.str(r.host);
    j.key("device"); j.integer(r.device);
    j.key("device_hex"); j.str(r.device >= 0 ? "cuda:" + std::to_string(r.device) : "host");
    j.key("device_info"); j.str(r.device >= 0 ? "CUDA device buffers" : "host memory buffers");
    j.endObject();
  }
  j.endList();
  j.endObject();

  j.key("results");
  j.beginList();
  for (const Row& r : rows_) {
    j.beginObject();
    j.key("size"); j.integer((long long)r.bytes);
    j.key("count"); j.integer((long long)r.count);
    j.key("type"); j.str(r.type);
    j.key("redop"); j.str(r.op);
    char root[16];
    snprintf(root, sizeof root, "%6d", r.root);  // nccl-tests: the printed column
    j.key("root"); j.str(root);
    const struct { const char* name; const char* iterName; const Measure* m; } vs[] = {
        {"out_of_place", "out_of_place_per_iter", &r.outOfPlace},
        {"in_place", "in_place_per_iter", &r.inPlace}};
    for (const auto& v : vs) {
      j.key(v.name);
      if (!v.m->ran) {
        j.null();
        continue;
      }
      const double a = algbw(r, *v.m);
      j.beginObject();
      j.key(o.reportCpuTime ? "cpu_time" : "time"); j.num(v.m->timeUs);
      j.key("alg_bw"); j.num(a);
      j.key("bus_bw"); j.num(a * info_.busFactor);
      j.key("nwrong");
      if (v.m->wrong < 0) j.null();
      else j.num(double(v.m->wrong));
      j.endObject();
    }
    if (o.perIterTiming)
      for (const auto& v : vs)
        if (v.m->ran) perIter(j, v.iterName, v.m->iter, o.perIterSkip);
    j.key("actual_iterations"); j.integer(o.iters);
    j.key("experiment_name"); j.str("");
    j.endObject();
  }
  j.endList();

  int64_t wrong = 0;
  for (const Row& r : rows_)
    for (const Measure* m : {&r.outOfPlace, &r.inPlace})
      if (m->ran && m->wrong > 0) wrong += m->wrong;
  j.key("out_of_bounds");
  j.beginObject();
  j.key("count"); j.integer(wrong);
  j.key("okay"); ncclBool(j, wrong == 0);
  j.endObject();
  j.key("average_bus_bandwidth");
  j.beginObject();
  j.key("bandwidth"); j.num(avgBusBw());
  j.key("okay"); j.str("unchecked");
  j.endObject();
  j.key("attncomm");
  j.beginObject();
  j.key("program"); j.str(info_.program);
  j.key("collective"); j.str(info_.coll);
  j.key("nranks"); j.integer(info_.nranks);
  j.key("mode"); j.str(info_.mode);
  j.key("transport"); j.str(info_.transport);
  j.key("algo"); j.str(info_.algo);
  j.key("timing"); j.str(o.timing == Timing::kMedian ? "median" : "avg");
  j.key("timing_text"); j.str(timingText(o));
  j.key("bus_factor"); j.num(info_.busFactor);
  j.endObject();
  j.key("errors");
  j.beginList();
  j.endList();
  j.key("end_time"); j.str(nowString());
  j.endObject();
  fputc('\n', f);
  const bool ok = fclose(f) == 0;
  if (!ok) fprintf(stderr, "error writing %s\n", name.c_str());
  return ok;
}

}  // namespace attnperf
