// NCCL emulated on the emulated CUDA runtime (see ../README.md, "NCCL"):
// the state shared by the communicator calls (emu_nccl_comm.cc) and the
// operations (emu_nccl_ops.cc). Ranks are threads of one process; each
// operation runs on its stream's thread and meets its peers' there, so a
// rank's stream blocks until the peers arrive, as an NCCL kernel does.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace attn_emu::nccl {

// One communicator's ranks: where their operations meet.
struct Clique {
  explicit Clique(int n) : nranks(n), gone(size_t(n), false) {}
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> gone;     // ranks that aborted: their peers' waits fail
  std::string abortedBy;      // set by NCCL_SHRINK_ABORT: every wait fails

  // A collective of issue number `seq`: each rank's call and buffers.
  struct Call {
    int kind = -1;  // Kind below
    size_t count = 0;
    ncclDataType_t type = ncclInt8;
    ncclRedOp_t op = ncclSum;
    int root = 0;
  };
  struct CollSlot {
    std::vector<Call> calls;
    std::vector<const void*> send;
    std::vector<void*> recv;
    int arrived = 0, computed = 0, left = 0;
    std::string mismatch;  // first disagreement between the ranks' calls
  };
  std::map<uint64_t, CollSlot> colls;

  // A send of issue number seq from one rank to another, until received.
  struct SendPost {
    const void* buf;
    size_t bytes;
    bool taken = false;
  };
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<SendPost>> sends;

  // ncclCommSplit / ncclCommShrink of issue number seq: who came, with what.
  struct MgmtSlot {
    std::vector<int> color, key;  // per parent rank (split); color -2: not arrived
    std::vector<int> excluded;    // shrink: the first caller's list
    int arrived = 0, expected = 0, left = 0;
    bool built = false;
    std::string mismatch;
    std::map<int, std::pair<std::shared_ptr<Clique>, std::vector<int>>> children;  // color -> members
  };
  std::map<uint64_t, MgmtSlot> mgmt;

  // Why a wait that involves `ranks` cannot finish ("" while it can).
  std::string broken(const std::vector<int>& ranks) const;
};

// What one rank of a communicator keeps. Operations queued on streams hold
// it too, so ncclCommDestroy does not pull it from under them.
struct RankState {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  // Issue order, as NCCL matches operations: collectives, management calls,
  // and sends / receives per peer.
  uint64_t collSeq = 0, mgmtSeq = 0;
  std::vector<uint64_t> sendSeq, recvSeq;
  std::atomic<int> asyncError{ncclSuccess};
  std::mutex textMu;
  std::string asyncText;
  // The first failure of an operation on a stream: kept, and answered by
  // ncclCommGetAsyncError from then on.
  void failAsync(ncclResult_t r, const std::string& why);
};

std::vector<int> everyRank(int n);  // 0 .. n-1
std::shared_ptr<RankState> makeRank(std::shared_ptr<Clique> clique, int rank, int device);

// The thread's last error text (ncclGetLastError) and its code.
ncclResult_t fail(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

enum Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kKinds };

}  // namespace attn_emu::nccl

// The handle an application holds.
struct ncclComm {
  std::shared_ptr<attn_emu::nccl::RankState> st;
};
