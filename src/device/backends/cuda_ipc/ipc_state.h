// Per-communicator state of the cuda_ipc backend: whether it serves the
// communicator (agreed by every rank once), where each peer is (same
// process or not, direct device reads or not), the export and import
// caches and the device scratch of reductions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/device/device_buffer.h"
#include "src/device/backends/staging/pinned_arena.h"
#include "src/device/backends/staging/stage_pipeline.h"
#include "src/device/backends/cuda_ipc/ipc_handles.h"

struct attnComm;

namespace attn::ipc {

// What each rank tells the others once, when they agree on the backend.
struct AgreeCard {
  uint64_t process = 0;      // processToken()
  int32_t wants = 0;         // cuda_ipc allowed by this rank's ATTN_TRANSPORT / config
  int32_t device = -1;       // CUDA ordinal in its process
  unsigned char uuid[16] = {};  // the GPU, comparable across processes
};

struct IpcPeer {
  bool sameProcess = false;  // its buffers' addresses are valid here
  bool directRead = false;   // kernels on this rank's device may read its buffers
};

class IpcState {
 public:
  // `device`: the communicator's CUDA device. Reads ATTN_CUDA_IPC_CACHE.
  explicit IpcState(int device);
  ~IpcState();  // closes the mappings and frees the scratch on `device`
  IpcState(const IpcState&) = delete;
  IpcState& operator=(const IpcState&) = delete;

  // Collective over the communicator, run by the first operation routed
  // here (on every rank the same one): decides with every rank whether
  // this backend serves the communicator. Logs the choice once.
  attnResult_t agree(attnComm* comm);
  bool enabled() const { return state_ == kOn; }
  // This rank's card (its text in *why when it cannot take part).
  AgreeCard card(const attnComm* comm, std::string* why) const;
  // Whether this rank reaches the buffers of `rank`, whose card is
  // `theirs`: *ok, the way (*peer), or why not. Enables peer access
  // between devices of this process where CUDA allows it.
  attnResult_t reachOne(const AgreeCard& mine, const AgreeCard& theirs, int rank, IpcPeer* peer,
                        bool* ok, std::string* why);

  int device() const { return device_; }
  const IpcPeer& peer(int r) const { return peers_[r]; }
  // Some peer is in another process: buffers need handles.
  bool needHandles() const { return needHandles_; }
  IpcExporter& exporter() { return exporter_; }
  IpcImporter& importer() { return *importer_; }
  // Device memory of at least `bytes` on device(), grown as needed in
  // stream order on `stream` (the proxy's copy stream, its only user).
  attnResult_t scratch(size_t bytes, cudaStream_t stream, void** out);
  // Pinned staging of grouped sends and receives that cannot be pulled
  // (ipc_p2p.cc, src/device/backends/staging/staged_p2p.h), and the events of its slices.
  PinnedArena& p2pStage() { return p2pStage_; }
  SliceEvents& p2pSliceEvents() { return p2pSliceEvents_; }
  // An operation ran staged because a buffer could not be served: logged
  // the first time per communicator.
  void noteStaged(int rank, const std::string& why);

 private:
  enum State { kUndecided, kOn, kOff };
  // Whether this rank can reach every peer's buffers; fills peers_.
  attnResult_t reachPeers(attnComm* comm, const std::vector<AgreeCard>& cards, bool* ok,
                          std::string* why);

  int device_;
  State state_ = kUndecided;
  std::vector<IpcPeer> peers_;
  bool needHandles_ = false;
  bool loggedStaged_ = false;
  IpcExporter exporter_;
  std::unique_ptr<IpcImporter> importer_;
  DeviceBuffer scratch_;
  PinnedArena p2pStage_;
  SliceEvents p2pSliceEvents_;
};

}  // namespace attn::ipc
