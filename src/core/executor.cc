#include "src/core/executor.h"

namespace attn {

Executor::Executor(std::function<void(attnResult_t)> onResult)
    : onResult_(std::move(onResult)), thread_([this] { loop(); }) {}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Executor::submit(Task task) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
}

bool Executor::busy() {
  std::lock_guard<std::mutex> g(mu_);
  return running_ || !queue_.empty();
}

void Executor::drain() {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return !running_ && queue_.empty(); });
}

void Executor::loop() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Task t = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    g.unlock();
    attnResult_t r = t();
    onResult_(r);
    g.lock();
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace attn
