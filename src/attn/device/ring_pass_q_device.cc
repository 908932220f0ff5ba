// Ring pass-Q on the GPU (CP paper Alg. 3 with the device kernels), run on
// the proxy thread of a device communicator as one stream-bridge work item.
// The host algorithm is src/attn/ring_pass_q.cc; this is the same message
// order with the blocks and partials on the device.
//
// Query block j (this rank's own at j = 0) travels as pass-KV's KV blocks
// do: pinned host buffer j % 2 is sent and received, device buffer j % 2 is
// what the kernel reads; blockReady / kernelDone order the upload of block
// j + 1 (copy stream) against kernel j - 1 (compute stream). The keys stay.
//
// On the compute stream, step j runs:
//  - own queries: fold them over the local keys into the accumulator;
//  - a visitor's: write its partial into R.visit, copy it down into the
//    owner's slot of R.hostOut and record partialOnHost[owner]. The host
//    sends it home once that event has passed, after the next step's ring
//    transfer is posted and its kernel enqueued, so neither waits for it.
// Partials coming home land in R.hostIn (one slot per peer); each is
// uploaded into R.visit and folded into the accumulator on the compute
// stream as soon as it arrives (merge-on-receive). Every R.visit use is on
// the compute stream, so stream order keeps them apart.
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
namespace {

// Partials coming home, in R.hostIn: one slot and request per peer.
struct DeviceHomecoming {
  PeerSlots slot;
  std::unique_ptr<Request[]> req;
  std::vector<bool> posted, folded;
  explicit DeviceHomecoming(int n) : slot(n), req(new Request[n]), posted(n, false), folded(n, false) {}
};

// Uploads and folds every partial that has arrived and was not folded yet.
attnResult_t foldArrivedOnDevice(AttnCall& c, DeviceAttnState& R, DeviceAccumulator& acc,
                                 DeviceHomecoming& h, size_t myPartial) {
  for (size_t p = 0; p < h.posted.size(); ++p) {
    if (!h.posted[p] || h.folded[p] || h.req[p].pending()) continue;
    if (h.req[p].state.load() == Request::kFailed)
      return setError(h.req[p].error, "%s", h.req[p].message.c_str());
    if (h.req[p].bytes != myPartial)
      return setError(attnInvalidUsage, "partial from rank %zu has %zu bytes, %zu expected", p,
                      h.req[p].bytes, myPartial);
    if (myPartial) {
      ATTN_CUDA_CHECK(cudaMemcpyAsync(R.visit.get(), R.hostIn.base() + h.slot.offset[p], myPartial,
                                      cudaMemcpyHostToDevice, R.compute));
      ATTN_CHECK(acc.fold(c, R, reinterpret_cast<const float*>(R.visit.get())));
    }
    h.folded[p] = true;
  }
  return attnSuccess;
}

}  // namespace

attnResult_t runPassQDevice(AttnCall& c, const DeviceAttnBuffers& io) {
  DeviceCallEnv env;
  ATTN_CHECK(beginDeviceCall(c, "pass-Q", static_cast<size_t>(c.comm->nranks), &env));
  DeviceAttnState& R = *env.R;
  Engine& e = *env.e;
  const cudaStream_t copy = env.copy;
  const int n = env.n, me = env.me;
  const int S = c.numSeqs;
  const size_t myPartial = c.partialBytes(c.q.rows);

  // Buffers first, while both streams are idle (see pass-KV).
  size_t capacity = 0, maxPartial = 0;
  for (int r = 0; r < n; ++r) {
    capacity = std::max(capacity, BlockLayout::of(S, c.qRowsOf[r], c.qRow()).total);
    maxPartial = std::max(maxPartial, c.partialBytes(c.qRowsOf[r]));
  }
  ATTN_CHECK(DeviceRing::reserve(R, capacity, env.ring));
  PeerSlots outSlot(n);
  DeviceHomecoming home(n);
  for (int p = 0; p < n; ++p)
    if (p != me) {
      outSlot.add(p, c.partialBytes(c.qRowsOf[p]));
      home.slot.add(p, myPartial);
    }
  ATTN_CHECK(R.hostOut.reserve(outSlot.total + 64));
  ATTN_CHECK(R.hostIn.reserve(home.slot.total + 64));
  ATTN_CHECK(R.visit.reserve(maxPartial + 64, R.compute));
  // The keys stay on the device.
  DeviceKernels kernels(c, R);
  DeviceAccumulator acc;
  ATTN_CHECK(prepareKernels(c, R, {c.kv}, n, &kernels, &acc));
  const DeviceRows myKv = kernels.resident(0);
  float* visitO = reinterpret_cast<float*>(R.visit.get());
  // Block 0 is this rank's queries.
  DeviceRing ring(e, R, copy, me, env.next, env.prev, capacity, env.ring);
  ATTN_CHECK(ring.loadOwn(S, c.q, c.qRow()));

  std::unique_ptr<Request[]> outReq(new Request[n]);
  RingSteps steps(c, std::max(capacity, maxPartial));
  // Partials from ranks other than prev can be expected at once; prev's
  // comes after its last query block.
  auto expectPartial = [&](int p) {
    home.posted[p] = true;
    return e.irecv(p, R.hostIn.base() + home.slot.offset[p], myPartial, &home.req[p]);
  };
  for (int p = 0; p < n; ++p)
    if (p != me && p != env.prev) ATTN_CHECK(expectPartial(p));

  ProgressThread* driver = steps.driver();
  std::vector<bool> outPosted(n, false);
  int waitingOwner = -1;  // a partial on its way down, to be sent home
  auto sendWaitingPartial = [&]() -> attnResult_t {
    if (waitingOwner < 0) return attnSuccess;
    const int owner = waitingOwner;
    waitingOwner = -1;
    ATTN_CUDA_CHECK(cudaEventSynchronize(R.partialOnHost[owner]));
    ATTN_CHECK(e.isend(owner, R.hostOut.base() + outSlot.offset[owner], c.partialBytes(c.qRowsOf[owner]),
                       &outReq[owner]));
    outPosted[owner] = true;
    ATTN_CHECK(driver->kick());
    return attnSuccess;
  };

  auto step = [&](int s) -> attnResult_t {
    const int from = s == 0 ? me : (me - 1 + n) % n;
    BlockView visitor;
    ATTN_CHECK(parseBlock(ring.host(), ring.bytes(), anyCardBlock(c, from, false), &visitor));
    const int owner = visitor.origin;
    if (owner != me && (outPosted[owner] || owner == waitingOwner))
      return setError(attnRemoteError, "pass-Q: rank %d passed on rank %d's queries twice", from, owner);
    if (visitor.rows != c.qRowsOf[owner])
      return setError(attnRemoteError, "pass-Q: query block of rank %d from rank %d has %d rows, %lld expected",
                      owner, from, visitor.rows, static_cast<long long>(c.qRowsOf[owner]));
    const DeviceRows qd = deviceRowsOf(visitor, ring.host(), ring.device());
    ATTN_CUDA_CHECK(cudaStreamWaitEvent(R.compute, R.blockReady[ring.cur()], 0));
    if (owner == me) {
      ATTN_CHECK(kernels.accumulate(qd, myKv, acc.o, acc.lse));
    } else {
      const size_t bytes = c.partialBytes(visitor.rows);
      float* visitLse = visitO + static_cast<size_t>(visitor.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v;
      ATTN_CHECK(kernels.partial(qd, myKv, visitO, visitLse));
      if (bytes)
        ATTN_CUDA_CHECK(cudaMemcpyAsync(R.hostOut.base() + outSlot.offset[owner], visitO, bytes,
                                        cudaMemcpyDeviceToHost, R.compute));
      ATTN_CUDA_CHECK(cudaEventRecord(R.partialOnHost[owner], R.compute));
    }
    ATTN_CUDA_CHECK(cudaEventRecord(R.kernelDone[ring.cur()], R.compute));
    // The previous step's partial goes home now that this step's transfer
    // and kernel are under way.
    ATTN_CHECK(sendWaitingPartial());
    if (owner != me) waitingOwner = owner;
    return foldArrivedOnDevice(c, R, acc, home, myPartial);
  };
  // The previous rank sends its partial of our queries after its last
  // block, which the last move has received.
  auto afterMove = [&](int s) -> attnResult_t {
    if (s != n - 2) return attnSuccess;
    ATTN_CHECK(expectPartial(env.prev));
    ATTN_CHECK(driver->kick());
    return attnSuccess;
  };
  ATTN_CHECK(steps.run(ring, "device pass-Q", step, afterMove));
  ATTN_CHECK(sendWaitingPartial());
  ATTN_CHECK(ring.finish(n - 1, &c.stats.waitUs));
  // The rest of the all-to-all: fold partials in arrival order.
  auto t0 = Clock::now();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ATTN_CHECK(driver->wait(&home.req[p]));
    ATTN_CHECK(foldArrivedOnDevice(c, R, acc, home, myPartial));
  }
  for (int p = 0; p < n; ++p)
    if (outPosted[p]) ATTN_CHECK(driver->wait(&outReq[p]));
  c.stats.waitUs += usSince(t0);
  steps.done();

  return finishDeviceCall(c, env, acc, kernels, io);
}

}  // namespace attn
