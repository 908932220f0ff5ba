#include "perf/attn/attn_cli.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "perf/launch.h"

namespace attnperf {
namespace {

void usage(const char* prog, bool decode) {
  fprintf(stderr,
          "usage: %s [-t N | -p N] [-n iters] [-w warmup] [-c 0|1] [-J file.json]\n"
          "          [-L tokens] %s [-H q_heads] [-K kv_heads] [-D head_dim]\n"
          "          [-d float|half|bfloat16] [-C 0|1 causal] [-M modes] [-G device]\n"
          "  modes: comma list of kv, q, ship, auto, seq (all-gather KV then compute,\n"
          "         on the host or, with -G, on the device), heads (all-to-all over\n"
          "         heads, CSPS SP-NTP / Ulysses)\n"
          "  -G DEV: tensors on CUDA device DEV, every rank on it, one stream per rank\n"
          "  -k KEEPS (level_attn_perf): comma list of host:rack:cluster keep fractions\n",
          prog, decode ? "[-b batch sizes, e.g. 1,4,16]" : "[-m miss rates, e.g. 1,0.1,0.01] [-B seqs]");
}

template <typename T>
bool parseList(const char* s, std::vector<T>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    char* end;
    double v = strtod(tok.c_str(), &end);
    if (*end) return false;
    out->push_back(static_cast<T>(v));
  }
  return !out->empty();
}

// "1:0.5:0.25,0.5" -> {1, 0.5, 0.25}, {0.5, 0.5, 0.5}; each in [0, 1].
bool parseKeeps(const char* s, std::vector<std::array<float, 3>>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::vector<float> v;
    std::stringstream is(item);
    std::string tok;
    while (std::getline(is, tok, ':')) {
      char* end;
      const float x = strtof(tok.c_str(), &end);
      if (tok.empty() || *end || !(x >= 0 && x <= 1)) return false;
      v.push_back(x);
    }
    if (v.size() == 1) v.assign(3, v[0]);
    if (v.size() != 3) return false;
    out->push_back({v[0], v[1], v[2]});
  }
  return !out->empty();
}

bool parseModes(const char* s, std::vector<int>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok == "kv") out->push_back(attnModePassKV);
    else if (tok == "q") out->push_back(attnModePassQ);
    else if (tok == "ship") out->push_back(attnModeShipQ);
    else if (tok == "heads") out->push_back(attnModeHeadParallel);
    else if (tok == "auto") out->push_back(attnModeAuto);
    else if (tok == "seq") out->push_back(-1);
    else return false;
  }
  return !out->empty();
}

}  // namespace

std::string rankMode(const AttnOptions& o) {
  std::string m = launchedExternally() ? "launched" : o.procs ? "processes" : "threads";
  if (o.device != ATTN_DEVICE_HOST) m += ", cuda:" + std::to_string(o.device);
  return m;
}

bool parseAttnOptions(int argc, char** argv, bool decode, AttnOptions* o, int* exitCode) {
  *exitCode = 2;
  int c;
  while ((c = getopt(argc, argv, "t:p:n:w:c:J:L:m:b:B:H:K:D:d:C:M:G:k:h")) != -1) {
    bool good = true;
    switch (c) {
      case 't': o->threads = atoi(optarg); good = o->threads > 0; break;
      case 'p': o->procs = atoi(optarg); good = o->procs > 0; break;
      case 'n': o->iters = atoi(optarg); good = o->iters > 0; break;
      case 'w': o->warmup = atoi(optarg); good = o->warmup >= 0; break;
      case 'c': o->check = atoi(optarg); break;
      case 'J': o->json = optarg; break;
      case 'L': o->length = atoll(optarg); good = o->length > 0; break;
      case 'm': good = parseList(optarg, &o->miss); break;
      case 'b': good = parseList(optarg, &o->batches); break;
      case 'B': o->seqs = atoi(optarg); good = o->seqs > 0; break;
      case 'H': o->cfg.num_q_heads = atoi(optarg); break;
      case 'K': o->cfg.num_kv_heads = atoi(optarg); break;
      case 'D': o->cfg.head_dim = atoi(optarg); break;
      case 'C': o->cfg.causal = atoi(optarg); break;
      case 'd':
        if (!strcmp(optarg, "float")) o->cfg.dtype = attnFloat32;
        else if (!strcmp(optarg, "half")) o->cfg.dtype = attnFloat16;
        else if (!strcmp(optarg, "bfloat16") || !strcmp(optarg, "bf16")) o->cfg.dtype = attnBfloat16;
        else good = false;
        break;
      case 'M': good = parseModes(optarg, &o->modes); break;
      case 'G': o->device = atoi(optarg); good = o->device >= 0; break;
      case 'k': good = parseKeeps(optarg, &o->keeps); break;
      case 'h': *exitCode = 0; good = false; break;
      default: good = false;
    }
    if (!good) {
      usage(argv[0], decode);
      return false;
    }
  }
  if (o->threads == 0 && o->procs == 0) o->threads = 4;
  const bool onDevice = o->device != ATTN_DEVICE_HOST;
  if (o->modes.empty())
    o->modes = decode     ? std::vector<int>{attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto}
               : onDevice ? std::vector<int>{attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto, -1}
                          : std::vector<int>{attnModePassKV, attnModePassQ, attnModeAuto, -1};
  return true;
}

}  // namespace attnperf
