// Kernel launches on the emulated runtime: the configuration is checked as
// cudaLaunchKernel checks it (the error is the launching thread's last
// error, for cudaGetLastError), then the grid runs on the stream's thread.
#include <string>
#include <utility>

#include "tests/cuda_emu/emu_core.h"
#include "tests/cuda_emu/simt/simt.h"

namespace attn_simt {

void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t dynamicSmem,
            cudaStream_t stream, SharedMemoryOf smem, std::function<void()> body) {
  if (cudaError_t e = attn_emu::enter(); e != cudaSuccess) {
    attn_emu::fail(e, "%s: runtime unusable", name);
    return;
  }
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    attn_emu::fail(cudaErrorInvalidConfiguration, "%s: grid (%u,%u,%u) x block (%u,%u,%u)", name,
                   grid.x, grid.y, grid.z, block.x, block.y, block.z);
    return;
  }
  const size_t allowed = attn_emu::maxDynamicSharedMemory(kernel);
  if (dynamicSmem > allowed) {
    attn_emu::fail(cudaErrorInvalidValue, "%s: %zu bytes of dynamic shared memory, %zu allowed", name,
                   dynamicSmem, allowed);
    return;
  }
  std::string what(name);
  const cudaError_t e = attn_emu::enqueue(
      stream, [what, grid, block, smem, dynamicSmem, body = std::move(body)] {
        const std::string why = runGrid(grid, block, smem, dynamicSmem, body);
        if (!why.empty()) attn_emu::stickyFault(cudaErrorLaunchFailure, what + ": " + why);
      });
  if (e != cudaSuccess) attn_emu::fail(e, "%s: launch on a bad stream", name);
}

}  // namespace attn_simt
