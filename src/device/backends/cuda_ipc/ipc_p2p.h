// Grouped sends and receives (attnGroupStart/End of attnSend/attnRecv) of a
// device communicator, pair by pair: a receiver on the same host copies
// straight out of the sender's device buffer (CUDA IPC handle across
// processes, the address within one); any other pair moves the bytes
// through pinned host memory over the host transport.
//
// Unlike the collectives, a group involves only the ranks it names, so
// nothing here is collective: for each send, the sender tells its receiver
// where the buffer is and who it is (process, GPU, whether cuda_ipc is
// allowed); the receiver decides, pulls or asks for the bytes, and answers
// once its copy is done, so the sender never returns while its buffer may
// still be read.
#pragma once

#include <cuda_runtime_api.h>

#include "attncomm.h"
#include "src/device/device_op.h"
#include "src/device/backends/cuda_ipc/ipc_state.h"

struct attnComm;

namespace attn::ipc {

// Runs op.p2p (kP2pGroup) on the proxy thread; `copy` is the copy stream.
attnResult_t runP2pGroup(attnComm* comm, IpcState& st, const DeviceOp& op, cudaStream_t copy);

}  // namespace attn::ipc
