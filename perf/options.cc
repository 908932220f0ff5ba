#include "perf/options.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "perf/datatypes.h"

namespace attnperf {

namespace {

void usage(const char* prog) {
  fprintf(stderr,
          "usage: %s [options]\n"
          "  -b,--minbytes SIZE     smallest size (K/M/G suffix)   [32M]\n"
          "  -e,--maxbytes SIZE     largest size                  [32M]\n"
          "  -f,--stepfactor F      multiply size by F            [2]\n"
          "  -i,--stepbytes SIZE    add SIZE instead of -f\n"
          "  -n,--iters N           timed iterations              [20]\n"
          "  -w,--warmup_iters N    untimed iterations            [5]\n"
          "  -c,--check 0|1         verify results (#wrong)       [1]\n"
          "  -I,--inplace 0|1       also time the in-place variant [1]\n"
          "  -d,--datatype T        int8 uint8 int32 int64 half float double bfloat16\n"
          "  -o,--op OP             sum prod max min avg          [sum]\n"
          "  -r,--root R            root rank                     [0]\n"
          "  -t,--threads N         N ranks as threads of this process\n"
          "  -p,--procs N           N ranks as forked processes\n"
          "  -A,--algo ring|hier|direct|auto  sets ATTN_ALGO\n"
          "  -T,--transport LIST    sets ATTN_TRANSPORT (e.g. shm,tcp)\n"
          "  -J,--json FILE         also write results as JSON\n"
          "  -C,--coll NAME         (baselines) all_gather|reduce_scatter|alltoall\n"
          "  -R,--local_register 0|1  buffers from attnMemAlloc  [0]\n"
          "  -G,--device DEV        buffers on CUDA device DEV, every rank on it, one\n"
          "                         stream per rank (CUDA builds)  [host memory]\n"
          "  -g,--cudagraph 0|1     with -G: capture each size's call into a CUDA\n"
          "                         graph once and time launches of it  [0]\n"
          "Launched by mpirun/torchrun/emulate_hosts.sh (ATTN_RANK, RANK or\n"
          "OMPI_COMM_WORLD_RANK set), each process is one rank.\n",
          prog);
}

bool toInt(const char* s, int* out) {
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 0 || v > 1 << 30) return false;
  *out = int(v);
  return true;
}

}  // namespace

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || v < 0) return 0;
  size_t mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = size_t(1) << 10; end++; break;
    case 'm': case 'M': mult = size_t(1) << 20; end++; break;
    case 'g': case 'G': mult = size_t(1) << 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return 0;
  return size_t(v * double(mult));
}

std::vector<size_t> sizeList(const Options& o) {
  std::vector<size_t> v;
  for (size_t s = o.minBytes; s <= o.maxBytes;) {
    v.push_back(s);
    size_t next = o.stepBytes ? s + o.stepBytes : size_t(double(s) * o.stepFactor);
    if (next <= s) break;  // factor <= 1 or overflow: stop, don't spin
    s = next;
  }
  return v;
}

bool parseOptions(int argc, char** argv, Options* o, int* exitCode) {
  static const option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},
      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepfactor", required_argument, nullptr, 'f'},
      {"stepbytes", required_argument, nullptr, 'i'},
      {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},
      {"inplace", required_argument, nullptr, 'I'},
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"root", required_argument, nullptr, 'r'},
      {"threads", required_argument, nullptr, 't'},
      {"procs", required_argument, nullptr, 'p'},
      {"algo", required_argument, nullptr, 'A'},
      {"transport", required_argument, nullptr, 'T'},
      {"json", required_argument, nullptr, 'J'},
      {"coll", required_argument, nullptr, 'C'},
      {"local_register", required_argument, nullptr, 'R'},
      {"device", required_argument, nullptr, 'G'},
      {"cudagraph", required_argument, nullptr, 'g'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  *exitCode = 2;
  int c;
  bool ok = true;
  optind = 1;
  while (ok && (c = getopt_long(argc, argv, "b:e:f:i:n:w:c:I:d:o:r:t:p:A:T:J:C:R:G:g:h",
                                kLong, nullptr)) != -1) {
    int v = 0;
    switch (c) {
      case 'b': ok = (o->minBytes = parseSize(optarg)) > 0; break;
      case 'e': ok = (o->maxBytes = parseSize(optarg)) > 0; break;
      case 'i': ok = (o->stepBytes = parseSize(optarg)) > 0; break;
      case 'f': o->stepFactor = atof(optarg); ok = o->stepFactor > 1.0; break;
      case 'n': ok = toInt(optarg, &o->iters) && o->iters > 0; break;
      case 'w': ok = toInt(optarg, &o->warmup); break;
      case 'c': ok = toInt(optarg, &o->check); break;
      case 'I': ok = toInt(optarg, &v); o->inPlace = v != 0; break;
      case 'd': ok = parseType(optarg, &o->dtype); break;
      case 'o': ok = parseOp(optarg, &o->op); break;
      case 'r': ok = toInt(optarg, &o->root); break;
      case 't': ok = toInt(optarg, &o->threads) && o->threads > 0; break;
      case 'p': ok = toInt(optarg, &o->procs) && o->procs > 0; break;
      case 'A': o->algo = optarg; break;
      case 'T': o->transports = optarg; break;
      case 'J': o->jsonPath = optarg; break;
      case 'C': o->coll = optarg; break;
      case 'R': ok = toInt(optarg, &o->registered) && o->registered <= 1; break;
      case 'G': ok = toInt(optarg, &o->device); break;
      case 'g': ok = toInt(optarg, &v) && v <= 1; o->cudaGraph = v != 0; break;
      case 'h': *exitCode = 0; ok = false; break;
      default: ok = false; break;
    }
    if (!ok && c != 'h' && c != '?')
      fprintf(stderr, "%s: bad value for -%c: '%s'\n", argv[0], c, optarg);
  }
  if (ok && optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
    ok = false;
  }
  if (ok && o->minBytes > o->maxBytes) {
    fprintf(stderr, "%s: -b is larger than -e\n", argv[0]);
    ok = false;
  }
  if (ok && o->threads && o->procs) {
    fprintf(stderr, "%s: give -t or -p, not both\n", argv[0]);
    ok = false;
  }
  if (ok && o->cudaGraph && o->device < 0) {
    fprintf(stderr, "%s: -g 1 (CUDA graphs) needs -G (device buffers)\n", argv[0]);
    ok = false;
  }
  if (ok && o->device >= 0 && o->registered) {
    fprintf(stderr, "%s: -R 1 (host shareable buffers) and -G (device buffers) exclude each other\n",
            argv[0]);
    ok = false;
  }
  if (!ok) usage(argv[0]);
  return ok;
}

}  // namespace attnperf
