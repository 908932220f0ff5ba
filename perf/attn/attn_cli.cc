#include "perf/attn/attn_cli.h"

#include <getopt.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "perf/launch.h"

namespace attnperf {
namespace {

// Long options without a short letter (values above any char).
enum : int {
  kProcs = 256, kMiss, kBatches, kKvHeads, kHeadDim, kHeadDimV, kCausal, kModes, kDevice, kPlot,
  kBlockTokens, kLend, kRequests, kBreakdown, kLayers, kWindows, kSoftcap, kPlacement,
};

// Bit per program, for the options only some binaries take.
constexpr unsigned bit(AttnProgram p) { return 1u << static_cast<unsigned>(p); }
constexpr unsigned kAll = bit(AttnProgram::Ring) | bit(AttnProgram::Decode) | bit(AttnProgram::Level) |
                          bit(AttnProgram::Kv);

unsigned programsOf(int c) {
  switch (c) {
    case kMiss: case kWindows: case kPlacement: return bit(AttnProgram::Ring);
    case kSoftcap: return bit(AttnProgram::Ring) | bit(AttnProgram::Decode);
    case kBatches: return bit(AttnProgram::Decode);
    case kModes: case kBreakdown: case kLayers: return bit(AttnProgram::Ring) | bit(AttnProgram::Decode);
    case 'B': return bit(AttnProgram::Ring) | bit(AttnProgram::Level);
    case 'k': return bit(AttnProgram::Level);
    case kCausal: return kAll & ~bit(AttnProgram::Kv);  // kv: the query is the last token
    case kBlockTokens: case kLend: case kRequests: return bit(AttnProgram::Kv);
    default: return kAll;
  }
}

const option kLong[] = {
    {"threads", required_argument, nullptr, 't'},   {"procs", required_argument, nullptr, kProcs},
    {"iters", required_argument, nullptr, 'n'},     {"warmup_iters", required_argument, nullptr, 'w'},
    {"check", required_argument, nullptr, 'c'},     {"datatype", required_argument, nullptr, 'd'},
    {"output_file", required_argument, nullptr, 'J'}, {"timeout", required_argument, nullptr, 'T'},
    {"average", required_argument, nullptr, 'a'},   {"help", no_argument, nullptr, 'h'},
    {"tokens", required_argument, nullptr, 'L'},    {"heads", required_argument, nullptr, 'H'},
    {"seqs", required_argument, nullptr, 'B'},      {"keeps", required_argument, nullptr, 'k'},
    {"miss", required_argument, nullptr, kMiss},    {"batches", required_argument, nullptr, kBatches},
    {"kv-heads", required_argument, nullptr, kKvHeads}, {"head-dim", required_argument, nullptr, kHeadDim},
    {"head-dim-v", required_argument, nullptr, kHeadDimV},
    {"causal", required_argument, nullptr, kCausal}, {"modes", required_argument, nullptr, kModes},
    {"device", required_argument, nullptr, kDevice}, {"plot", required_argument, nullptr, kPlot},
    {"block-tokens", required_argument, nullptr, kBlockTokens}, {"lend", required_argument, nullptr, kLend},
    {"requests", required_argument, nullptr, kRequests}, {"breakdown", no_argument, nullptr, kBreakdown},
    {"layers", required_argument, nullptr, kLayers},
    {"windows", required_argument, nullptr, kWindows}, {"softcap", required_argument, nullptr, kSoftcap},
    {"placement", required_argument, nullptr, kPlacement},
    {nullptr, 0, nullptr, 0},
};

// nccl-tests' letters these binaries do not take, and why (with the new
// spelling of what the letter meant here before); never reinterpreted.
std::string refusal(int c, AttnProgram p) {
  const bool kv = p == AttnProgram::Kv;
  switch (c) {
    case 'g': return "nccl-tests' GPUs per thread; ranks are -t threads or --procs processes, on --device DEV";
    case 'b':
      return std::string("attention benchmarks size by --tokens/-L, not bytes") +
             (kv ? " (tokens per block: --block-tokens)" : p == AttnProgram::Decode ? " (batch sizes: --batches)" : "");
    case 'e': case 'i': return "attention benchmarks size by --tokens/-L, not bytes";
    case 'f':
      return std::string("attention benchmarks size by --tokens/-L, not a byte step factor") +
             (kv ? " (shares lent: --lend)" : "");
    case 'm':
      return std::string("nccl-tests' aggregated iterations; each call is timed alone here") +
             (p == AttnProgram::Ring ? " (miss rates: --miss)" : "");
    case 'N': return "nccl-tests' run cycles; not supported, run the binary again";
    case 'p': return "nccl-tests' parallel init; ranks as processes are --procs N";
    case 'I':
      return std::string("nccl-tests' per-iteration timing; not supported") +
             (kv ? " (requests in rank 0's pool: --requests)" : "");
    case 'K': return "nccl-tests' per-iteration skip; not supported (KV heads: --kv-heads)";
    case 'o': return "nccl-tests' reduction op; attention has none";
    case 'r': return "nccl-tests' root; attention collectives have none";
    case 'z': return "nccl-tests' blocking mode; not supported (every call is timed to completion)";
    case 'y': return "nccl-tests' null stream; not supported";
    case 'G': return "nccl-tests' CUDA graph launches; not supported (the device: --device DEV)";
    case 'C': return std::string("nccl-tests' CPU-time report; not supported") + (kv ? "" : " (causal mask: --causal 0|1)");
    case 'R': return "nccl-tests' buffer registration; not supported";
    case 'x': case 'V': return "nccl-tests' device-kernel option; not supported";
    case 'D': return "nccl-tests' device implementation; not supported (head dim: --head-dim)";
    case 'S': return "nccl-tests' timestamps; not supported";
    case 'M':
      return std::string("nccl-tests' memory report; not supported") +
             (p == AttnProgram::Ring || p == AttnProgram::Decode ? " (modes: --modes)" : "");
    case 'u': return "nccl-tests' unaligned buffers; not supported";
    default: return "";
  }
}

void usage(AttnProgram p) {
  const char* prog = programName(p);
  fprintf(stderr,
          "usage: %s [-t N | --procs N] [-n iters] [-w warmup] [-c 0|1] [-d float|half|bfloat16]\n"
          "          [-J file.json] [--plot file.png] [-T seconds] [-a 0|1|2|3] [--device DEV]\n"
          "          [-L|--tokens N] [-H|--heads N | -H q:kv:dim] [--kv-heads N] [--head-dim N]\n"
          "          [--head-dim-v N]\n",
          prog);
  switch (p) {
    case AttnProgram::Ring:
      fprintf(stderr, "          [--miss 1,0.1,0.01] [-B|--seqs N] [--causal 0|1] [--modes LIST] [--breakdown]\n"
                      "          [--layers N] [--windows -1,4096] [--softcap X] [--placement planner|contiguous]\n");
      break;
    case AttnProgram::Decode:
      fprintf(stderr, "          [--batches 1,4,16] [--causal 0|1] [--modes LIST] [--breakdown]\n"
                      "          [--layers N] [--softcap X]\n");
      break;
    case AttnProgram::Level:
      fprintf(stderr, "          [-B|--seqs N] [--causal 0|1] [-k|--keeps host:rack:cluster,...]\n");
      break;
    case AttnProgram::Kv:
      fprintf(stderr, "          [--block-tokens N] [--lend 0,0.25,0.5] [--requests N]\n");
      break;
  }
  fprintf(stderr,
          "  -t/-n/-w/-c/-d/-J/-T/-a/-h mean what they mean in nccl-tests; nccl-tests' other\n"
          "  letters are refused. -T S: after S seconds abort the communicators and fail.\n"
          "  -a: how the ranks' times combine: 0 rank 0, 1 mean, 2 fastest, 3 slowest (default%s)\n"
          "  --modes: comma list of kv, q, ship, auto, seq (all-gather KV then compute), heads\n"
          "         (all-to-all over heads, CSPS SP-NTP / Ulysses), ag (attnModeAllGatherKV, merged\n"
          "         on receive: gather-kv in the table); decode_attn_perf also one\n"
          "         (the whole step on rank 0 alone, through a one-rank communicator)\n"
          "  --device DEV: tensors on CUDA device DEV, every rank on it, one stream per rank\n"
          "  --breakdown: after each row, where rank 0's call went (medians, us): outside the\n"
          "         library's call, planning, set-up, kernel, waiting, output, the rest\n"
          "  --layers N: each timed step is N calls, one per layer, each layer with its own KV\n"
          "         (a whole model's decode step: time per token); --modes seq's attn column\n"
          "         is then the same step computed on one rank\n"
          "  --windows: sliding windows (window_left in tokens, -1 none), one table block each;\n"
          "         the sent(MB) column is the most any rank sent\n"
          "  --head-dim-v N: head dim of V and of the output, 1..256, 0 (default) the head dim\n"
          "         (MLA-shaped heads: --head-dim 192 --head-dim-v 128); Q and K keep --head-dim%s\n"
          "  --softcap X: logit soft-capping (0 none)\n"
          "  --placement: planner (attnPlanPrefill's balanced shards, default) or contiguous\n"
          "         (rank r holds the r-th slice of every sequence, as a window favours)\n"
          "  --plot FILE.png: a picture of the table (perf/plot_perf.py, needs matplotlib)\n",
          p == AttnProgram::Kv ? "; kv_attn_perf times rank 0 only: 0" : " 3",
          p == AttnProgram::Kv ? ";\n         KV pools hold V of the head dim: kv_attn_perf takes only --head-dim-v 0 or\n"
                                 "         the head dim"
                               : "");
}

// Whole-string integer in [lo, hi].
bool parseInt(const char* s, long lo, long hi, long* out) {
  if (!s || !*s) return false;
  errno = 0;
  char* end;
  const long v = strtol(s, &end, 10);
  if (*end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

template <typename T>
bool setInt(const char* s, long lo, long hi, T* out) {
  long v;
  if (!parseInt(s, lo, hi, &v)) return false;
  *out = static_cast<T>(v);
  return true;
}

// Comma list of numbers in [lo, hi]; integers only when `whole`.
template <typename T>
bool parseList(const char* s, double lo, double hi, bool whole, std::vector<T>* out) {
  std::vector<T> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) return false;
    char* end;
    const double x = strtod(tok.c_str(), &end);
    if (*end || !(x >= lo && x <= hi) || (whole && x != static_cast<double>(static_cast<long>(x)))) return false;
    v.push_back(static_cast<T>(x));
  }
  if (v.empty()) return false;
  *out = std::move(v);
  return true;
}

// "1:0.5:0.25,0.5" -> {1, 0.5, 0.25}, {0.5, 0.5, 0.5}; each in [0, 1].
bool parseKeeps(const char* s, std::vector<std::array<float, 3>>* out) {
  std::vector<std::array<float, 3>> keeps;
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
    keeps.push_back({v[0], v[1], v[2]});
  }
  if (keeps.empty()) return false;
  *out = std::move(keeps);
  return true;
}

bool parseModes(const char* s, AttnProgram p, std::vector<int>* out) {
  std::vector<int> m;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok == "kv") m.push_back(attnModePassKV);
    else if (tok == "q") m.push_back(attnModePassQ);
    else if (tok == "ship") m.push_back(attnModeShipQ);
    else if (tok == "heads") m.push_back(attnModeHeadParallel);
    else if (tok == "auto") m.push_back(attnModeAuto);
    else if (tok == "ag") m.push_back(attnModeAllGatherKV);
    else if (tok == "seq") m.push_back(-1);
    else if (tok == "one" && p == AttnProgram::Decode) m.push_back(kOneRankMode);
    else return false;
  }
  if (m.empty()) return false;
  *out = std::move(m);
  return true;
}

// nccl-tests' names, and the short ones kv_attn_perf took.
bool parseType(const char* s, attnDataType_t* t) {
  if (!strcmp(s, "float") || !strcmp(s, "fp32")) *t = attnFloat32;
  else if (!strcmp(s, "half") || !strcmp(s, "fp16")) *t = attnFloat16;
  else if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16")) *t = attnBfloat16;
  else return false;
  return true;
}

// -H N, or -H q:kv:dim (kv_attn_perf's spelling) for all three.
bool parseHeads(const char* s, attnAttnConfig_t* cfg) {
  if (!strchr(s, ':')) return setInt(s, 1, 65536, &cfg->num_q_heads);
  int q, kv, d;
  char extra;
  if (sscanf(s, "%d:%d:%d%c", &q, &kv, &d, &extra) != 3 || q < 1 || kv < 1 || d < 1 || d > 65536) return false;
  cfg->num_q_heads = q;
  cfg->num_kv_heads = kv;
  cfg->head_dim = d;
  return true;
}

// The flag as the user wrote it, for messages.
std::string flagName(int c, int longIndex) {
  if (longIndex >= 0) return std::string("--") + kLong[longIndex].name;
  return std::string("-") + static_cast<char>(c);
}

}  // namespace

const char* programName(AttnProgram p) {
  switch (p) {
    case AttnProgram::Ring: return "ring_attn_perf";
    case AttnProgram::Decode: return "decode_attn_perf";
    case AttnProgram::Level: return "level_attn_perf";
    case AttnProgram::Kv: return "kv_attn_perf";
  }
  return "attn_perf";
}

AttnOptions defaultOptions(AttnProgram p) {
  AttnOptions o;
  if (p == AttnProgram::Decode) o.length = 8192;
  if (p == AttnProgram::Kv) {
    o.length = 32768;
    o.iters = 20;
    o.warmup = 3;
    o.average = 0;
    o.cfg = attnAttnConfig_t ATTN_ATTN_CONFIG(32, 8, 128, attnFloat32, 0.0f, 1);
  }
  return o;
}

std::string rankMode(const AttnOptions& o) {
  std::string m = launchedExternally() ? "launched" : o.procs ? "processes" : "threads";
  if (o.device != ATTN_DEVICE_HOST) m += ", cuda:" + std::to_string(o.device);
  return m;
}

std::string headDimText(const attnAttnConfig_t& cfg) {
  std::string t = "head_dim " + std::to_string(cfg.head_dim);
  if (cfg.head_dim_v > 0 && cfg.head_dim_v != cfg.head_dim) t += "/" + std::to_string(cfg.head_dim_v);
  return t;
}

const char* averageName(int average) {
  switch (average) {
    case 0: return "rank 0";
    case 1: return "the mean over ranks";
    case 2: return "the fastest rank";
    default: return "the slowest rank";
  }
}

bool parseAttnOptions(int argc, char** argv, AttnProgram p, AttnOptions* o, int* exitCode) {
  *exitCode = 2;
  const char* prog = programName(p);
  optind = 0;  // glibc: a full rescan, so the parser can run again (tests)
  opterr = 0;  // one line of our own instead of getopt's
  int c, longIndex = -1;
  bool threadsSet = false;
  while ((c = getopt_long(argc, argv, ":t:n:w:c:d:J:T:a:hL:H:B:k:g:b:e:i:f:m:N:p:I:K:o:r:z:y:G:C:R:x:D:V:S:M:u:",
                          kLong, &longIndex)) != -1) {
    const std::string flag = flagName(c == '?' || c == ':' ? optopt : c, longIndex);
    longIndex = -1;
    if (c == '?') {
      if (optopt) fprintf(stderr, "%s: unknown option -%c (-h lists them)\n", prog, optopt);
      else fprintf(stderr, "%s: unknown option %s (-h lists them)\n", prog, argv[optind - 1]);
      return false;
    }
    if (c == ':') {
      fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
      return false;
    }
    if (const std::string why = refusal(c, p); !why.empty()) {
      fprintf(stderr, "%s: %s: %s\n", prog, flag.c_str(), why.c_str());
      return false;
    }
    if (!(programsOf(c) & bit(p))) {
      fprintf(stderr, "%s: %s does not apply to %s\n", prog, flag.c_str(), prog);
      return false;
    }
    bool good = true;
    const char* want = "";  // what a good value looks like
    switch (c) {
      case 't': want = "a rank count >= 1"; good = setInt(optarg, 1, 4096, &o->threads); threadsSet = true; break;
      case kProcs: want = "a rank count >= 1"; good = setInt(optarg, 1, 4096, &o->procs); break;
      case 'n': want = "an iteration count >= 1"; good = setInt(optarg, 1, 1000000, &o->iters); break;
      case 'w': want = "an iteration count >= 0"; good = setInt(optarg, 0, 1000000, &o->warmup); break;
      case 'c': want = "0 or a check count"; good = setInt(optarg, 0, 1000000, &o->check); break;
      case 'd': want = "float, half or bfloat16"; good = parseType(optarg, &o->cfg.dtype); break;
      case 'J': want = "a file name"; good = *optarg != 0; o->json = optarg; break;
      case kPlot: want = "a file name"; good = *optarg != 0; o->plot = optarg; break;
      case 'T': want = "seconds >= 0"; good = setInt(optarg, 0, 86400 * 7, &o->timeoutS); break;
      case 'a':
        want = "0 (rank 0), 1 (mean), 2 (min) or 3 (max)"; good = setInt(optarg, 0, 3, &o->average);
        if (good && p == AttnProgram::Kv && o->average != 0) {
          fprintf(stderr, "%s: -a %s: only rank 0 (the query's owner) times the decode step; use -a 0\n", prog,
                  optarg);
          return false;
        }
        break;
      case 'h': usage(p); *exitCode = 0; return false;
      case 'L': want = "a token count >= 1"; good = setInt(optarg, 1, int64_t(1) << 31, &o->length); break;
      case 'H': want = "a head count >= 1, or q:kv:dim"; good = parseHeads(optarg, &o->cfg); break;
      case kKvHeads: want = "a head count >= 1"; good = setInt(optarg, 1, 65536, &o->cfg.num_kv_heads); break;
      case kHeadDim: want = "a dimension >= 1"; good = setInt(optarg, 1, 65536, &o->cfg.head_dim); break;
      case kHeadDimV:
        want = "a dimension in 1..256, or 0 (the head dim)";
        good = setInt(optarg, 0, 256, &o->cfg.head_dim_v);
        break;
      case kCausal: want = "0 or 1"; good = setInt(optarg, 0, 1, &o->cfg.causal); break;
      case 'B': want = "a sequence count >= 1"; good = setInt(optarg, 1, 1 << 20, &o->seqs); break;
      case 'k': want = "host:rack:cluster fractions in [0, 1], comma list"; good = parseKeeps(optarg, &o->keeps); break;
      case kMiss: want = "rates in (0, 1], comma list"; good = parseList(optarg, 1e-9, 1.0, false, &o->miss); break;
      case kBatches: want = "batch sizes >= 1, comma list"; good = parseList(optarg, 1, 1 << 20, true, &o->batches); break;
      case kModes:
        want = p == AttnProgram::Decode ? "kv, q, ship, heads, ag, auto, seq, one, comma list"
                                        : "kv, q, ship, heads, ag, auto, seq, comma list";
        good = parseModes(optarg, p, &o->modes);
        break;
      case kDevice: want = "a CUDA device ordinal"; good = setInt(optarg, 0, 1023, &o->device); break;
      case kBlockTokens: want = "tokens >= 1"; good = setInt(optarg, 1, 1 << 20, &o->blockTokens); break;
      case kLend: want = "shares in [0, 1], comma list"; good = parseList(optarg, 0.0, 1.0, false, &o->lend); break;
      case kRequests: want = "a request count >= 1"; good = setInt(optarg, 1, 1 << 16, &o->requests); break;
      case kBreakdown: o->breakdown = true; break;
      case kLayers: want = "a layer count in 1..1024"; good = setInt(optarg, 1, 1024, &o->layers); break;
      case kWindows: want = "windows >= -1, comma list"; good = parseList(optarg, -1, INT32_MAX, true, &o->windows); break;
      case kSoftcap: {
        want = "a cap >= 0";
        char* end;
        o->cfg.softcap = strtof(optarg, &end);
        good = *optarg && !*end && std::isfinite(o->cfg.softcap) && o->cfg.softcap >= 0;
        break;
      }
      case kPlacement:
        want = "planner or contiguous";
        good = !strcmp(optarg, "planner") || !strcmp(optarg, "contiguous");
        o->contiguous = !strcmp(optarg, "contiguous");
        break;
      default: good = false; break;
    }
    if (!good) {
      fprintf(stderr, "%s: %s %s: want %s\n", prog, flag.c_str(), optarg ? optarg : "", want);
      return false;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (-h lists the options)\n", prog, argv[optind]);
    return false;
  }
  if (threadsSet && o->procs) {
    fprintf(stderr, "%s: -t and --procs: give one (ranks as threads or as processes)\n", prog);
    return false;
  }
  if (o->cfg.num_q_heads % o->cfg.num_kv_heads != 0) {
    fprintf(stderr, "%s: %d query heads are not a multiple of %d KV heads\n", prog, o->cfg.num_q_heads,
            o->cfg.num_kv_heads);
    return false;
  }
  // A pool's blocks hold K and V rows of one head dim (attnKvPoolConfig_t),
  // so attnKvAttention refuses MLA-shaped heads.
  if (p == AttnProgram::Kv && o->cfg.head_dim_v != 0 && o->cfg.head_dim_v != o->cfg.head_dim) {
    fprintf(stderr,
            "%s: --head-dim-v %d: KV pools hold V rows of the head dim (%d); MLA-shaped heads "
            "(head_dim_v != head_dim) are not supported by attnKvAttention\n",
            prog, o->cfg.head_dim_v, o->cfg.head_dim);
    return false;
  }
  if (o->threads == 0 && o->procs == 0) o->threads = p == AttnProgram::Kv ? 2 : 4;
  if (p == AttnProgram::Kv && (o->procs ? o->procs : o->threads) < 2) {
    fprintf(stderr, "%s: needs 2 ranks or more (rank 0 lends to the others)\n", prog);
    return false;
  }
  const bool onDevice = o->device != ATTN_DEVICE_HOST;
  if (o->modes.empty())
    o->modes = p == AttnProgram::Decode ? std::vector<int>{attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto}
               : onDevice ? std::vector<int>{attnModePassKV, attnModePassQ, attnModeShipQ, attnModeAuto, -1}
                          : std::vector<int>{attnModePassKV, attnModePassQ, attnModeAuto, -1};
  *exitCode = 0;
  return true;
}

}  // namespace attnperf
