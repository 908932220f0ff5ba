// The dynamic shared memory of the blocks a host thread runs (see
// device_prelude.h): as large as the emulated device's opt-in limit.
#include "tests/cuda_emu/emu_core.h"

namespace attn::cuda {
alignas(128) thread_local unsigned char smem[attn_emu::kSharedMemoryOptin];
}
