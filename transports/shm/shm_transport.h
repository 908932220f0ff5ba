// The shm transport (shared memory between ranks of one host): its factory, for
// tests that drive it directly, and its registration (src/core/transport.h).
#pragma once

#include <memory>

#include "src/core/transport.h"

namespace attn {

std::unique_ptr<Transport> createShmTransport();
void registerShmTransport();

}  // namespace attn
