// Flag parsing: nccl-tests' getopt string and long names, then attncomm's
// long-only options. Values are checked here; combinations in
// options_check.cc.
#include "perf/options.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "perf/datatypes.h"

namespace attnperf {

bool checkOptions(Options* o, const char* prog);  // options_check.cc

namespace {

// Long-only options (no nccl-tests letter).
enum : int { kProcs = 256, kTransport, kDevice, kMem, kInPlace, kTiming, kColl, kPlot };

bool toInt(const char* s, int* out, int lo = 0, int hi = 1 << 30) {
  char* end = nullptr;
  long v = strtol(s, &end, 0);
  if (!*s || *end || v < lo || v > hi) return false;
  *out = int(v);
  return true;
}

// nccl-tests names attncomm lacks: refused by name rather than "unknown".
bool knownMissingType(const std::string& s) {
  for (const char* n : {"uint32", "uint64", "fp8", "f8e4m3", "f8e5m2", "e4m3", "e5m2"})
    if (s == n) return true;
  return false;
}

bool parseTypes(const char* prog, const char* arg, Options* o) {
  const std::string s = arg;
  o->dtypes.clear();
  if (s == "all") {
    for (int t = 0; t < attnNumTypes; t++) o->dtypes.push_back(attnDataType_t(t));
    return true;
  }
  attnDataType_t t;
  if (parseType(s, &t)) return o->dtypes.push_back(t), true;
  if (knownMissingType(s))
    fprintf(stderr, "%s: -d %s: attncomm has no such data type (it has int8 uint8 int32 int64 "
            "half float double bfloat16)\n", prog, arg);
  else
    fprintf(stderr, "%s: -d %s: unknown data type\n", prog, arg);
  return false;
}

bool parseOps(const char* prog, const char* arg, Options* o) {
  const std::string s = arg;
  o->ops.clear();
  if (s == "all") {
    for (int op = 0; op < attnNumOps; op++) o->ops.push_back(attnRedOp_t(op));
    return true;
  }
  attnRedOp_t op;
  if (parseOp(s, &op)) return o->ops.push_back(op), true;
  if (s == "mulsum")
    fprintf(stderr, "%s: -o mulsum: attncomm has no pre-multiplied sum (it has sum prod max min avg)\n",
            prog);
  else
    fprintf(stderr, "%s: -o %s: unknown reduction op\n", prog, arg);
  return false;
}

// NCCL-only knobs: the default passes, anything else says why not.
bool ncclOnly(const char* prog, char flag, const char* arg, int dflt, const char* what) {
  int v = 0;
  if (toInt(arg, &v, -1) && v == dflt) return true;
  fprintf(stderr, "%s: -%c %s: %s is NCCL-specific; attncomm only accepts -%c %d\n", prog, flag,
          arg, what, flag, dflt);
  return false;
}

const option kLong[] = {
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"parallel_init", required_argument, nullptr, 'p'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"timeout", required_argument, nullptr, 'T'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"report_timestamps", required_argument, nullptr, 'S'},
    {"output_file", required_argument, nullptr, 'J'},
    {"average", required_argument, nullptr, 'a'},
    {"local_register", required_argument, nullptr, 'R'},
    {"cta_policy", required_argument, nullptr, 'x'},
    {"device_implementation", required_argument, nullptr, 'D'},
    {"device_cta_count", required_argument, nullptr, 'V'},
    {"memory", required_argument, nullptr, 'M'},
    {"unalign", required_argument, nullptr, 'u'},
    {"per_iter_timing", required_argument, nullptr, 'I'},
    {"per_iter_skip", required_argument, nullptr, 'K'},
    {"algo", required_argument, nullptr, 'A'},
    {"procs", required_argument, nullptr, kProcs},
    {"transport", required_argument, nullptr, kTransport},
    {"device", required_argument, nullptr, kDevice},
    {"mem", required_argument, nullptr, kMem},
    {"inplace", required_argument, nullptr, kInPlace},
    {"timing", required_argument, nullptr, kTiming},
    {"coll", required_argument, nullptr, kColl},
    {"plot", required_argument, nullptr, kPlot},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0}};

const char* kShort = "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:A:";

// One flag; false: a message was printed.
bool parseOne(int c, const char* prog, Options* o, bool* deviceGiven) {
  int v = 0;
  bool ok = true;
  switch (c) {
    case 't': ok = toInt(optarg, &o->nthreads, 1, 1024); break;
    case 'g': ok = toInt(optarg, &o->ngpus, 1, 1024); break;
    case 'b': ok = (o->minBytes = parseSize(optarg)) > 0 || strcmp(optarg, "0") == 0; break;
    case 'e': ok = (o->maxBytes = parseSize(optarg)) > 0 || strcmp(optarg, "0") == 0; break;
    case 'i': ok = (o->stepBytes = parseSize(optarg)) > 0; break;
    case 'f': {
      char* end = nullptr;
      o->stepFactor = strtod(optarg, &end);
      ok = *optarg && !*end && o->stepFactor >= 1.0;
      break;
    }
    case 'n': ok = toInt(optarg, &o->iters, 1); break;
    case 'm': ok = toInt(optarg, &o->aggIters, 1, 1 << 16); break;
    case 'w': ok = toInt(optarg, &o->warmup); break;
    case 'N': ok = toInt(optarg, &o->runCycles); break;
    case 'p': ok = toInt(optarg, &o->parallelInit, 0, 1); break;
    case 'c': ok = toInt(optarg, &o->check); break;
    case 'o': return parseOps(prog, optarg, o);
    case 'd': return parseTypes(prog, optarg, o);
    case 'r':
      if (strcmp(optarg, "all") == 0) o->allRoots = true;
      else ok = toInt(optarg, &v), o->roots = {v}, o->allRoots = false;
      break;
    case 'z': ok = toInt(optarg, &o->blocking, 0, 3); break;
    case 'y': ok = toInt(optarg, &o->streamNull, 0, 1); break;
    case 'T': ok = toInt(optarg, &o->timeoutSec); break;
    case 'G': ok = toInt(optarg, &o->graphLaunches); break;
    case 'C': ok = toInt(optarg, &o->reportCpuTime, 0, 1); break;
    case 'S': ok = toInt(optarg, &o->timestamps, 0, 1); break;
    case 'J': o->jsonPath = optarg; ok = !o->jsonPath.empty(); break;
    case 'a': ok = toInt(optarg, &o->average, 0, 3); break;
    case 'R':
      if (toInt(optarg, &v, 0, 2) && v == 0) return true;
      fprintf(stderr, "%s: -R %s: attncomm has no buffer registration call; for buffers from "
              "attnMemAlloc use --mem shareable\n", prog, optarg);
      return false;
    case 'x': return ncclOnly(prog, 'x', optarg, 0, "the CTA policy");
    case 'D': return ncclOnly(prog, 'D', optarg, 0, "a device API implementation");
    case 'V': return ncclOnly(prog, 'V', optarg, 16, "the device API CTA count");
    case 'M': ok = toInt(optarg, &o->memoryReport, 0, 1); break;
    case 'u': ok = toInt(optarg, &o->unalign, 0, 1 << 20); break;
    case 'I': ok = toInt(optarg, &o->perIterTiming, 0, 1); break;
    case 'K': ok = toInt(optarg, &o->perIterSkip); break;
    case 'A': o->algo = optarg; break;
    case kProcs: ok = toInt(optarg, &o->procs, 1, 4096); break;
    case kTransport: o->transports = optarg; break;
    case kDevice:
      ok = toInt(optarg, &o->device, 0, 1023);
      *deviceGiven = true;
      break;
    case kMem:
      if (strcmp(optarg, "host") == 0) o->mem = MemKind::kHost;
      else if (strcmp(optarg, "shareable") == 0) o->mem = MemKind::kShareable;
      else if (strcmp(optarg, "device") == 0) o->mem = MemKind::kDevice;
      else ok = false;
      break;
    case kInPlace: ok = toInt(optarg, &v, 0, 1); o->inPlace = v != 0; break;
    case kTiming:
      if (strcmp(optarg, "avg") == 0) o->timing = Timing::kAvg;
      else if (strcmp(optarg, "median") == 0) o->timing = Timing::kMedian;
      else ok = false;
      break;
    case kColl: o->coll = optarg; break;
    case kPlot: o->plotPath = optarg; ok = !o->plotPath.empty(); break;
    default: return false;  // getopt already said what was wrong
  }
  if (!ok) {
    const option* name = nullptr;
    for (const option* l = kLong; l->name; l++)
      if (l->val == c) name = l;
    if (c < 256) fprintf(stderr, "%s: bad value for -%c: '%s'\n", prog, c, optarg);
    else fprintf(stderr, "%s: bad value for --%s: '%s'\n", prog, name ? name->name : "?", optarg);
  }
  return ok;
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
    case 't': case 'T': mult = size_t(1) << 40; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v * double(mult) > 1e18) return 0;
  return size_t(v * double(mult));
}

std::vector<size_t> sizeList(const Options& o) {
  std::vector<size_t> v;
  for (size_t s = o.minBytes; s <= o.maxBytes;) {
    v.push_back(s);
    const size_t next = o.stepFactor > 1.0 ? size_t(double(s) * o.stepFactor) : s + o.stepBytes;
    if (next <= s) break;  // 0 * factor, or overflow: stop, don't spin
    s = next;
  }
  return v;
}

std::string timingText(const Options& o) {
  if (o.timing == Timing::kMedian)
    return "median over iterations of (max over ranks of one iteration's time), barrier "
           "before each iteration";
  static const char* kHow[] = {"rank 0's", "average over ranks of", "min over ranks of",
                               "max over ranks of"};
  std::string s = std::string(kHow[o.average]) + " (loop time / (iters*agg_iters))";
  if (o.reportCpuTime) s += ", CPU time to issue the calls";
  return s;
}

bool parseOptions(int argc, char** argv, Options* o, int* exitCode) {
  const char* prog = argv[0];
  *exitCode = 2;
  o->args.assign(argv, argv + argc);
  bool deviceGiven = false;
  opterr = 1;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, kShort, kLong, nullptr)) != -1) {
    if (c == 'h') {
      printUsage(prog);
      *exitCode = 0;
      return false;
    }
    if (!parseOne(c, prog, o, &deviceGiven)) {
      fprintf(stderr, "%s: see --help\n", prog);
      return false;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
    return false;
  }
  // --device DEV alone means device buffers there; --mem device alone, device 0.
  if (deviceGiven && o->mem == MemKind::kHost) o->mem = MemKind::kDevice;
  if (o->mem == MemKind::kDevice && o->device < 0) o->device = 0;
  if (deviceGiven && o->mem == MemKind::kShareable) {
    fprintf(stderr, "%s: --mem shareable (host buffers) and --device exclude each other\n", prog);
    return false;
  }
  return checkOptions(o, prog);
}

}  // namespace attnperf
