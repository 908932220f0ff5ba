#include "perf/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace attnperf {

namespace {

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<attnComm_t> comms;
  std::atomic<bool> fired{false};
  bool stopped = false;
  pid_t runningIn = -1;  // the process whose watchdog thread runs (fork copies no thread)
  int armedSeconds = 0;
  std::string armedProgram = "perf";
};

// Never destroyed: the detached thread may outlive main's statics.
State& state() {
  static State* s = new State;
  return *s;
}

void watch(int seconds, std::string prog) {
  State& s = state();
  std::unique_lock<std::mutex> lk(s.mu);
  if (s.cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return s.stopped; })) return;
  s.fired = true;
  fprintf(stderr, "%s: timeout (-T %d): no result after %d s; aborting %zu communicator(s) of pid %d\n",
          prog.c_str(), seconds, seconds, s.comms.size(), int(getpid()));
  fflush(stderr);
  std::vector<attnComm_t> mine;
  mine.swap(s.comms);
  lk.unlock();
  // An abort may wait for a call in flight (a long kernel): on its own
  // thread, so the grace period below still ends the process.
  std::thread([mine] {
    for (attnComm_t c : mine) attnCommAbort(c);
  }).detach();
  lk.lock();
  if (!s.cv.wait_for(lk, std::chrono::seconds(30), [&] { return s.stopped; })) {
    fprintf(stderr, "%s: timeout (-T %d): ranks did not stop; exiting\n", prog.c_str(), seconds);
    fflush(stdout);
    fflush(stderr);
    _exit(kWatchdogExit);
  }
}

}  // namespace

void watchdogStart(int seconds, const char* program) {
  if (seconds <= 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.runningIn == getpid()) return;
  s.runningIn = getpid();
  s.stopped = false;
  s.fired = false;
  s.comms.clear();  // a forked rank's copy of its parent's list
  std::thread(watch, seconds, std::string(program)).detach();
}

void watchdogAdd(attnComm_t comm) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.fired) s.comms.push_back(comm);
}

bool watchdogRemove(attnComm_t comm) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = std::find(s.comms.begin(), s.comms.end(), comm);
  if (it == s.comms.end()) return !s.fired;
  s.comms.erase(it);
  return true;
}

bool watchdogFired() { return state().fired; }

void watchdogStop() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.stopped = true;
  s.cv.notify_all();
}

void watchdogArm(const char* program, int seconds) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.armedSeconds = seconds;
  s.armedProgram = program;
}

WatchdogGuard::WatchdogGuard(attnComm_t comm) : comm_(comm) {
  State& s = state();
  int seconds;
  std::string prog;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    seconds = s.armedSeconds;
    prog = s.armedProgram;
  }
  watchdogStart(seconds, prog.c_str());
  if (seconds > 0) watchdogAdd(comm);
}

WatchdogGuard::~WatchdogGuard() { watchdogRemove(comm_); }

}  // namespace attnperf
