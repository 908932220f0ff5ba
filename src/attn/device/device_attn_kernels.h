// What the three ring-attention algorithms on the GPU share: the call's
// small device arrays (offsets, positions, kernel segments), and the block
// kernel on the communicator's compute stream (the built-in CUDA kernel or
// the engine's own through attnCommSetAttnKernel), every launch timed with
// a pair of events so c.stats.computeUs is GPU time.
//
// Host-only C++ on the CUDA runtime API; runs on a device communicator's
// proxy thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "src/attn/attn_call.h"
#include "src/device/device_attn_state.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {

class RingLink;

inline size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Device address of `h`, a pointer into a host copy of a block at
// `hostBase`, in the device copy of the same block at `devBase`.
template <class T>
T* onDevice(const T* h, const char* hostBase, char* devBase) {
  return reinterpret_cast<T*>(devBase + (reinterpret_cast<const char*>(h) - hostBase));
}

// Rows of queries or keys on the device. Offsets on both sides: the host
// builds the built-in kernel's segments from them, a user kernel reads the
// device copy.
struct DeviceRows {
  const void* t0 = nullptr;  // Q, or K
  const void* t1 = nullptr;  // V (keys only)
  int32_t rows = 0;
  const int32_t* hostOffsets = nullptr;  // [numSeqs+1]
  const int32_t* devOffsets = nullptr;
  const int32_t* devPos = nullptr;       // [rows]
};

// The rows of a packed block (wire.h) whose host copy `v` views at
// `hostBase` and whose device copy starts at `devBase`.
DeviceRows deviceRowsOf(const BlockView& v, const char* hostBase, char* devBase);

// Where a device attention algorithm runs: the communicator's ring-attention
// state on the device, the bridge's copy stream, the engine, the ring. Made
// by beginDeviceCall; on every way out, errors included, both streams are
// idle again before the buffers they use can be reused or grown by the
// next call.
struct DeviceCallEnv {
  DeviceAttnState* R = nullptr;
  cudaStream_t copy = nullptr;
  Engine* e = nullptr;
  int n = 0, me = 0, next = 0, prev = 0;
  // How ring blocks move (ring_link.h: device to device when direct(),
  // else through pinned host memory); null with one rank.
  RingLink* ring = nullptr;

  DeviceCallEnv() = default;
  ~DeviceCallEnv() {
    if (!prepared_) return;
    (void)cudaStreamSynchronize(R->compute);
    (void)cudaStreamSynchronize(copy);
  }
  DeviceCallEnv(const DeviceCallEnv&) = delete;
  DeviceCallEnv& operator=(const DeviceCallEnv&) = delete;

 private:
  friend attnResult_t beginDeviceCall(const AttnCall&, const char*, size_t, DeviceCallEnv*);
  bool prepared_ = false;
};
// The set-up every device algorithm starts with, written once: fails
// (naming `algorithm`) unless c runs on a device communicator; agrees on
// the ring's link with the peers (collective, as the call is); prepares
// the state's stream and events, with `peerEvents` partialOnHost events.
// The previous call left both streams idle, so the algorithm may grow its
// buffers next (device ones on the compute stream) and only then.
attnResult_t beginDeviceCall(const AttnCall& c, const char* algorithm, size_t peerEvents, DeviceCallEnv* env);

// The fp32 accumulator of the call's own query rows, in R.acc: O
// [q rows, Hq, D], then LSE [q rows, Hq].
struct DeviceAccumulator {
  float* o = nullptr;
  float* lse = nullptr;
  // Grows R.acc on the compute stream (before anything else is enqueued).
  attnResult_t reserve(const AttnCall& c, DeviceAttnState& R);
  // O = 0, LSE = -inf, on the compute stream.
  attnResult_t init(const AttnCall& c, DeviceAttnState& R);
  // Writes the call's outputs from the accumulator on the compute stream and
  // waits for them: O in the call's dtype, LSE as it is.
  attnResult_t writeOut(const AttnCall& c, DeviceAttnState& R, const DeviceAttnBuffers& io);
  // Merge-on-receive: folds a partial (O then LSE, as wire.h sends them)
  // for all of the call's query rows.
  attnResult_t fold(const AttnCall& c, DeviceAttnState& R, const float* partial);
};

class DeviceKernels {
 public:
  DeviceKernels(AttnCall& c, DeviceAttnState& R) : c_(c), R_(R) {}

  // Room for the offsets and positions of `resident` (rows whose tensors
  // are already on the device and stay there: this rank's Q and/or KV,
  // with host offsets and positions) and for `launches` kernel launches
  // (segments and timing events each), plus a user kernel's partial for
  // the call's own query rows. Grows R.meta, R.part and R.metaStage on the
  // compute stream: call before anything else is enqueued, then
  // synchronise the compute stream.
  attnResult_t reserve(const std::vector<RowsRef>& resident, int launches);
  // Uploads the resident rows' offsets and positions on the compute stream.
  attnResult_t upload();
  // Resident rows i as the kernels take them.
  DeviceRows resident(size_t i) const;

  // Folds attention of `qs` over `kvs` into the fp32 accumulator (o, lse),
  // [qs.rows, Hq, D] and [qs.rows, Hq].
  attnResult_t accumulate(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse);
  // Writes the partial of `qs` over `kvs` into fresh (o, lse): a row that
  // sees no key gets O = 0, LSE = -inf.
  attnResult_t partial(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse);

  // Adds the launches' GPU time to c.stats.computeUs; once the compute
  // stream has finished them.
  attnResult_t addComputeTime();

 private:
  attnResult_t launch(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse, bool fold);
  attnResult_t builtIn(int slot, const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse,
                       bool fold);
  attnResult_t userKernel(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse, bool fold);

  AttnCall& c_;
  DeviceAttnState& R_;
  std::vector<RowsRef> resident_;
  std::vector<size_t> offsetsAt_, posAt_;  // by resident, in R.meta / R.metaStage
  size_t fixedBytes_ = 0, segAt_ = 0, segBytes_ = 0;
  int launches_ = 0, used_ = 0;
  std::vector<bool> timed_;  // launch i has timing events 2i, 2i+1 recorded
  // A user kernel's partial when folding it, or when it writes another
  // dtype or LSE convention than the accumulators': room for partRows_ rows.
  float* partO_ = nullptr;
  float* partLse_ = nullptr;
  int64_t partRows_ = 0;
};

// The first thing a device algorithm does with its kernels, after growing
// its other buffers on the compute stream: room for `resident` rows and
// `launches` launches (DeviceKernels::reserve) and for the call's
// accumulator, the compute stream synchronised (the buffers may have
// grown), the resident rows' metadata uploaded and the accumulator zeroed.
attnResult_t prepareKernels(AttnCall& c, DeviceAttnState& R, const std::vector<RowsRef>& resident, int launches,
                            DeviceKernels* kernels, DeviceAccumulator* acc);

// The end every accumulating device algorithm shares: the outputs written
// from the accumulator, the copy stream drained (the caller's stream is
// released when the work returns), the kernels' GPU time added to c.stats.
attnResult_t finishDeviceCall(AttnCall& c, const DeviceCallEnv& env, DeviceAccumulator& acc, DeviceKernels& kernels,
                              const DeviceAttnBuffers& io);

}  // namespace attn
