#include "src/attn/device/device_attn_kernels.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "src/core/error.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"

namespace attn {

attnResult_t beginDeviceCall(const AttnCall& c, const char* algorithm, size_t peerEvents, DeviceCallEnv* env) {
  if (!c.comm->device) return setError(attnInternalError, "device %s on a host communicator", algorithm);
  DeviceState& dev = *c.comm->device;
  env->R = &dev.attn;
  env->copy = dev.bridge->copyStream();
  env->e = c.comm->engine.get();
  env->n = c.comm->nranks;
  env->me = c.comm->rank;
  env->next = (env->me + 1) % env->n;
  env->prev = (env->me - 1 + env->n) % env->n;
  if (env->n > 1) {
    // Collective, as the call is: the first call on every rank agrees.
    if (!dev.ipc) dev.ipc = std::make_unique<ipc::IpcState>(c.comm->config.device);
    ATTN_CHECK(dev.ipc->agree(c.comm));
    if (!dev.ring) dev.ring = std::make_unique<RingLink>();
    ATTN_CHECK(dev.ring->agree(c.comm, *dev.ipc));
    env->ring = dev.ring.get();
  }
  ATTN_CHECK(env->R->prepare(0, peerEvents));
  env->prepared_ = true;
  return attnSuccess;
}

attnResult_t finishDeviceCall(AttnCall& c, const DeviceCallEnv& env, DeviceAccumulator& acc, DeviceKernels& kernels,
                              const DeviceAttnBuffers& io) {
  ATTN_CHECK(acc.writeOut(c, *env.R, io));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(env.copy));
  return kernels.addComputeTime();
}

DeviceRows deviceRowsOf(const BlockView& v, const char* hostBase, char* devBase) {
  DeviceRows r;
  r.t0 = onDevice(static_cast<const char*>(v.t0), hostBase, devBase);
  r.t1 = v.t1 ? onDevice(static_cast<const char*>(v.t1), hostBase, devBase) : nullptr;
  r.rows = v.rows;
  r.hostOffsets = v.offsets;
  r.devOffsets = onDevice(v.offsets, hostBase, devBase);
  r.devPos = onDevice(v.pos, hostBase, devBase);
  return r;
}

namespace {
size_t headRowsOf(const AttnCall& c) { return static_cast<size_t>(c.q.rows) * c.cfg.num_q_heads; }
}  // namespace

attnResult_t DeviceAccumulator::reserve(const AttnCall& c, DeviceAttnState& R) {
  const size_t headRows = headRowsOf(c);
  const size_t lseAt = alignUp(headRows * c.cfg.head_dim_v * sizeof(float), 256);
  ATTN_CHECK(R.acc.reserve(lseAt + headRows * sizeof(float) + 16, R.compute));
  o = reinterpret_cast<float*>(R.acc.get());
  lse = reinterpret_cast<float*>(R.acc.get() + lseAt);
  return attnSuccess;
}

attnResult_t DeviceAccumulator::init(const AttnCall& c, DeviceAttnState& R) {
  if (c.q.rows == 0) return attnSuccess;
  return cuda::initAccumulator(o, lse, c.q.rows, c.cfg.num_q_heads, c.cfg.head_dim_v, R.compute);
}

attnResult_t DeviceAccumulator::fold(const AttnCall& c, DeviceAttnState& R, const float* partial) {
  const size_t headRows = headRowsOf(c);
  if (headRows == 0) return attnSuccess;
  const cpu::AttnPartialRef part{partial, attnFloat32, partial + headRows * c.cfg.head_dim_v};
  return cuda::foldPartial(o, lse, part, headRows, c.cfg.head_dim_v, R.compute);
}

attnResult_t DeviceAccumulator::writeOut(const AttnCall& c, DeviceAttnState& R, const DeviceAttnBuffers& io) {
  const size_t headRows = headRowsOf(c);
  if (headRows) {
    // Sinks join the denominator once, after every rank's keys are merged.
    if (c.cfg.sinks)
      ATTN_CHECK(cuda::applySinks(o, lse, c.q.rows, c.cfg.num_q_heads, c.cfg.head_dim_v, c.cfg.sinks, R.compute));
    ATTN_CHECK(cuda::convertFromFloat(io.out, c.cfg.dtype, o, headRows * c.cfg.head_dim_v, R.compute));
    if (io.lse)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(io.lse, lse, headRows * sizeof(float), cudaMemcpyDefault, R.compute));
  }
  ATTN_CUDA_CHECK(cudaEventRecord(R.finished, R.compute));
  ATTN_CUDA_CHECK(cudaEventSynchronize(R.finished));
  return attnSuccess;
}

attnResult_t prepareKernels(AttnCall& c, DeviceAttnState& R, const std::vector<RowsRef>& resident, int launches,
                            DeviceKernels* kernels, DeviceAccumulator* acc) {
  ATTN_CHECK(kernels->reserve(resident, launches));
  ATTN_CHECK(acc->reserve(c, R));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
  ATTN_CHECK(kernels->upload());
  return acc->init(c, R);
}

attnResult_t DeviceKernels::reserve(const std::vector<RowsRef>& resident, int launches) {
  resident_ = resident;
  offsetsAt_.clear();
  posAt_.clear();
  size_t at = 0;
  for (const RowsRef& r : resident) {
    offsetsAt_.push_back(at);
    at = alignUp(at + sizeof(int32_t) * (c_.numSeqs + 1), 16);
    posAt_.push_back(at);
    at = alignUp(at + sizeof(int32_t) * r.rows, 16);
  }
  fixedBytes_ = at;
  segAt_ = at;
  segBytes_ = alignUp(sizeof(cpu::AttnSegment) * c_.numSeqs, 16);
  launches_ = launches;
  used_ = 0;
  // Each launch has its own segment slot, so an upload never races the
  // next launch's host writes.
  const size_t total = segAt_ + segBytes_ * launches + 16;
  ATTN_CHECK(R_.prepare(2 * static_cast<size_t>(launches)));
  ATTN_CHECK(R_.metaStage.reserve(total));
  ATTN_CHECK(R_.meta.reserve(total, R_.compute));
  // A user kernel's partial: the call's own query rows, or a visitor's
  // (pass-Q, ship-Q), in fp32 or the kernel's own dtype.
  partRows_ = c_.q.rows;
  for (int64_t r : c_.qRowsOf) partRows_ = std::max<int64_t>(partRows_, r);
  if (c_.state->userKernel && !c_.state->skipCompute && partRows_ > 0) {
    const size_t headRows = static_cast<size_t>(partRows_) * c_.cfg.num_q_heads;
    const size_t lseAt = alignUp(headRows * c_.cfg.head_dim_v * sizeof(float), 256);
    ATTN_CHECK(R_.part.reserve(lseAt + headRows * sizeof(float), R_.compute));
    partO_ = reinterpret_cast<float*>(R_.part.get());
    partLse_ = reinterpret_cast<float*>(R_.part.get() + lseAt);
  }
  timed_.assign(launches, false);
  return attnSuccess;
}

attnResult_t DeviceKernels::upload() {
  if (fixedBytes_ == 0) return attnSuccess;
  char* stage = R_.metaStage.base();
  for (size_t i = 0; i < resident_.size(); ++i) {
    const RowsRef& r = resident_[i];
    std::memcpy(stage + offsetsAt_[i], r.offsets, sizeof(int32_t) * (c_.numSeqs + 1));
    if (r.rows) std::memcpy(stage + posAt_[i], r.pos, sizeof(int32_t) * r.rows);
  }
  ATTN_CUDA_CHECK(cudaMemcpyAsync(R_.meta.get(), stage, fixedBytes_, cudaMemcpyHostToDevice, R_.compute));
  return attnSuccess;
}

DeviceRows DeviceKernels::resident(size_t i) const {
  const RowsRef& r = resident_[i];
  const char* meta = R_.meta.get();
  return DeviceRows{r.t0, r.t1, r.rows, r.offsets, reinterpret_cast<const int32_t*>(meta + offsetsAt_[i]),
                    reinterpret_cast<const int32_t*>(meta + posAt_[i])};
}

attnResult_t DeviceKernels::accumulate(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse) {
  // Nothing to fold: the accumulator stays as it is.
  if (qs.rows == 0 || kvs.rows == 0 || c_.state->skipCompute) return attnSuccess;
  return launch(qs, kvs, o, lse, true);
}

attnResult_t DeviceKernels::partial(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse) {
  if (qs.rows == 0) return attnSuccess;
  if (kvs.rows == 0 || c_.state->skipCompute)
    return cuda::initAccumulator(o, lse, qs.rows, c_.cfg.num_q_heads, c_.cfg.head_dim_v, R_.compute);
  return launch(qs, kvs, o, lse, false);
}

attnResult_t DeviceKernels::launch(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse,
                                   bool fold) {
  if (used_ >= launches_)
    return setError(attnInternalError, "device attention: launch %d of %d planned", used_ + 1, launches_);
  const int slot = used_++;
  ATTN_CUDA_CHECK(cudaEventRecord(R_.timing[2 * slot], R_.compute));
  if (c_.state->userKernel) ATTN_CHECK(userKernel(qs, kvs, o, lse, fold));
  else ATTN_CHECK(builtIn(slot, qs, kvs, o, lse, fold));
  ATTN_CUDA_CHECK(cudaEventRecord(R_.timing[2 * slot + 1], R_.compute));
  timed_[slot] = true;
  return attnSuccess;
}

attnResult_t DeviceKernels::builtIn(int slot, const DeviceRows& qs, const DeviceRows& kvs, float* o,
                                    float* lse, bool fold) {
  // Device tensors and positions, host offsets: problemOf builds the
  // segments on the host, and they go up from this launch's pinned slot.
  const RowsRef qd{qs.t0, nullptr, qs.rows, qs.hostOffsets, qs.devPos};
  const RowsRef kvd{kvs.t0, kvs.t1, kvs.rows, kvs.hostOffsets, kvs.devPos};
  std::vector<cpu::AttnSegment> segs;
  cpu::AttnProblem p = problemOf(c_, qd, kvd, &segs);
  const size_t at = segAt_ + static_cast<size_t>(slot) * segBytes_;
  auto* hs = reinterpret_cast<cpu::AttnSegment*>(R_.metaStage.base() + at);
  std::copy(segs.begin(), segs.end(), hs);
  auto* ds = reinterpret_cast<cpu::AttnSegment*>(R_.meta.get() + at);
  ATTN_CUDA_CHECK(cudaMemcpyAsync(ds, hs, sizeof(cpu::AttnSegment) * segs.size(), cudaMemcpyHostToDevice,
                                  R_.compute));
  p.segments = ds;
  cuda::AttnCudaExec ex;
  ex.stream = R_.compute;
  if (fold) return cuda::attentionAccumulate(p, o, lse, ex);
  return cuda::attentionPartial(p, o, lse, ex);
}

attnResult_t DeviceKernels::userKernel(const DeviceRows& qs, const DeviceRows& kvs, float* o, float* lse,
                                       bool fold) {
  const AttnState& st = *c_.state;
  // Straight into (o, lse) when the kernel writes what they hold; else into
  // R.part, folded from there as the kernel wrote it (no fp32 round trip).
  const bool direct = !fold && st.kernelWritesAccumulatorForm();
  if (!direct && (!partO_ || qs.rows > partRows_))
    return setError(attnInternalError, "device attention: %d query rows to fold, room for %lld", qs.rows,
                    (long long)partRows_);
  ATTN_CHECK(checkKernelOut(st, c_.cfg));
  attnAttnKernelArgs_t a;
  a.q = qs.t0;
  a.k = kvs.t0;
  a.v = kvs.t1;
  a.out = direct ? o : partO_;  // in out_dtype (attncomm.h)
  a.lse = direct ? lse : partLse_;
  a.num_seqs = c_.numSeqs;
  a.q_offsets = qs.devOffsets;
  a.q_pos = qs.devPos;
  a.kv_offsets = kvs.devOffsets;
  a.kv_pos = kvs.devPos;
  a.cfg = &c_.cfg;
  a.out_dtype = st.userOutDtype;
  a.lse_base = st.userLseBase;
  a.lse_layout = st.userLseLayout;
  attnResult_t r = st.userKernel(&a, st.userData, reinterpret_cast<attnStream_t>(R_.compute));
  if (r != attnSuccess)
    return setError(r, "the attention kernel set by attnCommSetAttnKernel failed (on the device)");
  if (direct) return attnSuccess;
  // A fresh partial is the fold of the kernel's into an empty one.
  if (!fold) ATTN_CHECK(cuda::initAccumulator(o, lse, qs.rows, c_.cfg.num_q_heads, c_.cfg.head_dim_v, R_.compute));
  const cpu::AttnPartialRef part{partO_, st.userOutDtype, partLse_, st.userLseBase, st.userLseLayout,
                                 c_.cfg.num_q_heads};
  return cuda::foldPartial(o, lse, part, static_cast<size_t>(qs.rows) * c_.cfg.num_q_heads,
                           c_.cfg.head_dim_v, R_.compute);
}

attnResult_t DeviceKernels::addComputeTime() {
  for (int s = 0; s < used_; ++s) {
    if (!timed_[s]) continue;
    float ms = 0;
    ATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, R_.timing[2 * s], R_.timing[2 * s + 1]));
    c_.stats.computeUs += 1000.0 * ms;
  }
  return attnSuccess;
}

}  // namespace attn
