// The direct backend as the route sees it (transport_direct.h): the
// collectives with device buffers handed to transports that take device
// memory; declined, on every rank alike, where some connection does not.
#include <memory>

#include "src/core/comm.h"
#include "src/device/backends/device_backend.h"
#include "src/device/backends/direct/transport_direct.h"
#include "src/device/device_state.h"

namespace attn {
namespace {

class DirectBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "direct"; }
  BackendCaps caps() const override { return {false, true, true, kCollectiveKinds}; }
  bool takes(const attnComm*, const DeviceOp& op) const override { return TransportDirect::implements(op.kind); }

  attnResult_t run(attnComm* comm, DeviceState& st, const DeviceOp& op, cudaStream_t copy,
                   bool* declined) const override {
    if (!st.direct) st.direct = std::make_unique<TransportDirect>(comm->config.device);
    ATTN_CHECK(st.direct->agree(comm));
    *declined = !st.direct->enabled();
    return *declined ? attnSuccess : st.direct->run(comm, op, copy);
  }
};

}  // namespace

const DeviceBackend& directBackend() {
  static const DirectBackend b;
  return b;
}

}  // namespace attn
