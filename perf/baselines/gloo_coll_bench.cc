// Gloo baseline over Gloo's TCP transport, measured and printed exactly
// like our *_perf binaries. Ranks are forked processes meeting through a
// FileStore (--procs N, default 2) or threads meeting through a HashStore (-t N).
//   gloo_coll_bench --procs 4 --coll alltoall -b 1M -e 64M
// GLOO_BENCH_HOST picks the address to bind (default 127.0.0.1).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "perf/baselines/gloo_backend.h"

namespace {
using namespace attnperf;

std::string hostAddr() {
  const char* h = getenv("GLOO_BENCH_HOST");
  return h && *h ? h : "127.0.0.1";
}

int runRank(int rank, int n, gloo::rendezvous::Store& store, const Options& o,
            const char* mode) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostAddr();
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
    ctx->setTimeout(std::chrono::seconds(300));
    ctx->connectFullMesh(store, dev);
    GlooBackend be(ctx);
    const std::string transport = "gloo tcp " + attr.hostname;
    return runBaseline(be, o, "gloo_coll_bench", mode, transport) ? 1 : 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "gloo_coll_bench rank %d: %s\n", rank, e.what());
    return 2;
  }
}

int runThreads(int n, const Options& o) {
  gloo::rendezvous::HashStore store;
  std::vector<int> rc(size_t(n), 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] { rc[size_t(r)] = runRank(r, n, store, o, "threads"); });
  for (auto& t : ts) t.join();
  return *std::max_element(rc.begin(), rc.end());
}

int runProcesses(int n, const Options& o) {
  char dir[] = "/tmp/attn_gloo_store.XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 2;
  fflush(stdout);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      break;
    }
    if (p == 0) {
      gloo::rendezvous::FileStore store(dir);
      int rc = runRank(r, n, store, o, "processes");
      fflush(stdout);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int worst = int(kids.size()) == n ? 0 : 2;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    worst = std::max(worst, WIFEXITED(st) ? WEXITSTATUS(st) : 2);
  }
  // The FileStore leaves one file per key behind.
  const std::string rm = std::string("rm -rf '") + dir + "'";
  if (system(rm.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return worst;
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.coll = "all_gather";
  int code = 0;
  if (!parseOptions(argc, argv, &o, &code)) return code;
  if (!baselineOptionsOk(o)) return 2;
  return o.nthreads > 1 ? runThreads(o.nthreads, o) : runProcesses(o.procs ? o.procs : 2, o);
}
