#include "kernels/cpu/worker_pool.h"

#include <algorithm>
#include <atomic>

namespace attn::cpu {
namespace {

void drain(std::atomic<int64_t>& next, int64_t ntasks, int worker, const TaskFn& fn) {
  for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < ntasks;) fn(worker, t);
}

}  // namespace

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::workerLoop(int worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (worker >= active_) continue;  // not needed this run
    const TaskFn* fn = fn_;
    std::atomic<int64_t>* next = next_;
    const int64_t ntasks = ntasks_;
    lk.unlock();
    drain(*next, ntasks, worker, *fn);
    lk.lock();
    if (--running_ == 0) done_.notify_all();
  }
}

void WorkerPool::run(int64_t ntasks, const TaskFn& fn, int max_threads) {
  if (ntasks <= 0) return;
  const int n = int(std::min<int64_t>({int64_t(threads()), int64_t(std::max(1, max_threads)), ntasks}));
  std::atomic<int64_t> next{0};
  if (n == 1) {
    drain(next, ntasks, 0, fn);
    return;
  }
  std::lock_guard<std::mutex> serial(run_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    next_ = &next;
    ntasks_ = ntasks;
    active_ = n;
    running_ = n - 1;
    ++generation_;
  }
  wake_.notify_all();
  drain(next, ntasks, 0, fn);
  std::unique_lock<std::mutex> lk(mu_);
  done_.wait(lk, [&] { return running_ == 0; });
}

void parallelFor(int threads, WorkerPool* pool, int64_t ntasks, const TaskFn& fn) {
  if (ntasks <= 0) return;
  if (pool != nullptr) {
    pool->run(ntasks, fn, threads);
    return;
  }
  const int n = int(std::min<int64_t>(std::max(1, threads), ntasks));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> extra;
  extra.reserve(n - 1);
  for (int w = 1; w < n; ++w) extra.emplace_back([&, w] { drain(next, ntasks, w, fn); });
  drain(next, ntasks, 0, fn);
  for (auto& t : extra) t.join();
}

}  // namespace attn::cpu
