// Device kernel rates, each next to its yardstick measured in the same run:
//  - merge (fold of fp32 / bf16 partials, 4-way merge) in GB/s of memory
//    traffic, next to cudaMemcpyAsync device-to-device GB/s (goal: >= 80%);
//  - partial attention, causal, bf16, head_dim 128, in TFLOP/s at 8K / 16K /
//    32K tokens (compare with perf/attn/sdpa_reference.py: torch SDPA flash
//    on the same shapes; first goal >= 0.5 of it), the launcher's kernel
//    (mma.sync) next to the WMMA kernel.
// Times are medians of -n iterations (CUDA events). Without a device it
// says so and exits 77 (the suite's "skipped").
//
//  - a decode step (one query per sequence over T keys each), split-K as the
//    launcher chooses it next to one launch without it (key_splits = 1),
//    with K/V read rates in GB/s.
//
//   cuda_kernel_perf [-n iters] [-w warmup] [-t tokens,...] [-q heads] [-k kv_heads]
//                    [-m merge_MiB] [-T decode keys,...] [-b decode batch,...]
//                    [-d head_dim] [-v head_dim_v (MLA: -d 192 -v 128)]
//                    [-g (use the SIMT kernel)]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "perf/timing.h"

namespace {

#define CK(call)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "cuda_kernel_perf: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define AK(call)                                                                     \
  do {                                                                               \
    if ((call) != attnSuccess) {                                                     \
      std::fprintf(stderr, "cuda_kernel_perf: %s failed\n", #call);                  \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Opts {
  int iters = 20, warmup = 3, hq = 32, hkv = 8;
  int d = 128, dv = 0;  // Q/K and V head dims (0: d)
  int valueDim() const { return dv > 0 ? dv : d; }
  size_t merge_mib = 512;
  bool generic = false;
  std::vector<int> tokens{8192, 16384, 32768};
  std::vector<int> decode_keys{32768, 131072};  // -T: keys per sequence of a decode step
  std::vector<int> decode_batch{1, 8};          // -b: sequences of a decode step
};

__global__ void fillKernel(uint16_t* p, size_t n, bool bf16, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float f = float(x & 0xffff) / 32768.0f - 1.0f;  // [-1, 1)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    p[i] = bf16 ? uint16_t(u >> 16) : uint16_t(0x3c00 | (x & 0x3ff));
  }
}

__global__ void fillF32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = v + float(i % 7) * 0.25f;
}

// Median time in microseconds of `fn` enqueued on `s`.
template <class F>
double medianUs(const Opts& o, cudaStream_t s, F&& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < o.iters; ++i) {
    CK(cudaEventRecord(a, s));
    fn();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return attnperf::summarize(t).medianUs;
}

void benchMerge(const Opts& o, cudaStream_t s) {
  const int d = 128;
  const size_t rows = o.merge_mib * (1u << 20) / (d * 4);
  const size_t obytes = rows * d * 4;
  float *acc, *acc_l, *src;
  CK(cudaMalloc(&acc, obytes));
  CK(cudaMalloc(&acc_l, rows * 4));
  CK(cudaMalloc(&src, obytes));
  std::vector<float*> part_o(4), part_l(4);
  for (int j = 0; j < 4; ++j) {
    CK(cudaMalloc(&part_o[j], obytes));
    CK(cudaMalloc(&part_l[j], rows * 4));
    fillF32<<<1024, 256, 0, s>>>(part_o[j], rows * d, 0.1f * j);
    fillF32<<<1024, 256, 0, s>>>(part_l[j], rows, 1.0f + j);
  }
  fillF32<<<1024, 256, 0, s>>>(acc, rows * d, 0.5f);
  fillF32<<<1024, 256, 0, s>>>(acc_l, rows, 0.0f);
  uint16_t* part_bf16;
  CK(cudaMalloc(&part_bf16, rows * d * 2));
  fillKernel<<<1024, 256, 0, s>>>(part_bf16, rows * d, true, 7);
  CK(cudaStreamSynchronize(s));

  const double copy_us = medianUs(o, s, [&] { CK(cudaMemcpyAsync(src, acc, obytes, cudaMemcpyDeviceToDevice, s)); });
  const double copy_gbs = 2.0 * obytes / copy_us / 1e3;  // read + write
  std::printf("# merge: %zu rows x head_dim %d (fp32 accumulator %.0f MiB); traffic = bytes read + written\n",
              rows, d, obytes / 1048576.0);
  std::printf("%-34s %10s %10s %10s\n", "operation", "time(us)", "GB/s", "vs copy");
  std::printf("%-34s %10.1f %10.1f %9.0f%%\n", "cudaMemcpyAsync D2D", copy_us, copy_gbs, 100.0);
  auto row = [&](const char* name, double us, double bytes) {
    const double gbs = bytes / us / 1e3;
    std::printf("%-34s %10.1f %10.1f %9.0f%%\n", name, us, gbs, 100.0 * gbs / copy_gbs);
  };
  attn::cpu::AttnPartialRef p32{part_o[0], attnFloat32, part_l[0]};
  row("fold 1 fp32 partial", medianUs(o, s, [&] { AK(attn::cuda::foldPartial(acc, acc_l, p32, rows, d, s)); }),
      3.0 * obytes + 3.0 * rows * 4);
  attn::cpu::AttnPartialRef p16{part_bf16, attnBfloat16, part_l[1]};
  row("fold 1 bf16 partial", medianUs(o, s, [&] { AK(attn::cuda::foldPartial(acc, acc_l, p16, rows, d, s)); }),
      2.5 * obytes + 3.0 * rows * 4);
  std::vector<attn::cpu::AttnPartialRef> parts;
  for (int j = 0; j < 4; ++j) parts.push_back({part_o[j], attnFloat32, part_l[j]});
  row("merge 4 fp32 partials", medianUs(o, s, [&] {
        AK(attn::cuda::mergePartials(acc, acc_l, parts.data(), 4, rows, d, s));
      }),
      6.0 * obytes + 6.0 * rows * 4);
  CK(cudaStreamSynchronize(s));
  for (int j = 0; j < 4; ++j) cudaFree(part_o[j]), cudaFree(part_l[j]);
  cudaFree(acc), cudaFree(acc_l), cudaFree(src), cudaFree(part_bf16);
}

// The chosen kernel next to the WMMA one (the previous tensor-core kernel)
// on the same inputs, interleaved so drift hits both alike.
void benchAttention(const Opts& o, cudaStream_t s) {
  const int d = o.d, dv = o.valueDim();
  std::printf("\n# partial attention: causal, bf16, head_dim %d/%d, Hq %d, Hkv %d, one sequence%s\n", d, dv,
              o.hq, o.hkv, o.generic ? " (SIMT kernel)" : "");
  std::printf("# TFLOP/s counts 2 * T^2 * Hq * (D + Dv) / 2 (causal half), as flash-attention benchmarks;\n"
              "# medians of 3 interleaved rounds of -n iterations; baseline = the WMMA kernel\n");
  std::printf("%8s %8s %12s %10s %12s %10s %9s %14s\n", "tokens", "kernel", "time(us)", "TFLOP/s", "wmma(us)",
              "TFLOP/s", "speed-up", "tiles skipped");
  for (int t : o.tokens) {
    const size_t qn = size_t(t) * o.hq * d, kn = size_t(t) * o.hkv * d, vn = size_t(t) * o.hkv * dv;
    const size_t on = size_t(t) * o.hq * dv;
    uint16_t *q, *k, *v;
    float *out, *lse;
    int32_t* pos;
    attn::cuda::AttnCudaStats* stats;
    CK(cudaMalloc(&q, qn * 2));
    CK(cudaMalloc(&k, kn * 2));
    CK(cudaMalloc(&v, vn * 2));
    CK(cudaMalloc(&out, on * 4));
    CK(cudaMalloc(&lse, size_t(t) * o.hq * 4));
    CK(cudaMalloc(&pos, size_t(t) * 4));
    CK(cudaMalloc(&stats, sizeof(*stats)));
    fillKernel<<<1024, 256, 0, s>>>(q, qn, true, 1);
    fillKernel<<<1024, 256, 0, s>>>(k, kn, true, 2);
    fillKernel<<<1024, 256, 0, s>>>(v, vn, true, 3);
    std::vector<int32_t> hp(t);
    for (int i = 0; i < t; ++i) hp[i] = i;
    CK(cudaMemcpy(pos, hp.data(), size_t(t) * 4, cudaMemcpyHostToDevice));
    attn::cpu::AttnProblem p;
    p.q = q, p.k = k, p.v = v;
    p.dtype = attnBfloat16;
    p.nq = p.nk = t;
    p.num_q_heads = o.hq, p.num_kv_heads = o.hkv, p.head_dim = d, p.head_dim_v = dv;
    p.causal = true;
    p.q_pos = p.k_pos = pos;
    attn::cuda::AttnCudaExec ex, wmma;
    ex.stream = wmma.stream = s;
    ex.force_generic = o.generic;
    wmma.force_wmma = true;
    attn::cuda::AttnCudaPlan plan, wplan;
    AK(attn::cuda::attentionPlan(p, ex, &plan));
    AK(attn::cuda::attentionPlan(p, wmma, &wplan));
    const bool compare = plan.kernel != wplan.kernel && wplan.kernel == attn::cuda::AttnCudaKernel::wmma;
    std::vector<double> t1, t2;
    for (int r = 0; r < 3; ++r) {
      t1.push_back(medianUs(o, s, [&] { AK(attn::cuda::attentionPartial(p, out, lse, ex)); }));
      if (compare) t2.push_back(medianUs(o, s, [&] { AK(attn::cuda::attentionPartial(p, out, lse, wmma)); }));
    }
    CK(cudaMemset(stats, 0, sizeof(*stats)));
    ex.stats = stats;
    AK(attn::cuda::attentionPartial(p, out, lse, ex));
    attn::cuda::AttnCudaStats st;
    CK(cudaMemcpy(&st, stats, sizeof(st), cudaMemcpyDeviceToHost));
    const double flops = 2.0 * double(t) * double(t) * o.hq * (d + dv) / 2.0;
    const double total = double(st.tiles_full + st.tiles_masked + st.tiles_skipped);
    const double us = attnperf::summarize(t1).medianUs;
    std::printf("%8d %8s %12.1f %10.2f", t, attn::cuda::attnCudaKernelName(plan.kernel), us, flops / us / 1e6);
    if (compare) {
      const double wus = attnperf::summarize(t2).medianUs;
      std::printf(" %12.1f %10.2f %8.2fx", wus, flops / wus / 1e6, wus / us);
    } else {
      std::printf(" %12s %10s %9s", "-", "-", "-");
    }
    std::printf(" %13.1f%%\n", total > 0 ? 100.0 * st.tiles_skipped / total : 0.0);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(pos), cudaFree(stats);
  }
}

// One decode step: B sequences, each one query at position T-1 over its T
// keys (causal). "one launch" is the kernel with key_splits = 1; "split-K"
// is the launcher's own choice.
void benchDecode(const Opts& o, cudaStream_t s) {
  const int d = o.d, dv = o.valueDim();
  std::printf("\n# decode step: bf16, head_dim %d/%d, Hq %d, Hkv %d, one query per sequence over T keys%s\n", d,
              dv, o.hq, o.hkv, o.generic ? " (SIMT kernel)" : "");
  std::printf("# GB/s = K and V bytes read over the time; wmma = the WMMA kernel with split-K\n");
  std::printf("%8s %4s %14s %10s %14s %10s %9s %10s %10s\n", "T", "B", "one launch(us)", "GB/s", "split-K(us)",
              "GB/s", "speed-up", "wmma(us)", "GB/s");
  for (int B : o.decode_batch)
    for (int T : o.decode_keys) {
      const size_t nk = size_t(B) * T, qn = size_t(B) * o.hq * d, kn = nk * o.hkv * d, vn = nk * o.hkv * dv;
      uint16_t *q, *k, *v;
      float *out, *lse;
      int32_t *qpos, *kpos;
      attn::cpu::AttnSegment* segs;
      CK(cudaMalloc(&q, qn * 2));
      CK(cudaMalloc(&k, kn * 2));
      CK(cudaMalloc(&v, vn * 2));
      CK(cudaMalloc(&out, size_t(B) * o.hq * dv * 4));
      CK(cudaMalloc(&lse, size_t(B) * o.hq * 4));
      CK(cudaMalloc(&qpos, size_t(B) * 4));
      CK(cudaMalloc(&kpos, nk * 4));
      CK(cudaMalloc(&segs, sizeof(attn::cpu::AttnSegment) * B));
      fillKernel<<<1024, 256, 0, s>>>(q, qn, true, 1);
      fillKernel<<<1024, 256, 0, s>>>(k, kn, true, 2);
      fillKernel<<<1024, 256, 0, s>>>(v, vn, true, 3);
      std::vector<int32_t> hq(B, T - 1), hk(nk);
      std::vector<attn::cpu::AttnSegment> hs(B);
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < T; ++j) hk[size_t(b) * T + j] = j;
        hs[b] = {b, b + 1, b * T, (b + 1) * T};
      }
      CK(cudaMemcpy(qpos, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(kpos, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(segs, hs.data(), hs.size() * sizeof(hs[0]), cudaMemcpyHostToDevice));
      attn::cpu::AttnProblem p;
      p.q = q, p.k = k, p.v = v;
      p.dtype = attnBfloat16;
      p.nq = B, p.nk = int(nk);
      p.num_q_heads = o.hq, p.num_kv_heads = o.hkv, p.head_dim = d, p.head_dim_v = dv;
      p.causal = true;
      p.q_pos = qpos, p.k_pos = kpos;
      p.segments = segs, p.num_segments = B;
      attn::cuda::AttnCudaExec one, split, wmma;
      one.stream = split.stream = wmma.stream = s;
      one.force_generic = split.force_generic = o.generic;
      one.key_splits = 1;
      wmma.force_wmma = true;
      // Interleaved, so drift hits all alike.
      std::vector<double> t1, t2, t3;
      for (int r = 0; r < 3; ++r) {
        t1.push_back(medianUs(o, s, [&] { AK(attn::cuda::attentionPartial(p, out, lse, one)); }));
        t2.push_back(medianUs(o, s, [&] { AK(attn::cuda::attentionPartial(p, out, lse, split)); }));
        t3.push_back(medianUs(o, s, [&] { AK(attn::cuda::attentionPartial(p, out, lse, wmma)); }));
      }
      const double a = attnperf::summarize(t1).medianUs, b = attnperf::summarize(t2).medianUs;
      const double c = attnperf::summarize(t3).medianUs;
      const double bytes = 2.0 * double(kn + vn);
      std::printf("%8d %4d %14.1f %10.1f %14.1f %10.1f %8.2fx %10.1f %10.1f\n", T, B, a, bytes / a / 1e3, b,
                  bytes / b / 1e3, a / b, c, bytes / c / 1e3);
      cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(qpos), cudaFree(kpos);
      cudaFree(segs);
    }
}

std::vector<int> parseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end;
    v.push_back(int(std::strtol(p, &end, 10)));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-g") { o.generic = true; continue; }
    if (a == "-h" || !val) {
      std::printf("usage: %s [-n iters] [-w warmup] [-t tokens,...] [-q heads] [-k kv_heads] "
                  "[-m merge_MiB] [-T decode keys,...] [-b decode batch,...] [-d head_dim] [-v head_dim_v] [-g]\n",
                  argv[0]);
      return a == "-h" ? 0 : 2;
    }
    ++i;
    if (a == "-n") o.iters = std::max(1, std::atoi(val));
    else if (a == "-w") o.warmup = std::max(0, std::atoi(val));
    else if (a == "-t") o.tokens = parseList(val);
    else if (a == "-q") o.hq = std::atoi(val);
    else if (a == "-k") o.hkv = std::atoi(val);
    else if (a == "-m") o.merge_mib = size_t(std::max(1, std::atoi(val)));
    else if (a == "-T") o.decode_keys = parseList(val);
    else if (a == "-b") o.decode_batch = parseList(val);
    else if (a == "-d") o.d = std::atoi(val);
    else if (a == "-v") o.dv = std::atoi(val);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (o.d < 1 || o.d > 256 || o.dv < 0 || o.dv > 256) {
    std::fprintf(stderr, "cuda_kernel_perf: -d %d / -v %d: head dims are 1..256 (-v 0: -d)\n", o.d, o.dv);
    return 2;
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("cuda_kernel_perf: no CUDA device (%s); nothing to measure\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  benchMerge(o, s);
  benchAttention(o, s);
  benchDecode(o, s);
  CK(cudaStreamDestroy(s));
  return 0;
}
