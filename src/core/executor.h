// A FIFO of operations run by one background thread, for non-blocking
// communicators: calls return attnInProgress at once, and the communicator's
// async state says when the queue drained or what broke it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "attncomm.h"

namespace attn {

class Executor {
 public:
  using Task = std::function<attnResult_t()>;
  // `onResult` receives the result of each task on the executor thread.
  explicit Executor(std::function<void(attnResult_t)> onResult);
  ~Executor();  // runs what is queued, then stops

  void submit(Task task);
  // Tasks queued or running.
  bool busy();
  // Blocks until the queue is empty and nothing runs.
  void drain();

 private:
  void loop();

  std::function<void(attnResult_t)> onResult_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace attn
