// Head-parallel attention on the GPU (CSPS SP-NTP; DeepSpeed-Ulysses), run
// on the proxy thread of a device communicator as one stream-bridge work
// item. The host algorithm is src/attn/head_parallel.cc; this one sends the
// same messages in the same order (head_parallel.h) and computes on the
// device:
//
//  - Our rows for each other rank's heads go down to pinned host memory
//    with one strided copy per tensor (the head slice of every row), on the
//    copy stream, and leave through the gated all-to-all (Outbox).
//  - Our rows for our own heads are copied device to device into their
//    slot of R.block[0]; each peer's rows for our heads land in pinned
//    R.hostIn and go up into theirs. Every pair (queries of rank a, keys of
//    rank b) is folded into rank a's fp32 accumulator (R.acc) as soon as
//    both are on the device, on the compute stream.
//  - When a rank's row of the grid is complete its outputs are converted to
//    the call's dtype (R.visit) and copied down for it to send (the event
//    partialOnHost[rank] says when), or, for our own rows, copied across
//    into our heads' columns of `out` and `lse`.
//  - The outputs of our rows for the other groups' heads go up from the
//    host straight into their columns, on the copy stream.
// The host never waits for the GPU while a message could move: it polls
// the events and sleeps on one only when nothing else can happen.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_call.h"
#include "src/attn/break_on_early_exit.h"
#include "src/attn/head_groups.h"
#include "src/attn/head_parallel.h"
#include "src/attn/progress_thread.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/attn/device/device_attn_kernels.h"
#include "src/device/device_state.h"
#include "src/attn/device/ring_attn_device.h"

namespace attn {
namespace {

// Heads [first, first + count) of `rows` rows of `rowHeads` heads each,
// into rows of `count` heads: one strided copy on `stream`.
attnResult_t takeHeads(void* dst, const void* src, int64_t rows, int rowHeads, int first, int count,
                       size_t headBytes, cudaStream_t stream) {
  if (rows == 0 || count == 0) return attnSuccess;
  ATTN_CUDA_CHECK(cudaMemcpy2DAsync(dst, count * headBytes,
                                    static_cast<const char*>(src) + first * headBytes,
                                    rowHeads * headBytes, count * headBytes, rows, cudaMemcpyDefault,
                                    stream));
  return attnSuccess;
}

// The reverse: rows of `count` heads into heads [first, first + count) of
// rows of `rowHeads` heads.
attnResult_t placeHeads(void* dst, const void* src, int64_t rows, int rowHeads, int first, int count,
                        size_t headBytes, cudaStream_t stream) {
  if (rows == 0 || count == 0) return attnSuccess;
  ATTN_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst) + first * headBytes, rowHeads * headBytes, src,
                                    count * headBytes, count * headBytes, rows, cudaMemcpyDefault, stream));
  return attnSuccess;
}

// Our rows for group `g` as the message `m`: its header, offsets and
// positions written at `meta` (pinned host), the head slices of Q, K and V
// copied from the device into `dst` on `stream`. When dst is not meta (our
// own heads: dst is on the device) the metadata goes up there too.
attnResult_t packHeads(const AttnCall& c, const HeadGroup& g, const HeadsMessage& m, char* meta, char* dst,
                       cudaStream_t stream) {
  const int me = c.comm->rank;
  const HeadBytes hb = headBytesOf(c.cfg);
  packBlockMeta(me, c.numSeqs, c.qOffsets.data(), c.q.pos, c.q.rows, m.qRow, meta);
  packBlockMeta(me, c.numSeqs, c.kvOffsets.data(), c.kv.pos, c.kv.rows, m.kvRow, meta + m.kvAt);
  if (dst != meta) {
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst, meta, m.q.t0At, cudaMemcpyHostToDevice, stream));
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dst + m.kvAt, meta + m.kvAt, m.kv.t0At, cudaMemcpyHostToDevice, stream));
  }
  const int hq = c.cfg.num_q_heads, hkv = c.cfg.num_kv_heads;
  ATTN_CHECK(takeHeads(dst + m.q.t0At, c.q.t0, c.q.rows, hq, g.qBegin, g.q(), hb.qk, stream));
  char* kv = dst + m.kvAt;
  ATTN_CHECK(takeHeads(kv + m.kv.t0At, c.kv.t0, c.kv.rows, hkv, g.kvBegin, g.kv(), hb.qk, stream));
  return takeHeads(kv + m.kv.t1At, c.kv.t1, c.kv.rows, hkv, g.kvBegin, g.kv(), hb.v, stream);
}

}  // namespace

attnResult_t runHeadParallelDevice(AttnCall& c, const DeviceAttnBuffers& io) {
  DeviceCallEnv env;
  ATTN_CHECK(beginDeviceCall(c, "head-parallel", static_cast<size_t>(c.comm->nranks), &env));
  DeviceAttnState& R = *env.R;
  Engine& e = *env.e;
  const cudaStream_t copy = env.copy;
  const int n = env.n, me = env.me;
  const int hq = c.cfg.num_q_heads, Dv = c.cfg.head_dim_v;  // Dv: of the outputs
  const std::vector<HeadGroup> groups = headGroups(hq, c.cfg.num_kv_heads, n);
  const HeadGroup& mine = groups[me];
  const size_t elem = dataTypeSize(c.cfg.dtype);
  const size_t oHeadBytes = elem * Dv;
  auto messageTo = [&](int from, int to) { return headsMessage(c, groups, from, to); };
  auto returnOf = [&](int64_t rows, const HeadGroup& g) { return ReturnMessage(rows, g.q(), Dv, elem); };

  // Pinned host memory. Out: our rows for each group (for ours only its
  // metadata), then the outputs we send home. In: each peer's rows for our
  // heads, then the outputs of our rows for each peer's heads.
  PeerSlots rowsOut(n), outputsOut(n), rowsIn(n), outputsIn(n);
  // Device: every rank's rows for our heads, their outputs in the dtype,
  // and (accRow) where each rank's rows start in the fp32 accumulator.
  PeerSlots rowsDev(n), outputsDev(n);
  std::vector<int64_t> accRow(n + 1, 0);
  for (int p = 0; p < n; ++p) {
    if (!groups[p].empty()) {
      const HeadsMessage m = messageTo(me, p);
      rowsOut.add(p, p == me ? m.kvAt + m.kv.t0At : m.total);  // ours: metadata only
    }
    if (p != me && !groups[p].empty()) outputsIn.add(p, returnOf(c.q.rows, groups[p]).total);
    accRow[p + 1] = accRow[p] + (mine.empty() ? 0 : c.qRowsOf[p]);
    if (mine.empty()) continue;
    rowsDev.add(p, messageTo(p, me).total);
    outputsDev.add(p, returnOf(c.qRowsOf[p], mine).oBytes);
    if (p == me) continue;
    outputsOut.add(p, returnOf(c.qRowsOf[p], mine).total);
    rowsIn.add(p, messageTo(p, me).total);
  }
  const size_t headRows = static_cast<size_t>(accRow[n]) * mine.q();
  const size_t lseAt = alignUp(headRows * Dv * sizeof(float), 256);

  // Buffers first, while both streams are idle (see pass-KV).
  ATTN_CHECK(R.hostOut.reserve(rowsOut.total + outputsOut.total + 64));
  ATTN_CHECK(R.hostIn.reserve(rowsIn.total + outputsIn.total + 64));
  ATTN_CHECK(R.block[0].reserve(rowsDev.total + 64, R.compute));
  ATTN_CHECK(R.acc.reserve(lseAt + headRows * sizeof(float) + 16, R.compute));
  ATTN_CHECK(R.visit.reserve(outputsDev.total + 64, R.compute));
  AttnCall sub = narrowedTo(c, mine);
  DeviceKernels kernels(sub, R);
  ATTN_CHECK(kernels.reserve({}, mine.empty() ? 0 : n * n));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
  char* const hostOut = R.hostOut.base();
  char* const hostOutputsOut = hostOut + rowsOut.total;
  char* const hostIn = R.hostIn.base();
  char* const hostOutputsIn = hostIn + rowsIn.total;
  char* const devRows = R.block[0].get();
  float* const accO = reinterpret_cast<float*>(R.acc.get());
  float* const accLse = reinterpret_cast<float*>(R.acc.get() + lseAt);
  char* const devOutputs = R.visit.get();

  // Our rows for the other groups go down on the copy stream; those for our
  // heads go across on the compute stream, where the accumulator starts.
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    if (groups[p].empty()) continue;
    char* slot = hostOut + rowsOut.offset[p];
    ATTN_CHECK(packHeads(c, groups[p], messageTo(me, p), slot, slot, copy));
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.ownOnHost, copy));
  if (!mine.empty()) {
    ATTN_CHECK(packHeads(c, mine, messageTo(me, me), hostOut + rowsOut.offset[me], devRows + rowsDev.offset[me],
                         R.compute));
    if (headRows) ATTN_CHECK(cuda::initAccumulator(accO, accLse, accRow[n], mine.q(), Dv, R.compute));
  }

  std::unique_ptr<Request[]> inReq(new Request[n]), homeReq(new Request[n]);
  Outbox outbox(e, n, everyGroupHasHeads(groups));
  BreakOnEarlyExit guard(e);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (!mine.empty())
      ATTN_CHECK(e.irecv(p, hostIn + rowsIn.offset[p], messageTo(p, me).total, &inReq[p]));
    if (!groups[p].empty())
      ATTN_CHECK(e.irecv(p, hostOutputsIn + outputsIn.offset[p], returnOf(c.q.rows, groups[p]).total,
                         &homeReq[p]));
  }
  ProgressThread driver(e, c.comm->prefix);
  auto look = [&] { return arrivedSoFar(groups, me, inReq.get(), homeReq.get()); };
  ATTN_CUDA_CHECK(cudaEventSynchronize(R.ownOnHost));
  for (int s = 1; s < n; ++s) {
    const int p = (me + s) % n;
    if (!groups[p].empty()) outbox.queue(Outbox::kRows, p, hostOut + rowsOut.offset[p], messageTo(me, p).total);
  }
  ATTN_CHECK(outbox.pump(driver, look()));

  // The grid of our heads: rows of each rank on the device once here, and
  // how many key blocks each rank's accumulator has folded.
  std::vector<DeviceRows> qOf(n), kvOf(n);
  std::vector<bool> here(n, false);
  std::vector<int> folded(n, 0);
  std::vector<int> goingDown;  // ranks whose outputs are being copied down, in stream order
  auto rowsHere = [&](int a, const char* host, size_t bytes, char* dev) -> attnResult_t {
    BlockView qv, kvv;
    ATTN_CHECK(viewHeadsMessage(c, a, host, bytes, messageTo(a, me), &qv, &kvv));
    qOf[a] = deviceRowsOf(qv, host, dev);
    kvOf[a] = deviceRowsOf(kvv, host, dev);
    here[a] = true;
    return attnSuccess;
  };
  auto fold = [&](int queriesOf, int keysOf) {
    ++folded[queriesOf];
    return kernels.accumulate(qOf[queriesOf], kvOf[keysOf], accO + accRow[queriesOf] * mine.q() * Dv,
                              accLse + accRow[queriesOf] * mine.q());
  };
  // Rank r's row of the grid is complete: its outputs in the dtype, then
  // down to the host (a peer's) or across into our heads' columns (ours).
  auto finish = [&](int r) -> attnResult_t {
    const int64_t rows = c.qRowsOf[r];
    const float* lse = accLse + accRow[r] * mine.q();
    char* o = devOutputs + outputsDev.offset[r];
    if (rows && c.cfg.sinks)  // this group's heads' sinks, once, on the merged rows
      ATTN_CHECK(cuda::applySinks(accO + accRow[r] * mine.q() * Dv, accLse + accRow[r] * mine.q(), rows, mine.q(), Dv,
                                  c.cfg.sinks + mine.qBegin, R.compute));
    if (rows)
      ATTN_CHECK(cuda::convertFromFloat(o, c.cfg.dtype, accO + accRow[r] * mine.q() * Dv,
                                        static_cast<size_t>(rows) * mine.q() * Dv, R.compute));
    if (r == me) {
      ATTN_CHECK(placeHeads(io.out, o, rows, hq, mine.qBegin, mine.q(), oHeadBytes, R.compute));
      if (io.lse) ATTN_CHECK(placeHeads(io.lse, lse, rows, hq, mine.qBegin, mine.q(), sizeof(float), R.compute));
      return attnSuccess;
    }
    const ReturnMessage m = returnOf(rows, mine);
    char* slot = hostOutputsOut + outputsOut.offset[r];
    if (rows) {
      ATTN_CUDA_CHECK(cudaMemcpyAsync(slot, o, m.oBytes, cudaMemcpyDeviceToHost, R.compute));
      ATTN_CUDA_CHECK(cudaMemcpyAsync(slot + m.lseAt, lse, m.total - m.lseAt, cudaMemcpyDeviceToHost, R.compute));
    }
    ATTN_CUDA_CHECK(cudaEventRecord(R.partialOnHost[r], R.compute));
    goingDown.push_back(r);
    return attnSuccess;
  };
  // Rank a's rows are on the device: fold every pair they complete.
  auto take = [&](int a) -> attnResult_t {
    for (int b = 0; b < n; ++b) {  // a's keys for the queries already here
      if (b == a || !here[b]) continue;
      ATTN_CHECK(fold(b, a));
      if (folded[b] == n) ATTN_CHECK(finish(b));
    }
    for (int b = 0; b < n; ++b)  // a's queries over every key here
      if (here[b]) ATTN_CHECK(fold(a, b));
    if (folded[a] == n) ATTN_CHECK(finish(a));
    return attnSuccess;
  };
  // Outputs now on the host go home (the compute stream finishes them in
  // the order they were enqueued).
  auto sendDone = [&](bool* moved) -> attnResult_t {
    while (!goingDown.empty()) {
      const int r = goingDown.front();
      const cudaError_t q = cudaEventQuery(R.partialOnHost[r]);
      if (q == cudaErrorNotReady) break;
      ATTN_CUDA_CHECK(q);
      outbox.queue(Outbox::kOutputs, r, hostOutputsOut + outputsOut.offset[r], returnOf(c.qRowsOf[r], mine).total);
      goingDown.erase(goingDown.begin());
      *moved = true;
    }
    return attnSuccess;
  };
  auto nextArrival = [&] {
    if (mine.empty()) return -1;
    for (int p = 0; p < n; ++p)
      if (p != me && !here[p] && !inReq[p].pending()) return p;
    return -1;
  };

  if (!mine.empty()) {
    ATTN_CHECK(rowsHere(me, hostOut + rowsOut.offset[me], messageTo(me, me).total, devRows + rowsDev.offset[me]));
    ATTN_CHECK(take(me));
  }
  double waitUs = 0;
  int left = mine.empty() ? 0 : n - 1;
  int idlePasses = 0;
  while (left > 0 || !goingDown.empty() || !outbox.drained()) {
    bool moved = false;
    ATTN_CHECK(sendDone(&moved));
    if (outbox.movable(look())) {
      ATTN_CHECK(outbox.pump(driver, look()));
      moved = true;
    }
    const int a = nextArrival();
    if (a >= 0) {
      ATTN_CHECK(driver.wait(&inReq[a]));
      char* host = hostIn + rowsIn.offset[a];
      char* dev = devRows + rowsDev.offset[a];
      ATTN_CHECK(rowsHere(a, host, inReq[a].bytes, dev));
      ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, host, inReq[a].bytes, cudaMemcpyHostToDevice, R.compute));
      ATTN_CHECK(take(a));
      --left;
      moved = true;
    }
    if (moved) {
      idlePasses = 0;
      continue;
    }
    if (++idlePasses <= 50) {
      std::this_thread::yield();
      continue;
    }
    // Nothing moved for a while: sleep on the outputs the GPU is finishing
    // (they need nobody's help), else on the network.
    const auto t0 = Clock::now();
    if (!goingDown.empty())
      ATTN_CUDA_CHECK(cudaEventSynchronize(R.partialOnHost[goingDown.front()]));
    else
      ATTN_CHECK(driver.waitFor([&] { return nextArrival() >= 0 || outbox.movable(look()); }));
    waitUs += usSince(t0);
  }
  c.stats.bytesSent += outbox.bytes();

  // Our rows' outputs for the other groups' heads, up into their columns.
  for (int p = 0; p < n; ++p) {
    if (p == me || groups[p].empty()) continue;
    const auto t0 = Clock::now();
    ATTN_CHECK(driver.wait(&homeReq[p]));
    waitUs += usSince(t0);
    const HeadGroup& g = groups[p];
    const ReturnMessage m = returnOf(c.q.rows, g);
    if (homeReq[p].bytes != m.total)
      return setError(attnInvalidUsage, "head-parallel: outputs from rank %d have %zu bytes, %zu expected", p,
                      homeReq[p].bytes, m.total);
    const char* src = hostOutputsIn + outputsIn.offset[p];
    ATTN_CHECK(placeHeads(io.out, src, c.q.rows, hq, g.qBegin, g.q(), oHeadBytes, copy));
    if (io.lse) ATTN_CHECK(placeHeads(io.lse, src + m.lseAt, c.q.rows, hq, g.qBegin, g.q(), sizeof(float), copy));
  }
  guard.done();
  c.stats.waitUs += waitUs;
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  ATTN_CUDA_CHECK(cudaEventRecord(R.finished, R.compute));
  ATTN_CUDA_CHECK(cudaEventSynchronize(R.finished));
  ATTN_CHECK(kernels.addComputeTime());
  c.stats.computeUs += sub.stats.computeUs;
  ATTN_TRACE(kLogAttn, "device heads [%d, %d): %.0f us on the GPU, %.0f us waiting", mine.qBegin, mine.qEnd,
             sub.stats.computeUs, waitUs);
  return attnSuccess;
}

}  // namespace attn
