#include "perf/baselines/baseline.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "perf/datatypes.h"
#include "perf/patterns.h"
#include "perf/timing.h"

namespace attnperf {

namespace {
// Values per collective, the same functions our *_perf binaries use.
// reduce, all_reduce, broadcast: count is the whole buffer (to rank 0, to
// every rank, from rank 0).
bool wholeBuffer(const std::string& c) {
  return c == "reduce" || c == "all_reduce" || c == "broadcast";
}
double sendValue(const std::string& c, int r, int n, size_t count, size_t j) {
  if (c == "all_gather") return copyValue(attnFloat32, r, 0, j);
  if (c == "broadcast") return r == 0 ? copyValue(attnFloat32, 0, 0, j) : -1.0;
  if (c == "alltoall") return copyValue(attnFloat32, r, int(j / count), j % count);
  (void)n;
  return reduceInput(attnSum, r, j);
}
double recvValue(const std::string& c, int r, int n, size_t count, size_t i) {
  if (c == "all_gather") return copyValue(attnFloat32, int(i / count), 0, i % count);
  if (c == "alltoall") return copyValue(attnFloat32, int(i / count), r, i % count);
  if (c == "broadcast") return copyValue(attnFloat32, 0, 0, i);
  if (c == "reduce" || c == "all_reduce") return reduceExpected(attnSum, n, i);
  return reduceExpected(attnSum, n, size_t(r) * count + i);
}

// The timed loop, combined over ranks as our binaries do: --timing avg:
// loop time / iters, then -a (avg via an int64 sum of nanoseconds, min as
// -max(-x)); --timing median: barrier before each call, max over ranks,
// median.
double timeCalls(Backend& be, const Options& o, BaselineOp& op) {
  if (o.timing == Timing::kMedian) {
    std::vector<double> t(size_t(o.iters));
    for (int i = 0; i < o.iters; i++) {
      be.barrier();
      const double t0 = nowUs();
      op.call();
      t[size_t(i)] = nowUs() - t0;
    }
    be.maxInPlace(t.data(), t.size());
    return summarize(t).medianUs;
  }
  be.barrier();
  const double t0 = nowUs();
  for (int i = 0; i < o.iters; i++) op.call();
  double mine = (nowUs() - t0) / double(o.iters);
  switch (o.average) {
    case 1: return double(be.sum(int64_t(mine * 1e3))) / 1e3 / double(be.nranks());
    case 2: mine = -mine; be.maxInPlace(&mine, 1); return -mine;
    case 3: be.maxInPlace(&mine, 1); return mine;
    default: return mine;
  }
}

}  // namespace

bool baselineCollKnown(const std::string& c) {
  return c == "all_gather" || c == "reduce_scatter" || c == "alltoall" || wholeBuffer(c);
}

bool baselineOptionsOk(const Options& o) {
  if (!baselineCollKnown(o.coll)) {
    fprintf(stderr, "--coll must be all_gather, reduce_scatter, alltoall, reduce, all_reduce or broadcast "
            "(got '%s')\n",
            o.coll.c_str());
    return false;
  }
  if (o.dtypes != std::vector<attnDataType_t>{attnFloat32} || o.ops != std::vector<attnRedOp_t>{attnSum}) {
    fprintf(stderr, "baselines measure -d float -o sum only\n");
    return false;
  }
  // What a baseline's loop does not have: groups, graphs, device buffers.
  if (o.ngpus > 1 || o.aggIters > 1 || o.graphLaunches || o.onDevice() || o.blocking || o.unalign ||
      o.runCycles != 1 || o.perIterTiming || o.allRoots || o.roots != std::vector<int>{0}) {
    fprintf(stderr, "baselines support -g 1 -m 1 -G 0 -z 0 -u 0 -N 1 -I 0 -r 0 and host memory only\n");
    return false;
  }
  return true;
}

int64_t runBaseline(Backend& be, const Options& o, const std::string& program,
                    const std::string& mode, const std::string& transport) {
  const int r = be.rank(), n = be.nranks();
  const std::string& coll = o.coll;
  const bool toAll = coll != "reduce_scatter";  // recv holds n blocks
  const bool whole = wholeBuffer(coll);         // one block of count elements
  const bool toRoot = coll == "reduce";         // checked on rank 0 only
  std::vector<RankInfo> ranks = be.gatherRankInfo(localRankInfo(r));

  std::unique_ptr<Reporter> rep;
  if (r == 0) {
    RunInfo info;
    info.program = program;
    info.library = be.library();
    info.coll = coll;
    info.mode = mode;
    info.transport = transport;
    info.nranks = n;
    info.busFactor = coll == "all_reduce" ? 2.0 * double(n - 1) / double(n)
                     : whole            ? 1.0
                                        : double(n - 1) / double(n);
    info.hasInPlace = false;
    rep = std::make_unique<Reporter>(info, o);
    rep->header(ranks);
  }

  const std::vector<size_t> sizes = sizeList(o);
  const size_t maxElems = sizes.empty() ? 0 : sizes.back() / sizeof(float);
  // Touched up front so page faults stay out of the timed calls.
  std::vector<float> send(maxElems + 1, 0.0f), recv(maxElems + 1, 0.0f);
  int64_t wrongTotal = 0;

  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float) / (whole ? 1 : size_t(n));
    if (count == 0) continue;
    const size_t all = whole ? count : count * size_t(n);
    const size_t nSend = coll == "all_gather" ? count : all;
    const size_t nRecv = toRoot ? (r == 0 ? all : 0) : toAll ? all : count;
    for (size_t j = 0; j < nSend; j++) send[j] = float(sendValue(coll, r, n, count, j));
    std::fill(recv.begin(), recv.begin() + all, -1.0f);
    BaselineOp op = be.prepare(coll, send.data(), recv.data(), count);

    Row row;
    row.bytes = all * sizeof(float);
    row.count = all;
    row.type = "float";
    row.op = coll == "reduce_scatter" || coll == "reduce" || coll == "all_reduce" ? "sum" : "none";
    Measure& m = row.outOfPlace;
    if (o.check) {
      op.call();
      int64_t wrong = int64_t(countWrong(attnFloat32, op.result, nRecv, [&](size_t i) {
        return recvValue(coll, r, n, count, i);
      }));
      m.wrong = be.sum(wrong);
      wrongTotal += m.wrong;
    }
    if (op.clobbered) std::fill(op.clobbered, op.clobbered + op.clobberedElems, 0.0f);
    for (int i = 0; i < o.warmup; i++) op.call();
    m.timeUs = timeCalls(be, o, op);
    m.ran = true;
    if (rep) rep->row(row);
  }
  if (rep) {
    rep->footer();
    std::string written;
    if (!o.jsonPath.empty() && rep->writeJson(o.jsonPath, &written))
      printf("# Wrote JSON output to %s\n", written.c_str());
  }
  return wrongTotal;
}

}  // namespace attnperf
