// Ring pass-KV on the GPU (CP paper Alg. 2 with the device kernels), run on
// the proxy thread of a device communicator as one stream-bridge work item.
//
// Block j (this rank's own at j = 0) is a packed KV block (wire.h: header,
// offsets, positions, K, V) held twice: in pinned host buffer j % 2, which
// the transports send and receive, and in device buffer j % 2, which the
// kernel reads. Two streams and four events order everything:
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
#include "src/attn/progress_thread.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"
#include "src/device/ring_attn_device.h"

namespace attn {
namespace {

size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The call's small device arrays in DeviceAttnState::meta (and in its pinned
// twin metaStage): q offsets, q positions, then one segment array per step
// (each step has its own slot, so an upload never races the next step's
// host writes).
struct MetaLayout {
  size_t qOffAt = 0, qPosAt = 0, segAt = 0, segBytes = 0, total = 0;
  static MetaLayout of(int numSeqs, int64_t qRows, int steps) {
    MetaLayout m;
    m.qPosAt = roundUp(sizeof(int32_t) * (numSeqs + 1), 16);
    m.segAt = roundUp(m.qPosAt + sizeof(int32_t) * qRows, 16);
    m.segBytes = sizeof(cpu::AttnSegment) * numSeqs;
    m.total = m.segAt + m.segBytes * steps;
    return m;
  }
};

// On every way out, errors included, both streams are idle before the
// buffers they use can be reused or grown by the next call.
class StreamsIdleOnExit {
 public:
  StreamsIdleOnExit(cudaStream_t a, cudaStream_t b) : a_(a), b_(b) {}
  ~StreamsIdleOnExit() {
    (void)cudaStreamSynchronize(a_);
    (void)cudaStreamSynchronize(b_);
  }
  StreamsIdleOnExit(const StreamsIdleOnExit&) = delete;
  StreamsIdleOnExit& operator=(const StreamsIdleOnExit&) = delete;

 private:
  cudaStream_t a_, b_;
};

// One call's pipeline state on the device.
struct Pipeline {
  Pipeline(AttnCall& call, DeviceAttnState& res, const MetaLayout& layout)
      : c(call), R(res), ml(layout) {}
  AttnCall& c;
  DeviceAttnState& R;
  MetaLayout ml;
  float* accO = nullptr;   // [q rows, Hq, D] fp32
  float* accLse = nullptr; // [q rows, Hq]
  float* partO = nullptr;  // a user kernel's partial
  float* partLse = nullptr;
  std::vector<bool> timed;  // step s has timing events 2s, 2s+1 recorded

  const int32_t* devQOffsets() const {
    return reinterpret_cast<const int32_t*>(R.meta.get() + ml.qOffAt);
  }
  const int32_t* devQPos() const { return reinterpret_cast<const int32_t*>(R.meta.get() + ml.qPosAt); }

  attnResult_t step(int s, int buf, const BlockView& b);
  attnResult_t builtIn(int s, const BlockView& b, const char* hostBase, char* devBase);
  attnResult_t userKernel(int s, const BlockView& b, const char* hostBase, char* devBase);
};

// Device address of `h`, a pointer into host buffer `hostBase`, in the device
// copy of the same block at `devBase` (same layout, same offsets).
template <class T>
T* onDevice(const T* h, const char* hostBase, char* devBase) {
  return reinterpret_cast<T*>(devBase + (reinterpret_cast<const char*>(h) - hostBase));
}

attnResult_t Pipeline::builtIn(int s, const BlockView& b, const char* hostBase, char* devBase) {
  // Device tensors and positions, host offsets (problemOf builds the
  // segments from them on the host).
  const RowsRef qd{c.q.t0, nullptr, c.q.rows, c.qOffsets.data(), devQPos()};
  const RowsRef kvd{onDevice(static_cast<const char*>(b.t0), hostBase, devBase),
                    onDevice(static_cast<const char*>(b.t1), hostBase, devBase), b.rows, b.offsets,
                    onDevice(b.pos, hostBase, devBase)};
  std::vector<cpu::AttnSegment> segs;
  cpu::AttnProblem p = problemOf(c, qd, kvd, &segs);
  // This step's segments go up from their own pinned slot, on the compute
  // stream, so the next step's host writes never race the upload.
  auto* hs = reinterpret_cast<cpu::AttnSegment*>(R.metaStage.base() + ml.segAt + s * ml.segBytes);
  std::copy(segs.begin(), segs.end(), hs);
  auto* ds = reinterpret_cast<cpu::AttnSegment*>(R.meta.get() + ml.segAt + s * ml.segBytes);
  ATTN_CUDA_CHECK(cudaMemcpyAsync(ds, hs, ml.segBytes, cudaMemcpyHostToDevice, R.compute));
  p.segments = ds;
  ATTN_CUDA_CHECK(cudaEventRecord(R.timing[2 * s], R.compute));
  cuda::AttnCudaExec ex;
  ex.stream = R.compute;
  ATTN_CHECK(cuda::attentionAccumulate(p, accO, accLse, ex));
  return attnSuccess;
}

attnResult_t Pipeline::userKernel(int s, const BlockView& b, const char* hostBase, char* devBase) {
  ATTN_CUDA_CHECK(cudaEventRecord(R.timing[2 * s], R.compute));
  attnAttnKernelArgs_t a;
  a.q = c.q.t0;
  a.k = onDevice(static_cast<const char*>(b.t0), hostBase, devBase);
  a.v = onDevice(static_cast<const char*>(b.t1), hostBase, devBase);
  a.out = partO;
  a.lse = partLse;
  a.num_seqs = c.numSeqs;
  a.q_offsets = devQOffsets();
  a.q_pos = devQPos();
  a.kv_offsets = onDevice(b.offsets, hostBase, devBase);
  a.kv_pos = onDevice(b.pos, hostBase, devBase);
  a.cfg = &c.cfg;
  attnResult_t r = c.state->userKernel(&a, c.state->userData, reinterpret_cast<attnStream_t>(R.compute));
  if (r != attnSuccess)
    return setError(r, "the attention kernel set by attnCommSetAttnKernel failed (device pass-KV, step %d)", s);
  const cpu::AttnPartialRef part{partO, attnFloat32, partLse};
  ATTN_CHECK(cuda::foldPartial(accO, accLse, part, static_cast<size_t>(c.q.rows) * c.cfg.num_q_heads,
                               c.cfg.head_dim, R.compute));
  return attnSuccess;
}

// Enqueues step s on the compute stream: block s is (or will be) in device
// buffer `buf`; `b` is its host copy, already checked.
attnResult_t Pipeline::step(int s, int buf, const BlockView& b) {
  ATTN_CUDA_CHECK(cudaStreamWaitEvent(R.compute, R.blockReady[buf], 0));
  if (c.q.rows > 0 && b.rows > 0 && !c.state->skipCompute) {
    const char* hostBase = R.hostBlock[buf].base();
    char* devBase = R.block[buf].get();
    if (c.state->userKernel) ATTN_CHECK(userKernel(s, b, hostBase, devBase));
    else ATTN_CHECK(builtIn(s, b, hostBase, devBase));
    ATTN_CUDA_CHECK(cudaEventRecord(R.timing[2 * s + 1], R.compute));
    timed[s] = true;
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.kernelDone[buf], R.compute));
  return attnSuccess;
}

}  // namespace

attnResult_t runPassKvDevice(AttnCall& c, const DeviceAttnBuffers& io) {
  if (!c.comm->device)
    return setError(attnInternalError, "device pass-KV on a host communicator");
  DeviceState& dev = *c.comm->device;
  DeviceAttnState& R = dev.attn;
  const cudaStream_t copy = dev.bridge->copyStream();
  Engine& e = *c.comm->engine;
  const int n = c.comm->nranks, me = c.comm->rank;
  const int next = (me + 1) % n, prev = (me - 1 + n) % n;
  const int S = c.numSeqs;
  const int64_t qRows = c.q.rows;
  const size_t headRows = static_cast<size_t>(qRows) * c.cfg.num_q_heads;
  const size_t accElems = headRows * c.cfg.head_dim;

  // Buffers first: the previous call left both streams idle, so growing
  // (freeing) them is safe here and only here. Device buffers grow on the
  // compute stream; the copy stream uses them after the sync below.
  ATTN_CHECK(R.prepare(2 * static_cast<size_t>(n)));
  StreamsIdleOnExit idle(R.compute, copy);
  size_t capacity = 0;
  for (int r = 0; r < n; ++r)
    capacity = std::max(capacity, BlockLayout::of(S, c.kvRowsOf[r], c.kvRowBytes, 2).total);
  for (int b = 0; b < 2; ++b) {
    ATTN_CHECK(R.hostBlock[b].reserve(capacity));
    ATTN_CHECK(R.block[b].reserve(capacity, R.compute));
  }
  Pipeline pl(c, R, MetaLayout::of(S, qRows, n));
  pl.timed.assign(n, false);
  ATTN_CHECK(R.metaStage.reserve(pl.ml.total));
  ATTN_CHECK(R.meta.reserve(pl.ml.total, R.compute));
  const size_t lseAt = roundUp(accElems * sizeof(float), 256);
  const size_t accBytes = lseAt + headRows * sizeof(float);
  ATTN_CHECK(R.acc.reserve(accBytes, R.compute));
  pl.accO = reinterpret_cast<float*>(R.acc.get());
  pl.accLse = reinterpret_cast<float*>(R.acc.get() + lseAt);
  if (c.state->userKernel && !c.state->skipCompute) {
    ATTN_CHECK(R.part.reserve(accBytes, R.compute));
    pl.partO = reinterpret_cast<float*>(R.part.get());
    pl.partLse = reinterpret_cast<float*>(R.part.get() + lseAt);
  }
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));

  // Q's offsets and positions on the device; the accumulator at O = 0,
  // LSE = -inf.
  char* ms = R.metaStage.base();
  std::memcpy(ms + pl.ml.qOffAt, c.qOffsets.data(), sizeof(int32_t) * (S + 1));
  if (qRows) std::memcpy(ms + pl.ml.qPosAt, c.q.pos, sizeof(int32_t) * qRows);
  ATTN_CUDA_CHECK(cudaMemcpyAsync(R.meta.get(), ms, pl.ml.segAt, cudaMemcpyHostToDevice, R.compute));
  if (qRows)
    ATTN_CHECK(cuda::initAccumulator(pl.accO, pl.accLse, qRows, c.cfg.num_q_heads, c.cfg.head_dim,
                                     R.compute));

  // Block 0, this rank's own: metadata packed on the host; K and V copied
  // to the host buffer (to be sent) and device to device into buffer 0.
  char* h0 = R.hostBlock[0].base();
  char* d0 = R.block[0].get();
  const BlockLayout own =
      packBlockMeta(me, S, c.kvOffsets.data(), c.kv.pos, c.kv.rows, c.kvRowBytes, 2, h0);
  if (c.kv.rows && n > 1) {
    ATTN_CUDA_CHECK(cudaMemcpyAsync(h0 + own.tensorAt, c.kv.t0, own.tensorBytes, cudaMemcpyDefault, copy));
    ATTN_CUDA_CHECK(cudaMemcpyAsync(h0 + own.tensorAt + own.tensorBytes, c.kv.t1, own.tensorBytes,
                                    cudaMemcpyDefault, copy));
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.ownOnHost, copy));
  ATTN_CUDA_CHECK(cudaMemcpyAsync(d0, h0, own.tensorAt, cudaMemcpyHostToDevice, copy));
  if (c.kv.rows) {
    ATTN_CUDA_CHECK(cudaMemcpyAsync(d0 + own.tensorAt, c.kv.t0, own.tensorBytes, cudaMemcpyDefault, copy));
    ATTN_CUDA_CHECK(cudaMemcpyAsync(d0 + own.tensorAt + own.tensorBytes, c.kv.t1, own.tensorBytes,
                                    cudaMemcpyDefault, copy));
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.blockReady[0], copy));
  size_t curBytes = own.total;

  std::unique_ptr<ProgressThread> driver;
  if (n > 1) driver = std::make_unique<ProgressThread>(e, c.comm->prefix);
  int cur = 0;
  for (int s = 0; s < n; ++s) {
    const bool moving = s < n - 1;
    const auto stepStart = Clock::now();
    Request sendReq, recvReq;
    if (moving) {
      // Block s goes out from host buffer `cur` (the own block once its
      // K/V are down); block s+1 comes into the other, whose block s-1 was
      // sent last step and must also be uploaded before it is overwritten.
      ATTN_CUDA_CHECK(cudaEventSynchronize(s == 0 ? R.ownOnHost : R.blockReady[1 - cur]));
      ATTN_CHECK(e.irecv(prev, R.hostBlock[1 - cur].base(), capacity, &recvReq));
      ATTN_CHECK(e.isend(next, R.hostBlock[cur].base(), curBytes, &sendReq));
      driver->kick();
    }
    BlockView block;
    attnResult_t stepResult = viewBlock(R.hostBlock[cur].base(), curBytes, c.kvRowBytes, 2, &block);
    if (stepResult == attnSuccess && block.numSeqs != S)
      stepResult = setError(attnInvalidUsage, "pass-KV block from rank %d has %d sequences, %d expected",
                            block.origin, block.numSeqs, S);
    if (stepResult == attnSuccess) stepResult = pl.step(s, cur, block);
    if (moving) {
      // The transfers finish before any error is returned: the engine holds
      // these requests and the host buffers.
      auto t0 = Clock::now();
      ATTN_CHECK(driver->wait(&sendReq));
      ATTN_CHECK(driver->wait(&recvReq));
      c.stats.waitUs += usSince(t0);
    }
    ATTN_CHECK(stepResult);
    if (moving) {
      // Upload block s+1 once kernel s-1, the last reader of that device
      // buffer, is done; kernel s+1 waits for blockReady.
      const int nb = 1 - cur;
      ATTN_CUDA_CHECK(cudaStreamWaitEvent(copy, R.kernelDone[nb], 0));
      ATTN_CUDA_CHECK(cudaMemcpyAsync(R.block[nb].get(), R.hostBlock[nb].base(), recvReq.bytes,
                                      cudaMemcpyHostToDevice, copy));
      ATTN_CUDA_CHECK(cudaEventRecord(R.blockReady[nb], copy));
      curBytes = recvReq.bytes;
      cur = nb;
    }
    ATTN_TRACE(kLogAttn, "device pass-KV step %d: %d key rows from rank %d, host %.0f us", s,
               block.rows, block.origin, usSince(stepStart));
  }

  if (qRows) {
    ATTN_CHECK(cuda::convertFromFloat(io.out, c.cfg.dtype, pl.accO, accElems, R.compute));
    if (io.lse)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(io.lse, pl.accLse, headRows * sizeof(float), cudaMemcpyDefault,
                                      R.compute));
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.finished, R.compute));
  ATTN_CUDA_CHECK(cudaEventSynchronize(R.finished));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(copy));
  // Compute time is the GPU's: the kernels' event intervals.
  for (int s = 0; s < n; ++s) {
    if (!pl.timed[s]) continue;
    float ms = 0;
    ATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, R.timing[2 * s], R.timing[2 * s + 1]));
    c.stats.computeUs += 1000.0 * ms;
  }
  return attnSuccess;
}

}  // namespace attn
