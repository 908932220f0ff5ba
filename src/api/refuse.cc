#include "src/api/refuse.h"

#include <string>

#include "src/core/api_call.h"
#include "src/device/device_route.h"

namespace attn {

attnResult_t refuseCollective(attnComm* comm, attnStream_t stream, CollKind kind, attnResult_t status) {
  if (!comm->config.checkSignatures || comm->nranks == 1) return status;
  const std::string why = threadLastError();
  CollSignature sig;
  sig.kind = static_cast<uint32_t>(kind);
  sig.status = status;
  if (deviceRoute(comm))
    (void)deviceRefuse(comm, stream, sig);
  else
    (void)dispatch(comm, "refused collective", [comm, sig] { return sendRefusedSignature(comm, sig); });
  return restoreError(status, why);  // the exchange may have set a text of its own
}

}  // namespace attn
