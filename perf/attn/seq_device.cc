#include "perf/attn/seq_device.h"

#include <cstdio>
#include <cstring>
#include <vector>

#if ATTN_PERF_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace attnperf {

#if ATTN_PERF_CUDA
namespace {

bool cudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "seq baseline: %s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

bool attnOk(attnResult_t r, attnComm_t comm, const char* what) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "seq baseline: %s failed: %s (%s)\n", what, attnGetErrorString(r),
          comm ? attnGetLastError(comm) : attnGetLastError(nullptr));
  return false;
}

size_t elemSize(attnDataType_t t) { return t == attnFloat32 ? 4 : 2; }

}  // namespace

SeqDevice::~SeqDevice() {
  auto s = reinterpret_cast<cudaStream_t>(dev_.stream());
  (void)cudaStreamSynchronize(s);
  for (void* p : {mine_, all_, acc_, qpos_, segs_})
    if (p) (void)(processes_ ? cudaFree(p) : cudaFreeAsync(p, s));
  (void)cudaStreamSynchronize(s);
}

bool SeqDevice::grow(void** p, size_t* have, size_t want) {
  if (*have >= want && *p) return true;
  auto s = reinterpret_cast<cudaStream_t>(dev_.stream());
  if (processes_) {
    if (*p && !cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return false;
    if (*p && !cudaOk(cudaFree(*p), "cudaFree")) return false;
  } else if (*p && !cudaOk(cudaFreeAsync(*p, s), "cudaFreeAsync")) {
    return false;
  }
  *p = nullptr;
  *have = 0;
  const size_t bytes = want ? want : 1;
  if (!cudaOk(processes_ ? cudaMalloc(p, bytes) : cudaMallocAsync(p, bytes, s), "allocation")) return false;
  *have = want;
  return true;
}

bool SeqDevice::once(attnComm_t comm, const Batch& b, const Shard& s, const void* q, const void* k,
                     const void* v, void* out, float* lse, double* computeUs) {
  int n = 0;
  attnCommCount(comm, &n);
  auto st = reinterpret_cast<cudaStream_t>(dev_.stream());
  const int S = s.layout.num_seqs;
  // K rows of head_dim, V rows and the output of the V head dim.
  const int Dv = valueHeadDim(b.cfg);
  const size_t krow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * b.cfg.head_dim;
  const size_t vrow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * Dv;
  const int64_t rows = static_cast<int64_t>(s.kvPos.size());
  int64_t maxRows = rows;
  if (!attnOk(attnAllReduce(&maxRows, &maxRows, 1, attnInt64, attnMax, comm, dev_.stream()), comm, "max rows") ||
      !dev_.finish(comm, "max rows"))
    return false;
  // A block: [rows, kv_offsets[S+1], kv_pos[maxRows]] then K and V, maxRows each.
  const size_t meta = sizeof(int32_t) * (S + 2 + maxRows), block = meta + (krow + vrow) * maxRows;
  const size_t nq = s.qPos.size(), heads = b.cfg.num_q_heads, width = heads * Dv;  // O rows
  if (!grow(&mine_, &mineBytes_, block) || !grow(&all_, &allBytes_, block * n) ||
      !grow(&acc_, &accBytes_, sizeof(float) * nq * width) || !grow(&qpos_, &qposBytes_, sizeof(int32_t) * nq) ||
      !grow(&segs_, &segsBytes_, sizeof(attn::cpu::AttnSegment) * S * n))
    return false;
  std::vector<int32_t> m(S + 2 + maxRows, 0);
  m[0] = static_cast<int32_t>(rows);
  std::memcpy(m.data() + 1, s.kvOffsets.data(), sizeof(int32_t) * (S + 1));
  std::memcpy(m.data() + S + 2, s.kvPos.data(), sizeof(int32_t) * rows);
  char* mine = static_cast<char*>(mine_);
  char* all = static_cast<char*>(all_);
  if (!cudaOk(cudaMemcpyAsync(mine, m.data(), meta, cudaMemcpyHostToDevice, st), "meta upload") ||
      !cudaOk(cudaMemcpyAsync(qpos_, s.qPos.data(), sizeof(int32_t) * nq, cudaMemcpyHostToDevice, st),
              "q_pos upload") ||
      (rows && !cudaOk(cudaMemcpyAsync(mine + meta, k, krow * rows, cudaMemcpyDeviceToDevice, st), "K copy")) ||
      (rows && !cudaOk(cudaMemcpyAsync(mine + meta + krow * maxRows, v, vrow * rows, cudaMemcpyDeviceToDevice, st),
                       "V copy")))
    return false;
  if (!attnOk(attnAllGather(mine, all, block, attnUint8, comm, dev_.stream()), comm, "attnAllGather"))
    return false;
  // The segments need every rank's offsets on the host.
  std::vector<int32_t> metas((S + 2) * size_t(n));
  for (int r = 0; r < n; ++r)
    if (!cudaOk(cudaMemcpyAsync(metas.data() + r * (S + 2), all + r * block, sizeof(int32_t) * (S + 2),
                                cudaMemcpyDeviceToHost, st),
                "meta download"))
      return false;
  if (!cudaOk(cudaStreamSynchronize(st), "cudaStreamSynchronize") || !dev_.finish(comm, "attnAllGather"))
    return false;
  std::vector<attn::cpu::AttnSegment> segs(size_t(S) * n);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < S; ++i) {
      const int32_t* h = metas.data() + r * (S + 2);
      segs[r * S + i] = {s.qOffsets[i], s.qOffsets[i + 1], h[1 + i], h[2 + i]};
    }
  if (!cudaOk(cudaMemcpyAsync(segs_, segs.data(), sizeof(segs[0]) * segs.size(), cudaMemcpyHostToDevice, st),
              "segments upload"))
    return false;
  cudaEvent_t t0, t1;
  if (!cudaOk(cudaEventCreate(&t0), "cudaEventCreate")) return false;
  if (!cudaOk(cudaEventCreate(&t1), "cudaEventCreate")) {
    cudaEventDestroy(t0);
    return false;
  }
  attn::cuda::AttnCudaExec ex;
  ex.stream = st;
  auto* acc = static_cast<float*>(acc_);
  bool good = cudaOk(cudaEventRecord(t0, st), "cudaEventRecord") &&
              attnOk(attn::cuda::initAccumulator(acc, lse, int64_t(nq), int(heads), Dv, st), nullptr,
                     "initAccumulator");
  for (int r = 0; r < n && good; ++r) {
    const char* blk = all + r * block;
    attn::cpu::AttnProblem p;
    p.q = q;
    p.k = blk + meta;
    p.v = blk + meta + krow * maxRows;
    p.dtype = b.cfg.dtype;
    p.nq = static_cast<int32_t>(nq);
    p.nk = metas[r * (S + 2)];
    p.num_q_heads = b.cfg.num_q_heads;
    p.num_kv_heads = b.cfg.num_kv_heads;
    p.head_dim = b.cfg.head_dim;
    p.head_dim_v = Dv;
    p.scale = b.cfg.softmax_scale;
    p.causal = b.cfg.causal;
    p.window_left = b.cfg.window_left;
    p.window_right = b.cfg.window_right;
    p.softcap = b.cfg.softcap;
    p.q_pos = static_cast<const int32_t*>(qpos_);
    p.k_pos = reinterpret_cast<const int32_t*>(blk) + S + 2;
    p.segments = static_cast<const attn::cpu::AttnSegment*>(segs_) + r * S;
    p.num_segments = S;
    good = attnOk(attn::cuda::attentionAccumulate(p, acc, lse, ex), nullptr, "attentionAccumulate");
  }
  good = good && attnOk(attn::cuda::convertFromFloat(out, b.cfg.dtype, acc, nq * width, st), nullptr,
                        "convertFromFloat") &&
         cudaOk(cudaEventRecord(t1, st), "cudaEventRecord") && cudaOk(cudaEventSynchronize(t1), "kernels");
  float ms = 0;
  good = good && cudaOk(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  *computeUs = ms * 1e3;
  return good;
}

#else

SeqDevice::~SeqDevice() = default;

bool SeqDevice::grow(void**, size_t*, size_t) { return false; }

bool SeqDevice::once(attnComm_t, const Batch&, const Shard&, const void*, const void*, const void*, void*, float*,
                     double*) {
  fprintf(stderr, "seq baseline: this build has no CUDA\n");
  return false;
}

#endif

}  // namespace attnperf
