// The list of device backends and the interface's defaults.
#include <array>
#include <cstring>

#include "src/core/error.h"
#include "src/device/backends/device_backend.h"

namespace attn {

attnResult_t DeviceBackend::enqueue(attnComm*, attnStream_t, DeviceOp& op) const {
  return setError(attnInternalError, "device backend %s does not run %s on the caller's stream", name(),
                  deviceOpName(op.kind));
}

attnResult_t DeviceBackend::run(attnComm*, DeviceState&, const DeviceOp& op, cudaStream_t, bool*) const {
  return setError(attnInternalError, "device backend %s does not run %s on the proxy thread", name(),
                  deviceOpName(op.kind));
}

std::span<const DeviceBackend* const> deviceBackends() {
  // Most specific first; staging takes whatever the others leave.
  static const std::array<const DeviceBackend*, 4> all = {&ncclBackend(), &cudaIpcBackend(), &directBackend(),
                                                          &stagingBackend()};
  return all;
}

const DeviceBackend* findDeviceBackend(const char* name) {
  for (const DeviceBackend* b : deviceBackends())
    if (std::strcmp(b->name(), name) == 0) return b;
  return nullptr;
}

}  // namespace attn
