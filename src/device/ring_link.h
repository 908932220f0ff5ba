// How the blocks of device ring attention reach the next rank, decided by
// every rank together on a communicator's first attention call:
//  - direct, when the cuda_ipc backend serves the communicator (every rank
//    on this host and able to reach every peer's GPU) and every rank can
//    count its reads in its previous rank's control word: the next rank
//    copies each block out of this rank's device buffer, by address when it
//    is a thread of this process, through CUDA IPC handles when it is
//    another process;
//  - via the transport, when not direct but every rank's transport to its
//    neighbours takes device memory (UCX built with CUDA): the device
//    block goes to the transport as it is (transport_direct.h);
//  - staged otherwise, through pinned host memory and the host transport.
// The control word is host memory shared with the next rank (a memfd it
// maps through /proc/<pid>/fd when it is another process): how many blocks
// it has copied out of this rank's buffers, ever. A rank overwrites a
// buffer only after its reader has counted the read (device_ring.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "attncomm.h"
#include "src/core/process_watch.h"

struct attnComm;

namespace attn {

namespace ipc {
class IpcState;
}

struct alignas(64) RingControl {
  std::atomic<uint64_t> reads{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the control word is shared between processes");

class RingLink {
 public:
  RingLink() = default;
  ~RingLink();  // unmaps the previous rank's word, frees this rank's
  RingLink(const RingLink&) = delete;
  RingLink& operator=(const RingLink&) = delete;

  // Collective over the communicator, on its first attention call (after
  // ipc.agree); later calls return at once. Logs the choice once.
  attnResult_t agree(attnComm* comm, ipc::IpcState& ipc);
  bool direct() const { return direct_; }
  bool viaTransport() const { return viaTransport_; }
  ipc::IpcState& ipc() const { return *ipc_; }
  // The neighbour is another process: blocks move through IPC handles, and
  // buffers it reads must be exportable.
  bool prevByHandle() const { return prevByHandle_; }
  bool nextByHandle() const { return nextByHandle_; }
  // This rank's word (the next rank adds to it) and the previous rank's
  // (this rank adds to it).
  std::atomic<uint64_t>& reads() { return mine_->reads; }
  std::atomic<uint64_t>& prevReads() { return prev_->reads; }
  // False once the next rank's process has exited (always true when it is
  // a thread of this one): a rank waiting for its reads has no socket to
  // tell it. Cheap; rate-limited.
  bool nextAlive() { return nextWatch_.alive(); }
  long nextPid() const { return static_cast<long>(nextWatch_.pid()); }

 private:
  // The part of agree() that decides viaTransport.
  attnResult_t agreeTransport(attnComm* comm);

  bool decided_ = false;
  bool direct_ = false;
  bool viaTransport_ = false;
  bool prevByHandle_ = false, nextByHandle_ = false;
  ipc::IpcState* ipc_ = nullptr;
  RingControl* mine_ = nullptr;  // shareableAlloc'd
  RingControl* prev_ = nullptr;  // the previous rank's, in this address space
  void* prevMap_ = nullptr;      // its mapping here when it is another process
  size_t prevMapBytes_ = 0;
  ProcessWatch nextWatch_;
};

}  // namespace attn
