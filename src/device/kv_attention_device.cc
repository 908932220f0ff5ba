// kvAttention's arithmetic on the GPU (a device pool): the protocol is
// src/attn/kv_attention.cc's; here the queries and blocks meet in the CUDA
// kernels. Runs on the communicator's proxy thread, on the compute stream of
// its DeviceAttnState, whose buffers it borrows for the call:
//  - R.acc: this rank's fp32 accumulator (O, then LSE);
//  - R.metaStage -> R.meta: positions of this rank's queries and of the keys
//    of every run of its slots;
//  - R.hostOut -> R.block[0]: one peer's queries, their positions and their
//    keys' positions; R.visit: the partial computed for that peer;
//  - R.part: a reply being folded.
// Positions live on the host with the books and go up with each call.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"
#include "src/device/kv_device.h"

namespace attn {
namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// Key positions of every run of `slots`, packed: one offset per run.
struct RunPositions {
  std::vector<int64_t> first;
  std::vector<int32_t> keys;
  std::vector<size_t> offset;  // in int32 elements from the section's start
  size_t total = 0;
};
void addRuns(KvPool& pool, const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens,
             RunPositions* rp) {
  (void)forEachSlotRun(slots, tokens, pool.config().block_tokens, [&](int64_t first, int32_t nk) {
    rp->first.push_back(first);
    rp->keys.push_back(nk);
    rp->offset.push_back(rp->total);
    rp->total += size_t(nk);
    return attnSuccess;
  });
}
void writeRuns(KvPool& pool, const RunPositions& rp, int32_t* dst) {
  for (size_t i = 0; i < rp.first.size(); ++i)
    std::memcpy(dst + rp.offset[i], pool.pos(rp.first[i]), size_t(rp.keys[i]) * sizeof(int32_t));
}

class DeviceKvAttnCompute : public KvAttnCompute {
 public:
  DeviceKvAttnCompute(KvPool& pool, const KvAttnArgs& a, DeviceAttnState& R)
      : pool_(pool), a_(a), R_(R), hq_(a.cfg.num_q_heads), d_(a.cfg.head_dim) {}

  attnResult_t init() {
    ATTN_CHECK(R_.prepare(0));
    s_ = R_.compute;
    const int64_t rows = a_.rows();
    ATTN_CHECK(R_.acc.reserve(size_t(rows) * hq_ * (d_ + 1) * sizeof(float) + 64, s_));
    accO_ = reinterpret_cast<float*>(R_.acc.get());
    accL_ = accO_ + size_t(rows) * hq_ * d_;
    return cuda::initAccumulator(accO_, accL_, rows, hq_, d_, s_);
  }

  ~DeviceKvAttnCompute() override {
    // Nothing of this call may still run when the buffers are lent again.
    if (s_) (void)cudaStreamSynchronize(s_);
  }

  attnResult_t serve(const KvQueryHeader& h, const std::vector<KvServedRequest>& reqs, int64_t rows,
                     std::vector<float>* result) override {
    const attnKvPoolConfig_t& pc = pool_.config();
    const size_t rb = size_t(h.numQHeads) * size_t(pc.head_dim) * dataTypeSize(pc.dtype);
    RunPositions runs;
    std::vector<size_t> runsOf(reqs.size() + 1, 0);
    for (size_t j = 0; j < reqs.size(); ++j) {
      addRuns(pool_, reqs[j].slots, reqs[j].tokens, &runs);
      runsOf[j + 1] = runs.first.size();
    }
    // Staged layout: queries, their positions, the keys' positions.
    const size_t qAt = 0, qPosAt = align256(size_t(rows) * rb), kPosAt = align256(qPosAt + size_t(rows) * 4);
    const size_t bytes = kPosAt + runs.total * 4 + 64;
    ATTN_CHECK(R_.hostOut.reserve(bytes));
    ATTN_CHECK(R_.block[0].reserve(bytes, s_));
    char* host = R_.hostOut.base();
    size_t row = 0;
    for (const KvServedRequest& r : reqs) {
      std::memcpy(host + qAt + row * rb, r.q, size_t(r.rows) * rb);
      std::memcpy(host + qPosAt + row * 4, r.pos, size_t(r.rows) * 4);
      row += size_t(r.rows);
    }
    writeRuns(pool_, runs, reinterpret_cast<int32_t*>(host + kPosAt));
    char* dev = R_.block[0].get();
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes - 64, cudaMemcpyHostToDevice, s_));

    const size_t od = size_t(pc.head_dim);
    const size_t resultBytes = size_t(rows) * h.numQHeads * (od + 1) * sizeof(float);
    ATTN_CHECK(R_.visit.reserve(resultBytes + 64, s_));
    float* o = reinterpret_cast<float*>(R_.visit.get());
    float* l = o + size_t(rows) * h.numQHeads * od;
    ATTN_CHECK(cuda::initAccumulator(o, l, rows, h.numQHeads, int(od), s_));
    row = 0;
    for (size_t j = 0; j < reqs.size(); ++j) {
      const KvServedRequest& r = reqs[j];
      for (size_t k = runsOf[j]; k < runsOf[j + 1] && r.rows > 0; ++k) {
        cpu::AttnProblem p = problem(h, dev + qAt + row * rb, r.rows,
                                     reinterpret_cast<const int32_t*>(dev + qPosAt) + row, runs, k);
        p.k_pos = reinterpret_cast<const int32_t*>(dev + kPosAt) + runs.offset[k];
        ATTN_CHECK(cuda::attentionAccumulate(p, o + row * h.numQHeads * od, l + row * h.numQHeads, exec()));
      }
      row += size_t(r.rows);
    }
    result->resize(resultBytes / sizeof(float));
    if (resultBytes)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(result->data(), o, resultBytes, cudaMemcpyDeviceToHost, s_));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(s_));
    return attnSuccess;
  }

  attnResult_t own(const std::vector<KvOwnWork>& work) override {
    RunPositions runs;
    std::vector<size_t> runsOf(work.size() + 1, 0);
    for (size_t j = 0; j < work.size(); ++j) {
      addRuns(pool_, work[j].slots, work[j].tokens, &runs);
      runsOf[j + 1] = runs.first.size();
    }
    if (runs.first.empty()) return attnSuccess;
    const int64_t rows = a_.rows();
    const size_t qPosAt = 0, kPosAt = align256(size_t(rows) * 4);
    const size_t bytes = kPosAt + runs.total * 4 + 64;
    ATTN_CHECK(R_.metaStage.reserve(bytes));
    ATTN_CHECK(R_.meta.reserve(bytes, s_));
    char* host = R_.metaStage.base();
    if (a_.hasQPos) std::memcpy(host + qPosAt, a_.qPos.data(), size_t(rows) * 4);
    else std::memset(host + qPosAt, 0, size_t(rows) * 4);
    writeRuns(pool_, runs, reinterpret_cast<int32_t*>(host + kPosAt));
    char* dev = R_.meta.get();
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes - 64, cudaMemcpyHostToDevice, s_));
    const KvQueryHeader mine{hq_, a_.cfg.causal, a_.cfg.softmax_scale, 0};
    const size_t qRowBytes = size_t(hq_) * size_t(d_) * dataTypeSize(a_.cfg.dtype);
    for (size_t j = 0; j < work.size(); ++j) {
      const int32_t r0 = work[j].r0;
      for (size_t k = runsOf[j]; k < runsOf[j + 1]; ++k) {
        cpu::AttnProblem p = problem(mine, static_cast<const char*>(a_.q) + size_t(r0) * qRowBytes, work[j].rows,
                                     reinterpret_cast<const int32_t*>(dev + qPosAt) + r0, runs, k);
        p.k_pos = reinterpret_cast<const int32_t*>(dev + kPosAt) + runs.offset[k];
        ATTN_CHECK(cuda::attentionAccumulate(p, accO_ + size_t(r0) * hq_ * d_, accL_ + size_t(r0) * hq_, exec()));
      }
    }
    return attnSuccess;
  }

  attnResult_t fold(const std::vector<float>& reply,
                    const std::vector<std::pair<int32_t, int32_t>>& ranges) override {
    if (reply.empty()) return attnSuccess;
    int64_t rows = 0;
    for (const auto& [r0, r] : ranges) rows += r;
    ATTN_CHECK(R_.part.reserve(reply.size() * sizeof(float) + 64, s_));
    float* o = reinterpret_cast<float*>(R_.part.get());
    ATTN_CUDA_CHECK(cudaMemcpyAsync(o, reply.data(), reply.size() * sizeof(float), cudaMemcpyHostToDevice, s_));
    const float* l = o + size_t(rows) * hq_ * d_;
    for (const auto& [r0, r] : ranges) {
      cpu::AttnPartialRef ref{o, attnFloat32, l};
      ATTN_CHECK(cuda::foldPartial(accO_ + size_t(r0) * hq_ * d_, accL_ + size_t(r0) * hq_, ref, size_t(r) * hq_,
                                   d_, s_));
      o += size_t(r) * hq_ * d_;
      l += size_t(r) * hq_;
    }
    // The reply's host buffer is the caller's: pageable, so the copy above
    // has read it before returning.
    return attnSuccess;
  }

  attnResult_t finish() override {
    const int64_t rows = a_.rows();
    if (rows > 0) {
      ATTN_CHECK(cuda::convertFromFloat(a_.out, a_.cfg.dtype, accO_, size_t(rows) * hq_ * d_, s_));
      if (a_.lse)
        ATTN_CUDA_CHECK(cudaMemcpyAsync(a_.lse, accL_, size_t(rows) * hq_ * sizeof(float), cudaMemcpyDeviceToDevice,
                                        s_));
    }
    ATTN_CUDA_CHECK(cudaStreamSynchronize(s_));
    return attnSuccess;
  }

 private:
  // One run of keys (run k of `runs`) for `rows` queries; the caller points
  // k_pos at where it staged the run's positions.
  cpu::AttnProblem problem(const KvQueryHeader& h, const void* q, int32_t rows, const int32_t* qPos,
                           const RunPositions& runs, size_t k) const {
    return kvRunProblem(pool_, h, q, rows, qPos, runs.first[k], runs.keys[k]);
  }
  cuda::AttnCudaExec exec() const {
    cuda::AttnCudaExec ex;
    ex.stream = s_;
    return ex;
  }

  KvPool& pool_;
  const KvAttnArgs& a_;
  DeviceAttnState& R_;
  const int hq_, d_;
  cudaStream_t s_ = nullptr;
  float* accO_ = nullptr;
  float* accL_ = nullptr;
};

}  // namespace

attnResult_t makeKvAttnComputeDevice(KvPool& pool, const KvAttnArgs& a, std::unique_ptr<KvAttnCompute>* out) {
  if (!pool.comm()->device) return setError(attnInternalError, "a device KV pool on a host communicator");
  auto c = std::make_unique<DeviceKvAttnCompute>(pool, a, pool.comm()->device->attn);
  ATTN_CHECK(c->init());
  *out = std::move(c);
  return attnSuccess;
}

attnResult_t kvDeviceDownload(KvPool& pool, const void* src, size_t bytes, std::vector<char>* host) {
  DeviceAttnState& R = pool.comm()->device->attn;
  ATTN_CHECK(R.prepare(0));
  host->resize(bytes);
  if (bytes == 0) return attnSuccess;
  ATTN_CUDA_CHECK(cudaMemcpyAsync(host->data(), src, bytes, cudaMemcpyDeviceToHost, R.compute));
  ATTN_CUDA_CHECK(cudaStreamSynchronize(R.compute));
  return attnSuccess;
}

}  // namespace attn
