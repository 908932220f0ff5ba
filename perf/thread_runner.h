// Internal to runner.cc / measure.cc: one thread of the benchmark, driving
// its rank slots (-g: one communicator each) through every phase, each
// phase's call issued on every slot inside one group (as nccl-tests does
// with several GPUs per thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "perf/coll_spec.h"
#include "perf/options.h"
#include "perf/rank_device.h"
#include "perf/report.h"

namespace attnperf {

struct BufferDeleter {
  bool shareable = false;  // from attnMemAlloc (--mem shareable)
  void operator()(void* p) const;
};
using Buffer = std::unique_ptr<uint8_t, BufferDeleter>;

// One rank this thread drives.
struct Slot {
  attnComm_t comm = nullptr;
  int rank = 0;
  RankDevice dev;
  // The host buffers hold the patterns; with device buffers the calls take
  // their device twins (in host memory the twins are the same buffers).
  Buffer send, recv;
  uint8_t* devSend = nullptr;
  uint8_t* devRecv = nullptr;
  Bench b;
};

class ThreadRunner {
 public:
  ThreadRunner(const Options& o, const CollSpec& s, int thread) : opts_(o), spec_(s), thread_(thread) {}
  // false: a call failed (already reported). *wrong: #wrong over the run.
  bool run(const std::vector<attnComm_t>& comms, const std::string& program,
           const std::string& mode, int64_t* wrong);

 private:
  bool ok(attnResult_t r, const char* what, const Slot& s);
  // fn on every slot inside one group (no group for a single slot).
  bool onAll(const char* what, const std::function<attnResult_t(Slot&)>& fn);
  bool waitAll(const char* what);
  bool barrierAll();
  // One iteration: agg_iters calls on every slot, with -z's waits.
  bool issue(bool inPlace);
  // Element-wise op over every rank of per-slot vectors (all the same length).
  bool allReduce(std::vector<std::vector<double>>& v, attnRedOp_t op);
  bool setup(const std::vector<attnComm_t>& comms, int nranks);
  bool measure(bool inPlace, Measure* m);
  bool check(bool inPlace, int64_t* wrong);
  bool timeLoop(bool inPlace, Measure* m);
  void* sendPtr(Slot& s, bool inPlace) const;
  void* recvPtr(Slot& s, bool inPlace) const;
  bool finishReport(int64_t wrong);

  const Options& opts_;
  const CollSpec& spec_;
  int thread_;
  int nranks_ = 1;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Reporter> rep_;  // on the thread that holds rank 0
  bool processes_ = false;         // ranks are processes: per-process -I rows
  size_t sendBytes_ = 0, recvBytes_ = 0;
};

}  // namespace attnperf
