// attnCommInitFromNccl: a device communicator over the engine's NCCL
// communicator. Rank 0 makes the attncomm unique id and sends it to every
// rank over NCCL itself (the NCCL backend, src/device/backends/nccl); then
// every rank joins as attnCommInitRankConfig does, and the communicator's
// collectives ride NCCL on the caller's stream. In builds without NCCL,
// ncclOpen (nccl_bridge.h) fails with attnNotSupported and says that the
// build has no NCCL.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "attncomm.h"
#include "src/core/api_guard.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/device/backends/nccl/nccl_bridge.h"

namespace attn {
namespace {

// The caller's config with the NCCL communicator's device.
attnResult_t configFor(const attnConfig_t* config, int device, attnConfig_t* cfg) {
  *cfg = ATTN_CONFIG_INITIALIZER;
  if (config) {
    ATTN_REQUIRE(config->magic == ATTN_CONFIG_MAGIC,
                 "attnConfig_t not initialised: start from ATTN_CONFIG_INITIALIZER");
    ATTN_REQUIRE(config->size >= offsetof(attnConfig_t, device) + sizeof(int),
                 "attnConfig_t size %zu is too small", config->size);
    // Fields the caller's (older) header lacks keep their defaults.
    std::memcpy(cfg, config, std::min(config->size, sizeof(*cfg)));
    cfg->size = sizeof(*cfg);
    if (config->device != ATTN_CONFIG_UNDEF_INT && config->device != device)
      return setError(attnInvalidArgument,
                      "config->device is %d but the NCCL communicator is on device %d", config->device,
                      device);
  }
  cfg->device = device;
  return attnSuccess;
}

attnResult_t initFromNccl(attnComm_t* comm, void* handle, const attnConfig_t* config) {
  ATTN_REQUIRE(comm != nullptr, "comm output pointer is NULL");
  *comm = nullptr;
  ATTN_REQUIRE(handle != nullptr, "nccl_comm is NULL (pass the application's ncclComm_t)");
  int rank = -1, nranks = 0, device = -1;
  // The broadcast needs the bridge's buffer: only a CUDA or NCCL failure
  // stops a rank before it. Any other failure is reported after the
  // broadcast, so no rank is left waiting inside NCCL; a rank that fails
  // after it leaves the others in the attncomm bootstrap, which times out
  // with a message.
  NcclBridgePtr bridge;
  ATTN_CHECK(ncclOpen(handle, &rank, &nranks, &device, &bridge));
  ErrorContext ctx("rank " + std::to_string(rank));
  attnConfig_t cfg;
  attnResult_t made = configFor(config, device, &cfg);
  std::string madeError = made == attnSuccess ? "" : threadLastError();
  char msg[kNcclIdMessageBytes] = {};
  if (rank == 0 && made == attnSuccess) {
    attnUniqueId id;
    made = attnGetUniqueId(&id);
    if (made == attnSuccess) {
      msg[0] = 1;
      std::memcpy(msg + 1, &id, sizeof(id));
    } else {
      madeError = threadLastError();
    }
  }
  ATTN_CHECK(ncclBroadcastIdMessage(bridge.get(), msg));
  if (made != attnSuccess) return restoreError(made, madeError);  // the saved text names the rank already
  if (msg[0] != 1) return setError(attnSystemError, "rank 0 could not create the attncomm unique id");
  attnUniqueId id;
  std::memcpy(&id, msg + 1, sizeof(id));
  const attnResult_t r = attnCommInitRankConfig(comm, nranks, id, rank, &cfg);
  if (r != attnSuccess && r != attnInProgress) return r;
  ncclAdopt(*comm, std::move(bridge));  // its device state is made by now, even when init goes on in the background
  return r;
}

}  // namespace

#if !ATTN_HAVE_CUDA
// Without the CUDA path the NCCL backend is not built; the communicator
// names the bridge's (always empty) pointer type all the same.
struct NcclBridge {};
void NcclBridgeDeleter::operator()(NcclBridge* b) const { delete b; }
#endif

}  // namespace attn

using attn::guardedEntry;

extern "C" attnResult_t attnCommInitFromNccl(attnComm_t* comm, void* nccl_comm, const attnConfig_t* config) {
  return guardedEntry([&]() -> attnResult_t {
    attn::ErrorContext ctx("-");
    attn::clearThreadLastError();
    return attn::initFromNccl(comm, nccl_comm, config);
  });
}
