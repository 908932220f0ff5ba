// Device communicators (config.device >= 0): how API entry points hand an
// operation on device buffers to the stream bridge (stream_bridge.h).
//
// The first version stages through pinned host memory: the proxy copies the
// inputs device-to-host on the library's stream, runs the same host-memory
// operation (the API entry point itself, re-entered on the proxy thread),
// and copies the outputs back. Everything stays ordered on the caller's
// stream and the caller's thread never blocks.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "attncomm.h"
#include "src/core/error.h"

struct attnComm;

namespace attn {

// A device (or host) buffer the operation reads (`in`) and/or writes
// (`out`). An output that the operation may leave partly untouched must also
// be an input, so the untouched part survives the round trip.
struct DeviceSpan {
  const void* ptr = nullptr;
  size_t bytes = 0;
  bool in = false;
  bool out = false;
};
// The host-memory operation, given one staged pointer per span (nullptr for
// empty spans).
using HostOp = std::function<attnResult_t(char* const* host)>;

#if ATTN_HAVE_CUDA
// comm is a device communicator and the caller is not its proxy thread.
bool deviceRoute(const attnComm* comm);
attnResult_t deviceEnqueue(attnComm* comm, attnStream_t stream, std::vector<DeviceSpan> spans,
                           HostOp op);
// Lifetime, called by the communicator (no-ops for host communicators).
attnResult_t deviceInit(attnComm* comm);
void deviceAbort(attnComm* comm);
void deviceFree(attnComm* comm);
bool deviceBusy(const attnComm* comm);
#else
inline bool deviceRoute(const attnComm*) { return false; }
inline attnResult_t deviceEnqueue(attnComm*, attnStream_t, std::vector<DeviceSpan>, HostOp) {
  return setError(attnNotSupported, "this build has no CUDA path");
}
inline attnResult_t deviceInit(attnComm*) { return attnSuccess; }
inline void deviceAbort(attnComm*) {}
inline void deviceFree(attnComm*) {}
inline bool deviceBusy(const attnComm*) { return false; }
#endif

}  // namespace attn
