// Multi-rank test harness: run a test body on N ranks, as threads of this
// process (attnCommInitAll, or attnCommInitRankConfig when a config is
// given) or as forked processes (the parent creates the unique id BEFORE
// fork, the children call attnCommInitRank[Config]).
//
// Neither runner can hang the suite: threads run under a watchdog that ends
// the test binary with a message past the deadline; children are reaped with
// a deadline and SIGKILLed when they overrun. gtest assertions inside a
// child are captured and sent to the parent through a pipe, where they turn
// into failures of the running test (with the rank named).
//
// Also here: typed host buffers with guard zones, exact value patterns for
// every attnDataType_t (fp16/bf16 hold small integers exactly), and
// reduction inputs whose exact result is representable for every op.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"

namespace attn_test {

// ---------------------------------------------------------------------------
// Types and values

constexpr attnDataType_t kAllTypes[] = {attnInt8,    attnUint8,   attnInt32,
                                        attnInt64,   attnFloat16, attnFloat32,
                                        attnFloat64, attnBfloat16};
constexpr attnRedOp_t kAllOps[] = {attnSum, attnProd, attnMax, attnMin, attnAvg};

size_t TypeSize(attnDataType_t t);
const char* TypeName(attnDataType_t t);
const char* OpName(attnRedOp_t op);
bool IsSignedType(attnDataType_t t);  // every type but attnUint8

// IEEE half / bfloat16 <-> float (round to nearest even).
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);

// While set (process-wide), TypedBufs take their storage from attnMemAlloc,
// so same-host peers in other processes map it (shm's mapped path).
void UseShareableBuffers(bool on);

// Storage from attnMemAlloc or the heap, chosen when the buffer is made.
template <class T>
struct TestAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  bool shareable = false;
  TestAllocator() = default;
  explicit TestAllocator(bool s) : shareable(s) {}
  template <class U>
  TestAllocator(const TestAllocator<U>& o) : shareable(o.shareable) {}
  T* allocate(size_t n) {
    if (!shareable) return std::allocator<T>().allocate(n);
    void* p = nullptr;
    if (attnMemAlloc(&p, n * sizeof(T) ? n * sizeof(T) : 1) != attnSuccess) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (shareable) attnMemFree(p);
    else std::allocator<T>().deallocate(p, n);
  }
  bool operator==(const TestAllocator& o) const { return shareable == o.shareable; }
};

// A host buffer of `count` elements of `type`, surrounded by guard zones of
// kGuardBytes filled with a known byte, so writes past either end show.
class TypedBuf {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr uint8_t kGuardByte = 0xA5;

  TypedBuf() = default;
  TypedBuf(attnDataType_t type, size_t count);
  attnDataType_t type() const { return type_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * TypeSize(type_); }
  void* data() { return storage_.data() + kGuardBytes; }
  const void* data() const { return storage_.data() + kGuardBytes; }
  // Address of element i (i may equal count()).
  char* at(size_t i) { return static_cast<char*>(data()) + i * TypeSize(type_); }

  void Set(size_t i, double v);
  double Get(size_t i) const;
  void Fill(double v);
  bool GuardsIntact() const;

 private:
  attnDataType_t type_ = attnFloat32;
  size_t count_ = 0;
  std::vector<uint8_t, TestAllocator<uint8_t>> storage_;
};

// Every element in [off, off+n) equals expect(i) (i is the buffer index),
// and the guards are intact. Reports the first few mismatches.
::testing::AssertionResult BufEquals(const TypedBuf& buf, size_t off, size_t n,
                                     const std::function<double(size_t)>& expect);

// A value that every type holds exactly: an integer in [0, 120) (unsigned)
// or [-60, 60) (signed types). `who` tells sources apart (e.g. a rank).
double Pattern(attnDataType_t t, int64_t who, size_t i);
// A sentinel value distinct from Pattern's range (exact in every type).
double Sentinel(attnDataType_t t);

// Inputs of a reduction over `nranks` ranks such that the exact result is
// representable in `t` and, for attnAvg, the sum divides by nranks.
double RedInput(attnRedOp_t op, attnDataType_t t, int rank, int nranks, size_t i);
// The exact result for element i.
double RedExpected(attnRedOp_t op, attnDataType_t t, int nranks, size_t i);

// ---------------------------------------------------------------------------
// Runners

// body(rank, nranks, comm). If the body destroys or aborts its communicator
// it sets comm = nullptr; otherwise the runner destroys it after the body.
using RankBody = std::function<void(int rank, int nranks, attnComm_t& comm)>;

struct RunOptions {
  // Threads: the watchdog ends the binary past this; processes: children
  // still running are SIGKILLed past this.
  int deadline_ms = 120000;
  // NULL: attnCommInitAll (threads) / attnCommInitRank (processes); else
  // attnCommInitRankConfig with this config on every rank.
  const attnConfig_t* config = nullptr;
  // Environment for the ranks: set in each child before init (processes),
  // or in this process around communicator creation (threads; restored
  // afterwards).
  std::vector<std::pair<std::string, std::string>> env;
  // Processes only: run in the child before anything else (after env).
  std::function<void(int rank)> child_setup;
};

// Runs body on n threads. Init failures and body assertions fail the test.
void RunThreads(int n, const RankBody& body, const RunOptions& opts = {});

// Runs `fn` on n threads (no communicator), under the watchdog.
void RunThreadsRaw(int n, const std::function<void(int rank)>& fn,
                   int deadline_ms = 120000);

// What happened to one child process.
struct ProcResult {
  int rank = -1;
  bool exited = false;   // exited normally
  int exit_code = -1;    // 0: body passed; 1: assertion failures; other: harness errors
  bool signaled = false;
  int signal = 0;
  bool deadline_killed = false;  // killed by the harness past the deadline
  std::string messages;          // assertion failures and ReportFromChild lines
  bool passed() const { return exited && exit_code == 0 && !deadline_killed; }
  std::string Describe() const;
};

// Forks n children; child r runs child(r, id) with `id` from attnGetUniqueId
// made in the parent before fork, then exits (0 if no gtest failure, else 1)
// with _exit. Returns once every child was reaped (killing stragglers past
// opts.deadline_ms). opts.config is not used here (the child inits itself).
std::vector<ProcResult> ForkRanks(int n,
                                  const std::function<void(int rank, const attnUniqueId& id)>& child,
                                  const RunOptions& opts = {});

// As ForkRanks, with the communicator made (attnCommInitRank[Config]) and
// destroyed around body. Returns the results without judging them.
std::vector<ProcResult> RunProcessesCollect(int n, const RankBody& body,
                                            const RunOptions& opts = {});
// As RunProcessesCollect, and every child must pass.
void RunProcesses(int n, const RankBody& body, const RunOptions& opts = {});

// Adds a test failure for every child that did not pass.
void ExpectAllPassed(const std::vector<ProcResult>& results);

// In a child: sends a line to the parent (shown if the test fails). In the
// parent or a thread: prints it.
void ReportFromChild(const std::string& line);
// True in a process forked by ForkRanks.
bool InChild();

// An int counter in memory shared by this process and its forked children
// (MAP_SHARED | MAP_ANONYMOUS). Make it before forking.
class SharedCounters {
 public:
  explicit SharedCounters(size_t n);
  ~SharedCounters();
  SharedCounters(const SharedCounters&) = delete;
  SharedCounters& operator=(const SharedCounters&) = delete;
  std::atomic<int64_t>& operator[](size_t i) { return p_[i]; }

 private:
  std::atomic<int64_t>* p_ = nullptr;
  size_t n_ = 0;
};

// Free TCP port on 127.0.0.1 (bound then released; racy but fine for tests).
int FindFreePort();

// Environment variable helpers for the threads runner.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars);
  ~ScopedEnv();

 private:
  std::vector<std::pair<std::string, std::pair<bool, std::string>>> saved_;
};

// ---------------------------------------------------------------------------
// Collective checkers: run one collective on this rank with exact inputs and
// check the result against host-computed values (and the guard zones). Every
// rank of `comm` must call the same checker with the same arguments (except
// rank). Failures are gtest failures naming the case and the rank.

void CheckAllReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                    size_t count, bool inPlace);
void CheckReduceScatter(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op,
                        size_t recvcount, bool inPlace);
void CheckAllGather(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count,
                    bool inPlace);
// Reduce to `root`: only the root's recvbuff changes. In place, every rank
// passes sendbuff == recvbuff (non-roots' must stay as they were);
// nullRecvOnNonRoot: non-roots pass recvbuff = NULL (allowed).
void CheckReduce(attnComm_t comm, int rank, int n, attnDataType_t t, attnRedOp_t op, size_t count, int root,
                 bool inPlace, bool nullRecvOnNonRoot = false);
// nullSendOnNonRoot: non-root ranks pass sendbuff = NULL (allowed: it is read
// on the root only).
void CheckBroadcast(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count, int root,
                    bool inPlace, bool nullSendOnNonRoot = false);
void CheckAllToAll(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count);
// Uneven counts (some zero) scaled by `scale`, displacements with gaps, and
// receive blocks in reverse peer order; gaps must stay untouched.
void CheckAllToAllv(attnComm_t comm, int rank, int n, attnDataType_t t, size_t scale);
// `rounds` barriers; `counter` is shared by all ranks (threads: any atomic;
// processes: SharedCounters) and starts at 0.
void CheckBarrier(attnComm_t comm, int rank, int n, std::atomic<int64_t>& counter, int rounds);
// Group ring exchange: send to rank+1, receive from rank-1 (with self when n==1).
void CheckRingExchange(attnComm_t comm, int rank, int n, attnDataType_t t, size_t count);

// "attnSuccess"-style name of a result code (for messages).
const char* ResultName(attnResult_t r);
// What a dead or silent peer makes an operation return.
inline bool IsPeerFailure(attnResult_t r) { return r == attnRemoteError || r == attnTimeout; }
// ATTN_CONFIG_INITIALIZER with timeout_ms set.
inline attnConfig_t ConfigWithTimeout(int ms) {
  attnConfig_t cfg = ATTN_CONFIG_INITIALIZER;
  cfg.timeout_ms = ms;
  return cfg;
}
// A rank that takes no part (a silent peer): waits until `done` reaches
// `target`, then aborts its communicator (comm = nullptr).
void IdleUntilThenAbort(const std::atomic<int>& done, int target, attnComm_t& comm);
inline bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace attn_test

// Assert/expect that an attncomm call succeeds, printing the cause.
#define ATTN_ASSERT_OK(comm, call)                                                 \
  do {                                                                             \
    attnResult_t attn_t_r_ = (call);                                               \
    ASSERT_EQ(attn_t_r_, attnSuccess)                                              \
        << #call << " -> " << ::attn_test::ResultName(attn_t_r_) << ": "           \
        << attnGetLastError(comm);                                                 \
  } while (0)
#define ATTN_EXPECT_OK(comm, call)                                                 \
  do {                                                                             \
    attnResult_t attn_t_r_ = (call);                                               \
    EXPECT_EQ(attn_t_r_, attnSuccess)                                              \
        << #call << " -> " << ::attn_test::ResultName(attn_t_r_) << ": "           \
        << attnGetLastError(comm);                                                 \
  } while (0)
