// The ucx transport (UCX (RDMA where the NIC has it); built only with UCX): its factory, for
// tests that drive it directly, and its registration (src/core/transport.h).
#pragma once

#include <memory>

#include "src/core/transport.h"

namespace attn {

std::unique_ptr<Transport> createUcxTransport();
void registerUcxTransport();

}  // namespace attn
