// Export and import of device buffers between the ranks of one host.
//
// A rank describes a buffer (IpcBuffer) by its address in its own process
// and, when some peer runs in another process, by the cudaIpcMemHandle_t of
// the allocation holding it. A peer in the same process uses the address
// directly (unified addressing; CUDA refuses to open a handle in the process
// that made it); a peer in another process opens the handle once and keeps
// the mapping (IpcImporter), keyed by the handle's bytes and not by the
// address: a freed and re-allocated buffer can come back at the same address
// with a new handle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "attncomm.h"

namespace attn::ipc {

// A buffer as its owner describes it to peers (sent as raw bytes).
struct IpcBuffer {
  cudaIpcMemHandle_t handle;  // of the allocation (hasHandle)
  uint64_t base = 0;          // allocation start, owner's address space
  uint64_t ptr = 0;           // the buffer, owner's address space
  uint64_t bytes = 0;         // extent peers may read from ptr
  int32_t hasHandle = 0;
  int32_t usable = 0;         // device memory this backend can serve
};
static_assert(std::is_trivially_copyable_v<IpcBuffer>);

// Identifies this process among the ranks of a host (pids can repeat
// across containers; the value is redrawn in a forked child).
uint64_t processToken();

// Describes this process's buffers for peers. Exported handles are cached
// by the allocation's buffer id, which CUDA never reuses in a process.
class IpcExporter {
 public:
  // Fills *out for [ptr, ptr + bytes). Not usable (out->usable = 0, *why
  // says why; still attnSuccess) when the memory is not plain device memory
  // on `device`, or (needHandle: a peer is in another process) cannot be
  // exported. An empty buffer is usable and needs nothing.
  attnResult_t describe(const void* ptr, size_t bytes, int device, bool needHandle,
                        IpcBuffer* out, std::string* why);

 private:
  struct Exported {
    cudaIpcMemHandle_t handle;
    uint64_t base;
  };
  std::unordered_map<uint64_t, Exported> byBufferId_;
};

// Peers' buffers opened in this process (the current device's context).
class IpcImporter {
 public:
  // limit: mappings kept open between operations (0: closed after each).
  explicit IpcImporter(size_t limit) : limit_(limit) {}
  ~IpcImporter();  // closes every mapping (caller makes the device current)
  IpcImporter(const IpcImporter&) = delete;
  IpcImporter& operator=(const IpcImporter&) = delete;

  // Starts an operation: mappings used from now on are not evicted until
  // endOp.
  void beginOp() { ++epoch_; }
  // After the operation's copies completed: trims the cache to the limit.
  void endOp();
  // A pointer in this process to `buf.ptr` of `peer`. sameProcess: the
  // address itself.
  attnResult_t map(int peer, bool sameProcess, const IpcBuffer& buf, const char** out);
  size_t openCount() const { return open_.size(); }

 private:
  struct Key {
    int peer;
    unsigned char handle[sizeof(cudaIpcMemHandle_t)];
    bool operator<(const Key& o) const {
      if (peer != o.peer) return peer < o.peer;
      return std::memcmp(handle, o.handle, sizeof(handle)) < 0;
    }
  };
  struct Mapping {
    void* base;
    uint64_t lastUse;
  };
  void closeOne(std::map<Key, Mapping>::iterator it);

  size_t limit_;
  uint64_t epoch_ = 0;
  std::map<Key, Mapping> open_;
};

}  // namespace attn::ipc
