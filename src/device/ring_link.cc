#include "src/device/ring_link.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/shareable_memory.h"
#include "src/device/backends/cuda_ipc/ipc_exchange.h"
#include "src/device/backends/cuda_ipc/ipc_state.h"

namespace attn {
namespace {

// Where a rank's control word is, for the next rank.
struct ControlCard {
  int64_t holder = 0;    // the process whose descriptor table holds fd
  int64_t ownerPid = 0;  // the region's name: attn-mem-<ownerPid>-<serial>
  uint64_t serial = 0;
  uint64_t bytes = 0;
  uint64_t addr = 0;    // in the holder's address space
  uint64_t offset = 0;  // of the word in the region
  int32_t fd = -1;    // -1: no memfd, only threads of this process can share it
  int32_t pad = 0;
};

// How often a rank waiting on its next rank's reads looks whether that
// process still exists.
constexpr int kNextWatchMs = 20;

}  // namespace

RingLink::~RingLink() {
  if (prevMap_) munmap(prevMap_, prevMapBytes_);
  if (mine_) (void)shareableFree(mine_);
}

attnResult_t RingLink::agree(attnComm* comm, ipc::IpcState& ipc) {
  if (decided_) return attnSuccess;
  ipc_ = &ipc;
  const int n = comm->nranks, me = comm->rank;
  const int prev = (me - 1 + n) % n, next = (me + 1) % n;
  // The cuda_ipc agreement is the same on every rank: off means staged
  // everywhere, with nothing to exchange.
  if (n < 2) {
    decided_ = true;
    return attnSuccess;
  }
  if (!ipc.enabled()) return agreeTransport(comm);
  prevByHandle_ = !ipc.peer(prev).sameProcess;
  nextByHandle_ = !ipc.peer(next).sameProcess;
  bool ok = true;
  std::string why;
  ControlCard mine;
  mine.holder = getpid();
  if (!mine_) {
    void* p = nullptr;
    if (shareableAlloc(sizeof(RingControl), &p) == attnSuccess) {
      mine_ = new (p) RingControl;
    } else {
      ok = false;
      why = threadLastError();
    }
  }
  ShareableRegion region;
  if (mine_ && findShareable(mine_, sizeof(RingControl), &region)) {
    mine.ownerPid = region.ownerPid;
    mine.serial = region.serial;
    mine.bytes = region.bytes;
    mine.addr = reinterpret_cast<uint64_t>(mine_);
    mine.offset = mine.addr - region.base;
    mine.fd = region.fd;
  }
  std::vector<ControlCard> cards;
  ATTN_CHECK(ipc::allGatherRecord(*comm->engine, mine, &cards));
  const ControlCard& theirs = cards[prev];
  if (nextByHandle_) nextWatch_.watch(static_cast<pid_t>(cards[next].holder), kNextWatchMs);
  if (ok && !prevByHandle_) {
    prev_ = reinterpret_cast<RingControl*>(theirs.addr);
    ok = prev_ != nullptr;
    if (!ok) why = "rank " + std::to_string(prev) + " has no control word";
  } else if (ok && theirs.fd < 0) {
    ok = false;
    why = "rank " + std::to_string(prev) + " could not make its control word shareable (no memfd)";
  } else if (ok) {
    ShareableRegion r;
    r.ownerPid = theirs.ownerPid;
    r.fd = theirs.fd;
    r.serial = theirs.serial;
    int err = 0;
    if (theirs.offset + sizeof(RingControl) <= theirs.bytes)
      prevMap_ = mapPeerShareable(theirs.holder, r, theirs.bytes, /*writable=*/true, /*populate=*/false, &why, &err);
    if (prevMap_) {
      prevMapBytes_ = theirs.bytes;
      prev_ = reinterpret_cast<RingControl*>(static_cast<char*>(prevMap_) + theirs.offset);
    } else {
      ok = false;
    }
  }
  std::vector<int32_t> oks;
  ATTN_CHECK(ipc::allGatherRecord(*comm->engine, int32_t(ok ? 1 : 0), &oks));
  int refused = -1;
  for (int r = 0; r < n && refused < 0; ++r)
    if (!oks[r]) refused = r;
  direct_ = refused < 0;
  if (direct_) {
    decided_ = true;
    ATTN_INFO(kLogAttn, "device ring attention: blocks move GPU to GPU (next rank %d %s)", next,
              nextByHandle_ ? "in another process, through CUDA IPC handles" : "in this process, by address");
    return attnSuccess;
  }
  ATTN_INFO(kLogAttn, "device ring attention: no peer copies (rank %d cannot count its reads in its previous "
            "rank's control word%s%s)", refused, refused == me ? ": " : "", refused == me ? why.c_str() : "");
  return agreeTransport(comm);
}

attnResult_t RingLink::agreeTransport(attnComm* comm) {
  Engine& e = *comm->engine;
  const int n = comm->nranks, me = comm->rank;
  const int prev = (me - 1 + n) % n, next = (me + 1) % n;
  const bool mine = e.takesDeviceMemory(prev) && e.takesDeviceMemory(next);
  std::vector<int32_t> all;
  ATTN_CHECK(ipc::allGatherRecord(e, int32_t(mine ? 1 : 0), &all));
  int refused = -1;
  for (int r = 0; r < n && refused < 0; ++r)
    if (!all[r]) refused = r;
  viaTransport_ = refused < 0;
  decided_ = true;
  if (viaTransport_)
    ATTN_INFO(kLogAttn, "device ring attention: blocks handed to the transport as device memory (%s)",
              e.transportName(next));
  else
    ATTN_INFO(kLogAttn, "device ring attention: blocks staged through pinned host memory (rank %d's transport "
              "takes host memory only)", refused);
  return attnSuccess;
}

}  // namespace attn
