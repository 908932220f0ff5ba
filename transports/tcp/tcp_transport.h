// The tcp transport (TCP sockets between any two ranks): its factory, for
// tests that drive it directly, and its registration (src/core/transport.h).
#pragma once

#include <memory>

#include "src/core/transport.h"

namespace attn {

std::unique_ptr<Transport> createTcpTransport();
void registerTcpTransport();

}  // namespace attn
