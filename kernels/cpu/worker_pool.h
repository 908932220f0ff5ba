// A parallel-for for kernels. Work is a count of independent tasks handed
// out one at a time (an atomic counter), so uneven tasks (causal tiles)
// balance themselves. The calling thread always takes part, so one thread
// means no thread at all.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attn::cpu {

// fn(worker, task): worker in [0, threads) names the thread (for per-thread
// scratch), task in [0, ntasks).
using TaskFn = std::function<void(int worker, int64_t task)>;

// Persistent workers for callers that run many kernel calls (ring attention
// steps): saves starting threads each call. One run at a time; concurrent
// run() calls queue.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);  // threads >= 1, the caller counted
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return int(workers_.size()) + 1; }
  // Runs all tasks on min(threads(), max_threads, ntasks) threads.
  void run(int64_t ntasks, const TaskFn& fn, int max_threads);

 private:
  void workerLoop(int worker);

  std::mutex run_mu_;  // serialises run()
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const TaskFn* fn_ = nullptr;
  int64_t ntasks_ = 0;
  int active_ = 0;        // workers taking part in this run
  int running_ = 0;       // of those, not yet finished
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::atomic<int64_t>* next_ = nullptr;
};

// Runs fn over [0, ntasks) on `threads` threads: on `pool` if given, else on
// threads started for this call.
void parallelFor(int threads, WorkerPool* pool, int64_t ntasks, const TaskFn& fn);

}  // namespace attn::cpu
