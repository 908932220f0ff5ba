#include "src/device/backends/direct/transport_direct.h"

#include <algorithm>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/settings.h"
#include "src/core/log.h"
#include "src/device/backends/cuda_ipc/ipc_exchange.h"

namespace attn {

DirectCounters& directCounters() {
  static DirectCounters c;
  return c;
}

namespace {
constexpr int64_t kDefaultScratch = int64_t(64) << 20;
}  // namespace

TransportDirect::TransportDirect(int device)
    : device_(device), scratchBudget_(size_t(settingInt<Setting::kDeviceDirectScratch>())) {}  // >= 1
static_assert(settingDefault(Setting::kDeviceDirectScratch) == kDefaultScratch);

TransportDirect::~TransportDirect() {
  if (!scratch_.get()) return;
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  if (saved != device_) (void)cudaSetDevice(device_);
  scratch_.reset(nullptr);  // stream-ordered: never waits for the device
  if (saved >= 0 && saved != device_) (void)cudaSetDevice(saved);
}

bool TransportDirect::implements(DeviceOpKind kind) { return isCollective(kind); }

attnResult_t TransportDirect::agree(attnComm* comm) {
  if (decided_) return attnSuccess;
  Engine& e = *comm->engine;
  const int me = comm->rank, n = comm->nranks;
  int without = -1;  // a peer whose connection takes host memory only
  for (int p = 0; p < n && without < 0; ++p)
    if (p != me && !e.takesDeviceMemory(p)) without = p;
  const int32_t mine = n > 1 && without < 0 ? 1 : 0;
  std::vector<int32_t> all;
  ATTN_CHECK(ipc::allGatherRecord(e, mine, &all));
  int refused = -1;
  for (int r = 0; r < n && refused < 0; ++r)
    if (!all[r]) refused = r;
  enabled_ = n > 1 && refused < 0;
  decided_ = true;
  if (enabled_) {
    ATTN_INFO(kLogNet, "device collectives: buffers handed to the transport as device memory (%s)",
              e.transportName(me == 0 ? 1 : 0));
  } else if (n > 1) {
    ATTN_INFO(kLogNet, "device collectives: staged through pinned host memory (rank %d's transport%s "
              "takes host memory only)", refused,
              refused == me ? (" to rank " + std::to_string(without) + " (" + e.transportName(without) + ")").c_str()
                            : "");
  }
  return attnSuccess;
}

}  // namespace attn
