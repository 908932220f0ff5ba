#include "src/core/transport.h"

#include "src/core/error.h"

namespace attn {

// Callers ask takesDeviceMemory() first: reaching these is a bug.
attnResult_t Connection::postDeviceSend(const void*, size_t, Request* req) {
  req->fail(attnInternalError, "device-memory send on a transport that takes only host memory");
  return setError(attnInternalError, "device-memory send to peer %d on a transport that takes only host memory",
                  peer());
}

attnResult_t Connection::postDeviceRecv(void*, size_t, Request* req) {
  req->fail(attnInternalError, "device-memory receive on a transport that takes only host memory");
  return setError(attnInternalError,
                  "device-memory receive from peer %d on a transport that takes only host memory", peer());
}

}  // namespace attn
