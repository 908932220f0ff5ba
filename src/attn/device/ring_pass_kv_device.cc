// Ring pass-KV on the GPU (CP paper Alg. 2 with the device kernels), run on
// the proxy thread of a device communicator as one stream-bridge work item.
//
// Block j (this rank's own at j = 0) is a packed KV block (wire.h: header,
// offsets, positions, K, V) held twice: in pinned host buffer j % 2, which
// the transports send and receive, and in device buffer j % 2, which the
// kernel reads (device_ring.h; when every rank is a thread of this process,
// only the metadata goes through the host and the next rank copies the
// block out of this rank's device buffer, device to device). Two streams
// and four events order everything:
//  - compute stream: waits for blockReady[j % 2] ("block j is in device
//    buffer j % 2"), folds Q x block j into the fp32 accumulator, records
//    kernelDone[j % 2];
//  - copy stream (the bridge's): uploads block j + 1 into device buffer
//    (j + 1) % 2 after kernelDone of that buffer (kernel j - 1 read it), then
//    records blockReady[(j + 1) % 2];
//  - meanwhile the host sends block j's host copy to rank + 1 and receives
//    block j + 1 from rank - 1 into the other host buffer. A host buffer is
//    received into only after its block was sent (the previous step waited
//    for the send) and uploaded (blockReady synchronised).
// So the network transfer and the upload of the next block run while the
// GPU computes on this one. Outputs are converted on the compute stream and
// the work returns once they are written, which releases the caller's
// stream.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_call.h"
#include "src/attn/ring_steps.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/attn/device/device_attn_kernels.h"
#include "src/attn/device/device_ring.h"
#include "src/device/device_state.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {

attnResult_t runPassKvDevice(AttnCall& c, const DeviceAttnBuffers& io) {
  DeviceCallEnv env;
  ATTN_CHECK(beginDeviceCall(c, "pass-KV", 0, &env));
  DeviceAttnState& R = *env.R;
  Engine& e = *env.e;
  const cudaStream_t copy = env.copy;
  const int n = env.n, me = env.me;
  const int S = c.numSeqs;

  // Buffers first: the previous call left both streams idle, so growing
  // (freeing) them is safe here and only here. Device buffers grow on the
  // compute stream; the copy stream uses them after the sync below.
  size_t capacity = 0;
  for (int r = 0; r < n; ++r)
    capacity = std::max(capacity, BlockLayout::of(S, c.kvRowsOf[r], c.kvRow()).total);
  ATTN_CHECK(DeviceRing::reserve(R, capacity, env.ring));
  // The queries stay on the device.
  DeviceKernels kernels(c, R);
  DeviceAccumulator acc;
  ATTN_CHECK(prepareKernels(c, R, {c.q}, n, &kernels, &acc));
  const DeviceRows myQ = kernels.resident(0);
  // Block 0 is this rank's KV.
  DeviceRing ring(e, R, copy, me, env.next, env.prev, capacity, env.ring);
  ATTN_CHECK(ring.loadOwn(S, c.kv, c.kvRow()));

  RingSteps steps(c, capacity);
  ATTN_CHECK(steps.run(ring, "device pass-KV", [&](int s) -> attnResult_t {
    const int from = s == 0 ? me : (me - 1 + n) % n;
    BlockView block;
    ATTN_CHECK(parseBlock(ring.host(), ring.bytes(), anyCardBlock(c, from, true), &block));
    if (block.rows != c.kvRowsOf[size_t(block.origin)])
      return setError(attnRemoteError, "pass-KV: key/value block of rank %d from rank %d has %d rows, %lld expected",
                      block.origin, from, block.rows, static_cast<long long>(c.kvRowsOf[size_t(block.origin)]));
    // Kernel s reads the current device buffer once its upload is done.
    ATTN_CUDA_CHECK(cudaStreamWaitEvent(R.compute, R.blockReady[ring.cur()], 0));
    ATTN_CHECK(kernels.accumulate(myQ, deviceRowsOf(block, ring.host(), ring.device()), acc.o, acc.lse));
    ATTN_CUDA_CHECK(cudaEventRecord(R.kernelDone[ring.cur()], R.compute));
    return attnSuccess;
  }));
  ATTN_CHECK(ring.finish(n - 1, &c.stats.waitUs));
  steps.done();

  return finishDeviceCall(c, env, acc, kernels, io);
}

}  // namespace attn
