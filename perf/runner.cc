#include "perf/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "perf/datatypes.h"
#include "perf/thread_runner.h"
#include "perf/watchdog.h"

#if __has_include("perf/plot.h")
#include "perf/plot.h"
#define ATTN_PERF_HAVE_PLOT 1
#endif

namespace attnperf {

void BufferDeleter::operator()(void* p) const {
  if (shareable) attnMemFree(p);
  else free(p);
}

namespace {

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

}  // namespace

bool ThreadRunner::setup(const std::vector<attnComm_t>& comms, int nranks) {
  nranks_ = nranks;
  for (attnComm_t c : comms) {
    auto s = std::make_unique<Slot>();
    s->comm = c;
    if (!ok(attnCommUserRank(c, &s->rank), "attnCommUserRank", *s)) return false;
    // Processes' buffers must be exportable for cuda_ipc; threads' are
    // stream-ordered (see RankDevice::open).
    if (!s->dev.open(opts_.device, processes_, opts_.streamNull != 0)) return false;
    s->b.comm = c;
    s->b.rank = s->rank;
    s->b.nranks = nranks;
    s->b.stream = s->dev.stream();
    slots_.push_back(std::move(s));
  }
  // One pair of buffers for the largest size and type, reused by all.
  size_t maxSend = 0, maxRecv = 0;
  Bench b;
  b.nranks = nranks;
  for (attnDataType_t t : opts_.dtypes)
    for (size_t bytes : sizeList(opts_)) {
      const size_t elt = typeSize(t);
      b.count = spec_.countFor(bytes, nranks, elt);
      maxSend = std::max(maxSend, (spec_.sendElems(b) + spec_.inPlaceSendOffset(b)) * elt);
      maxRecv = std::max(maxRecv, (spec_.recvElems(b) + spec_.inPlaceRecvOffset(b)) * elt);
    }
  maxRecv = std::max(maxSend, maxRecv);
  const size_t pad = size_t(opts_.unalign) * 8;  // -u, for the widest type
  sendBytes_ = maxSend + pad;
  recvBytes_ = maxRecv + pad;
  const bool shareable = opts_.mem == MemKind::kShareable;
  for (auto& s : slots_) {
    s->send = allocTouched(sendBytes_, shareable);
    s->recv = allocTouched(recvBytes_, shareable);
    if (!s->send || !s->recv) {
      fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", s->rank, recvBytes_);
      return false;
    }
    s->devSend = static_cast<uint8_t*>(s->dev.place(s->send.get(), sendBytes_));
    s->devRecv = static_cast<uint8_t*>(s->dev.place(s->recv.get(), recvBytes_));
    if (!s->devSend || !s->devRecv) return false;
  }
  return true;
}

bool ThreadRunner::finishReport(int64_t) {
  rep_->footer();
  if (opts_.memoryReport) rep_->memoryLine(sendBytes_, recvBytes_);
  std::string json = opts_.jsonPath, written;
  if (json.empty() && !opts_.plotPath.empty())
    json = "/tmp/" + std::string(getenv("USER") ? getenv("USER") : "attnperf") + "-plot-" +
           std::to_string(getpid()) + ".json";
  if (json.empty()) return true;
  if (!rep_->writeJson(json, &written)) return false;
  printf("# Wrote JSON output to %s\n", written.c_str());
  if (opts_.plotPath.empty()) return true;
#ifdef ATTN_PERF_HAVE_PLOT
  std::string why;
  if (writePlot(written, opts_.plotPath, &why)) printf("# Wrote plot to %s\n", opts_.plotPath.c_str());
  else printf("# plot not written: %s\n", why.c_str());
#else
  printf("# plot not written: this build has no plot support (perf/plot.h)\n");
#endif
  if (opts_.jsonPath.empty()) unlink(written.c_str());
  fflush(stdout);
  return true;
}

bool ThreadRunner::run(const std::vector<attnComm_t>& comms, const std::string& program,
                       const std::string& mode, int64_t* wrongTotal) {
  processes_ = mode != "threads";
  int nranks = 1;
  if (attnCommCount(comms[0], &nranks) != attnSuccess) {
    fprintf(stderr, "attnCommCount failed: %s\n", attnGetLastError(comms[0]));
    return false;
  }
  if (!setup(comms, nranks)) return false;
  if (spec_.usesRoot)
    for (int r : opts_.roots)
      if (!opts_.allRoots && r >= nranks) {
        fprintf(stderr, "rank %d: root %d out of range (%d ranks)\n", slots_[0]->rank, r, nranks);
        return false;
      }

  // Who is where, for the "# Rank" lines (and JSON devices).
  std::vector<std::vector<RankInfo>> all(slots_.size(), std::vector<RankInfo>(size_t(nranks)));
  std::vector<RankInfo> mine;
  for (auto& s : slots_) mine.push_back(localRankInfo(s->rank, opts_.device, thread_));
  size_t k = 0;
  if (!onAll("attnAllGather", [&](Slot& s) {
        const size_t i = k++;
        return attnAllGather(&mine[i], all[i].data(), sizeof(RankInfo), attnUint8, s.comm, s.dev.stream());
      }) || !waitAll("attnAllGather"))
    return false;

  const bool holdsRank0 = slots_[0]->rank == 0;
  if (holdsRank0) {
    int v = 0;
    attnGetVersion(&v);
    char lib[64];
    snprintf(lib, sizeof lib, "attncomm %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    RunInfo info;
    info.program = program;
    info.library = lib;
    info.versionCode = v;
    info.coll = spec_.name;
    info.mode = mode;
    if (opts_.ngpus > 1) info.mode += ", " + std::to_string(opts_.ngpus) + " ranks per thread";
    if (opts_.onDevice()) info.mode += ", cuda:" + std::to_string(opts_.device);
    if (opts_.mem == MemKind::kShareable) info.mode += ", shareable buffers";
    if (opts_.graphLaunches) info.mode += ", graph x" + std::to_string(opts_.graphLaunches);
    if (opts_.streamNull && opts_.onDevice()) info.mode += ", NULL stream";
    info.transport = envOr(opts_.transports, "ATTN_TRANSPORT");
    info.algo = envOr(opts_.algo, "ATTN_ALGO");
    info.nranks = nranks;
    info.busFactor = spec_.busFactor(nranks);
    info.hasInPlace = spec_.hasInPlace && opts_.inPlace;
    rep_ = std::make_unique<Reporter>(info, opts_);
    rep_->header(all[0]);
  }

  // The loops nccl-tests runs: types, ops, roots, then sizes; -N cycles.
  std::vector<attnRedOp_t> ops = spec_.usesOp ? opts_.ops : std::vector<attnRedOp_t>{attnSum};
  std::vector<int> roots = spec_.usesRoot ? opts_.roots : std::vector<int>{0};
  if (spec_.usesRoot && opts_.allRoots) {
    roots.clear();
    for (int r = 0; r < nranks; r++) roots.push_back(r);
  }
  const std::vector<size_t> sizes = sizeList(opts_);
  for (long cycle = 0; opts_.runCycles == 0 || cycle < opts_.runCycles; cycle++)
    for (attnDataType_t t : opts_.dtypes)
      for (attnRedOp_t op : ops)
        for (int root : roots)
          for (size_t bytes : sizes) {
            const size_t elt = typeSize(t);
            const size_t count = spec_.countFor(bytes, nranks, elt);
            if (count == 0) continue;  // same decision on every rank
            for (auto& s : slots_) {
              s->b.dtype = t;
              s->b.op = op;
              s->b.root = root;
              s->b.count = count;
            }
            const Bench& b = slots_[0]->b;
            Row row;
            row.count = spec_.sizeElems(b);
            row.bytes = row.count * elt;
            row.type = typeName(t);
            row.op = spec_.usesOp ? opName(op) : "none";
            row.root = spec_.usesRoot ? root : -1;
            if (!measure(false, &row.outOfPlace)) return false;
            if (spec_.hasInPlace && opts_.inPlace && !measure(true, &row.inPlace)) return false;
            *wrongTotal += std::max<int64_t>(0, row.outOfPlace.wrong) +
                           std::max<int64_t>(0, row.inPlace.wrong);
            if (rep_) rep_->row(row);
          }
  return !rep_ || finishReport(*wrongTotal);
}

RankStatus runThread(const Options& opts, const CollSpec& spec, const std::vector<attnComm_t>& comms,
                     int thread, const std::string& program, const std::string& mode) {
  for (attnComm_t c : comms) watchdogAdd(c);
  int64_t wrong = 0;
  // Destroyed last: its device buffers outlive the communicators' work.
  ThreadRunner r(opts, spec, thread);
  const bool good = r.run(comms, program, mode, &wrong);
  RankStatus st = good ? (wrong ? kRankWrong : kRankOk) : kRankFailed;
  for (attnComm_t c : comms) {
    if (!watchdogRemove(c)) continue;  // the watchdog aborted it already
    if (!good) {
      attnCommAbort(c);  // peers waiting on us fail instead of hanging
      continue;
    }
    const attnResult_t d = attnCommDestroy(c);
    if (d != attnSuccess) {
      fprintf(stderr, "attnCommDestroy failed: %s\n", attnGetErrorString(d));
      st = kRankFailed;
    }
  }
  return st;
}

}  // namespace attnperf
