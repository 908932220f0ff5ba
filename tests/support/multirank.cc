#include "tests/support/multirank.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

namespace attn_test {

// ---------------------------------------------------------------------------
// Types

size_t TypeSize(attnDataType_t t) {
  switch (t) {
    case attnInt8:
    case attnUint8: return 1;
    case attnFloat16:
    case attnBfloat16: return 2;
    case attnInt32:
    case attnFloat32: return 4;
    case attnInt64:
    case attnFloat64: return 8;
    default: return 1;
  }
}

const char* TypeName(attnDataType_t t) {
  switch (t) {
    case attnInt8: return "int8";
    case attnUint8: return "uint8";
    case attnInt32: return "int32";
    case attnInt64: return "int64";
    case attnFloat16: return "float16";
    case attnFloat32: return "float32";
    case attnFloat64: return "float64";
    case attnBfloat16: return "bfloat16";
    default: return "badtype";
  }
}

const char* OpName(attnRedOp_t op) {
  switch (op) {
    case attnSum: return "sum";
    case attnProd: return "prod";
    case attnMax: return "max";
    case attnMin: return "min";
    case attnAvg: return "avg";
    default: return "badop";
  }
}

const char* ResultName(attnResult_t r) {
  switch (r) {
    case attnSuccess: return "attnSuccess";
    case attnUnhandledCudaError: return "attnUnhandledCudaError";
    case attnSystemError: return "attnSystemError";
    case attnInternalError: return "attnInternalError";
    case attnInvalidArgument: return "attnInvalidArgument";
    case attnInvalidUsage: return "attnInvalidUsage";
    case attnRemoteError: return "attnRemoteError";
    case attnInProgress: return "attnInProgress";
    case attnTimeout: return "attnTimeout";
    case attnNotSupported: return "attnNotSupported";
    default: return "attnResult(?)";
  }
}

bool IsSignedType(attnDataType_t t) { return t != attnUint8; }

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = int(exp) - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (uint32_t(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = 0;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        ++e;
      }
      mant &= 0x3ffu;
      x = sign | (uint32_t(113 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

float Bf16ToFloat(uint16_t h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// ---------------------------------------------------------------------------
// TypedBuf

namespace {
std::atomic<bool> gShareableBuffers{false};
}  // namespace

void UseShareableBuffers(bool on) { gShareableBuffers.store(on); }

TypedBuf::TypedBuf(attnDataType_t type, size_t count)
    : type_(type),
      count_(count),
      storage_(2 * kGuardBytes + count * TypeSize(type), kGuardByte,
               TestAllocator<uint8_t>(gShareableBuffers.load())) {
  std::memset(data(), 0, bytes());
}

void TypedBuf::Set(size_t i, double v) {
  char* p = at(i);
  switch (type_) {
    case attnInt8: { int8_t x = int8_t(v); std::memcpy(p, &x, 1); break; }
    case attnUint8: { uint8_t x = uint8_t(v); std::memcpy(p, &x, 1); break; }
    case attnInt32: { int32_t x = int32_t(v); std::memcpy(p, &x, 4); break; }
    case attnInt64: { int64_t x = int64_t(v); std::memcpy(p, &x, 8); break; }
    case attnFloat16: { uint16_t x = FloatToHalf(float(v)); std::memcpy(p, &x, 2); break; }
    case attnFloat32: { float x = float(v); std::memcpy(p, &x, 4); break; }
    case attnFloat64: { std::memcpy(p, &v, 8); break; }
    case attnBfloat16: { uint16_t x = FloatToBf16(float(v)); std::memcpy(p, &x, 2); break; }
    default: break;
  }
}

double TypedBuf::Get(size_t i) const {
  const char* p = static_cast<const char*>(data()) + i * TypeSize(type_);
  switch (type_) {
    case attnInt8: { int8_t x; std::memcpy(&x, p, 1); return x; }
    case attnUint8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
    case attnInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case attnInt64: { int64_t x; std::memcpy(&x, p, 8); return double(x); }
    case attnFloat16: { uint16_t x; std::memcpy(&x, p, 2); return HalfToFloat(x); }
    case attnFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case attnFloat64: { double x; std::memcpy(&x, p, 8); return x; }
    case attnBfloat16: { uint16_t x; std::memcpy(&x, p, 2); return Bf16ToFloat(x); }
    default: return 0;
  }
}

void TypedBuf::Fill(double v) {
  if (count_ == 0) return;
  Set(0, v);
  const size_t esz = TypeSize(type_);
  for (size_t i = 1; i < count_; ++i) std::memcpy(at(i), at(0), esz);
}

bool TypedBuf::GuardsIntact() const {
  const size_t total = storage_.size();
  for (size_t i = 0; i < kGuardBytes; ++i)
    if (storage_[i] != kGuardByte || storage_[total - 1 - i] != kGuardByte) return false;
  return true;
}

::testing::AssertionResult BufEquals(const TypedBuf& buf, size_t off, size_t n,
                                     const std::function<double(size_t)>& expect) {
  if (!buf.GuardsIntact())
    return ::testing::AssertionFailure() << "guard zone of a " << TypeName(buf.type())
                                         << " buffer of " << buf.count()
                                         << " elements was overwritten";
  if (off + n > buf.count())
    return ::testing::AssertionFailure() << "check range [" << off << ", " << off + n
                                         << ") exceeds buffer of " << buf.count();
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = off; i < off + n; ++i) {
    const double want = expect(i), got = buf.Get(i);
    if (!(got == want)) {
      if (bad < 5) os << "\n  [" << i << "] got " << got << " want " << want;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " " << TypeName(buf.type())
                                       << " elements differ (range [" << off << ", " << off + n
                                       << "))" << os.str();
}

double Pattern(attnDataType_t t, int64_t who, size_t i) {
  const uint64_t v = (uint64_t(who) * 37u + uint64_t(i) * 11u + 3u) % 120u;
  return IsSignedType(t) ? double(int64_t(v) - 60) : double(v);
}

double Sentinel(attnDataType_t t) { return IsSignedType(t) ? -100.0 : 250.0; }

namespace {
int64_t posMod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

double redBase(attnRedOp_t op, attnDataType_t t, int r, size_t i) {
  const bool s = IsSignedType(t);
  const uint64_t ii = i;
  switch (op) {
    case attnSum:
    case attnAvg: return double(int64_t((ii * 3 + uint64_t(r) * 5) % 7) - (s ? 3 : 0));
    case attnProd: {
      double v = ((ii + uint64_t(r)) % 4 == 0) ? 2 : 1;
      if (s && (ii * 5 + uint64_t(r) * 3) % 7 == 3) v = -v;
      return v;
    }
    case attnMax:
    case attnMin: return double(int64_t((ii * 7 + uint64_t(r) * 13) % 11) - (s ? 5 : 0));
    default: return 0;
  }
}
}  // namespace

double RedInput(attnRedOp_t op, attnDataType_t t, int rank, int nranks, size_t i) {
  double v = redBase(op, t, rank, i);
  if (op == attnAvg && rank == nranks - 1) {
    int64_t s = 0;
    for (int r = 0; r < nranks; ++r) s += int64_t(redBase(op, t, r, i));
    v += double(posMod(-s, nranks));
  }
  return v;
}

double RedExpected(attnRedOp_t op, attnDataType_t t, int nranks, size_t i) {
  double acc = RedInput(op, t, 0, nranks, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = RedInput(op, t, r, nranks, i);
    switch (op) {
      case attnSum:
      case attnAvg: acc += v; break;
      case attnProd: acc *= v; break;
      case attnMax: acc = std::max(acc, v); break;
      case attnMin: acc = std::min(acc, v); break;
      default: break;
    }
  }
  if (op == attnAvg) acc /= nranks;  // exact: the inputs make the sum divisible
  return acc;
}

// ---------------------------------------------------------------------------
// Watchdog: ends the process if a threaded test overruns its deadline.

namespace {

class Watchdog {
 public:
  Watchdog(int deadlineMs, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, deadlineMs] {
      std::unique_lock<std::mutex> g(mu_);
      if (!cv_.wait_for(g, std::chrono::milliseconds(deadlineMs), [this] { return done_; })) {
        const ::testing::TestInfo* ti = ::testing::UnitTest::GetInstance()->current_test_info();
        std::fprintf(stderr,
                     "\n*** attn_test watchdog: %s.%s: %s did not finish within %d ms; "
                     "ending the test binary so the suite cannot hang ***\n",
                     ti ? ti->test_suite_name() : "?", ti ? ti->name() : "?", what_.c_str(),
                     deadlineMs);
        std::fflush(stderr);
        _exit(86);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Waits for a non-blocking init to finish. Returns the final state.
attnResult_t waitInit(attnComm_t comm, int deadlineMs) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadlineMs);
  attnResult_t st = attnInProgress;
  while (std::chrono::steady_clock::now() < end) {
    if (attnCommGetAsyncError(comm, &st) != attnSuccess) return attnInternalError;
    if (st != attnInProgress) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return attnTimeout;
}

}  // namespace

ScopedEnv::ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [k, v] : vars) {
    const char* old = std::getenv(k.c_str());
    saved_.push_back({k, {old != nullptr, old ? old : ""}});
    setenv(k.c_str(), v.c_str(), 1);
  }
}

ScopedEnv::~ScopedEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second.first)
      setenv(it->first.c_str(), it->second.second.c_str(), 1);
    else
      unsetenv(it->first.c_str());
  }
}

void RunThreadsRaw(int n, const std::function<void(int rank)>& fn, int deadline_ms) {
  Watchdog dog(deadline_ms, "a threaded multi-rank body");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

void RunThreads(int n, const RankBody& body, const RunOptions& opts) {
  Watchdog dog(opts.deadline_ms, "RunThreads(" + std::to_string(n) + ")");
  std::vector<attnComm_t> comms(n, nullptr);
  {
    ScopedEnv env(opts.env);
    if (opts.config == nullptr) {
      const attnResult_t r = attnCommInitAll(comms.data(), n, nullptr);
      ASSERT_EQ(r, attnSuccess) << "attnCommInitAll(" << n << ") -> " << ResultName(r) << ": "
                                << attnGetLastError(nullptr);
    } else {
      attnUniqueId id;
      const attnResult_t ir = attnGetUniqueId(&id);
      ASSERT_EQ(ir, attnSuccess) << "attnGetUniqueId: " << attnGetLastError(nullptr);
      std::vector<attnResult_t> res(n, attnSuccess);
      std::vector<std::string> errs(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          attnConfig_t cfg = *opts.config;
          res[r] = attnCommInitRankConfig(&comms[r], n, id, r, &cfg);
          if (res[r] == attnInProgress && comms[r] != nullptr)
            res[r] = waitInit(comms[r], opts.deadline_ms);
          if (res[r] != attnSuccess)
            errs[r] = comms[r] ? attnGetLastError(comms[r]) : attnGetLastError(nullptr);
        });
      for (auto& t : threads) t.join();
      bool ok = true;
      for (int r = 0; r < n; ++r)
        if (res[r] != attnSuccess) {
          ok = false;
          ADD_FAILURE() << "rank " << r << ": attnCommInitRankConfig -> " << ResultName(res[r])
                        << ": " << errs[r];
        }
      if (!ok) {
        for (auto c : comms)
          if (c) attnCommAbort(c);
        return;
      }
    }
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      attnComm_t comm = comms[r];
      body(r, n, comm);
      if (comm != nullptr) {
        const attnResult_t d = attnCommDestroy(comm);
        EXPECT_EQ(d, attnSuccess) << "rank " << r << ": attnCommDestroy: "
                                  << attnGetLastError(nullptr);
      }
    });
  for (auto& t : threads) t.join();
}

// ---------------------------------------------------------------------------
// Processes

namespace {

int g_childFd = -1;
int g_childRank = -1;
bool g_inChild = false;
std::atomic<bool> g_childFailed{false};

void writeAll(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    left -= size_t(w);
  }
}

class PipeListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    g_childFailed.store(true);
    std::ostringstream os;
    os << "[rank " << g_childRank << ", pid " << getpid() << "] "
       << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number() << ": "
       << r.message() << "\n";
    writeAll(g_childFd, os.str());
  }
};

[[noreturn]] void childMain(int rank, int fd, const attnUniqueId& id,
                            const std::function<void(int, const attnUniqueId&)>& child,
                            const RunOptions& opts) {
  g_inChild = true;
  g_childFd = fd;
  g_childRank = rank;
  g_childFailed.store(false);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new PipeListener);
  for (const auto& [k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
  int code = 0;
  try {
    if (opts.child_setup) opts.child_setup(rank);
    child(rank, id);
  } catch (const std::exception& e) {
    writeAll(fd, "[rank " + std::to_string(rank) + "] uncaught exception: " + e.what() + "\n");
    code = 3;
  } catch (...) {
    writeAll(fd, "[rank " + std::to_string(rank) + "] uncaught exception\n");
    code = 3;
  }
  if (code == 0 && g_childFailed.load()) code = 1;
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

}  // namespace

bool InChild() { return g_inChild; }

void ReportFromChild(const std::string& line) {
  if (g_inChild) {
    writeAll(g_childFd, "[rank " + std::to_string(g_childRank) + "] " + line + "\n");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::string ProcResult::Describe() const {
  std::ostringstream os;
  os << "rank " << rank << ": ";
  if (deadline_killed)
    os << "still running at the deadline, killed by the harness";
  else if (signaled)
    os << "killed by signal " << signal << " (" << strsignal(signal) << ")";
  else if (exited)
    os << (exit_code == 0 ? "passed" : exit_code == 1 ? "assertions failed" : "exited with code ")
       << (exit_code > 1 ? std::to_string(exit_code) : "");
  else
    os << "not reaped";
  if (!messages.empty()) os << "\n" << messages;
  return os.str();
}

std::vector<ProcResult> ForkRanks(int n,
                                  const std::function<void(int rank, const attnUniqueId& id)>& child,
                                  const RunOptions& opts) {
  std::vector<ProcResult> results(n);
  for (int r = 0; r < n; ++r) results[r].rank = r;
  std::fflush(stdout);
  std::fflush(stderr);
  // Fork first, then create the id (which starts the bootstrap root's
  // thread) and hand it to the children through a pipe: forking a process
  // that already runs threads can leave a child with a lock held by a
  // thread that does not exist there (UCX's memory-hook lock did this).
  std::vector<pid_t> pids(n, -1);
  std::vector<int> fds(n, -1), idFds(n, -1);
  for (int r = 0; r < n; ++r) {
    int p[2], q[2];
    if (pipe(p) != 0) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      break;
    }
    if (pipe(q) != 0) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      ::close(p[0]);
      ::close(p[1]);
      break;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << strerror(errno);
      for (int fd : {p[0], p[1], q[0], q[1]}) ::close(fd);
      break;
    }
    if (pid == 0) {
      ::close(p[0]);
      ::close(q[1]);
      for (int k = 0; k < r; ++k) {
        ::close(fds[k]);
        ::close(idFds[k]);
      }
      attnUniqueId id;
      size_t got = 0;
      while (got < sizeof(id)) {
        const ssize_t k = ::read(q[0], reinterpret_cast<char*>(&id) + got, sizeof(id) - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) _exit(3);  // the parent could not make an id
        got += size_t(k);
      }
      ::close(q[0]);
      childMain(r, p[1], id, child, opts);
    }
    ::close(p[1]);
    ::close(q[0]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    pids[r] = pid;
    fds[r] = p[0];
    idFds[r] = q[1];
  }
  attnUniqueId id;
  const attnResult_t ir = attnGetUniqueId(&id);
  if (ir != attnSuccess) {
    ADD_FAILURE() << "attnGetUniqueId -> " << ResultName(ir) << ": " << attnGetLastError(nullptr);
    for (auto& res : results) res.messages = "not started: attnGetUniqueId failed";
  }
  for (int r = 0; r < n; ++r) {
    if (idFds[r] < 0) continue;
    if (ir == attnSuccess && ::write(idFds[r], &id, sizeof(id)) != ssize_t(sizeof(id)))
      ADD_FAILURE() << "rank " << r << ": could not pass the unique id: " << strerror(errno);
    ::close(idFds[r]);  // without an id the child exits
  }

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.deadline_ms);
  std::vector<bool> reaped(n, false);
  for (int r = 0; r < n; ++r)
    if (pids[r] < 0) reaped[r] = true;
  auto drain = [&](int r) {
    if (fds[r] < 0) return;
    char buf[4096];
    for (;;) {
      const ssize_t got = ::read(fds[r], buf, sizeof(buf));
      if (got > 0) {
        results[r].messages.append(buf, size_t(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        ::close(fds[r]);
        fds[r] = -1;
      }
      return;
    }
  };
  auto record = [&](int r, int st) {
    reaped[r] = true;
    if (WIFEXITED(st)) {
      results[r].exited = true;
      results[r].exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      results[r].signaled = true;
      results[r].signal = WTERMSIG(st);
    }
  };
  for (;;) {
    std::vector<pollfd> pfds;
    for (int r = 0; r < n; ++r)
      if (fds[r] >= 0) pfds.push_back({fds[r], POLLIN, 0});
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 20);
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int r = 0; r < n; ++r) drain(r);
    bool all = true;
    for (int r = 0; r < n; ++r) {
      if (reaped[r]) continue;
      int st = 0;
      const pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) record(r, st);
      else all = false;
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (!reaped[r]) {
          kill(pids[r], SIGKILL);
          int st = 0;
          while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
          }
          record(r, st);
          results[r].deadline_killed = true;
        }
      break;
    }
  }
  for (int r = 0; r < n; ++r) {
    drain(r);
    if (fds[r] >= 0) ::close(fds[r]);
  }
  return results;
}

std::vector<ProcResult> RunProcessesCollect(int n, const RankBody& body, const RunOptions& opts) {
  auto child = [&](int rank, const attnUniqueId& id) {
    attnComm_t comm = nullptr;
    attnResult_t r;
    if (opts.config) {
      attnConfig_t cfg = *opts.config;
      r = attnCommInitRankConfig(&comm, n, id, rank, &cfg);
      if (r == attnInProgress && comm) r = waitInit(comm, opts.deadline_ms);
    } else {
      r = attnCommInitRank(&comm, n, id, rank);
    }
    ASSERT_EQ(r, attnSuccess) << "init -> " << ResultName(r) << ": "
                              << (comm ? attnGetLastError(comm) : attnGetLastError(nullptr));
    body(rank, n, comm);
    if (comm != nullptr) {
      const attnResult_t d = attnCommDestroy(comm);
      EXPECT_EQ(d, attnSuccess) << "attnCommDestroy: " << attnGetLastError(nullptr);
    }
  };
  return ForkRanks(n, child, opts);
}

void ExpectAllPassed(const std::vector<ProcResult>& results) {
  for (const auto& r : results)
    if (!r.passed()) ADD_FAILURE() << r.Describe();
}

void RunProcesses(int n, const RankBody& body, const RunOptions& opts) {
  ExpectAllPassed(RunProcessesCollect(n, body, opts));
}

// ---------------------------------------------------------------------------
// Collective checkers

namespace {
std::string caseName(const char* coll, attnComm_t comm, int rank, int n, attnDataType_t t,
                     const char* extra, size_t count, bool inPlace) {
  std::ostringstream os;
  os << coll << "(" << TypeName(t);
  if (extra && *extra) os << ", " << extra;
  os << ", count=" << count << (inPlace ? ", in-place" : "") << ") on rank " << rank << "/" << n;
  return os.str();
}
}  // namespace

void CheckAllReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                    size_t count, bool inPlace) {
  const std::string what = caseName("AllReduce", comm, rank, n, t, OpName(op), count, inPlace);
  TypedBuf send(t, count), recv(t, count);
  for (size_t i = 0; i < count; ++i) send.Set(i, RedInput(op, t, rank, n, i));
  recv.Fill(Sentinel(t));
  const attnResult_t r = inPlace
      ? attnAllReduce(send.data(), send.data(), count, t, op, comm, nullptr)
      : attnAllReduce(send.data(), recv.data(), count, t, op, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  const TypedBuf& out = inPlace ? send : recv;
  EXPECT_TRUE(BufEquals(out, 0, count, [&](size_t i) { return RedExpected(op, t, n, i); }))
      << what;
  if (!inPlace)
    EXPECT_TRUE(BufEquals(send, 0, count, [&](size_t i) { return RedInput(op, t, rank, n, i); }))
        << what << ": sendbuff was modified";
}

void CheckReduceScatter(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                        size_t recvcount, bool inPlace) {
  const std::string what =
      caseName("ReduceScatter", comm, rank, n, t, OpName(op), recvcount, inPlace);
  const size_t total = recvcount * size_t(n);
  TypedBuf send(t, total), recv(t, recvcount);
  for (size_t j = 0; j < total; ++j) send.Set(j, RedInput(op, t, rank, n, j));
  recv.Fill(Sentinel(t));
  void* out = inPlace ? static_cast<void*>(send.at(size_t(rank) * recvcount)) : recv.data();
  const attnResult_t r = attnReduceScatter(send.data(), out, recvcount, t, op, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  const size_t base = size_t(rank) * recvcount;
  if (inPlace) {
    EXPECT_TRUE(BufEquals(send, base, recvcount,
                          [&](size_t j) { return RedExpected(op, t, n, j); }))
        << what;
  } else {
    EXPECT_TRUE(BufEquals(recv, 0, recvcount,
                          [&](size_t i) { return RedExpected(op, t, n, base + i); }))
        << what;
    EXPECT_TRUE(BufEquals(send, 0, total, [&](size_t j) { return RedInput(op, t, rank, n, j); }))
        << what << ": sendbuff was modified";
  }
}

void CheckReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op, size_t count, int root,
                 bool inPlace, bool nullRecvOnNonRoot) {
  std::string extra = std::string(OpName(op)) + ", root=" + std::to_string(root) +
                      (nullRecvOnNonRoot ? ", NULL recv" : "");
  const std::string what = caseName("Reduce", comm, rank, n, t, extra.c_str(), count, inPlace);
  TypedBuf send(t, count), recv(t, count);
  for (size_t i = 0; i < count; ++i) send.Set(i, RedInput(op, t, rank, n, i));
  recv.Fill(Sentinel(t));
  void* rp = inPlace ? send.data() : recv.data();
  if (rank != root && nullRecvOnNonRoot) rp = nullptr;
  const attnResult_t r = attnReduce(send.data(), rp, count, t, op, root, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  if (rank == root)
    EXPECT_TRUE(BufEquals(inPlace ? send : recv, 0, count, [&](size_t i) { return RedExpected(op, t, n, i); }))
        << what;
  else
    EXPECT_TRUE(BufEquals(recv, 0, count, [&](size_t) { return Sentinel(t); }))
        << what << ": a non-root's recvbuff was written";
  if (!inPlace || rank != root)
    EXPECT_TRUE(BufEquals(send, 0, count, [&](size_t i) { return RedInput(op, t, rank, n, i); }))
        << what << ": sendbuff was modified";
}

void CheckAllGather(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count,
                    bool inPlace) {
  const std::string what = caseName("AllGather", comm, rank, n, t, "", count, inPlace);
  const size_t total = count * size_t(n);
  TypedBuf send(t, count), recv(t, total);
  recv.Fill(Sentinel(t));
  const void* sp;
  if (inPlace) {
    for (size_t i = 0; i < count; ++i) recv.Set(size_t(rank) * count + i, Pattern(t, rank, i));
    sp = recv.at(size_t(rank) * count);
  } else {
    for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(t, rank, i));
    sp = send.data();
  }
  const attnResult_t r = attnAllGather(sp, recv.data(), count, t, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(recv, 0, total, [&](size_t j) {
    return Pattern(t, int64_t(j / (count ? count : 1)), j % (count ? count : 1));
  })) << what;
  if (!inPlace)
    EXPECT_TRUE(BufEquals(send, 0, count, [&](size_t i) { return Pattern(t, rank, i); }))
        << what << ": sendbuff was modified";
}

void CheckBroadcast(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count, int root,
                    bool inPlace, bool nullSendOnNonRoot) {
  std::string extra = "root=" + std::to_string(root) + (nullSendOnNonRoot ? ", NULL send" : "");
  const std::string what = caseName("Broadcast", comm, rank, n, t, extra.c_str(), count, inPlace);
  TypedBuf send(t, count), recv(t, count);
  const int64_t src = 1000 + root;
  recv.Fill(Sentinel(t));
  if (rank == root) {
    for (size_t i = 0; i < count; ++i) (inPlace ? recv : send).Set(i, Pattern(t, src, i));
  } else {
    for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(t, 500 + rank, i));  // must be ignored
  }
  const void* sp = inPlace ? recv.data() : send.data();
  if (rank != root && nullSendOnNonRoot) sp = nullptr;
  const attnResult_t r = attnBroadcast(sp, recv.data(), count, t, root, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(recv, 0, count, [&](size_t i) { return Pattern(t, src, i); })) << what;
  if (!inPlace)
    EXPECT_TRUE(BufEquals(send, 0, count, [&](size_t i) {
      return rank == root ? Pattern(t, src, i) : Pattern(t, 500 + rank, i);
    })) << what << ": sendbuff was modified";
}

void CheckAllToAll(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count) {
  const std::string what = caseName("AllToAll", comm, rank, n, t, "", count, false);
  const size_t total = count * size_t(n);
  TypedBuf send(t, total), recv(t, total);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i) send.Set(size_t(p) * count + i, Pattern(t, rank * 64 + p, i));
  recv.Fill(Sentinel(t));
  const attnResult_t r = attnAllToAll(send.data(), recv.data(), count, t, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  const size_t c = count ? count : 1;
  EXPECT_TRUE(BufEquals(recv, 0, total, [&](size_t j) {
    return Pattern(t, int64_t(j / c) * 64 + rank, j % c);
  })) << what;
}

void CheckAllToAllv(attnComm_t comm, int rank, int n, attnDataType_t t, size_t scale) {
  const std::string what =
      caseName("AllToAllv", comm, rank, n, t, ("scale=" + std::to_string(scale)).c_str(), 0, false);
  auto cnt = [&](int src, int dst) { return size_t((src + 2 * dst + 1) % 4) * scale; };
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t sTotal = 0, rTotal = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = cnt(rank, p);
    sd[p] = sTotal;
    sTotal += sc[p] + 1;  // one-element gap after each block
  }
  for (int p = n - 1; p >= 0; --p) {  // receive blocks in reverse peer order
    rc[p] = cnt(p, rank);
    rd[p] = rTotal;
    rTotal += rc[p] + 2;
  }
  TypedBuf send(t, sTotal), recv(t, rTotal);
  send.Fill(Sentinel(t));
  recv.Fill(Sentinel(t));
  for (int p = 0; p < n; ++p)
    for (size_t j = 0; j < sc[p]; ++j) send.Set(sd[p] + j, Pattern(t, rank * 64 + p, j));
  std::vector<double> expect(rTotal, Sentinel(t));
  for (int p = 0; p < n; ++p)
    for (size_t j = 0; j < rc[p]; ++j) expect[rd[p] + j] = Pattern(t, p * 64 + rank, j);
  const attnResult_t r = attnAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                                       rd.data(), t, comm, nullptr);
  ASSERT_EQ(r, attnSuccess) << what << " -> " << ResultName(r) << ": " << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(recv, 0, rTotal, [&](size_t i) { return expect[i]; })) << what;
}

void CheckBarrier(attnComm_t comm, int rank, int n, std::atomic<int64_t>& counter, int rounds) {
  for (int k = 0; k < rounds; ++k) {
    counter.fetch_add(1);
    attnResult_t r = attnBarrier(comm, nullptr);
    ASSERT_EQ(r, attnSuccess) << "Barrier round " << k << " on rank " << rank << ": "
                              << attnGetLastError(comm);
    EXPECT_EQ(counter.load(), int64_t(n) * (k + 1))
        << "rank " << rank << " left barrier round " << k << " before every rank entered it";
    r = attnBarrier(comm, nullptr);
    ASSERT_EQ(r, attnSuccess) << "Barrier round " << k << "b on rank " << rank << ": "
                              << attnGetLastError(comm);
  }
}

void CheckRingExchange(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count) {
  const std::string what = caseName("RingExchange", comm, rank, n, t, "", count, false);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  TypedBuf send(t, count), recv(t, count);
  for (size_t i = 0; i < count; ++i) send.Set(i, Pattern(t, rank, i));
  recv.Fill(Sentinel(t));
  ATTN_ASSERT_OK(comm, attnGroupStart());
  const attnResult_t s = attnSend(send.data(), count, t, next, comm, nullptr);
  const attnResult_t rv = attnRecv(recv.data(), count, t, prev, comm, nullptr);
  const attnResult_t e = attnGroupEnd();
  ASSERT_EQ(s, attnSuccess) << what << ": attnSend: " << attnGetLastError(comm);
  ASSERT_EQ(rv, attnSuccess) << what << ": attnRecv: " << attnGetLastError(comm);
  ASSERT_EQ(e, attnSuccess) << what << ": attnGroupEnd -> " << ResultName(e) << ": "
                            << attnGetLastError(comm);
  EXPECT_TRUE(BufEquals(recv, 0, count, [&](size_t i) { return Pattern(t, prev, i); })) << what;
  EXPECT_TRUE(BufEquals(send, 0, count, [&](size_t i) { return Pattern(t, rank, i); }))
      << what << ": sendbuff was modified";
}

// ---------------------------------------------------------------------------
// Misc

SharedCounters::SharedCounters(size_t n) : n_(n) {
  void* p = mmap(nullptr, sizeof(std::atomic<int64_t>) * n, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::abort();
  }
  p_ = static_cast<std::atomic<int64_t>*>(p);
  for (size_t i = 0; i < n; ++i) new (&p_[i]) std::atomic<int64_t>(0);
}

SharedCounters::~SharedCounters() { munmap(p_, sizeof(std::atomic<int64_t>) * n_); }

int FindFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

void IdleUntilThenAbort(const std::atomic<int>& done, int target, attnComm_t& comm) {
  while (done.load() < target) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(attnCommAbort(comm), attnSuccess);
  comm = nullptr;
}

}  // namespace attn_test
