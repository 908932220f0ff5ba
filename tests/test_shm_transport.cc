// Tests of the shared-memory transport (transports/shm): ranks as threads of
// this process (FakeBootstrap) and as forked processes (a socketpair
// bootstrap below). Each rank runs a function that returns "" or the reason
// it failed; a small driver progresses the connections with a deadline.
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/transport.h"
#include "tests/support/fake_bootstrap.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_layout.h"
#include "transports/shm/shm_transport.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDeadlineMs = 60000;

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// In a rank function (with its World `w` in scope): return the failure as
// text instead of asserting (a forked child has no gtest to report to).
// Closes the connections first, so no peer keeps reading buffers that are
// about to be freed.
#define RANK_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      w.closeAll();                                                                    \
      std::string e_ = fmt("%s:%d: (%s) ", __FILE__, __LINE__, #cond) + fmt(__VA_ARGS__); \
      fprintf(stderr, "rank %d failed: %s\n", w.rank, e_.c_str());                     \
      return e_;                                                                       \
    }                                                                                  \
  } while (0)

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// ---------------------------------------------------------------------------
// A Bootstrap over a full mesh of socketpairs, for forked ranks.
class SocketBootstrap : public Bootstrap {
 public:
  SocketBootstrap(int rank, std::vector<int> fds) : rank_(rank), fds_(std::move(fds)) {}
  ~SocketBootstrap() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return static_cast<int>(fds_.size()); }
  const uint8_t* secret() const override {
    static const uint8_t s[16] = {1};
    return s;
  }
  std::string localIp() const override { return "127.0.0.1"; }

  attnResult_t allGather(void* data, size_t bytes) override {
    const uint32_t tag = 0x7fff0000u + seq_++;
    auto* p = static_cast<uint8_t*>(data);
    for (int r = 0; r < nranks(); ++r)
      if (r != rank_) ATTN_CHECK(send(r, tag, p + rank_ * bytes, bytes));
    for (int r = 0; r < nranks(); ++r)
      if (r != rank_) ATTN_CHECK(recv(r, tag, p + r * bytes, bytes));
    return attnSuccess;
  }
  attnResult_t send(int peer, uint32_t tag, const void* data, size_t bytes) override {
    uint32_t hdr[2] = {tag, static_cast<uint32_t>(bytes)};
    if (!io(fds_[peer], hdr, sizeof(hdr), true) || !io(fds_[peer], const_cast<void*>(data), bytes, true))
      return attnRemoteError;
    return attnSuccess;
  }
  attnResult_t recv(int peer, uint32_t tag, void* data, size_t bytes) override {
    auto& stash = stash_[peer];
    for (;;) {
      for (auto it = stash.begin(); it != stash.end(); ++it)
        if (it->first == tag) {
          if (it->second.size() != bytes) return attnInvalidUsage;
          std::memcpy(data, it->second.data(), bytes);
          stash.erase(it);
          return attnSuccess;
        }
      uint32_t hdr[2];
      if (!io(fds_[peer], hdr, sizeof(hdr), false)) return attnRemoteError;
      std::vector<uint8_t> body(hdr[1]);
      if (!io(fds_[peer], body.data(), body.size(), false)) return attnRemoteError;
      stash.emplace_back(hdr[0], std::move(body));
    }
  }
  attnResult_t barrier() override {
    std::vector<char> all(nranks());
    return allGather(all.data(), 1);
  }
  void close() override {
    for (int fd : fds_)
      if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }

 private:
  static bool io(int fd, void* buf, size_t n, bool out) {
    auto* p = static_cast<char*>(buf);
    while (n) {
      ssize_t k = out ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  int rank_;
  std::vector<int> fds_;
  uint32_t seq_ = 0;
  std::map<int, std::deque<std::pair<uint32_t, std::vector<uint8_t>>>> stash_;
};

// ---------------------------------------------------------------------------
// One rank's view: its bootstrap, transport and connections.
struct World {
  int rank = 0;
  int n = 0;
  uint64_t commHash = 0;
  Bootstrap* boot = nullptr;
  int readyFd = -1;  // processes: tells the parent we reached a checkpoint
  std::vector<PeerInfo> peers;
  std::unique_ptr<Transport> transport;
  std::vector<std::unique_ptr<Connection>> conns;  // [n]; null: self / not connected

  Connection* conn(int p) { return conns[p].get(); }
  void closeAll() {
    for (auto& c : conns)
      if (c) c->close();
  }

  // Collective over all ranks (each may pass another list, symmetric).
  attnResult_t connect(const std::vector<int>& list) {
    conns.clear();
    transport.reset();
    std::vector<int64_t> pids(n);
    pids[rank] = getpid();
    ATTN_CHECK(boot->allGather(pids.data(), sizeof(int64_t)));
    peers.assign(n, PeerInfo{});
    for (int r = 0; r < n; ++r) {
      peers[r].rank = r;
      peers[r].pid = pids[r];
      snprintf(peers[r].hostId, sizeof(peers[r].hostId), "testhost");
      peers[r].hostHash = 0x1234;
      peers[r].commHash = commHash;
    }
    transport = createShmTransport();
    TransportContext ctx;
    ctx.rank = rank;
    ctx.nranks = n;
    ctx.bootstrap = boot;
    ctx.peers = peers.data();
    std::vector<std::unique_ptr<Connection>> made;
    ATTN_CHECK(transport->connect(ctx, list, &made));
    if (made.size() != list.size()) return attnInternalError;
    conns.resize(n);
    for (size_t i = 0; i < list.size(); ++i) conns[list[i]] = std::move(made[i]);
    return attnSuccess;
  }
  attnResult_t connectAll() {
    std::vector<int> list;
    for (int r = 0; r < n; ++r)
      if (r != rank) list.push_back(r);
    return connect(list);
  }
  void notifyParent() {
    char c = 1;
    if (readyFd >= 0 && write(readyFd, &c, 1) != 1) perror("notifyParent");
  }
};

// Progresses every busy connection until none of `reqs` is pending, or the
// deadline (then attnTimeout). Returns the first failed request's code.
// Waits like the library's engine: a few hundred idle passes (yielding now
// and then), then sleeps in waitForActivity.
attnResult_t drive(World& w, const std::vector<Request*>& reqs, int deadlineMs = kDeadlineMs) {
  const auto end = Clock::now() + std::chrono::milliseconds(deadlineMs);
  int idlePasses = 0;
  for (;;) {
    bool pending = false;
    for (Request* r : reqs) pending |= r->pending();
    if (!pending) break;
    bool progressed = false;
    for (auto& c : w.conns) {
      if (!c || c->idle()) continue;
      bool p = false;
      c->progress(&p);  // a failure fails that connection's requests
      progressed |= p;
    }
    if (progressed) {
      idlePasses = 0;
    } else if (++idlePasses < 200) {
      if (idlePasses % 32 == 0) sched_yield();
    } else {
      if (Clock::now() > end) return attnTimeout;
      // As the engine does: ask to be rung, look once more, then sleep.
      w.transport->armWait();
      bool moved = false;
      for (auto& c : w.conns) {
        bool p = false;
        if (c && !c->idle()) c->progress(&p);
        moved |= p;
      }
      if (!moved) w.transport->waitForActivity(1000);
      w.transport->disarmWait();
    }
  }
  for (Request* r : reqs)
    if (r->state.load() == Request::kFailed) return r->error;
  return attnSuccess;
}

// Deterministic content: 8 bytes at a time from a hash of (src, dst, msg).
void fillPattern(uint8_t* p, size_t n, int src, int dst, int msg) {
  uint64_t seed = (uint64_t(src) << 48) ^ (uint64_t(dst) << 32) ^ uint64_t(msg) * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = (seed + i) * 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    std::memcpy(p + i, &x, std::min<size_t>(8, n - i));
  }
}
// Index of the first wrong byte, or -1.
long checkPattern(const uint8_t* p, size_t n, int src, int dst, int msg) {
  if (n == 0) return -1;
  std::vector<uint8_t> want(n);
  fillPattern(want.data(), n, src, dst, msg);
  if (std::memcmp(p, want.data(), n) == 0) return -1;
  for (size_t i = 0; i < n; ++i)
    if (p[i] != want[i]) return static_cast<long>(i);
  return -1;
}

std::vector<std::string> shmLeftovers(uint64_t commHash) {
  std::vector<std::string> found;
  char prefix[64];
  snprintf(prefix, sizeof(prefix), "attn-%016llx", (unsigned long long)commHash);
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) found.push_back(e->d_name);
    closedir(d);
  }
  return found;
}

// ---------------------------------------------------------------------------
// Running ranks.
enum class Mode { kThreads, kProcesses };
using RankFn = std::function<std::string(World&)>;

std::vector<std::string> runThreads(int n, uint64_t commHash, const RankFn& fn) {
  testing::FakeBootstrapHub hub(n);
  std::vector<std::string> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      testing::FakeBootstrap boot(&hub, r);
      World w;
      w.rank = r;
      w.n = n;
      w.commHash = commHash;
      w.boot = &boot;
      out[r] = fn(w);
      if (!out[r].empty()) hub.close();  // unblock the others' bootstrap waits
    });
  for (auto& t : threads) t.join();
  return out;
}

struct Spawned {
  std::vector<pid_t> pids;
  std::vector<int> resultFds;
  std::vector<int> readyFds;
};

Spawned spawnProcesses(int n, uint64_t commHash, const RankFn& fn) {
  std::vector<std::vector<int>> mesh(n, std::vector<int>(n, -1));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
      mesh[i][j] = sv[0];
      mesh[j][i] = sv[1];
    }
  Spawned s;
  std::vector<std::array<int, 2>> res(n), rdy(n);
  for (int r = 0; r < n; ++r)
    if (pipe(res[r].data()) != 0 || pipe(rdy[r].data()) != 0) abort();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j)
          if (i != r && mesh[i][j] >= 0) ::close(mesh[i][j]);
        ::close(res[i][0]);
        ::close(rdy[i][0]);
        if (i != r) {
          ::close(res[i][1]);
          ::close(rdy[i][1]);
        }
      }
      std::string err;
      {
        SocketBootstrap boot(r, mesh[r]);
        World w;
        w.rank = r;
        w.n = n;
        w.commHash = commHash;
        w.boot = &boot;
        w.readyFd = rdy[r][1];
        err = fn(w);
      }
      if (!err.empty() && write(res[r][1], err.data(), err.size()) < 0) perror("write");
      fflush(stdout);
      _exit(err.empty() ? 0 : 1);
    }
    s.pids.push_back(pid);
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j)
      if (mesh[i][j] >= 0) ::close(mesh[i][j]);
    ::close(res[i][1]);
    ::close(rdy[i][1]);
    s.resultFds.push_back(res[i][0]);
    s.readyFds.push_back(rdy[i][0]);
  }
  return s;
}

bool waitReady(const Spawned& s, int rank, int ms) {
  pollfd p{s.readyFds[rank], POLLIN, 0};
  char c;
  return poll(&p, 1, ms) == 1 && read(s.readyFds[rank], &c, 1) == 1;
}

// Waits for rank r's process (killing it at the deadline) and returns its text.
std::string collectOne(Spawned& s, int r, Clock::time_point deadline) {
  int status = 0;
  std::string out;
  for (;;) {
    pid_t k = waitpid(s.pids[r], &status, WNOHANG);
    if (k == s.pids[r]) break;
    if (Clock::now() > deadline) {
      kill(s.pids[r], SIGKILL);
      waitpid(s.pids[r], &status, 0);
      out = "timed out; ";
      break;
    }
    usleep(2000);
  }
  char buf[4096];
  ssize_t k;
  while ((k = read(s.resultFds[r], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(k));
  ::close(s.resultFds[r]);
  ::close(s.readyFds[r]);
  if (WIFSIGNALED(status)) out += fmt("killed by signal %d", WTERMSIG(status));
  else if (WEXITSTATUS(status) != 0 && out.empty()) out = fmt("exit status %d", WEXITSTATUS(status));
  return out;
}

std::vector<std::string> runRanks(Mode mode, int n, uint64_t commHash, const RankFn& fn) {
  if (mode == Mode::kThreads) return runThreads(n, commHash, fn);
  Spawned s = spawnProcesses(n, commHash, fn);
  auto deadline = Clock::now() + std::chrono::milliseconds(2 * kDeadlineMs);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(collectOne(s, r, deadline));
  return out;
}

// Sets environment variables for one test; restores them after.
using EnvVars = std::vector<std::pair<const char*, const char*>>;
class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvVars& vars) {
    for (auto& [k, v] : vars) {
      const char* old = getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k, v, 1);
    }
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

uint64_t freshCommHash() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

const char* modeName(Mode m) { return m == Mode::kThreads ? "Threads" : "Processes"; }

class ShmTransportTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { hash_ = freshCommHash(); }
  void TearDown() override {
    auto left = shmLeftovers(hash_);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
  }
  std::vector<std::string> run(int n, const RankFn& fn) { return runRanks(GetParam(), n, hash_, fn); }
  static void expectOk(const std::vector<std::string>& res) {
    for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r], "") << "rank " << r;
  }
  uint64_t hash_ = 0;
};

// ---------------------------------------------------------------------------
// Paths: every size through every way a message can travel.
enum class Path { kDefault, kRingOnly, kTinyRing, kDirectAll };
const char* pathName(Path p) {
  switch (p) {
    case Path::kDefault: return "Default";
    case Path::kRingOnly: return "RingOnly";
    case Path::kTinyRing: return "TinyRing";
    case Path::kDirectAll: return "DirectAll";
  }
  return "?";
}
// Thresholds of 1 TiB keep every message in the ring.
const EnvVars kRingOnlyEnv = {{"ATTN_SHM_CMA", "0"}, {"ATTN_SHM_MEMCPY_MIN", "1099511627776"}};

EnvVars envFor(Path p) {
  switch (p) {
    case Path::kDefault: return {};
    case Path::kRingOnly: return kRingOnlyEnv;
    case Path::kTinyRing: {  // 3 slots of 8 KiB: many chunks, constant wrap-around
      EnvVars v = kRingOnlyEnv;
      v.insert(v.end(), {{"ATTN_SHM_SLOTS", "3"}, {"ATTN_SHM_SLOT_BYTES", "8192"}});
      return v;
    }
    case Path::kDirectAll: return {{"ATTN_SHM_CMA_MIN", "1"}, {"ATTN_SHM_MEMCPY_MIN", "1"}};
  }
  return {};
}

// The direct mode each path should end up with. Threads can always read
// each other's memory; ring-only paths keep them in the ring by threshold.
uint32_t expectedMode(Mode m, Path p) {
  if (m == Mode::kThreads) return shm::kDirectMemcpy;
  return p == Path::kRingOnly || p == Path::kTinyRing ? shm::kDirectNone : shm::kDirectCma;
}

class ShmPathTest : public ::testing::TestWithParam<std::tuple<Mode, Path>> {
 protected:
  void SetUp() override { hash_ = freshCommHash(); }
  void TearDown() override {
    auto left = shmLeftovers(hash_);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
  }
  uint64_t hash_ = 0;
};

std::string checkModes(World& w, uint32_t want) {
  for (int p = 0; p < w.n; ++p) {
    auto* c = dynamic_cast<shm::ShmConnection*>(w.conn(p));
    if (!c) continue;
    RANK_CHECK(c->sendMode() == want && c->recvMode() == want,
               "rank %d peer %d: modes send %u recv %u, want %u", w.rank, p, c->sendMode(),
               c->recvMode(), want);
  }
  return "";
}

// 4 ranks, all pairs at once, every size; content checked.
TEST_P(ShmPathTest, AllPairsAllSizes) {
  auto [mode, path] = GetParam();
  ScopedEnv env(envFor(path));
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 300 << 10, (1 << 20) + 3, 32 << 20};
  const uint32_t want = expectedMode(mode, path);
  auto res = runRanks(mode, 4, hash_, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    std::string e = checkModes(w, want);
    if (!e.empty()) return e;
    for (size_t m = 0; m < sizes.size(); ++m) {
      const size_t size = sizes[m];
      std::vector<std::vector<uint8_t>> sbuf(w.n), rbuf(w.n);
      std::deque<Request> reqs;
      std::vector<Request*> all;
      for (int p = 0; p < w.n; ++p) {
        if (p == w.rank) continue;
        rbuf[p].assign(size + 5, 0xEE);  // capacity above the size: bytes must say size
        all.push_back(&reqs.emplace_back());
        w.conn(p)->postRecv(rbuf[p].data(), rbuf[p].size(), all.back());
      }
      for (int p = 0; p < w.n; ++p) {
        if (p == w.rank) continue;
        sbuf[p].resize(size);
        fillPattern(sbuf[p].data(), size, w.rank, p, static_cast<int>(m));
        all.push_back(&reqs.emplace_back());
        w.conn(p)->postSend(sbuf[p].data(), size, all.back());
      }
      attnResult_t r = drive(w, all);
      RANK_CHECK(r == attnSuccess, "rank %d size %zu: %s / %s", w.rank, size, attnGetErrorString(r),
                 all[0]->message.c_str());
      int i = 0;
      for (int p = 0; p < w.n; ++p) {
        if (p == w.rank) continue;
        RANK_CHECK(all[i]->bytes == size, "rank %d from %d: %zu bytes, want %zu", w.rank, p,
                   all[i]->bytes, size);
        long bad = checkPattern(rbuf[p].data(), size, p, w.rank, static_cast<int>(m));
        RANK_CHECK(bad < 0, "rank %d from %d size %zu: byte %ld wrong", w.rank, p, size, bad);
        RANK_CHECK(rbuf[p][size] == 0xEE, "rank %d: wrote past the message", w.rank);
        ++i;
      }
    }
    return "";
  });
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r], "") << "rank " << r;
}

// Hundreds of messages of mixed sizes (ring and direct) both ways, all posted
// at once: they must match in order.
TEST_P(ShmPathTest, ManyMessagesFifo) {
  auto [mode, path] = GetParam();
  ScopedEnv env(envFor(path));
  const std::vector<size_t> cycle = {0, 1, 100, 5000, 70000, 3, 200000, 4096, 65536, 65535};
  const int kMsgs = 400;
  auto res = runRanks(mode, 2, hash_, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    const int peer = 1 - w.rank;
    std::vector<std::vector<uint8_t>> sbuf(kMsgs), rbuf(kMsgs);
    std::deque<Request> rreq, sreq;
    std::vector<Request*> all;
    for (int i = 0; i < kMsgs; ++i) {
      rbuf[i].assign(cycle[i % cycle.size()], 0);
      all.push_back(&rreq.emplace_back());
      w.conn(peer)->postRecv(rbuf[i].data(), rbuf[i].size(), all.back());
    }
    for (int i = 0; i < kMsgs; ++i) {
      sbuf[i].resize(cycle[i % cycle.size()]);
      fillPattern(sbuf[i].data(), sbuf[i].size(), w.rank, peer, i);
      all.push_back(&sreq.emplace_back());
      w.conn(peer)->postSend(sbuf[i].data(), sbuf[i].size(), all.back());
    }
    attnResult_t r = drive(w, all);
    RANK_CHECK(r == attnSuccess, "%s", attnGetErrorString(r));
    for (int i = 0; i < kMsgs; ++i) {
      RANK_CHECK(rreq[i].bytes == rbuf[i].size(), "message %d: %zu bytes", i, rreq[i].bytes);
      RANK_CHECK(checkPattern(rbuf[i].data(), rbuf[i].size(), peer, w.rank, i) < 0,
                 "message %d out of order or corrupt", i);
    }
    return "";
  });
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    Shm, ShmPathTest,
    ::testing::Combine(::testing::Values(Mode::kThreads, Mode::kProcesses),
                       ::testing::Values(Path::kDefault, Path::kRingOnly, Path::kTinyRing,
                                         Path::kDirectAll)),
    [](const auto& info) {
      return std::string(modeName(std::get<0>(info.param))) + pathName(std::get<1>(info.param));
    });

// ---------------------------------------------------------------------------
// Truncation: a message longer than the receive fails it (attnInvalidUsage,
// "truncated") and breaks the connection on both sides.
TEST_P(ShmTransportTest, TruncationFailsBothSides) {
  for (size_t size : {size_t(1000), size_t(1) << 20}) {  // ring, then direct
    auto res = run(2, [&](World& w) -> std::string {
      RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
      std::vector<uint8_t> buf(size, 1);
      Request req;
      if (w.rank == 1) {
        w.conn(0)->postRecv(buf.data(), 100, &req);
        attnResult_t r = drive(w, {&req});
        RANK_CHECK(r == attnInvalidUsage, "recv got %s", attnGetErrorString(r));
        RANK_CHECK(req.message.find("truncated") != std::string::npos, "message: %s",
                   req.message.c_str());
        RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
        Request again;  // the connection stays broken
        RANK_CHECK(w.conn(0)->postRecv(buf.data(), size, &again) != attnSuccess &&
                       again.state.load() == Request::kFailed,
                   "post after truncation succeeded");
        return "";
      }
      w.conn(1)->postSend(buf.data(), size, &req);
      attnResult_t r = drive(w, {&req});
      if (size >= 65536) {  // direct: the receiver never took it
        RANK_CHECK(r == attnInvalidUsage, "direct send got %s", attnGetErrorString(r));
        RANK_CHECK(req.message.find("truncated") != std::string::npos, "message: %s",
                   req.message.c_str());
      } else {  // inline: the send completed when it was in the ring
        RANK_CHECK(r == attnSuccess, "inline send got %s", attnGetErrorString(r));
      }
      RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
      Request next;
      w.conn(1)->postSend(buf.data(), 10, &next);
      r = drive(w, {&next}, 5000);
      RANK_CHECK(r == attnInvalidUsage, "next send got %s", attnGetErrorString(r));
      RANK_CHECK(next.message.find("peer 1") != std::string::npos, "message: %s",
                 next.message.c_str());
      return "";
    });
    expectOk(res);
  }
}

// close() on one side: the other side's pending send and receive fail with
// attnRemoteError naming the peer, promptly.
TEST_P(ShmTransportTest, CloseFailsPeer) {
  auto res = run(2, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    std::vector<uint8_t> sbuf(4 << 20, 7), rbuf(1024);
    if (w.rank == 1) {
      RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
      w.conn(0)->close();
      Request after;
      RANK_CHECK(w.conn(0)->postSend(sbuf.data(), 1, &after) != attnSuccess,
                 "send after close was accepted");
      return "";
    }
    Request s, r;
    w.conn(1)->postRecv(rbuf.data(), rbuf.size(), &r);
    w.conn(1)->postSend(sbuf.data(), sbuf.size(), &s);
    bool p;
    w.conn(1)->progress(&p);
    RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
    auto t0 = Clock::now();
    drive(w, {&s, &r}, 10000);
    double ms = msSince(t0);
    RANK_CHECK(s.state.load() == Request::kFailed && s.error == attnRemoteError,
               "send: state %d error %s", s.state.load(), attnGetErrorString(s.error));
    RANK_CHECK(r.state.load() == Request::kFailed && r.error == attnRemoteError,
               "recv: state %d error %s", r.state.load(), attnGetErrorString(r.error));
    RANK_CHECK(r.message.find("peer 1") != std::string::npos, "message: %s", r.message.c_str());
    RANK_CHECK(ms < 2000, "took %.0f ms to notice", ms);
    return "";
  });
  expectOk(res);
}

// Data the peer sent before it went away is still delivered.
TEST_P(ShmTransportTest, DataBeforeCloseIsDelivered) {
  auto res = run(2, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    std::vector<uint8_t> buf(3000);
    if (w.rank == 1) {
      fillPattern(buf.data(), buf.size(), 1, 0, 0);
      Request s;
      w.conn(0)->postSend(buf.data(), buf.size(), &s);
      RANK_CHECK(drive(w, {&s}) == attnSuccess, "send");
      w.conns.clear();  // destroy: the peer sees the channel closed
      RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
      return "";
    }
    RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
    Request r, r2;
    w.conn(1)->postRecv(buf.data(), buf.size(), &r);
    w.conn(1)->postRecv(buf.data(), buf.size(), &r2);
    RANK_CHECK(drive(w, {&r}, 5000) == attnSuccess, "first receive failed: %s", r.message.c_str());
    RANK_CHECK(checkPattern(buf.data(), buf.size(), 1, 0, 0) < 0, "corrupt");
    RANK_CHECK(drive(w, {&r2}, 5000) == attnRemoteError, "second receive: %s", r2.message.c_str());
    return "";
  });
  expectOk(res);
}

// A rank with no shm peers still takes part in connect (collective).
TEST_P(ShmTransportTest, EmptyPeerList) {
  auto res = run(3, [&](World& w) -> std::string {
    std::vector<int> list;
    if (w.rank < 2) list.push_back(1 - w.rank);
    RANK_CHECK(w.connect(list) == attnSuccess, "connect failed");
    if (w.rank == 2) {
      for (auto& c : w.conns) RANK_CHECK(c == nullptr, "rank 2 got a connection");
      return "";
    }
    int v = w.rank + 40, got = 0;
    Request s, r;
    w.conn(1 - w.rank)->postRecv(&got, sizeof(got), &r);
    w.conn(1 - w.rank)->postSend(&v, sizeof(v), &s);
    RANK_CHECK(drive(w, {&s, &r}) == attnSuccess, "exchange");
    RANK_CHECK(got == 41 - w.rank, "got %d", got);
    return "";
  });
  expectOk(res);
}

// Names are unlinked as soon as connect returns: nothing can leak later.
TEST_P(ShmTransportTest, NoNamesLeftAfterConnect) {
  uint64_t hash = hash_;
  auto res = run(3, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
    auto left = shmLeftovers(hash);
    RANK_CHECK(left.empty(), "still in /dev/shm: %s", left.front().c_str());
    RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
    return "";
  });
  expectOk(res);
}

// A waiting rank sleeps (little CPU), wakes promptly on the peer's doorbell,
// and waitForActivity respects its timeout.
TEST_P(ShmTransportTest, WaitSleepsAndWakes) {
  auto res = run(2, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    int v = 5, got = 0;
    if (w.rank == 1) {
      RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Request s;
      w.conn(0)->postSend(&v, sizeof(v), &s);
      RANK_CHECK(drive(w, {&s}) == attnSuccess, "send");
      return "";
    }
    auto t0 = Clock::now();
    w.transport->waitForActivity(20000);  // nothing pending: bounded
    RANK_CHECK(msSince(t0) < 200, "waitForActivity(20 ms) took %.0f ms", msSince(t0));
    Request r;
    w.conn(1)->postRecv(&got, sizeof(got), &r);
    bool p;
    w.transport->armWait();   // the peer rings only a watched bell
    w.conn(1)->progress(&p);  // notes the bell before the sleep
    RANK_CHECK(w.boot->barrier() == attnSuccess, "barrier");
    rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    t0 = Clock::now();
    // One long sleep: only the peer's doorbell can end it early.
    while (r.pending() && msSince(t0) < 5000) {
      w.transport->waitForActivity(3000000);
      w.conn(1)->progress(&p);
    }
    double wall = msSince(t0);
    getrusage(RUSAGE_THREAD, &ru1);
    w.transport->disarmWait();
    double cpu = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) * 1e3 +
                 (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e3 +
                 (ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) * 1e3 +
                 (ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e3;
    RANK_CHECK(!r.pending() && got == 5, "not received");
    RANK_CHECK(wall < 1500, "woke after %.0f ms (the send came at ~300 ms)", wall);
    RANK_CHECK(cpu < 0.25 * wall, "burnt %.1f ms CPU in %.0f ms of waiting", cpu, wall);
    return "";
  });
  expectOk(res);
}

// Peers ring a doorbell only while its owner watches it (armWait). A rank
// that sleeps after every message, armed then polling once more as the
// engine does, must never miss a message that landed around the arming: in
// a ping-pong of 2000 messages each way no sleep may run to its full (long)
// timeout, and every message arrives in order.
TEST_P(ShmTransportTest, ArmedSleepNeverMissesAMessage) {
  auto res = run(2, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    const int peer = 1 - w.rank;
    Connection* c = w.conn(peer);
    int fullSleeps = 0;
    // Sleeps until `req` is done, always through an armed wait.
    auto sleepUntil = [&](Request& req) {
      while (req.pending()) {
        w.transport->armWait();
        bool p = false;
        c->progress(&p);
        if (!p && req.pending()) {
          const auto t0 = Clock::now();
          w.transport->waitForActivity(2000000);
          if (msSince(t0) >= 1900) ++fullSleeps;
        }
        w.transport->disarmWait();
      }
    };
    for (int i = 0; i < 2000; ++i) {
      int out = i * 2 + w.rank, in = -1;
      Request s, r;
      if (w.rank == 0) {
        c->postSend(&out, sizeof(out), &s);
        c->postRecv(&in, sizeof(in), &r);
      } else {
        c->postRecv(&in, sizeof(in), &r);
        sleepUntil(r);
        c->postSend(&out, sizeof(out), &s);
      }
      sleepUntil(r);
      sleepUntil(s);
      RANK_CHECK(r.state.load() == Request::kDone && in == i * 2 + peer, "message %d: got %d", i, in);
      RANK_CHECK(fullSleeps == 0, "a sleep ran its full 2 s at message %d: a ring was missed", i);
    }
    return "";
  });
  expectOk(res);
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmTransportTest,
                         ::testing::Values(Mode::kThreads, Mode::kProcesses),
                         [](const auto& info) { return std::string(modeName(info.param)); });

// ---------------------------------------------------------------------------
// Shareable memory (attnMemAlloc): a receiver in another process maps the
// sender's region and reads it with memcpy. Messages start anywhere in a
// region; the sender frees and reallocates between messages (new regions,
// never confused with old mappings); no more than ATTN_SHM_MAP_CACHE
// regions stay mapped; small messages keep to the ring; ATTN_SHM_MAP=0 and
// threads (plain memcpy already) map nothing.
struct MappedCase {
  Mode mode;
  const char* map;        // ATTN_SHM_MAP
  size_t wantMapped;      // regions each rank holds mapped at the end
};

class ShmMappedTest : public ::testing::TestWithParam<MappedCase> {};

TEST_P(ShmMappedTest, RegionsReadAtAnyOffset) {
  const MappedCase mc = GetParam();
  ScopedEnv env({{"ATTN_SHM_MAP", mc.map}, {"ATTN_SHM_MAP_CACHE", "3"}});
  const uint64_t hash = freshCommHash();
  auto res = runRanks(mc.mode, 2, hash, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    const int peer = 1 - w.rank;
    auto* c = dynamic_cast<shm::ShmConnection*>(w.conn(peer));
    RANK_CHECK(c != nullptr, "not a shm connection");
    // (size, offset in the region): ring-sized first, then direct ones.
    const std::vector<std::pair<size_t, size_t>> msgs = {
        {100, 0}, {(1 << 20) + 3, 0}, {(3 << 20) + 4099, 8}, {70000, 4096 * 3 + 24},
        {1 << 20, 1 << 20}, {(2 << 20) + 1, 5}, {65536, 7}};
    for (size_t m = 0; m < msgs.size(); ++m) {
      const auto [size, offset] = msgs[m];
      void* region = nullptr;
      RANK_CHECK(attnMemAlloc(&region, size + offset + 100) == attnSuccess, "attnMemAlloc: %s",
                 threadLastError().c_str());
      uint8_t* send = static_cast<uint8_t*>(region) + offset;
      fillPattern(send, size, w.rank, peer, static_cast<int>(m));
      std::vector<uint8_t> recv(size + 1, 0xEE);
      Request rr, sr;
      c->postRecv(recv.data(), size, &rr);
      c->postSend(send, size, &sr);
      attnResult_t r = drive(w, {&rr, &sr});
      RANK_CHECK(r == attnSuccess, "message %zu: %s / %s", m, attnGetErrorString(r),
                 rr.message.c_str());
      RANK_CHECK(attnMemFree(region) == attnSuccess, "attnMemFree failed");
      RANK_CHECK(rr.bytes == size, "message %zu: %zu bytes, want %zu", m, rr.bytes, size);
      long bad = checkPattern(recv.data(), size, peer, w.rank, static_cast<int>(m));
      RANK_CHECK(bad < 0, "message %zu (%zu bytes at offset %zu): byte %ld wrong", m, size,
                 offset, bad);
      RANK_CHECK(recv[size] == 0xEE, "wrote past the message");
      if (m == 0)
        RANK_CHECK(c->mappedRegions() == 0, "a %zu-byte message mapped a region", size);
    }
    RANK_CHECK(c->mappedRegions() == mc.wantMapped, "%zu regions mapped, want %zu",
               c->mappedRegions(), mc.wantMapped);
    return "";
  });
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r], "") << "rank " << r;
  EXPECT_TRUE(shmLeftovers(hash).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Shm, ShmMappedTest,
    ::testing::Values(MappedCase{Mode::kProcesses, "1", 3}, MappedCase{Mode::kProcesses, "0", 0},
                      MappedCase{Mode::kThreads, "1", 0}),
    [](const auto& info) {
      return std::string(modeName(info.param.mode)) + (info.param.map[0] == '1' ? "Map" : "NoMap");
    });

// ---------------------------------------------------------------------------
// A peer process killed with SIGKILL: the survivor's pending send and
// receive fail with attnRemoteError ("died") within bounded time, even while
// the dead peer is an unreaped zombie. Also in ring-only mode (no CMA).
class ShmKillTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShmKillTest, KilledPeerFailsPromptly) {
  const bool ringOnly = GetParam();
  ScopedEnv env(ringOnly ? EnvVars{{"ATTN_SHM_CMA", "0"}} : EnvVars{});
  const uint64_t hash = freshCommHash();
  Spawned s = spawnProcesses(2, hash, [&](World& w) -> std::string {
    RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
    if (w.rank == 1) {
      w.notifyParent();
      for (;;) pause();
    }
    std::vector<uint8_t> sbuf(16 << 20, 3), rbuf(1 << 20);
    Request sr, rr;
    w.conn(1)->postRecv(rbuf.data(), rbuf.size(), &rr);
    w.conn(1)->postSend(sbuf.data(), sbuf.size(), &sr);
    bool p;
    w.conn(1)->progress(&p);  // fills the ring / publishes the address
    w.notifyParent();
    auto t0 = Clock::now();
    drive(w, {&sr, &rr}, 20000);
    double ms = msSince(t0);
    for (Request* q : {&sr, &rr}) {
      RANK_CHECK(q->state.load() == Request::kFailed && q->error == attnRemoteError,
                 "state %d error %s", q->state.load(), attnGetErrorString(q->error));
      RANK_CHECK(q->message.find("peer 1") != std::string::npos &&
                     q->message.find("died") != std::string::npos,
                 "message: %s", q->message.c_str());
    }
    RANK_CHECK(ms < 3000, "took %.0f ms to notice", ms);
    return "";
  });
  ASSERT_TRUE(waitReady(s, 1, 30000)) << "rank 1 never connected";
  ASSERT_TRUE(waitReady(s, 0, 30000)) << "rank 0 never posted";
  usleep(100000);  // let rank 0 go to sleep first
  kill(s.pids[1], SIGKILL);
  // Reap rank 0 first: rank 1 stays a zombie meanwhile.
  auto deadline = Clock::now() + std::chrono::seconds(30);
  EXPECT_EQ(collectOne(s, 0, deadline), "");
  EXPECT_EQ(collectOne(s, 1, deadline), "killed by signal 9");
  auto left = shmLeftovers(hash);
  EXPECT_TRUE(left.empty()) << left.front();
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmKillTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RingOnly" : "Default"; });

// ---------------------------------------------------------------------------
// Bandwidth, for people tuning the transport (not a pass/fail test):
//   test_shm_transport --gtest_also_run_disabled_tests --gtest_filter='*Perf*'
double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string pairBandwidth(World& w, size_t size, int iters, double* gbps) {
  RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
  std::vector<uint8_t> buf(size, 1);
  std::vector<double> times;
  for (int i = 0; i < iters + 2; ++i) {
    Request r;
    auto t0 = Clock::now();
    if (w.rank == 0) w.conn(1)->postSend(buf.data(), size, &r);
    else w.conn(0)->postRecv(buf.data(), size, &r);
    RANK_CHECK(drive(w, {&r}) == attnSuccess, "transfer failed");
    if (i >= 2) times.push_back(msSince(t0));
  }
  *gbps = size / medianOf(times) / 1e6;
  return "";
}

TEST(ShmTransportPerf, DISABLED_PairBandwidth) {
  for (Mode mode : {Mode::kThreads, Mode::kProcesses})
    for (bool ring : {false, true})
      for (size_t size : {size_t(1) << 20, size_t(64) << 20}) {
        ScopedEnv env(ring ? kRingOnlyEnv : EnvVars{});
        auto res = runRanks(mode, 2, freshCommHash(), [&](World& w) -> std::string {
          double gbps = 0;
          std::string e = pairBandwidth(w, size, size > (8 << 20) ? 20 : 200, &gbps);
          if (e.empty() && w.rank == 1)
            printf("pair %-9s %-6s %6zu KiB: %6.2f GB/s\n", modeName(mode), ring ? "ring" : "direct",
                   size >> 10, gbps);
          return e;
        });
        for (auto& e : res) EXPECT_EQ(e, "");
      }
}

// Round-trip latency of small messages.
TEST(ShmTransportPerf, DISABLED_PingPong) {
  for (Mode mode : {Mode::kThreads, Mode::kProcesses})
    for (size_t size : {size_t(8), size_t(64) << 10, size_t(256) << 10}) {
      auto res = runRanks(mode, 2, freshCommHash(), [&](World& w) -> std::string {
        RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
        std::vector<uint8_t> buf(size, 1);
        const int peer = 1 - w.rank;
        std::vector<double> t;
        for (int i = 0; i < 2000; ++i) {
          auto t0 = Clock::now();
          Request a, b;
          if (w.rank == 0) {
            w.conn(peer)->postSend(buf.data(), size, &a);
            w.conn(peer)->postRecv(buf.data(), size, &b);
          } else {
            w.conn(peer)->postRecv(buf.data(), size, &b);
            RANK_CHECK(drive(w, {&b}) == attnSuccess, "recv");
            w.conn(peer)->postSend(buf.data(), size, &a);
          }
          RANK_CHECK(drive(w, {&a, &b}) == attnSuccess, "pingpong");
          if (i >= 100) t.push_back(msSince(t0) * 1000);
        }
        if (w.rank == 0)
          printf("pingpong %-9s %7zu B: median round trip %7.1f us\n", modeName(mode), size, medianOf(t));
        return "";
      });
      for (auto& e : res) EXPECT_EQ(e, "");
    }
}

// Ring all-gather over the transport, the way the collectives use it.
// PERF_AG_SIZE=<bytes> and PERF_AG_MODE=threads|processes narrow it down.
TEST(ShmTransportPerf, DISABLED_RingAllGather4) {
  const int n = 4;
  std::vector<size_t> totals = {size_t(1) << 20, size_t(4) << 20, size_t(16) << 20, size_t(64) << 20};
  if (const char* e = getenv("PERF_AG_SIZE")) totals = {size_t(strtoull(e, nullptr, 0))};
  std::vector<Mode> modes = {Mode::kThreads, Mode::kProcesses};
  if (const char* e = getenv("PERF_AG_MODE"))
    modes = {strcmp(e, "threads") == 0 ? Mode::kThreads : Mode::kProcesses};
  for (Mode mode : modes)
    for (size_t total : totals) {
      auto res = runRanks(mode, n, freshCommHash(), [&](World& w) -> std::string {
        RANK_CHECK(w.connectAll() == attnSuccess, "connect failed");
        const size_t blk = total / n;
        std::vector<uint8_t> buf(total, uint8_t(w.rank));
        const int next = (w.rank + 1) % n, prev = (w.rank + n - 1) % n;
        // Samples of `reps` back-to-back all-gathers (one barrier per sample).
        std::vector<double> times;
        const int reps = total <= (4u << 20) ? 20 : 3;
        for (int sample = 0; sample < 7; ++sample) {
          w.boot->barrier();
          auto t0 = Clock::now();
          for (int it = 0; it < reps; ++it)
            for (int s = 0; s < n - 1; ++s) {
              int sendBlk = (w.rank - s + n) % n, recvBlk = (w.rank - s - 1 + n) % n;
              Request sr, rr;
              w.conn(prev)->postRecv(buf.data() + recvBlk * blk, blk, &rr);
              w.conn(next)->postSend(buf.data() + sendBlk * blk, blk, &sr);
              RANK_CHECK(drive(w, {&sr, &rr}) == attnSuccess, "step failed");
            }
          if (sample >= 1) times.push_back(msSince(t0) / reps);
        }
        double ms = medianOf(times);
        if (w.rank == 0)
          printf("allgather %-9s %3d ranks %6zu KiB: %8.3f ms, busbw %6.2f GB/s\n", modeName(mode),
                 n, total >> 10, ms, double(total) * (n - 1) / n / ms / 1e6);
        return "";
      });
      for (auto& e : res) EXPECT_EQ(e, "");
    }
}

}  // namespace
}  // namespace attn
