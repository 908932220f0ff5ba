// attn_model: the mode selector's predictions without running anything, for
// what-if studies. Defaults reproduce the CP paper's Table 4 setting:
// Llama3-405B per CP rank (128 query heads, 8 KV heads, head_dim 128,
// bf16, causal), CP4, T+P = 128000, H100 bf16 dense peak (989 TFLOP/s) and
// 400 Gb/s RDMA (50 GB/s).
//
//   attn_model [-N ranks] [-L T+P] [-H q_heads] [-K kv_heads] [-D head_dim]
//              [-B GB/s] [-l latency_us] [-F TFLOP/s] [-I interference 0..1] [-m miss rates]
#include <getopt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "attncomm.h"

namespace {
const char* name(attnAttnMode_t m) {
  switch (m) {
    case attnModePassKV: return "pass-KV";
    case attnModePassQ: return "pass-Q";
    case attnModeShipQ: return "ship-Q";
    case attnModeHeadParallel: return "heads";
    default: return "auto";
  }
}
}  // namespace

int main(int argc, char** argv) {
  int N = 4;
  long long L = 128000;
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(128, 8, 128, attnBfloat16, 0.0f, 1);
  attnCostModel_t m{50.0, 10.0, 989.0, 0.0};
  std::vector<double> miss = {0.01, 0.025, 0.05, 0.1, 0.125, 0.25, 0.5, 1.0};
  int c;
  while ((c = getopt(argc, argv, "N:L:H:K:D:B:l:F:I:m:h")) != -1) {
    switch (c) {
      case 'N': N = atoi(optarg); break;
      case 'L': L = atoll(optarg); break;
      case 'H': cfg.num_q_heads = atoi(optarg); break;
      case 'K': cfg.num_kv_heads = atoi(optarg); break;
      case 'D': cfg.head_dim = atoi(optarg); break;
      case 'B': m.link_bandwidth_GBps = atof(optarg); break;
      case 'l': m.link_latency_us = atof(optarg); break;
      case 'F': m.attn_tflops = atof(optarg); break;
      case 'I': m.comm_interference = atof(optarg); break;
      case 'm': {
        miss.clear();
        std::stringstream ss(optarg);
        std::string t;
        while (std::getline(ss, t, ',')) miss.push_back(atof(t.c_str()));
        break;
      }
      default:
        fprintf(stderr, "usage: %s [-N ranks] [-L T+P] [-H] [-K] [-D] [-B GB/s] [-l us] [-F TFLOP/s] [-I 0..1] [-m rates]\n", argv[0]);
        return c == 'h' ? 0 : 2;
    }
  }
  printf("# N=%d T+P=%lld heads %d/%d D=%d bf16 causal; link %.1f GB/s %.1f us; kernel %.1f TFLOP/s; "
         "interference %.2f\n",
         N, L, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, m.link_bandwidth_GBps, m.link_latency_us,
         m.attn_tflops, m.comm_interference);
  printf("# %7s %8s %8s %12s %12s %12s %10s %12s\n", "miss%", "T", "P", "pass-KV(ms)", "pass-Q(ms)",
         "heads(ms)", "choice", "Alg.5");
  for (double r : miss) {
    long long T = std::llround(r * L), P = L - T;
    attnModeEstimate_t e;
    if (attnEstimateModes(&m, &cfg, N, T, P, &e) != attnSuccess) {
      fprintf(stderr, "%s\n", attnGetLastError(NULL));
      return 1;
    }
    printf("  %7.2f %8lld %8lld %12.2f %12.2f %12.2f %10s %12s\n", 100 * r, T, P, e.pass_kv_us / 1e3,
           e.pass_q_us / 1e3, e.head_parallel_us / 1e3, name(e.chosen), name(e.alg1_choice));
  }
  attnModeEstimate_t e;
  attnEstimateModes(&m, &cfg, N, L / 2, L / 2, &e);
  printf("# Eq. 2 threshold: pass-KV hides its ring when T >= %.0f tokens\n", e.alg1_threshold_tokens);
  return 0;
}
