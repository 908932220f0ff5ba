#include "src/core/proxy_thread.h"

namespace attn {
namespace {
thread_local bool tlsOnProxy = false;
}  // namespace

bool onDeviceProxyThread() { return tlsOnProxy; }
void markDeviceProxyThread() { tlsOnProxy = true; }

}  // namespace attn
