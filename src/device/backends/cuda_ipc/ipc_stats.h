// Counters of the cuda_ipc backend, process-wide (every communicator of the
// process adds to them). Tests read them to see which backend ran and that
// repeated calls on the same buffers reuse opened handles. Plain C++: no
// CUDA header needed to read them.
#pragma once

#include <atomic>
#include <cstdint>

namespace attn::ipc {

struct IpcCounters {
  std::atomic<uint64_t> ops{0};          // operations run GPU-to-GPU
  std::atomic<uint64_t> stagedOps{0};    // routed here but run over the host transports (staged or direct)
  std::atomic<uint64_t> opens{0};        // cudaIpcOpenMemHandle calls (cache misses)
  std::atomic<uint64_t> openHits{0};     // peer buffers found already open
  std::atomic<uint64_t> closes{0};       // cudaIpcCloseMemHandle calls
  std::atomic<uint64_t> exports{0};      // cudaIpcGetMemHandle calls (cache misses)
  std::atomic<uint64_t> exportHits{0};   // own buffers found already exported
  std::atomic<uint64_t> p2pGroups{0};    // send/recv groups run by ipc_p2p
  std::atomic<uint64_t> p2pPulls{0};     // receives copied GPU to GPU
  std::atomic<uint64_t> p2pViaHost{0};   // sends and receives moved through pinned host memory
  std::atomic<uint64_t> ringPulls{0};    // ring-attention blocks copied device to device (src/device)
  std::atomic<uint64_t> ringOpens{0};    // a neighbour's ring buffer opened from its handle (once per call)
  std::atomic<uint64_t> ringCloses{0};   // and closed again
};

IpcCounters& ipcCounters();

}  // namespace attn::ipc
