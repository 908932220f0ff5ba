// A device backend: one way to run a device communicator's operations
// (device_op.h). device_route.cc asks each backend, in the order of
// deviceBackends(), whether it takes an operation, and hands it to the
// first that does; a backend that runs on the proxy thread may decline
// there (with every rank agreeing), and the route goes on to the next one.
// No backend calls back into the route or the public API.
//
// The backends, in route order:
//   nccl      the engine's NCCL communicator (attnCommInitFromNccl): the
//             NCCL call on the caller's stream
//   cuda_ipc  every rank on this host: GPU-to-GPU peer copies
//   direct    every connection takes device memory (UCX with CUDA): the
//             device buffers handed to the transports
//   staging   always: pinned host copies around the host collective
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "attncomm.h"
#include "src/device/device_op.h"

struct attnComm;

namespace attn {

struct DeviceState;

// What a backend can do, asked before any operation runs.
struct BackendCaps {
  // Where it runs: on the caller's stream from the caller's thread (NCCL),
  // else on the communicator's proxy thread, ordered on the stream.
  bool onCallerStream = false;
  // Which memory it moves as it is: device memory without staging.
  bool movesDeviceMemory = false;
  // Which peers it reaches: ranks on other hosts too.
  bool crossesHosts = false;
  // Which operations: a bit per DeviceOpKind.
  uint32_t kinds = 0;
  bool runs(DeviceOpKind k) const { return kinds & (1u << unsigned(k)); }
};

constexpr uint32_t kindBit(DeviceOpKind k) { return 1u << unsigned(k); }
constexpr uint32_t kCollectiveKinds =
    kindBit(DeviceOpKind::kAllGather) | kindBit(DeviceOpKind::kReduceScatter) |
    kindBit(DeviceOpKind::kAllReduce) | kindBit(DeviceOpKind::kBroadcast) | kindBit(DeviceOpKind::kReduce) |
    kindBit(DeviceOpKind::kAllToAll) | kindBit(DeviceOpKind::kAllToAllv);

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  virtual BackendCaps caps() const = 0;
  // Whether this backend takes `op` on `comm`: its kinds, and what it needs
  // of the communicator (an NCCL communicator, every peer on this host).
  // The same answer on every rank, so all ranks pick the same backend.
  virtual bool takes(const attnComm* comm, const DeviceOp& op) const = 0;
  // caps().onCallerStream: enqueues `op` on `stream` from the caller's thread.
  virtual attnResult_t enqueue(attnComm* comm, attnStream_t stream, DeviceOp& op) const;
  // Otherwise: runs `op` on the proxy thread and returns once its outputs
  // are complete on the device. *declined: it found, every rank alike, that
  // it cannot (cuda_ipc off or unable, a connection without device memory);
  // nothing moved and the next backend runs it.
  virtual attnResult_t run(attnComm* comm, DeviceState& st, const DeviceOp& op, cudaStream_t copy,
                           bool* declined) const;
};

// Every backend of this build, in the order the route tries them.
std::span<const DeviceBackend* const> deviceBackends();
// The backend called `name`, or null (tests, logs).
const DeviceBackend* findDeviceBackend(const char* name);

// Each backend's single instance (device_backends.cc lists them).
const DeviceBackend& ncclBackend();
const DeviceBackend& cudaIpcBackend();
const DeviceBackend& directBackend();
const DeviceBackend& stagingBackend();

}  // namespace attn
