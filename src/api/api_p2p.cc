// C API: point-to-point send and receive. Outside a group each call posts one
// operation and waits for it; inside a group the operation is queued and the
// group runs them all together (src/api/api_group.cc).
#include "src/core/api_call.h"
#include "src/core/datatype.h"
#include "src/device/device_group.h"
#include "src/device/device_route.h"

using namespace attn;

namespace {

attnResult_t p2p(bool isSend, void* buf, size_t count, attnDataType_t type, int peer,
                 attnComm* comm, attnStream_t stream) {
  ApiCall call(comm);
  const char* what = isSend ? "send" : "receive";
  ATTN_CHECK(call.finish(call.check()));
  if (!validDataType(type)) return call.finish(setError(attnInvalidArgument, "invalid datatype %d", (int)type));
  if (stream != nullptr && !deviceRoute(comm))
    return call.finish(setError(attnInvalidArgument, "a host-memory communicator takes a NULL stream"));
  if (peer < 0 || peer >= comm->nranks)
    return call.finish(setError(attnInvalidArgument, "%s: peer %d is outside [0, %d)", what, peer, comm->nranks));
  if (count > 0 && buf == nullptr)
    return call.finish(setError(attnInvalidArgument, "%s: buffer is NULL with count %zu", what, count));
  size_t bytes;
  if (__builtin_mul_overflow(count, dataTypeSize(type), &bytes) || bytes > (size_t(1) << 56))
    return call.finish(setError(attnInvalidArgument, "%s: count %zu is too large", what, count));
  P2pOp op{isSend, peer, buf, bytes, stream};
  if (deviceRoute(comm)) {
    // Device communicators: a group's operations become one device operation
    // at attnGroupEnd; a lone one is a group of one (device_group.h).
    if (inGroup()) {
      groupAddDeviceP2p(comm, op);
      return attnSuccess;
    }
    if (peer == comm->rank)
      return call.finish(setError(attnInvalidUsage,
                                  "%s to self outside a group would never match; use attnGroupStart", what));
    StreamJoin none;  // one stream: nothing to join
    return call.finish(deviceP2pGroup(comm, {op}, &none));
  }
  if (inGroup()) {
    groupAddP2p(comm, op);
    return attnSuccess;
  }
  if (peer == comm->rank)
    return call.finish(setError(attnInvalidUsage,
                                "%s to self outside a group would never match; use attnGroupStart", what));
  // A lone operation is a group of one.
  attnGroupStart();
  groupAddP2p(comm, op);
  return call.finish(attnGroupEnd());
}

}  // namespace

extern "C" attnResult_t attnSend(const void* sendbuff, size_t count, attnDataType_t datatype,
                                 int peer, attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    return p2p(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
  });
}

extern "C" attnResult_t attnRecv(void* recvbuff, size_t count, attnDataType_t datatype, int peer,
                                 attnComm_t comm, attnStream_t stream) {
  return guardedEntry([&]() -> attnResult_t {
    return p2p(false, recvbuff, count, datatype, peer, comm, stream);
  });
}
