// kvAttention's arithmetic on the GPU (a device pool): the protocol is
// src/attn/kv_attention.cc's; here the queries and blocks meet in the CUDA
// kernels. Runs on the communicator's proxy thread, on the compute stream of
// its DeviceAttnState, whose buffers it borrows for the call:
//  - R.acc: this rank's fp32 accumulator (O, then LSE);
//  - R.part: first the blocks of positions that changed since the last call,
//    uploaded into the pool's mirror; later a reply being folded;
//  - R.metaStage -> R.meta: positions of this rank's queries, the key blocks
//    of its paged requests, and the key table expanded from them;
//  - R.hostOut -> R.block[0]: every serving peer's queries, their
//    positions, the key blocks of their paged requests and their table;
//    R.visit: the partials computed for them (all peers in one go: one
//    upload, one copy down, one synchronisation).
// What goes up per call is a few bytes per block (cpu::KeyBlock), not a
// row and a position per key: the device expands the table from the
// pool's mirror of the positions. Each request is one kernel launch,
// however its blocks are scattered.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "kernels/cuda/cuda_kernels.h"
#include "src/attn/attn_config.h"
#include "src/core/comm.h"
#include "src/core/datatype.h"
#include "src/device/cuda_check.h"
#include "src/device/device_state.h"
#include "src/attn/device/kv_device.h"

namespace attn {
namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// The keys of a call's requests. Those whose blocks are one run read the
// mirror's positions in place; the paged ones share one key table, which
// the device expands from their blocks (one launch for all of them).
// Device layout of a section: the blocks (uploaded), the table's rows, its
// positions.
class DeviceKeyTables {
 public:
  explicit DeviceKeyTables(KvPool& pool) : pool_(pool) {}

  void add(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens) {
    keys_.push_back(kvKeyLayoutOf(pool_, slots, tokens));
    at_.push_back(entries_);
    if (keys_.back().paged) {
      kvKeyBlocks(slots, tokens, entries_, &blocks_);
      entries_ += keys_.back().count;
    }
  }
  const KvKeyLayout& keys(size_t i) const { return keys_[i]; }
  bool any() const {
    return std::any_of(keys_.begin(), keys_.end(), [](const KvKeyLayout& k) { return k.count > 0; });
  }
  size_t uploadBytes() const { return blocks_.size() * sizeof(cpu::KeyBlock); }
  size_t bytes() const { return rowsAt() + align256(size_t(entries_) * 8) + size_t(entries_) * 4; }
  void write(char* host) const { std::memcpy(host, blocks_.data(), uploadBytes()); }

  // Once the section's blocks are on the device at `dev`.
  attnResult_t expand(char* dev, cudaStream_t s) const {
    return cuda::gatherKeyTable(rows(dev), pos(dev), reinterpret_cast<const cpu::KeyBlock*>(dev), blocks_.size(),
                                pool_.config().block_tokens, pool_.devicePositions(),
                                size_t(pool_.config().capacity_blocks), s);
  }
  cpu::AttnProblem problem(size_t i, const KvQueryHeader& h, const void* q, int32_t rows, const int32_t* qPos,
                           char* dev) const {
    const KvKeyLayout& k = keys_[i];
    const int32_t* keyPos = k.paged ? pos(dev) + at_[i]
                                    : pool_.devicePositions() + size_t(k.first) * size_t(pool_.config().block_tokens);
    return kvKeysProblem(pool_, h, q, rows, qPos, k, k.paged ? this->rows(dev) + at_[i] : nullptr, keyPos);
  }

 private:
  size_t rowsAt() const { return align256(uploadBytes()); }
  int64_t* rows(char* dev) const { return reinterpret_cast<int64_t*>(dev + rowsAt()); }
  int32_t* pos(char* dev) const {
    return reinterpret_cast<int32_t*>(dev + rowsAt() + align256(size_t(entries_) * 8));
  }

  KvPool& pool_;
  std::vector<KvKeyLayout> keys_;
  std::vector<int32_t> at_;  // paged: the request's first table entry
  std::vector<cpu::KeyBlock> blocks_;
  int32_t entries_ = 0;
};

class DeviceKvAttnCompute : public KvAttnCompute {
 public:
  DeviceKvAttnCompute(KvPool& pool, const KvAttnArgs& a, DeviceAttnState& R)
      : pool_(pool), a_(a), R_(R), hq_(a.cfg.num_q_heads), d_(a.cfg.head_dim) {}

  attnResult_t init() {
    ATTN_CHECK(R_.prepare(0));
    s_ = R_.compute;
    ATTN_CHECK(syncPositions());
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

  attnResult_t serve(std::vector<KvServeBatch>& batches,
                     const std::function<attnResult_t(size_t)>& ready) override {
    if (batches.empty()) return attnSuccess;
    const attnKvPoolConfig_t& pc = pool_.config();
    const size_t od = size_t(pc.head_dim), elt = dataTypeSize(pc.dtype);
    // Staged layout: every batch's queries, then their positions, then the
    // key blocks of all their requests (then, on the device only, the key
    // table). Results: each batch's O then LSE, one after another.
    DeviceKeyTables tables(pool_);
    std::vector<size_t> qAt(batches.size()), posAt(batches.size()), resAt(batches.size() + 1, 0);
    size_t at = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      qAt[i] = at;
      at = align256(at + size_t(batches[i].rows) * size_t(batches[i].h.numQHeads) * od * elt);
    }
    for (size_t i = 0; i < batches.size(); ++i) {
      posAt[i] = at;
      at = align256(at + size_t(batches[i].rows) * 4);
      for (const KvServedRequest& r : batches[i].reqs) tables.add(r.slots, r.tokens);
      resAt[i + 1] = resAt[i] + size_t(batches[i].rows) * size_t(batches[i].h.numQHeads) * (od + 1);
    }
    const size_t keysAt = at, upload = keysAt + tables.uploadBytes();
    ATTN_CHECK(R_.hostOut.reserve(upload + 64));
    ATTN_CHECK(R_.block[0].reserve(keysAt + tables.bytes() + 64, s_));
    char* host = R_.hostOut.base();
    for (size_t i = 0; i < batches.size(); ++i) {
      const size_t rb = size_t(batches[i].h.numQHeads) * od * elt;
      size_t row = 0;
      for (const KvServedRequest& r : batches[i].reqs) {
        std::memcpy(host + qAt[i] + row * rb, r.q, size_t(r.rows) * rb);
        std::memcpy(host + posAt[i] + row * 4, r.pos, size_t(r.rows) * 4);
        row += size_t(r.rows);
      }
    }
    tables.write(host + keysAt);
    char* dev = R_.block[0].get();
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, host, upload, cudaMemcpyHostToDevice, s_));
    ATTN_CHECK(tables.expand(dev + keysAt, s_));

    const size_t resultFloats = resAt.back();
    ATTN_CHECK(R_.visit.reserve(resultFloats * sizeof(float) + 64, s_));
    float* res = reinterpret_cast<float*>(R_.visit.get());
    size_t key = 0;  // the request's index in `tables`
    for (size_t i = 0; i < batches.size(); ++i) {
      const KvServeBatch& b = batches[i];
      const int hq = b.h.numQHeads;
      const size_t rb = size_t(hq) * od * elt;
      float* o = res + resAt[i];
      float* l = o + size_t(b.rows) * hq * od;
      ATTN_CHECK(cuda::initAccumulator(o, l, b.rows, hq, int(od), s_));
      size_t row = 0;
      for (const KvServedRequest& r : b.reqs) {
        if (r.rows > 0 && tables.keys(key).count > 0) {
          const cpu::AttnProblem p = tables.problem(key, b.h, dev + qAt[i] + row * rb, r.rows,
                                                    reinterpret_cast<const int32_t*>(dev + posAt[i]) + row,
                                                    dev + keysAt);
          ATTN_CHECK(cuda::attentionAccumulate(p, o + row * hq * od, l + row * hq, exec()));
        }
        row += size_t(r.rows);
        ++key;
      }
    }
    // One copy down and one wait for all of them.
    std::vector<float> all(resultFloats);
    if (resultFloats)
      ATTN_CUDA_CHECK(cudaMemcpyAsync(all.data(), res, resultFloats * sizeof(float), cudaMemcpyDeviceToHost, s_));
    ATTN_CUDA_CHECK(cudaStreamSynchronize(s_));
    for (size_t i = 0; i < batches.size(); ++i) {
      batches[i].result->assign(all.begin() + long(resAt[i]), all.begin() + long(resAt[i + 1]));
      ATTN_CHECK(ready(i));
    }
    return attnSuccess;
  }

  attnResult_t own(const std::vector<KvOwnWork>& work) override {
    DeviceKeyTables tables(pool_);
    for (const KvOwnWork& w : work) tables.add(w.slots, w.tokens);
    if (!tables.any()) return attnSuccess;
    const int64_t rows = a_.rows();
    const size_t qPosAt = 0, keysAt = align256(size_t(rows) * 4);
    const size_t upload = keysAt + tables.uploadBytes();
    ATTN_CHECK(R_.metaStage.reserve(upload + 64));
    ATTN_CHECK(R_.meta.reserve(keysAt + tables.bytes() + 64, s_));
    char* host = R_.metaStage.base();
    if (a_.hasQPos) std::memcpy(host + qPosAt, a_.qPos.data(), size_t(rows) * 4);
    else std::memset(host + qPosAt, 0, size_t(rows) * 4);
    tables.write(host + keysAt);
    char* dev = R_.meta.get();
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, host, upload, cudaMemcpyHostToDevice, s_));
    ATTN_CHECK(tables.expand(dev + keysAt, s_));
    const KvQueryHeader mine = kvQueryHeaderOf(a_.cfg, hq_);
    const size_t qRowBytes = size_t(hq_) * size_t(d_) * dataTypeSize(a_.cfg.dtype);
    for (size_t j = 0; j < work.size(); ++j) {
      const int32_t r0 = work[j].r0;
      if (work[j].rows == 0 || tables.keys(j).count == 0) continue;
      const cpu::AttnProblem p = tables.problem(j, mine, static_cast<const char*>(a_.q) + size_t(r0) * qRowBytes,
                                                work[j].rows, reinterpret_cast<const int32_t*>(dev + qPosAt) + r0,
                                                dev + keysAt);
      ATTN_CHECK(cuda::attentionAccumulate(p, accO_ + size_t(r0) * hq_ * d_, accL_ + size_t(r0) * hq_, exec()));
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
      if (a_.cfg.sinks) ATTN_CHECK(cuda::applySinks(accO_, accL_, rows, hq_, d_, a_.cfg.sinks, s_));
      ATTN_CHECK(cuda::convertFromFloat(a_.out, a_.cfg.dtype, accO_, size_t(rows) * hq_ * d_, s_));
      if (a_.lse && lseIsNatural(a_.cfg))
        ATTN_CUDA_CHECK(cudaMemcpyAsync(a_.lse, accL_, size_t(rows) * hq_ * sizeof(float), cudaMemcpyDeviceToDevice,
                                        s_));
      else if (a_.lse)  // the config's convention (kernels/cuda/lse.cu)
        ATTN_CHECK(cuda::writeLse(a_.lse, accL_, rows, hq_, a_.cfg.lse_base == attnLseBase2,
                                  a_.cfg.lse_layout == attnLseHeadMajor, s_));
    }
    ATTN_CUDA_CHECK(cudaStreamSynchronize(s_));
    return attnSuccess;
  }

 private:
  // Brings the pool's mirror of the positions up to date: the blocks
  // written since the last call go up together (pageable: the runtime takes
  // them at the call) and are scattered into place.
  attnResult_t syncPositions() {
    std::vector<int32_t> slots, pos;
    pool_.takeChangedPositions(&slots, &pos);
    if (slots.empty()) return attnSuccess;
    const attnResult_t r = uploadPositions(slots, pos);
    if (r != attnSuccess) pool_.positionsNotMirrored(slots);
    return r;
  }
  attnResult_t uploadPositions(const std::vector<int32_t>& slots, const std::vector<int32_t>& pos) {
    const size_t posAt = align256(slots.size() * 4), bytes = posAt + pos.size() * 4;
    std::vector<char> staged(bytes);
    std::memcpy(staged.data(), slots.data(), slots.size() * 4);
    std::memcpy(staged.data() + posAt, pos.data(), pos.size() * 4);
    ATTN_CHECK(R_.part.reserve(bytes + 64, s_));
    char* dev = R_.part.get();
    ATTN_CUDA_CHECK(cudaMemcpyAsync(dev, staged.data(), bytes, cudaMemcpyHostToDevice, s_));
    const size_t bt = size_t(pool_.config().block_tokens);
    return cuda::scatterRows(pool_.devicePositions(), dev + posAt, reinterpret_cast<const int32_t*>(dev),
                             slots.size(), size_t(pool_.config().capacity_blocks), bt * 4, s_);
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
