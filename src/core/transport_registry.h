// The transports this library was built with, by name. Each transport
// registers itself (registerTransport, src/core/transport.h); the build's
// generated builtin_transports.cc calls every registration once, on the
// first lookup, so src/ names no transport and no transport header.
#pragma once

#include "src/core/transport.h"

namespace attn {

// The factory registered under `name` ("tcp", "shm", "ucx"), or nullptr when
// this build has no such transport.
TransportMaker findTransport(const char* name);

// Defined in the build's generated builtin_transports.cc: calls the
// register<Name>Transport() of every transport compiled in.
void registerBuiltinTransports();

}  // namespace attn
