#include "src/attn/attn_state.h"

#include "kernels/cpu/worker_pool.h"
#include "src/core/comm.h"
#include "src/core/settings.h"

namespace attn {

AttnState::AttnState() {
  kernelThreads = static_cast<int>(settingInt<Setting::kKernelThreads>());  // at least 1
  if (kernelThreads > 1) pool = std::make_unique<cpu::WorkerPool>(kernelThreads);
}
AttnState::~AttnState() = default;

AttnState& attnStateOf(attnComm* comm) {
  if (!comm->attnState) comm->attnState = std::make_shared<AttnState>();
  return *comm->attnState;
}

}  // namespace attn
