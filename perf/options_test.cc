// The collective perf binaries' flag parser: nccl-tests' letters mean what
// they mean there, attncomm's own options are long, bad values are refused.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "perf/options.h"

namespace attnperf {
namespace {

// Parses a command line; *code is parseOptions' exit code.
bool parse(std::initializer_list<const char*> args, Options* o, int* code = nullptr) {
  std::vector<std::string> s{"all_reduce_perf"};
  s.insert(s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : s) argv.push_back(a.data());
  int c = -1;
  const bool ok = parseOptions(int(argv.size()), argv.data(), o, &c);
  if (code) *code = c;
  return ok;
}

TEST(PerfOptions, NcclTestsDefaults) {
  Options o;
  ASSERT_TRUE(parse({}, &o));
  EXPECT_EQ(o.nthreads, 1);
  EXPECT_EQ(o.ngpus, 1);
  EXPECT_EQ(o.minBytes, size_t(32) << 20);
  EXPECT_EQ(o.maxBytes, size_t(32) << 20);
  EXPECT_EQ(o.stepBytes, size_t(1) << 20);
  EXPECT_EQ(o.stepFactor, 1.0);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup, 1);
  EXPECT_EQ(o.aggIters, 1);
  EXPECT_EQ(o.check, 1);
  EXPECT_EQ(o.average, 1);
  EXPECT_EQ(o.timing, Timing::kAvg);
  EXPECT_EQ(o.mem, MemKind::kHost);
}

TEST(PerfOptions, EveryNcclTestsFlag) {
  Options o;
  ASSERT_TRUE(parse({"-t", "2", "-g", "3", "-b", "8", "-e", "128M", "-f", "2", "-n", "7", "-m", "4",
                     "-w", "3", "-N", "2", "-p", "1", "-I", "1", "-K", "2", "-c", "5", "-o", "max",
                     "-d", "bfloat16", "-r", "1", "-z", "3", "-y", "0", "-T", "30", "-C", "1", "-S",
                     "1", "-J", "x.json", "-a", "2", "-R", "0", "-x", "0", "-D", "0", "-V", "16",
                     "-M", "1", "-u", "3"},
                    &o));
  EXPECT_EQ(o.ranksPerProcess(), 6);
  EXPECT_EQ(o.maxBytes, size_t(128) << 20);
  EXPECT_EQ(o.aggIters, 4);
  EXPECT_EQ(o.runCycles, 2);
  EXPECT_EQ(o.parallelInit, 1);
  EXPECT_EQ(o.perIterTiming, 1);
  EXPECT_EQ(o.perIterSkip, 2);
  EXPECT_EQ(o.check, 5);
  EXPECT_EQ(o.ops, std::vector<attnRedOp_t>{attnMax});
  EXPECT_EQ(o.dtypes, std::vector<attnDataType_t>{attnBfloat16});
  EXPECT_EQ(o.roots, std::vector<int>{1});
  EXPECT_EQ(o.blocking, 3);
  EXPECT_EQ(o.timeoutSec, 30);
  EXPECT_EQ(o.reportCpuTime, 1);
  EXPECT_EQ(o.timestamps, 1);
  EXPECT_EQ(o.jsonPath, "x.json");
  EXPECT_EQ(o.average, 2);
  EXPECT_EQ(o.memoryReport, 1);
  EXPECT_EQ(o.unalign, 3);
  // The long names are nccl-tests' too.
  Options l;
  ASSERT_TRUE(parse({"--nthreads", "2", "--ngpus", "2", "--agg_iters", "3", "--run_cycles", "0",
                     "--blocking", "1", "--average", "0", "--output_file", "y.json",
                     "--per_iter_timing", "1", "--per_iter_skip", "1", "--unalign", "1"},
                    &l));
  EXPECT_EQ(l.ngpus, 2);
  EXPECT_EQ(l.aggIters, 3);
  EXPECT_EQ(l.runCycles, 0);
  EXPECT_EQ(l.jsonPath, "y.json");
}

TEST(PerfOptions, OldSpellingsNowMeanNcclTests) {
  Options o;
  // -p was processes: now parallel_init (0|1).
  ASSERT_TRUE(parse({"-p", "1"}, &o));
  EXPECT_EQ(o.parallelInit, 1);
  EXPECT_EQ(o.procs, 0);
  EXPECT_FALSE(parse({"-p", "4"}, &o));
  // -T was the transport list: now a timeout in seconds.
  EXPECT_FALSE(parse({"-T", "shm,tcp"}, &o));
  Options t;
  ASSERT_TRUE(parse({"-T", "5"}, &t));
  EXPECT_EQ(t.timeoutSec, 5);
  EXPECT_TRUE(t.transports.empty());
  // -I was in-place: now per-iteration timing.
  Options i;
  ASSERT_TRUE(parse({"-I", "1"}, &i));
  EXPECT_EQ(i.perIterTiming, 1);
  EXPECT_TRUE(i.inPlace);
  // -g was the CUDA graph switch: now ranks per thread.
  Options g;
  ASSERT_TRUE(parse({"-g", "1"}, &g));
  EXPECT_EQ(g.ngpus, 1);
  EXPECT_EQ(g.graphLaunches, 0);
  // -G was the device: now graph launches, which need device buffers.
  Options g0;
  ASSERT_TRUE(parse({"-G", "0"}, &g0));
  EXPECT_EQ(g0.mem, MemKind::kHost);
  Options gd;
  EXPECT_FALSE(parse({"-G", "2"}, &gd));
  // -C was the baselines' collective: now report_cputime (0|1).
  EXPECT_FALSE(parse({"-C", "all_gather"}, &o));
  // -R 1 was attnMemAlloc buffers: refused with a pointer to --mem.
  EXPECT_FALSE(parse({"-R", "1"}, &o));
}

TEST(PerfOptions, AttncommLongOptions) {
  Options o;
  ASSERT_TRUE(parse({"--procs", "4", "--transport", "shm,tcp", "--algo", "ring", "--inplace", "0",
                     "--timing", "median", "--coll", "alltoall", "--plot", "p.png", "--mem",
                     "shareable"},
                    &o));
  EXPECT_EQ(o.procs, 4);
  EXPECT_EQ(o.transports, "shm,tcp");
  EXPECT_EQ(o.algo, "ring");
  EXPECT_FALSE(o.inPlace);
  EXPECT_EQ(o.timing, Timing::kMedian);
  EXPECT_EQ(o.coll, "alltoall");
  EXPECT_EQ(o.plotPath, "p.png");
  EXPECT_EQ(o.mem, MemKind::kShareable);
  Options a;
  ASSERT_TRUE(parse({"-A", "hier"}, &a));
  EXPECT_EQ(a.algo, "hier");
  Options d;
  ASSERT_TRUE(parse({"--device", "1", "-G", "3"}, &d));
  EXPECT_EQ(d.mem, MemKind::kDevice);
  EXPECT_EQ(d.device, 1);
  EXPECT_EQ(d.graphLaunches, 3);
  Options m;
  ASSERT_TRUE(parse({"--mem", "device"}, &m));
  EXPECT_EQ(m.device, 0);
  EXPECT_FALSE(parse({"--mem", "shareable", "--device", "0"}, &m));
}

TEST(PerfOptions, AllExpands) {
  Options o;
  ASSERT_TRUE(parse({"-d", "all", "-o", "all", "-r", "all"}, &o));
  EXPECT_EQ(o.dtypes.size(), size_t(attnNumTypes));
  EXPECT_EQ(o.ops.size(), size_t(attnNumOps));
  EXPECT_TRUE(o.allRoots);
  Options n;
  for (const char* t : {"int8", "char", "uint8", "int32", "int", "int64", "half", "float16", "float",
                        "float32", "double", "float64", "bfloat16"})
    EXPECT_TRUE(parse({"-d", t}, &n)) << t;
}

TEST(PerfOptions, BadValuesRefused) {
  Options o;
  int code = 0;
  for (auto bad : std::vector<std::vector<const char*>>{
           {"-d", "fp8"}, {"-d", "uint64"}, {"-d", "nope"}, {"-o", "mulsum"}, {"-o", "xor"},
           {"-z", "4"}, {"-a", "4"}, {"-n", "0"}, {"-m", "0"}, {"-b", "abc"}, {"-b", "2M", "-e", "1M"},
           {"-x", "1"}, {"-D", "1"}, {"-V", "8"}, {"-R", "2"}, {"-K", "1"}, {"-I", "1", "-K", "20"},
           {"-y", "2"}, {"--timing", "fast"}, {"--mem", "gpu"}, {"--procs", "2", "-t", "2"},
           {"-G", "1"}, {"--device", "0", "-G", "1", "-I", "1"}, {"--device", "0", "-G", "1", "-z", "1"},
           {"-i", "0"}, {"-t", "0"}, {"--bogus"}, {"extra"}}) {
    Options b;
    std::vector<std::string> s{"all_reduce_perf"};
    s.insert(s.end(), bad.begin(), bad.end());
    std::vector<char*> argv;
    for (auto& a : s) argv.push_back(a.data());
    EXPECT_FALSE(parseOptions(int(argv.size()), argv.data(), &b, &code)) << s[1];
    EXPECT_EQ(code, 2) << s[1];
  }
  EXPECT_FALSE(parse({"-h"}, &o, &code));
  EXPECT_EQ(code, 0);
}

TEST(PerfOptions, SizeList) {
  Options o;
  ASSERT_TRUE(parse({"-b", "8", "-e", "128", "-f", "2"}, &o));
  EXPECT_EQ(sizeList(o), (std::vector<size_t>{8, 16, 32, 64, 128}));
  Options i;
  ASSERT_TRUE(parse({"-b", "1K", "-e", "3K", "-i", "1K"}, &i));
  EXPECT_EQ(sizeList(i), (std::vector<size_t>{1024, 2048, 3072}));
}

}  // namespace
}  // namespace attnperf
