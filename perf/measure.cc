// One size of one variant (out-of-place or in-place): checked iterations,
// warm-up, then the timed loop, as nccl-tests times it (or, with
// --timing median, attncomm's older per-iteration measure).
#include <algorithm>
#include <cstdio>

#include "perf/datatypes.h"
#include "perf/thread_runner.h"
#include "perf/timing.h"
#include "perf/watchdog.h"

namespace attnperf {

bool ThreadRunner::ok(attnResult_t r, const char* what, const Slot& s) {
  if (r == attnSuccess) return true;
  if (watchdogFired()) {  // the communicator is gone: no last error to ask
    fprintf(stderr, "rank %d: %s stopped by the timeout (-T)\n", s.rank, what);
    return false;
  }
  fprintf(stderr, "rank %d: %s failed: %s: %s\n", s.rank, what, attnGetErrorString(r),
          attnGetLastError(s.comm));
  fflush(stderr);
  return false;
}

bool ThreadRunner::onAll(const char* what, const std::function<attnResult_t(Slot&)>& fn) {
  const bool group = slots_.size() > 1;
  if (group && !ok(attnGroupStart(), "attnGroupStart", *slots_[0])) return false;
  bool good = true;
  for (auto& s : slots_) good = ok(fn(*s), what, *s) && good;
  // The group is always closed, so a failed call leaves no queued work.
  if (group) good = ok(attnGroupEnd(), what, *slots_[0]) && good;
  return good;
}

bool ThreadRunner::waitAll(const char* what) {
  for (auto& s : slots_)
    if (!s->dev.finish(s->comm, what)) return false;
  return true;
}

bool ThreadRunner::barrierAll() {
  return onAll("attnBarrier", [](Slot& s) { return attnBarrier(s.comm, s.dev.stream()); }) &&
         waitAll("attnBarrier");
}

void* ThreadRunner::sendPtr(Slot& s, bool inPlace) const {
  const size_t elt = typeSize(s.b.dtype);
  const size_t off = inPlace ? spec_.inPlaceSendOffset(s.b) : 0;
  return (inPlace ? s.devRecv : s.devSend) + (off + size_t(opts_.unalign)) * elt;
}

void* ThreadRunner::recvPtr(Slot& s, bool inPlace) const {
  const size_t elt = typeSize(s.b.dtype);
  const size_t off = inPlace ? spec_.inPlaceRecvOffset(s.b) : 0;
  return s.devRecv + (off + size_t(opts_.unalign)) * elt;
}

bool ThreadRunner::issue(bool inPlace) {
  auto one = [&](Slot& s) { return spec_.run(s.b, sendPtr(s, inPlace), recvPtr(s, inPlace)); };
  const int m = opts_.aggIters;
  if (opts_.blocking == 1 || opts_.blocking == 2) {
    // Each call completes (and with -z 1 meets the others) before the next.
    for (int a = 0; a < m; a++) {
      if (!onAll("collective", one) || !waitAll("collective")) return false;
      if (opts_.blocking == 1 && !barrierAll()) return false;
    }
    return true;
  }
  if (m == 1) return onAll("collective", one);
  // -m: the iteration's calls form one group.
  if (!ok(attnGroupStart(), "attnGroupStart", *slots_[0])) return false;
  bool good = true;
  for (int a = 0; a < m && good; a++)
    for (auto& s : slots_) good = ok(one(*s), "collective", *s) && good;
  return ok(attnGroupEnd(), "attnGroupEnd", *slots_[0]) && good;
}

bool ThreadRunner::allReduce(std::vector<std::vector<double>>& v, attnRedOp_t op) {
  size_t i = 0;
  return onAll("attnAllReduce", [&](Slot& s) {
           std::vector<double>& x = v[i++];
           return attnAllReduce(x.data(), x.data(), x.size(), attnFloat64, op, s.comm, s.dev.stream());
         }) &&
         waitAll("attnAllReduce");
}

bool ThreadRunner::check(bool inPlace, int64_t* wrongOut) {
  int64_t total = 0;
  for (int c = 0; c < opts_.check; c++) {
    // -1 marks slots nobody wrote (patterns are never negative); then the
    // send data, which in place overwrites part of the marks.
    for (auto& sp : slots_) {
      Slot& s = *sp;
      const Bench& b = s.b;
      const size_t elt = typeSize(b.dtype), u = size_t(opts_.unalign);
      const size_t sendOff = inPlace ? spec_.inPlaceSendOffset(b) : 0;
      const size_t recvOff = inPlace ? spec_.inPlaceRecvOffset(b) : 0;
      const size_t nSend = spec_.sendElems(b), nRecv = spec_.recvElems(b);
      const size_t marked = std::max(nRecv + recvOff, nSend + sendOff);
      uint8_t* hostRecvBase = s.recv.get() + u * elt;
      uint8_t* hostSend = (inPlace ? s.recv.get() : s.send.get()) + (u + sendOff) * elt;
      fillBuffer(b.dtype, hostRecvBase, marked, [](size_t) { return -1.0; });
      fillBuffer(b.dtype, hostSend, nSend, [&](size_t i) { return spec_.sendValue(b, i); });
      if (!s.dev.upload(s.devRecv + u * elt, hostRecvBase, marked * elt) ||
          (!inPlace && !s.dev.upload(s.devSend + u * elt, hostSend, nSend * elt)))
        return false;
    }
    // One call per rank (not -m of them: in place they would compound).
    auto one = [&](Slot& s) { return spec_.run(s.b, sendPtr(s, inPlace), recvPtr(s, inPlace)); };
    if (opts_.graphLaunches > 0) {
      // As nccl-tests: the checked call too runs as a CUDA graph.
      for (auto& s : slots_)
        if (!ok(s->dev.beginCapture(), "cudaStreamBeginCapture", *s)) return false;
      const bool issued = onAll("collective", one);
      for (auto& s : slots_)
        if (!ok(s->dev.endCapture(), "cudaStreamEndCapture", *s)) return false;
      if (!issued || !onAll("cudaGraphLaunch", [](Slot& s) { return s.dev.launchGraph(); })) return false;
    } else if (!onAll("collective", one)) {
      return false;
    }
    if (!waitAll("collective")) return false;
    std::vector<std::vector<double>> wrong;
    for (auto& sp : slots_) {
      Slot& s = *sp;
      const Bench& b = s.b;
      const size_t elt = typeSize(b.dtype), nRecv = spec_.recvElems(b);
      const size_t recvOff = inPlace ? spec_.inPlaceRecvOffset(b) : 0;
      uint8_t* hostRecv = s.recv.get() + (size_t(opts_.unalign) + recvOff) * elt;
      if (!s.dev.download(hostRecv, recvPtr(s, inPlace), nRecv * elt)) return false;
      wrong.push_back({double(countWrong(b.dtype, hostRecv, nRecv,
                                         [&](size_t i) { return spec_.recvValue(b, i); },
                                         spec_.tolerance(b)))});
    }
    if (!allReduce(wrong, attnSum)) return false;
    total += int64_t(wrong[0][0]);
    if (total) break;  // as nccl-tests: stop at the first wrong iteration
  }
  *wrongOut = total;
  return true;
}

bool ThreadRunner::timeLoop(bool inPlace, Measure* m) {
  const Options& o = opts_;
  const bool median = o.timing == Timing::kMedian;
  const bool perIter = median || o.perIterTiming;
  const double calls = double(o.iters) * double(o.aggIters);
  std::vector<double> iterUs;
  double cpuUs = 0, elapsedUs = 0;
  if (!barrierAll()) return false;
  if (o.graphLaunches > 0) {
    for (auto& s : slots_)
      if (!ok(s->dev.beginCapture(), "cudaStreamBeginCapture", *s)) return false;
    bool issued = true;
    for (int i = 0; i < o.iters && issued; i++) issued = issue(inPlace);
    for (auto& s : slots_)
      if (!ok(s->dev.endCapture(), "cudaStreamEndCapture", *s)) return false;
    if (!issued || !barrierAll()) return false;
    const double t0 = nowUs();
    for (int l = 0; l < o.graphLaunches; l++)
      if (!onAll("cudaGraphLaunch", [](Slot& s) { return s.dev.launchGraph(); })) return false;
    cpuUs = nowUs() - t0;
    if (!waitAll("cudaGraphLaunch")) return false;
    elapsedUs = (nowUs() - t0) / double(o.graphLaunches);
    cpuUs /= double(o.graphLaunches);
  } else {
    double collOnly = 0;
    const double t0 = nowUs();
    for (int i = 0; i < o.iters; i++) {
      if (median && !barrierAll()) return false;
      const double ti = nowUs();
      if (!issue(inPlace)) return false;
      if (o.blocking == 3 || perIter) {
        if (!waitAll("collective")) return false;
        const double d = nowUs() - ti;
        collOnly += d;
        if (perIter) iterUs.push_back(d / double(o.aggIters));
        // -z 3: the barrier after each iteration stays out of the time.
        if (o.blocking == 3 && !barrierAll()) return false;
      }
    }
    cpuUs = nowUs() - t0;
    if (!waitAll("collective")) return false;
    elapsedUs = nowUs() - t0;
    if (o.blocking == 3) cpuUs = elapsedUs = collOnly;
  }
  // Combine over ranks: -a for the loop time; max for per-iteration times.
  const double mine = (o.reportCpuTime ? cpuUs : elapsedUs) / calls;
  std::vector<std::vector<double>> t(slots_.size(), std::vector<double>{mine});
  static const attnRedOp_t kOp[] = {attnSum, attnSum, attnMin, attnMax};
  if (!allReduce(t, kOp[o.average])) return false;
  m->timeUs = o.average == 0 ? mine : o.average == 1 ? t[0][0] / nranks_ : t[0][0];
  if (perIter) {
    std::vector<std::vector<double>> rows;
    if (processes_ && o.perIterTiming) {
      // Each process's own row, for nccl-tests' per_process_max_times_us.
      std::vector<double> all(iterUs.size() * size_t(nranks_));
      Slot& s = *slots_[0];
      if (!ok(attnAllGather(iterUs.data(), all.data(), iterUs.size(), attnFloat64, s.comm, s.dev.stream()),
              "attnAllGather", s) || !waitAll("attnAllGather"))
        return false;
      for (int r = 0; r < nranks_; r++)
        rows.emplace_back(all.begin() + long(size_t(r) * iterUs.size()),
                          all.begin() + long(size_t(r + 1) * iterUs.size()));
    }
    std::vector<std::vector<double>> mx(slots_.size(), iterUs);
    if (!allReduce(mx, attnMax)) return false;
    if (median) m->timeUs = summarize(mx[0]).medianUs;
    if (o.perIterTiming) m->iter = IterSeries{mx[0], rows};
  }
  m->ran = true;
  return true;
}

bool ThreadRunner::measure(bool inPlace, Measure* m) {
  if (opts_.check && !check(inPlace, &m->wrong)) return false;
  for (int i = 0; i < opts_.warmup; i++)
    if (!issue(inPlace)) return false;
  if (!waitAll("collective")) return false;
  return timeLoop(inPlace, m);
}

}  // namespace attnperf
