#include "src/device/backends/cuda_ipc/ipc_state.h"

#include <cstring>

#include "src/core/comm.h"
#include "src/core/config.h"
#include "src/core/settings.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/backends/cuda_ipc/ipc_exchange.h"

namespace attn::ipc {

IpcState::IpcState(int device) : device_(device) {
  // Peer mappings kept open between operations, per communicator (>= 0).
  const int64_t limit = settingInt<Setting::kCudaIpcCache>();
  importer_ = std::make_unique<IpcImporter>(static_cast<size_t>(limit));
}

IpcState::~IpcState() {
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  importer_.reset();
  scratch_.reset(nullptr);  // stream-ordered: never waits for the device
  if (saved >= 0) (void)cudaSetDevice(saved);
}

attnResult_t IpcState::scratch(size_t bytes, cudaStream_t stream, void** out) {
  // Not cudaMalloc / cudaFree: the proxy runs this while its caller's stream
  // (and other ranks' on this GPU) wait for it, and those may wait for the
  // whole device.
  ATTN_CHECK(scratch_.reserve(bytes, stream));
  *out = scratch_.get();
  return attnSuccess;
}

void IpcState::noteStaged(int rank, const std::string& why) {
  if (loggedStaged_) return;
  loggedStaged_ = true;
  ATTN_INFO(kLogNet, "cuda_ipc: an operation runs staged through host memory (rank %d: %s); "
            "later ones that cannot be served are not logged", rank, why.c_str());
}

attnResult_t IpcState::reachOne(const AgreeCard& mine, const AgreeCard& theirs, int rank,
                                IpcPeer* peer, bool* ok, std::string* why) {
  *peer = IpcPeer{};
  *ok = true;
  peer->sameProcess = theirs.process == mine.process;
  // The peer's GPU as an ordinal of this process.
  int local = -1;
  if (peer->sameProcess) {
    local = theirs.device;
  } else if (std::memcmp(theirs.uuid, mine.uuid, sizeof(mine.uuid)) == 0) {
    local = device_;
  } else {
    int visible = 0;
    ATTN_CUDA_CHECK(cudaGetDeviceCount(&visible));
    for (int d = 0; d < visible && local < 0; ++d) {
      cudaDeviceProp prop;
      ATTN_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
      if (std::memcmp(&prop.uuid, theirs.uuid, sizeof(theirs.uuid)) == 0) local = d;
    }
  }
  if (local == device_) {
    peer->directRead = true;
    return attnSuccess;
  }
  if (local < 0) {
    // cudaIpcOpenMemHandle might still map it, but peer access cannot be
    // checked from here: do not promise what may fail mid-operation.
    *ok = false;
    *why = "rank " + std::to_string(rank) + "'s GPU is not visible in this process (CUDA_VISIBLE_DEVICES)";
    return attnSuccess;
  }
  int can = 0;
  ATTN_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, local));
  if (peer->sameProcess) {
    // Copies between devices of one process always work (through the host
    // without peer access); kernels read the peer's memory only with it.
    if (can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(local, 0);
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) peer->directRead = true;
      if (e != cudaSuccess) (void)cudaGetLastError();
    }
  } else if (can) {
    peer->directRead = true;  // cudaIpcMemLazyEnablePeerAccess enables it at open
  } else {
    *ok = false;
    *why = "no peer access between this rank's GPU " + std::to_string(device_) + " and rank " +
           std::to_string(rank) + "'s GPU " + std::to_string(local) + " (another process)";
  }
  return attnSuccess;
}

attnResult_t IpcState::reachPeers(attnComm* comm, const std::vector<AgreeCard>& cards, bool* ok,
                                  std::string* why) {
  const int me = comm->rank, n = comm->nranks;
  peers_.assign(n, IpcPeer{});
  peers_[me] = IpcPeer{true, true};
  *ok = true;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    bool reached = true;
    std::string whyNot;
    ATTN_CHECK(reachOne(cards[me], cards[p], p, &peers_[p], &reached, &whyNot));
    if (!peers_[p].sameProcess) needHandles_ = true;
    if (!reached) {
      *ok = false;
      *why = whyNot;
    }
  }
  return attnSuccess;
}

AgreeCard IpcState::card(const attnComm* comm, std::string* why) const {
  AgreeCard mine;
  mine.process = processToken();
  mine.wants = (comm->config.transports & kTransportCudaIpc) ? 1 : 0;
  mine.device = device_;
  // A failure to look at the device makes this rank say no, never leave
  // the others waiting in an exchange.
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
    std::memcpy(mine.uuid, &prop.uuid, sizeof(mine.uuid));
  } else {
    (void)cudaGetLastError();
    mine.wants = 0;
    *why = "cudaGetDeviceProperties failed";
  }
  return mine;
}

attnResult_t IpcState::agree(attnComm* comm) {
  if (state_ != kUndecided) return attnSuccess;
  Engine& e = *comm->engine;
  const int me = comm->rank, n = comm->nranks;
  bool ok = false;
  std::string why;
  const AgreeCard mine = card(comm, &why);
  std::vector<AgreeCard> cards;
  ATTN_CHECK(allGatherRecord(e, mine, &cards));
  if (mine.wants) {
    if (reachPeers(comm, cards, &ok, &why) != attnSuccess) {
      ok = false;
      why = threadLastError();
    }
  }
  std::vector<int32_t> oks;
  ATTN_CHECK(allGatherRecord(e, int32_t(ok ? 1 : 0), &oks));
  int noWant = -1, noReach = -1, processes = 0;
  for (int r = 0; r < n; ++r) {
    if (!cards[r].wants && noWant < 0) noWant = r;
    if (!oks[r] && noReach < 0) noReach = r;
    bool first = true;
    for (int q = 0; q < r; ++q) first = first && cards[q].process != cards[r].process;
    processes += first;
  }
  state_ = noWant < 0 && noReach < 0 ? kOn : kOff;
  if (state_ == kOn) {
    ATTN_INFO(kLogNet, "device communicator: cuda_ipc backend, %d ranks in %d process(es) on this host; "
              "device buffers move GPU to GPU", n, processes);
  } else if (noWant >= 0) {
    ATTN_INFO(kLogNet, "device communicator: staging backend (rank %d does not allow cuda_ipc%s%s)",
              noWant, noWant == me && !why.empty() ? ": " : "", noWant == me ? why.c_str() : "");
  } else {
    ATTN_INFO(kLogNet, "device communicator: staging backend (rank %d cannot reach a peer's GPU%s%s)",
              noReach, noReach == me ? ": " : "", noReach == me ? why.c_str() : "");
  }
  return attnSuccess;
}

}  // namespace attn::ipc
