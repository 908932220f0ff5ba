// Whether the calling thread is a device communicator's proxy (the stream
// bridge's thread, src/device/stream_bridge.cc, marks itself when it
// starts). On the ground floor because the front door's handle check
// (src/core/api_call.cc) asks it for every call, and src/core includes
// nothing above it.
#pragma once

namespace attn {

bool onDeviceProxyThread();
// Called once by a proxy thread on itself.
void markDeviceProxyThread();

}  // namespace attn
