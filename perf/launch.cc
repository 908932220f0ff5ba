#include "perf/launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "perf/mpi_launch.h"
#include "perf/timing.h"

namespace attnperf {

namespace {

void initFailed(const char* what, attnResult_t r) {
  fprintf(stderr, "%s failed: %s: %s\n", what, attnGetErrorString(r),
          attnGetLastError(nullptr));
}

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= size_t(w);
  }
  return true;
}

bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= size_t(r);
  }
  return true;
}

// Child `rank` of launchProcesses: rank 0 makes the id and hands it to the
// others through their pipes; nobody touched the library before fork.
int processRank(int rank, int nranks, std::vector<int>& pipes, const RankBody& body, int device) {
  attnUniqueId id;
  if (rank == 0) {
    attnResult_t r = attnGetUniqueId(&id);
    if (r != attnSuccess) return initFailed("attnGetUniqueId", r), 2;
    for (int q = 1; q < nranks; q++)
      if (!writeAll(pipes[2 * q + 1], &id, sizeof id)) return perror("pipe write"), 2;
  } else if (!readAll(pipes[2 * rank], &id, sizeof id)) {
    fprintf(stderr, "rank %d: no unique id from rank 0\n", rank);
    return 2;
  }
  for (int fd : pipes) close(fd);
  attnConfig_t config = ATTN_CONFIG_INITIALIZER;
  if (device != ATTN_DEVICE_HOST) config.device = device;
  attnComm_t comm = nullptr;
  attnResult_t r = attnCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != attnSuccess) return initFailed("attnCommInitRankConfig", r), 2;
  return body(comm);
}

}  // namespace

bool launchedExternally() {
  for (const char* v : {"ATTN_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (getenv(v)) return true;
  // A batch or salloc shell has SLURM_PROCID too; only srun's tasks have a step.
  return getenv("SLURM_PROCID") && (getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID"));
}

RankBody abortingOnFailure(RankBody body) {
  return [body = std::move(body)](attnComm_t comm) {
    const int rc = body(comm);
    if (rc != 0) attnCommAbort(comm);
    return rc;
  };
}

int launchThreads(int nranks, const RankBody& body, int device) {
  std::vector<attnComm_t> comms(size_t(nranks), nullptr);
  const std::vector<int> devices(size_t(nranks), device);
  attnResult_t r =
      attnCommInitAll(comms.data(), nranks, device == ATTN_DEVICE_HOST ? nullptr : devices.data());
  if (r != attnSuccess) return initFailed("attnCommInitAll", r), 2;
  std::vector<int> rc(size_t(nranks), 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < nranks; i++)
    threads.emplace_back([&, i] { rc[size_t(i)] = body(comms[size_t(i)]); });
  for (auto& t : threads) t.join();
  return *std::max_element(rc.begin(), rc.end());
}

int launchThreadSlots(int nthreads, int perThread, bool parallelInit, const SlotsBody& body,
                      int device) {
  const int nranks = nthreads * perThread;
  std::vector<attnComm_t> comms(size_t(nranks), nullptr);
  attnUniqueId id;
  if (!parallelInit) {
    const std::vector<int> devices(size_t(nranks), device);
    attnResult_t r =
        attnCommInitAll(comms.data(), nranks, device == ATTN_DEVICE_HOST ? nullptr : devices.data());
    if (r != attnSuccess) return initFailed("attnCommInitAll", r), 2;
  } else if (attnResult_t r = attnGetUniqueId(&id); r != attnSuccess) {
    return initFailed("attnGetUniqueId", r), 2;
  }
  std::vector<int> rc(size_t(nranks), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; t++)
    threads.emplace_back([&, t] {
      std::vector<attnComm_t> mine(comms.begin() + t * perThread, comms.begin() + (t + 1) * perThread);
      if (parallelInit) {
        attnConfig_t config = ATTN_CONFIG_INITIALIZER;
        if (device != ATTN_DEVICE_HOST) config.device = device;
        // attnCommInitRank blocks until every rank joined, so a thread's
        // several ranks init side by side on short-lived helpers.
        std::vector<attnResult_t> res(size_t(perThread), attnSuccess);
        std::vector<std::thread> helpers;
        for (int g = 0; g < perThread; g++)
          helpers.emplace_back([&, g] {
            res[size_t(g)] = attnCommInitRankConfig(&mine[size_t(g)], nranks, id, t * perThread + g, &config);
          });
        for (auto& h : helpers) h.join();
        attnResult_t r = attnSuccess;
        for (attnResult_t x : res)
          if (x != attnSuccess) r = x;
        if (r != attnSuccess) {
          initFailed("attnCommInitRankConfig", r);
          for (attnComm_t c : mine) attnCommAbort(c);
          rc[size_t(t)] = 2;
          return;
        }
      }
      rc[size_t(t)] = body(t, mine);
    });
  for (auto& t : threads) t.join();
  return *std::max_element(rc.begin(), rc.end());
}

int launchProcesses(int nranks, const RankBody& body, int device) {
  std::vector<int> pipes(2 * size_t(nranks), -1);
  for (int q = 1; q < nranks; q++)
    if (pipe(&pipes[2 * size_t(q)]) != 0) return perror("pipe"), 2;
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> kids;
  for (int q = 0; q < nranks; q++) {
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      for (pid_t k : kids) kill(k, SIGKILL);
      break;
    }
    if (p == 0) {
      int rc = processRank(q, nranks, pipes, body, device);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    kids.push_back(p);
  }
  for (int fd : pipes)
    if (fd >= 0) close(fd);

  // Reap children; once one fails, give the rest a grace period to notice
  // and exit on their own, then kill them rather than hang.
  int worst = int(kids.size()) == nranks ? 0 : 2;
  size_t left = kids.size();
  double killAt = 0;
  while (left) {
    int st = 0;
    pid_t p = waitpid(-1, &st, killAt ? WNOHANG : 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    if (p == 0) {
      if (nowUs() > killAt) {
        for (pid_t k : kids)
          if (k > 0) kill(k, SIGKILL);  // reaped ones are -1: never kill(-1)
        killAt = 1e300;
      }
      usleep(20000);
      continue;
    }
    auto it = std::find(kids.begin(), kids.end(), p);
    if (it == kids.end()) continue;
    *it = -1;  // never signal a reaped (maybe reused) pid
    left--;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 2;
    if (WIFSIGNALED(st))
      fprintf(stderr, "rank %d killed by signal %d\n", int(it - kids.begin()), WTERMSIG(st));
    worst = std::max(worst, rc);
    if (rc == 2 && !killAt) killAt = nowUs() + 30e6;
  }
  return worst;
}

int launchExternal(const RankBody& body, int device) {
  if (int rc = 0; launchWithMpi(body, device, &rc)) return rc;
  attnConfig_t config = ATTN_CONFIG_INITIALIZER;
  if (device != ATTN_DEVICE_HOST) config.device = device;
  attnComm_t comm = nullptr;
  attnResult_t r = attnCommInitFromEnv(&comm, &config);
  if (r != attnSuccess) return initFailed("attnCommInitFromEnv", r), 2;
  return body(comm);
}

}  // namespace attnperf
