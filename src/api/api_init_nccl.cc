// attnCommInitFromNccl in builds without NCCL (no CUDA, ATTN_ENABLE_NCCL=OFF,
// or NCCL not found): the symbol exists everywhere and says why it cannot
// work. The real one is src/device/nccl_comm.cc.
#include "attncomm.h"
#include "src/core/api_guard.h"
#include "src/core/error.h"

#if !ATTN_HAVE_NCCL
using attn::guardedEntry;

extern "C" attnResult_t attnCommInitFromNccl(attnComm_t* comm, void* nccl_comm, const attnConfig_t* config) {
  return guardedEntry([&]() -> attnResult_t {
    attn::ErrorContext ctx("-");
    attn::clearThreadLastError();
    if (comm == nullptr) return attn::setError(attnInvalidArgument, "comm output pointer is NULL");
    *comm = nullptr;
    if (nccl_comm == nullptr)
      return attn::setError(attnInvalidArgument, "nccl_comm is NULL (pass the application's ncclComm_t)");
    (void)config;
    return attn::setError(attnNotSupported,
                          "attnCommInitFromNccl: this build of attncomm has no NCCL (it needs CUDA and "
                          "NCCL at build time; see ATTN_ENABLE_NCCL)");
  });
}
#endif

#if !ATTN_HAVE_CUDA
// Without the CUDA path nccl_comm.cc is not built; a split names the
// bridge's (always empty) pointer type all the same.
#include "src/device/nccl_bridge.h"
namespace attn {
struct NcclBridge {};
void NcclBridgeDeleter::operator()(NcclBridge* b) const { delete b; }
}  // namespace attn
#endif
