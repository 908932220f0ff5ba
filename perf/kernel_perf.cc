// kernel_perf: the CPU partial-attention kernel against OpenBLAS doing the
// same two matrix products (S = Q K^T and O = S V per query head), in one run.
//
//   kernel_perf [-T 2048,4096] [-Q 0,1] [-H 8,32] [-K 8,1] [-D 128] [-d fp32,bf16]
//               [-c 0,1] [-W -1,4096] [-s softcap] [-B 0|1] [-t threads] [-r reps]
//               [-w warmup] [-C 0|1] [-J out.json] [--dv N]
//
// T is the key count; -Q lists query row counts (0 = T, a square prefill;
// 1 = a decode step: the last position attends to all T keys). kv_GB/s is
// the K and V bytes in the kernel's dtype over its time: for decode, which
// reads every key once, the figure to hold against read_GB/s, a plain
// vectorised pass over the same K and V buffers timed in the same run.
//
// -K lists kv-head counts; a value > Hq is skipped, so "-H 8,32 -K 32,8,1"
// covers MHA and GQA. Attention FLOPs are 4*nq*nk*D*Hq, times the visible
// fraction (T+1)/(2T) when causal: the kernel is credited only for the work
// the mask leaves. OpenBLAS is credited with the full products it computes
// (it cannot skip masked blocks), so for causal rows "time x" (BLAS time /
// kernel time) is the fairer speed-up, "rate x" the ratio of GFLOP/s.
// Times are medians of the repetitions, the two contenders interleaved; BLAS
// runs on fp32 copies of the inputs (conversion not timed) with the same
// thread count. -C 1 times by process CPU time instead of wall time: steadier
// on a shared, oversubscribed host, and meaningful only with -t 1.
// -W lists sliding windows (AttnProblem::window_left; -1 = none): each query
// sees the keys at most W positions before it (and, without causal, the
// whole future); FLOPs count the visible pairs only. -s sets a softcap
// (0 = none); kv_GB/s still counts all T keys' K and V bytes, those a
// window lets the kernel skip included. --dv N gives V (and O) a head dim
// of their own (MLA, e.g. -D 192 --dv 128; default: the head dim of -D);
// FLOPs count 2*nq*nk*(D+Dv)*Hq then. -B 0 skips the OpenBLAS products (long windowed runs, where
// the full products would take minutes): their columns read nan.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/worker_pool.h"

namespace {

using attn::cpu::AttnProblem;

bool g_cpu_time = false;  // -C 1: process CPU time instead of wall time

struct Options {
  std::vector<int> T{2048, 4096}, Q{0}, H{8, 32}, K{8, 1}, D{128}, causal{0, 1}, window{-1};
  float softcap = 0.0f;
  bool blas = true;
  std::vector<std::string> dtypes{"fp32", "bf16"};
  int threads = 1, reps = 5, warmup = 1;
  int dv = 0;  // --dv: V's head dim; 0: each D
  std::string json;
};

std::vector<int> intList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    if (!p) break;
    ++p;
  }
  return v;
}

std::vector<std::string> strList(const char* s) {
  std::vector<std::string> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == 0) {
      if (!cur.empty()) v.push_back(cur);
      cur.clear();
      if (*p == 0) break;
    } else {
      cur += *p;
    }
  }
  return v;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "-T") o.T = intList(v);
    else if (a == "-Q") o.Q = intList(v);
    else if (a == "-H") o.H = intList(v);
    else if (a == "-K") o.K = intList(v);
    else if (a == "-D") o.D = intList(v);
    else if (a == "-c") o.causal = intList(v);
    else if (a == "-W") o.window = intList(v);
    else if (a == "-s") o.softcap = float(std::atof(v));
    else if (a == "-B") o.blas = std::atoi(v) != 0;
    else if (a == "-d") o.dtypes = strList(v);
    else if (a == "-t") o.threads = std::max(1, std::atoi(v));
    else if (a == "-r") o.reps = std::max(1, std::atoi(v));
    else if (a == "-w") o.warmup = std::max(0, std::atoi(v));
    else if (a == "-J") o.json = v;
    else if (a == "-C") g_cpu_time = std::atoi(v) != 0;
    else if (a == "--dv") o.dv = std::max(0, std::atoi(v));
    else return false;
  }
  return true;
}

attnDataType_t dtypeOf(const std::string& s) {
  if (s == "fp16") return attnFloat16;
  if (s == "bf16") return attnBfloat16;
  return attnFloat32;
}

double now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double seconds(const std::function<void()>& f) {
  const double a = now();
  f();
  return now() - a;
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of the two contenders, their repetitions interleaved so that both
// see the same machine (shared hosts drift over seconds).
std::pair<double, double> medianPair(int reps, int warmup, const std::function<void()>& a,
                                     const std::function<void()>& b) {
  for (int i = 0; i < warmup; ++i) a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(seconds(a));
    tb.push_back(seconds(b));
  }
  return {median(ta), median(tb)};
}

double medianTime(int reps, int warmup, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(seconds(f));
  return median(t);
}

struct Row {
  int T, Q, H, K, D, Dv, causal, window;
  std::string dtype;
  double ours_s, blas_s, ours_gflops, blas_gflops, kv_gbps, read_gbps;
};

// Reads every byte of the buffers once (the memory-bandwidth yardstick for
// a decode step); the sum keeps the compiler from dropping the loads.
uint64_t readAll(const std::vector<char>& a, const std::vector<char>& b) {
  uint64_t sum = 0;
  for (const auto* buf : {&a, &b}) {
    const size_t words = buf->size() / sizeof(uint64_t);
    const auto* w = reinterpret_cast<const uint64_t*>(buf->data());
    for (size_t i = 0; i < words; ++i) sum += w[i];
  }
  return sum;
}

Row measure(const Options& o, int T, int Q, int H, int K, int D, int causal, int window,
            const std::string& dt, attn::cpu::WorkerPool* pool) {
  const attnDataType_t dtype = dtypeOf(dt);
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int Dv = o.dv > 0 ? o.dv : D;
  const size_t nq = size_t(Q) * H * D, nk = size_t(T) * K * D;
  const size_t no = size_t(Q) * H * Dv, nv = size_t(T) * K * Dv;  // O and V
  std::vector<float> q(nq), k(nk), v(nv);
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = nd(rng);
  // The kernel reads `dtype`; BLAS reads the same values widened back to fp32.
  const size_t es = dtype == attnFloat32 ? 4 : 2;
  std::vector<char> qd(nq * es), kd(nk * es), vd(nv * es);
  (void)attn::cpu::convertFromFloat(qd.data(), dtype, q.data(), nq);
  (void)attn::cpu::convertFromFloat(kd.data(), dtype, k.data(), nk);
  (void)attn::cpu::convertFromFloat(vd.data(), dtype, v.data(), nv);
  (void)attn::cpu::convertToFloat(q.data(), qd.data(), dtype, nq);
  (void)attn::cpu::convertToFloat(k.data(), kd.data(), dtype, nk);
  (void)attn::cpu::convertToFloat(v.data(), vd.data(), dtype, nv);

  // Keys at 0..T-1, queries at the last Q of those positions.
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int i = 0; i < T; ++i) pos[size_t(i)] = i;
  const int32_t* qpos = pos.data() + (T - Q);
  AttnProblem p;
  p.q = qd.data();
  p.k = kd.data();
  p.v = vd.data();
  p.dtype = dtype;
  p.nq = Q;
  p.nk = T;
  p.num_q_heads = H;
  p.num_kv_heads = K;
  p.head_dim = D;
  p.head_dim_v = Dv;
  p.causal = causal != 0;
  p.window_left = window;
  p.softcap = o.softcap;
  p.q_pos = qpos;
  p.k_pos = pos.data();
  std::vector<float> out(no), lse(size_t(Q) * H);
  const attn::cpu::AttnExec ex{o.threads, pool, nullptr};
  auto kernel = [&] {
    if (attn::cpu::attentionPartial(p, out.data(), lse.data(), ex) != attnSuccess) std::abort();
  };

  // OpenBLAS: per query head, S = Q_h K_g^T (Q x T), then O_h = S V_g.
  std::vector<float> s(size_t(Q) * T), o_blas(no);
  const int group = H / K;
  auto blas_products = [&] {
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Q, T, D, 1.0f, q.data() + h * D,
                  H * D, k.data() + g * D, K * D, 0.0f, s.data(), T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Q, Dv, T, 1.0f, s.data(), T,
                  v.data() + g * Dv, K * Dv, 0.0f, o_blas.data() + h * Dv, H * Dv);
    }
  };
  double ours = 0, blas = std::nan("");
  if (o.blas) std::tie(ours, blas) = medianPair(o.reps, o.warmup, kernel, blas_products);
  else ours = medianTime(o.reps, o.warmup, kernel);
  volatile uint64_t sink = 0;
  const double read = medianTime(o.reps, o.warmup, [&] { sink = sink + readAll(kd, vd); });
  const double full = 2.0 * Q * double(T) * (D + Dv) * H;
  // Query i (of Q, at position t = T-Q+i) sees keys [t - window, t] when
  // causal (t + 1 of them without a window), [t - window, T) when not.
  double seen = 0;
  for (int i = 0; i < Q; ++i) {
    const int64_t t = T - Q + i, lo = window < 0 ? 0 : std::max<int64_t>(0, t - window);
    seen += double((causal ? t + 1 : T) - lo);
  }
  const double visible = full * seen / (double(Q) * T);
  const double kv_bytes = double(nk + nv) * double(es);
  return {T,    Q,    H,   K, D, Dv, causal, window, dt, ours, blas, visible / ours * 1e-9,
          full / blas * 1e-9, kv_bytes / ours * 1e-9, kv_bytes / read * 1e-9};
}

// A JSON number, or null for nan (BLAS not run, -B 0).
std::string jnum(double x, const char* fmt) {
  if (std::isnan(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

void writeJson(const std::string& path, const Options& o, const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::perror(path.c_str());
    return;
  }
  std::fprintf(f,
               "{\"bench\":\"kernel_perf\",\"isa\":\"%s\",\"threads\":%d,\"clock\":\"%s\","
               "\"rows\":[\n",
               attn::cpu::isaName(attn::cpu::activeIsa()), o.threads, g_cpu_time ? "cpu" : "wall");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"T\":%d,\"Q\":%d,\"Hq\":%d,\"Hkv\":%d,\"D\":%d,\"Dv\":%d,\"dtype\":\"%s\",\"causal\":%d,"
                 "\"window_left\":%d,\"softcap\":%g,"
                 "\"kernel_ms\":%.3f,\"blas_ms\":%s,\"kernel_gflops\":%.2f,"
                 "\"blas_gflops\":%s,\"rate_ratio\":%s,\"time_ratio\":%s,"
                 "\"kv_gbps\":%.3f,\"read_gbps\":%.3f}%s\n",
                 r.T, r.Q, r.H, r.K, r.D, r.Dv, r.dtype.c_str(), r.causal, r.window, double(o.softcap),
                 r.ours_s * 1e3, jnum(r.blas_s * 1e3, "%.3f").c_str(), r.ours_gflops,
                 jnum(r.blas_gflops, "%.2f").c_str(), jnum(r.ours_gflops / r.blas_gflops, "%.3f").c_str(),
                 jnum(r.blas_s / r.ours_s, "%.3f").c_str(), r.kv_gbps,
                 r.read_gbps, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  // The kernels read no environment: this program, their caller, hands
  // them ATTN_CPU_ISA (as the library does for its own calls).
  attn::cpu::setIsaSetting([]() -> const char* { return std::getenv("ATTN_CPU_ISA"); });
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: %s [-T list] [-Q list] [-H list] [-K list] [-D list] [-d fp32,bf16,fp16] "
                 "[-c 0,1] [-W windows] [-s softcap] [-B 0|1] [-t threads] [-r reps] [-w warmup] [-C 0|1] "
                 "[-J out.json] [--dv N]\n",
                 argv[0]);
    return 2;
  }
  openblas_set_num_threads(o.threads);
  attn::cpu::WorkerPool pool(o.threads);
  std::printf("# kernel_perf: isa %s, %d thread(s), median of %d (%s time), OpenBLAS %s\n",
              attn::cpu::isaName(attn::cpu::activeIsa()), o.threads, o.reps,
              g_cpu_time ? "cpu" : "wall", openblas_get_config());
  if (o.softcap != 0.0f) std::printf("# softcap %g\n", double(o.softcap));
  std::printf("# %5s %5s %4s %4s %4s %4s %5s %6s %6s %11s %11s %10s %10s %7s %7s %8s %9s\n", "T", "Q",
              "Hq", "Hkv", "D", "Dv", "dtype", "causal", "window", "kernel_ms", "blas_ms", "kern_GF/s",
              "blas_GF/s", "rate_x", "time_x", "kv_GB/s", "read_GB/s");
  std::vector<Row> rows;
  for (int T : o.T)
    for (int Q0 : o.Q)
    for (int H : o.H)
      for (int K : o.K) {
        if (K > H || H % K) continue;
        for (int D : o.D)
          for (const auto& dt : o.dtypes)
            for (int c : o.causal)
              for (int w : o.window) {
              const int Q = Q0 <= 0 || Q0 > T ? T : Q0;
              const Row r = measure(o, T, Q, H, K, D, c, w, dt, &pool);
              std::printf("  %5d %5d %4d %4d %4d %4d %5s %6d %6d %11.2f %11.2f %10.1f %10.1f %7.2f %7.2f "
                          "%8.2f %9.2f\n",
                          r.T, r.Q, r.H, r.K, r.D, r.Dv, r.dtype.c_str(), r.causal, r.window, r.ours_s * 1e3,
                          r.blas_s * 1e3, r.ours_gflops, r.blas_gflops,
                          r.ours_gflops / r.blas_gflops, r.blas_s / r.ours_s, r.kv_gbps, r.read_gbps);
              std::fflush(stdout);
              rows.push_back(r);
            }
      }
  if (!o.json.empty()) writeJson(o.json, o, rows);
  return 0;
}
