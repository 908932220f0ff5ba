// Ship-Q on the GPU, run on the proxy thread of a device communicator as one
// stream-bridge work item. The host algorithm is src/attn/ship_q.cc; this is
// the same message order (between two ranks: query block, then the partial
// for it) with the kernels and merges on the device.
//
//  - This rank's query block is packed in R.hostOut (Q copied down on the
//    copy stream) and sent to every peer; meanwhile its own queries fold
//    over the local keys on the compute stream.
//  - A visitor's query block lands in its slot of R.hostIn, goes up into
//    R.block[0], and its partial is computed into R.visit and copied down
//    into the visitor's slot of R.hostOut; partialOnHost[visitor] tells the
//    host when to send it back.
//  - A partial coming home lands in R.hostIn, goes up into R.visit and folds
//    into the accumulator.
// Everything on the device runs on the compute stream in the order the host
// enqueues it, so one R.block[0] and one R.visit serve every peer.
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/progress_thread.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/attn/device/device_attn_kernels.h"
#include "src/device/device_state.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {
namespace {

// What a rank does for one peer, in the order it happens.
enum class PeerStep { kAwaitQuery, kComputing, kServed };

}  // namespace

attnResult_t runShipQDevice(AttnCall& c, const DeviceAttnBuffers& io) {
  DeviceCallEnv env;
  ATTN_CHECK(beginDeviceCall(c, "ship-Q", static_cast<size_t>(c.comm->nranks), &env));
  DeviceAttnState& R = *env.R;
  Engine& e = *env.e;
  const cudaStream_t copy = env.copy;
  const int n = env.n, me = env.me;
  const int S = c.numSeqs;
  const int64_t qRows = c.q.rows;
  const size_t myPartial = c.partialBytes(qRows);

  // Buffers first, while both streams are idle (see pass-KV). Outgoing: our
  // query block, then each visitor's partial; incoming: each peer's query
  // block and the partial it sends us.
  PeerSlots out(n), qin(n), pin(n);
  out.add(me, BlockLayout::of(S, qRows, c.qRow()).total);
  size_t maxBlock = 0, maxPartial = myPartial;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const size_t block = BlockLayout::of(S, c.qRowsOf[p], c.qRow()).total;
    out.add(p, c.partialBytes(c.qRowsOf[p]));
    qin.add(p, block);
    maxBlock = std::max(maxBlock, block);
    maxPartial = std::max(maxPartial, c.partialBytes(c.qRowsOf[p]));
  }
  for (int p = 0; p < n; ++p)
    if (p != me) pin.add(p, myPartial);
  ATTN_CHECK(R.hostOut.reserve(out.total + 64));
  ATTN_CHECK(R.hostIn.reserve(qin.total + pin.total + 64));
  ATTN_CHECK(R.block[0].reserve(maxBlock + 64, R.compute));
  ATTN_CHECK(R.visit.reserve(maxPartial + 64, R.compute));
  // Our queries and the local keys stay on the device.
  DeviceKernels kernels(c, R);
  DeviceAccumulator acc;
  ATTN_CHECK(prepareKernels(c, R, {c.q, c.kv}, n, &kernels, &acc));
  const DeviceRows myQ = kernels.resident(0);
  const DeviceRows myKv = kernels.resident(1);
  char* const hostOut = R.hostOut.base();
  char* const hostIn = R.hostIn.base();
  char* const partialsIn = hostIn + qin.total;  // pin's slots follow qin's
  char* const dBlock = R.block[0].get();
  float* const visitO = reinterpret_cast<float*>(R.visit.get());

  // Our query block goes down on the copy stream while our own queries
  // fold over the local keys on the compute stream.
  const BlockLayout mine = packBlockMeta(me, S, c.qOffsets.data(), c.q.pos, qRows, c.qRow(), hostOut);
  if (qRows && n > 1)
    ATTN_CUDA_CHECK(cudaMemcpyAsync(hostOut + mine.t0At, c.q.t0, mine.t0Bytes, cudaMemcpyDefault, copy));
  ATTN_CUDA_CHECK(cudaEventRecord(R.ownOnHost, copy));
  ATTN_CHECK(kernels.accumulate(myQ, myKv, acc.o, acc.lse));

  std::unique_ptr<Request[]> qinReq(new Request[n]), pinReq(new Request[n]), qoutReq(new Request[n]),
      poutReq(new Request[n]);
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ATTN_CHECK(e.irecv(p, hostIn + qin.offset[p], BlockLayout::of(S, c.qRowsOf[p], c.qRow()).total,
                       &qinReq[p]));
    ATTN_CHECK(e.irecv(p, partialsIn + pin.offset[p], myPartial, &pinReq[p]));
  }
  ATTN_CUDA_CHECK(cudaEventSynchronize(R.ownOnHost));
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    ATTN_CHECK(e.isend(p, hostOut, mine.total, &qoutReq[p]));
  }
  std::unique_ptr<ProgressThread> driver;
  if (n > 1) {
    driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
    ATTN_CHECK(driver->kick());
  }

  // Serve the visitors' queries, send their partials back, fold ours.
  std::vector<PeerStep> serve(n, PeerStep::kServed);
  std::vector<bool> folded(n, true);
  for (int p = 0; p < n; ++p)
    if (p != me) {
      serve[p] = PeerStep::kAwaitQuery;
      folded[p] = false;
    }
  int remaining = 2 * (n - 1);
  auto waitStart = Clock::now();
  int idlePasses = 0;
  while (remaining > 0) {
    bool did = false;
    for (int s = 1; s < n; ++s) {
      const int p = (me - s + n) % n;  // serve in the order the visitors were sent
      if (serve[p] == PeerStep::kAwaitQuery && !qinReq[p].pending()) {
        ATTN_CHECK(driver->wait(&qinReq[p]));
        BlockView visitor;
        ATTN_CHECK(parseBlock(hostIn + qin.offset[p], qinReq[p].bytes, cardBlock(c, p, p, false), &visitor));
        // Up, partial, down: stream order keeps R.block[0] and R.visit
        // apart from the previous visitor's.
        ATTN_CUDA_CHECK(cudaMemcpyAsync(dBlock, hostIn + qin.offset[p], qinReq[p].bytes,
                                        cudaMemcpyHostToDevice, R.compute));
        const size_t bytes = c.partialBytes(visitor.rows);
        float* visitLse = visitO + static_cast<size_t>(visitor.rows) * c.cfg.num_q_heads * c.cfg.head_dim_v;
        ATTN_CHECK(kernels.partial(deviceRowsOf(visitor, hostIn + qin.offset[p], dBlock), myKv, visitO, visitLse));
        if (bytes)
          ATTN_CUDA_CHECK(cudaMemcpyAsync(hostOut + out.offset[p], visitO, bytes, cudaMemcpyDeviceToHost,
                                          R.compute));
        ATTN_CUDA_CHECK(cudaEventRecord(R.partialOnHost[p], R.compute));
        serve[p] = PeerStep::kComputing;
        did = true;
      }
      if (serve[p] == PeerStep::kComputing) {
        const cudaError_t q = cudaEventQuery(R.partialOnHost[p]);
        if (q != cudaErrorNotReady) {
          ATTN_CUDA_CHECK(q);
          ATTN_CHECK(e.isend(p, hostOut + out.offset[p], c.partialBytes(c.qRowsOf[p]), &poutReq[p]));
          ATTN_CHECK(driver->kick());
          serve[p] = PeerStep::kServed;
          --remaining;
          did = true;
        }
      }
      if (!folded[p] && !pinReq[p].pending()) {
        ATTN_CHECK(driver->wait(&pinReq[p]));
        if (pinReq[p].bytes != myPartial)
          return setError(attnInvalidUsage, "partial from rank %d has %zu bytes, %zu expected", p,
                          pinReq[p].bytes, myPartial);
        if (myPartial) {
          ATTN_CUDA_CHECK(cudaMemcpyAsync(visitO, partialsIn + pin.offset[p], myPartial, cudaMemcpyHostToDevice,
                                          R.compute));
          ATTN_CHECK(acc.fold(c, R, visitO));
        }
        folded[p] = true;
        --remaining;
        did = true;
      }
    }
    if (did) {
      idlePasses = 0;
      continue;
    }
    if (++idlePasses <= 50) {
      std::this_thread::yield();
      continue;
    }
    // Nothing moved for a while: sleep on the first thing outstanding, a
    // partial on the GPU first (it finishes without anybody's help).
    bool slept = false;
    for (int p = 0; p < n && !slept; ++p)
      if (serve[p] == PeerStep::kComputing) {
        ATTN_CUDA_CHECK(cudaEventSynchronize(R.partialOnHost[p]));
        slept = true;
      }
    for (int p = 0; p < n && !slept; ++p) {
      if (serve[p] == PeerStep::kAwaitQuery) {
        ATTN_CHECK(driver->wait(&qinReq[p]));
        slept = true;
      } else if (!folded[p]) {
        ATTN_CHECK(driver->wait(&pinReq[p]));
        slept = true;
      }
    }
  }
  for (int p = 0; p < n; ++p)
    if (p != me) {
      ATTN_CHECK(driver->wait(&qoutReq[p]));
      ATTN_CHECK(driver->wait(&poutReq[p]));
    }
  c.stats.waitUs += usSince(waitStart);
  guard.done();

  return finishDeviceCall(c, env, acc, kernels, io);
}

}  // namespace attn
