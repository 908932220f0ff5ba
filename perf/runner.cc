#include "perf/runner.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "perf/datatypes.h"
#include "perf/rank_device.h"
#include "perf/report.h"
#include "perf/timing.h"

namespace attnperf {

namespace {

struct BufferDeleter {
  bool shareable = false;  // from attnMemAlloc (-R 1)
  void operator()(void* p) const {
    if (shareable) attnMemFree(p);
    else free(p);
  }
};
using Buffer = std::unique_ptr<uint8_t, BufferDeleter>;

// Page-aligned and touched now, so page faults never land in a timed call.
Buffer allocTouched(size_t bytes, bool shareable) {
  const size_t page = 4096;
  const size_t len = (bytes + page - 1) / page * page + page;
  void* p = nullptr;
  if (shareable) {
    if (attnMemAlloc(&p, len) != attnSuccess) p = nullptr;
  } else {
    p = aligned_alloc(page, len);
  }
  if (p) memset(p, 0, len);
  return Buffer(static_cast<uint8_t*>(p), BufferDeleter{shareable});
}

std::string envOr(const std::string& v, const char* name) {
  if (!v.empty()) return v;
  const char* e = getenv(name);
  return e ? e : "";
}

class RankRunner {
 public:
  RankRunner(const Options& o, const CollSpec& s, attnComm_t c)
      : opts_(o), spec_(s), comm_(c) {}

  // false: an attn call failed (already reported).
  bool run(const std::string& program, const std::string& mode, int64_t* wrong);

 private:
  bool ok(attnResult_t r, const char* what, int line);
  bool measure(Bench& b, bool inPlace, Measure* m);

  const Options& opts_;
  const CollSpec& spec_;
  attnComm_t comm_;
  int rank_ = 0, nranks_ = 1;
  // The host buffers hold the patterns; with -G the calls take their
  // device twins (on the host, the twins are the same buffers).
  Buffer send_, recv_;
  RankDevice dev_;
  uint8_t* devSend_ = nullptr;
  uint8_t* devRecv_ = nullptr;
};

#define PERF_OK(call) ok((call), #call, __LINE__)
// A call, then (with -G) the wait for the stream it was enqueued on.
#define PERF_RUN(call) (ok((call), #call, __LINE__) && dev_.finish(comm_, #call))

bool RankRunner::ok(attnResult_t r, const char* what, int line) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "rank %d: %s:%d: %s failed: %s: %s\n", rank_, __FILE__, line,
          what, attnGetErrorString(r), attnGetLastError(comm_));
  fflush(stderr);
  return false;
}

bool RankRunner::measure(Bench& b, bool inPlace, Measure* m) {
  const size_t elt = typeSize(b.dtype);
  const size_t nSend = spec_.sendElems(b), nRecv = spec_.recvElems(b);
  const size_t sendOff = inPlace ? spec_.inPlaceSendOffset(b) : 0;
  const size_t recvOff = inPlace ? spec_.inPlaceRecvOffset(b) : 0;
  void* send = (inPlace ? devRecv_ : devSend_) + sendOff * elt;
  void* recv = devRecv_ + recvOff * elt;
  // -g: the call is captured once; the check, the warm-up and the timed
  // iterations launch the graph.
  if (opts_.cudaGraph && !PERF_OK(dev_.captureGraph([&] { return spec_.run(b, send, recv); }))) return false;
  auto call = [&] { return opts_.cudaGraph ? dev_.launchGraph() : spec_.run(b, send, recv); };

  if (opts_.check) {
    // -1 marks slots nobody wrote (patterns are never negative); then the
    // send data, which in place overwrites part of the marks.
    const size_t marked = std::max(nRecv + recvOff, nSend + sendOff);
    uint8_t* hostSend = (inPlace ? recv_.get() : send_.get()) + sendOff * elt;
    uint8_t* hostRecv = recv_.get() + recvOff * elt;
    fillBuffer(b.dtype, recv_.get(), marked, [](size_t) { return -1.0; });
    fillBuffer(b.dtype, hostSend, nSend, [&](size_t i) { return spec_.sendValue(b, i); });
    if (!dev_.upload(devRecv_, recv_.get(), marked * elt) ||
        (!inPlace && !dev_.upload(devSend_, send_.get(), nSend * elt)))
      return false;
    if (!PERF_RUN(call())) return false;
    if (!dev_.download(hostRecv, recv, nRecv * elt)) return false;
    int64_t wrong = int64_t(countWrong(
        b.dtype, hostRecv, nRecv, [&](size_t i) { return spec_.recvValue(b, i); },
        spec_.tolerance(b)));
    if (!PERF_RUN(attnAllReduce(&wrong, &wrong, 1, attnInt64, attnSum, comm_, dev_.stream())))
      return false;
    m->wrong = wrong;
  }
  for (int i = 0; i < opts_.warmup; i++)
    if (!PERF_RUN(call())) return false;

  std::vector<double> t(size_t(opts_.iters));
  for (int i = 0; i < opts_.iters; i++) {
    if (!PERF_RUN(attnBarrier(comm_, dev_.stream()))) return false;
    const double t0 = nowUs();
    if (!PERF_RUN(call())) return false;
    t[size_t(i)] = nowUs() - t0;
  }
  // A call is as slow as its slowest rank.
  if (!PERF_RUN(attnAllReduce(t.data(), t.data(), t.size(), attnFloat64, attnMax,
                              comm_, dev_.stream())))
    return false;
  m->t = summarize(t);
  m->ran = true;
  return true;
}

bool RankRunner::run(const std::string& program, const std::string& mode,
                     int64_t* wrongTotal) {
  if (!PERF_OK(attnCommCount(comm_, &nranks_)) || !PERF_OK(attnCommUserRank(comm_, &rank_)))
    return false;
  if (spec_.usesRoot && opts_.root >= nranks_) {
    fprintf(stderr, "rank %d: root %d out of range (%d ranks)\n", rank_, opts_.root, nranks_);
    return false;
  }
  // Processes' buffers must be exportable for cuda_ipc; threads' are
  // stream-ordered (see RankDevice::open).
  if (!dev_.open(opts_.device, /*exportable=*/mode != "threads")) return false;
  RankInfo mine = localRankInfo(rank_);
  std::vector<RankInfo> all(static_cast<size_t>(nranks_));
  if (!PERF_RUN(attnAllGather(&mine, all.data(), sizeof mine, attnUint8, comm_, dev_.stream())))
    return false;

  Bench b;
  b.comm = comm_;
  b.rank = rank_;
  b.nranks = nranks_;
  b.dtype = opts_.dtype;
  b.op = opts_.op;
  b.root = opts_.root;
  b.stream = dev_.stream();
  const size_t elt = typeSize(b.dtype);
  const std::vector<size_t> sizes = sizeList(opts_);

  // One pair of buffers for the largest size, reused by every size.
  size_t maxSend = 0, maxRecv = 0;
  for (size_t s : sizes) {
    b.count = spec_.countFor(s, nranks_, elt);
    maxSend = std::max(maxSend, spec_.sendElems(b) + spec_.inPlaceSendOffset(b));
    maxRecv = std::max(maxRecv, spec_.recvElems(b) + spec_.inPlaceRecvOffset(b));
  }
  send_ = allocTouched(maxSend * elt, opts_.registered != 0);
  recv_ = allocTouched(std::max(maxSend, maxRecv) * elt, opts_.registered != 0);
  if (!send_ || !recv_) {
    fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", rank_,
            std::max(maxSend, maxRecv) * elt);
    return false;
  }
  devSend_ = static_cast<uint8_t*>(dev_.place(send_.get(), maxSend * elt));
  devRecv_ = static_cast<uint8_t*>(dev_.place(recv_.get(), std::max(maxSend, maxRecv) * elt));
  if (!devSend_ || !devRecv_) return false;

  std::unique_ptr<Reporter> rep;
  if (rank_ == 0) {
    int v = 0;
    attnGetVersion(&v);
    char lib[64];
    snprintf(lib, sizeof lib, "attncomm %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    RunInfo info;
    info.program = program;
    info.library = lib;
    info.coll = spec_.name;
    info.mode = opts_.device >= 0 ? mode + ", cuda:" + std::to_string(opts_.device) : mode;
    if (opts_.cudaGraph) info.mode += ", graph";
    info.transport = envOr(opts_.transports, "ATTN_TRANSPORT");
    info.algo = envOr(opts_.algo, "ATTN_ALGO");
    info.nranks = nranks_;
    info.busFactor = spec_.busFactor(nranks_);
    info.hasInPlace = spec_.hasInPlace && opts_.inPlace;
    rep = std::make_unique<Reporter>(info, opts_);
    rep->header(all);
  }

  for (size_t s : sizes) {
    b.count = spec_.countFor(s, nranks_, elt);
    if (b.count == 0) continue;  // same decision on every rank
    Row row;
    row.count = spec_.sizeElems(b);
    row.bytes = row.count * elt;
    row.type = typeName(b.dtype);
    row.op = spec_.usesOp ? opName(b.op) : "none";
    row.root = spec_.usesRoot ? b.root : -1;
    if (!measure(b, false, &row.outOfPlace)) return false;
    if (spec_.hasInPlace && opts_.inPlace && !measure(b, true, &row.inPlace)) return false;
    *wrongTotal += std::max<int64_t>(0, row.outOfPlace.wrong) +
                   std::max<int64_t>(0, row.inPlace.wrong);
    if (rep) rep->row(row);
  }
  if (rep) {
    rep->footer();
    if (!opts_.jsonPath.empty() && !rep->writeJson(opts_.jsonPath)) return false;
  }
  return true;
}

}  // namespace

RankStatus runRank(const Options& opts, const CollSpec& spec, attnComm_t comm,
                   const std::string& program, const std::string& mode) {
  RankRunner r(opts, spec, comm);
  int64_t wrong = 0;
  if (!r.run(program, mode, &wrong)) {
    attnCommAbort(comm);  // peers waiting on us fail instead of hanging
    return kRankFailed;
  }
  const attnResult_t d = attnCommDestroy(comm);
  if (d != attnSuccess) {
    fprintf(stderr, "attnCommDestroy failed: %s\n", attnGetErrorString(d));
    return kRankFailed;
  }
  return wrong ? kRankWrong : kRankOk;
}

}  // namespace attnperf
