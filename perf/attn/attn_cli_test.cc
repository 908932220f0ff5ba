// parseAttnOptions: the new long options, nccl-tests' letters keeping their
// meaning or refused (never reinterpreted), bad values refused.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "perf/attn/attn_cli.h"

namespace attnperf {
namespace {

// Parses `args` as `p`'s command line; *code gets the exit code.
bool parse(AttnProgram p, std::initializer_list<const char*> args, AttnOptions* o, int* code) {
  std::vector<std::string> keep = {programName(p)};
  for (const char* a : args) keep.emplace_back(a);
  std::vector<char*> argv;
  for (auto& s : keep) argv.push_back(s.data());
  argv.push_back(nullptr);
  *o = defaultOptions(p);
  return parseAttnOptions(static_cast<int>(keep.size()), argv.data(), p, o, code);
}

bool refused(AttnProgram p, std::initializer_list<const char*> args) {
  AttnOptions o;
  int code = 0;
  return !parse(p, args, &o, &code) && code == 2;
}

TEST(AttnCli, LongOptions) {
  AttnOptions o;
  int code = -1;
  ASSERT_TRUE(parse(AttnProgram::Ring,
                    {"--procs", "3", "--miss", "1,0.5,0.01", "--kv-heads", "4", "--head-dim", "32", "--causal", "0",
                     "--modes", "kv,q,seq", "--device", "1", "--tokens", "512", "--heads", "16", "--seqs", "2",
                     "--plot", "x.png"},
                    &o, &code));
  EXPECT_EQ(code, 0);
  EXPECT_EQ(o.procs, 3);
  EXPECT_EQ(o.threads, 0);
  EXPECT_EQ(o.miss, (std::vector<double>{1, 0.5, 0.01}));
  EXPECT_EQ(o.cfg.num_kv_heads, 4);
  EXPECT_EQ(o.cfg.head_dim, 32);
  EXPECT_EQ(o.cfg.causal, 0);
  EXPECT_EQ(o.modes, (std::vector<int>{attnModePassKV, attnModePassQ, -1}));
  EXPECT_EQ(o.device, 1);
  EXPECT_EQ(o.length, 512);
  EXPECT_EQ(o.cfg.num_q_heads, 16);
  EXPECT_EQ(o.seqs, 2);
  EXPECT_EQ(o.plot, "x.png");

  ASSERT_TRUE(parse(AttnProgram::Ring, {"--modes", "heads,ag,auto"}, &o, &code));
  EXPECT_EQ(o.modes, (std::vector<int>{attnModeHeadParallel, attnModeAllGatherKV, attnModeAuto}));
  ASSERT_TRUE(parse(AttnProgram::Decode, {"--batches", "1,8,32"}, &o, &code));
  EXPECT_EQ(o.batches, (std::vector<int>{1, 8, 32}));
  EXPECT_EQ(o.threads, 4);  // the default
  ASSERT_TRUE(parse(AttnProgram::Level, {"--keeps", "1,0.5:0.25:0.125"}, &o, &code));
  ASSERT_EQ(o.keeps.size(), 2u);
  EXPECT_FLOAT_EQ(o.keeps[1][2], 0.125f);
  ASSERT_TRUE(parse(AttnProgram::Kv, {"--block-tokens", "32", "--lend", "0,0.5,1", "--requests", "4", "-H", "8:2:64"},
                    &o, &code));
  EXPECT_EQ(o.blockTokens, 32);
  EXPECT_EQ(o.lend, (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(o.requests, 4);
  EXPECT_EQ(o.cfg.num_q_heads, 8);
  EXPECT_EQ(o.cfg.num_kv_heads, 2);
  EXPECT_EQ(o.cfg.head_dim, 64);
  EXPECT_EQ(o.threads, 2);  // kv_attn_perf's default
}

// --head-dim-v: the head dim of V and of the output (MLA-shaped heads), 0
// (the default) the head dim; kv_attn_perf's pools hold V of the head dim.
TEST(AttnCli, HeadDimV) {
  AttnOptions o;
  int code = -1;
  for (AttnProgram p : {AttnProgram::Ring, AttnProgram::Decode, AttnProgram::Level, AttnProgram::Kv}) {
    ASSERT_TRUE(parse(p, {}, &o, &code)) << programName(p);
    EXPECT_EQ(o.cfg.head_dim_v, 0) << programName(p);  // the default: V of the head dim
    EXPECT_EQ(headDimText(o.cfg), "head_dim " + std::to_string(o.cfg.head_dim));
  }
  for (AttnProgram p : {AttnProgram::Ring, AttnProgram::Decode, AttnProgram::Level}) {
    ASSERT_TRUE(parse(p, {"--head-dim", "192", "--head-dim-v", "128"}, &o, &code)) << programName(p);
    EXPECT_EQ(code, 0);
    EXPECT_EQ(o.cfg.head_dim, 192);
    EXPECT_EQ(o.cfg.head_dim_v, 128);
    EXPECT_EQ(headDimText(o.cfg), "head_dim 192/128");
  }
  // With -H q:kv:dim, in either order; V larger than K; 0 and 256.
  ASSERT_TRUE(parse(AttnProgram::Ring, {"--head-dim-v", "64", "-H", "8:2:32"}, &o, &code));
  EXPECT_EQ(o.cfg.head_dim, 32);
  EXPECT_EQ(o.cfg.head_dim_v, 64);
  EXPECT_EQ(headDimText(o.cfg), "head_dim 32/64");
  ASSERT_TRUE(parse(AttnProgram::Ring, {"--head-dim-v", "0"}, &o, &code));
  EXPECT_EQ(o.cfg.head_dim_v, 0);
  ASSERT_TRUE(parse(AttnProgram::Decode, {"--head-dim-v", "256"}, &o, &code));
  EXPECT_EQ(o.cfg.head_dim_v, 256);
  // Equal to the head dim: the same problem, printed as before.
  ASSERT_TRUE(parse(AttnProgram::Ring, {"--head-dim", "64", "--head-dim-v", "64"}, &o, &code));
  EXPECT_EQ(headDimText(o.cfg), "head_dim 64");
  // kv_attn_perf: 0 or its head dim only.
  ASSERT_TRUE(parse(AttnProgram::Kv, {"--head-dim-v", "128"}, &o, &code));  // its default head dim
  EXPECT_EQ(o.cfg.head_dim_v, 128);
  ASSERT_TRUE(parse(AttnProgram::Kv, {"-H", "8:2:64", "--head-dim-v", "0"}, &o, &code));
  ASSERT_TRUE(parse(AttnProgram::Kv, {"-H", "8:2:64", "--head-dim-v", "64"}, &o, &code));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"--head-dim-v", "64"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-H", "8:2:192", "--head-dim-v", "128"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"--head-dim-v", "128", "--head-dim", "192"}));
  // Bad values.
  for (const char* bad : {"-1", "257", "1000", "12x", "", "0.5", "abc"})
    EXPECT_TRUE(refused(AttnProgram::Ring, {"--head-dim-v", bad})) << bad;
  EXPECT_TRUE(refused(AttnProgram::Decode, {"--head-dim-v", "-5"}));
  EXPECT_TRUE(refused(AttnProgram::Level, {"--head-dim-v", "512"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--head-dim-v"}));  // no value
}

TEST(AttnCli, NcclTestsLettersKeepTheirMeaning) {
  AttnOptions o;
  int code;
  ASSERT_TRUE(parse(AttnProgram::Ring,
                    {"-t", "2", "-n", "7", "-w", "0", "-c", "0", "-d", "bfloat16", "-J", "r.json", "-T", "30", "-a",
                     "1"},
                    &o, &code));
  EXPECT_EQ(o.threads, 2);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.cfg.dtype, attnBfloat16);
  EXPECT_EQ(o.json, "r.json");
  EXPECT_EQ(o.timeoutS, 30);
  EXPECT_EQ(o.average, 1);
  ASSERT_TRUE(parse(AttnProgram::Ring, {"-d", "half"}, &o, &code));
  EXPECT_EQ(o.cfg.dtype, attnFloat16);
  EXPECT_EQ(defaultOptions(AttnProgram::Ring).average, 3);  // what the tables always measured
  // -h: usage, exit 0.
  EXPECT_FALSE(parse(AttnProgram::Ring, {"-h"}, &o, &code));
  EXPECT_EQ(code, 0);
}

TEST(AttnCli, OldCollidingLettersRefused) {
  // The letters these binaries used to take, nccl-tests' elsewhere.
  for (const char* flag : {"-p", "-m", "-b", "-K", "-D", "-C", "-M", "-G", "-f", "-I"})
    EXPECT_TRUE(refused(AttnProgram::Ring, {flag, "1"})) << flag;
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-b", "32"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-f", "0,0.5"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-G", "0"}));
  // nccl-tests' other letters.
  for (const char* flag : {"-g", "-e", "-i", "-N", "-o", "-r", "-z", "-y", "-R", "-x", "-V", "-S", "-u"})
    EXPECT_TRUE(refused(AttnProgram::Decode, {flag, "1"})) << flag;
}

TEST(AttnCli, BadValuesRefused) {
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-t", "0"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-t", "4x"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-n", ""}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-L", "-5"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-d", "int8"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-a", "4"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-a", "3"}));  // kv times rank 0 only
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-T", "-1"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--miss", "1,,0.5"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--miss", "2"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--miss", "0"}));
  EXPECT_TRUE(refused(AttnProgram::Decode, {"--batches", "1.5"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--modes", "kv,fast"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--causal", "2"}));
  EXPECT_TRUE(refused(AttnProgram::Level, {"-k", "1:0.5"}));
  EXPECT_TRUE(refused(AttnProgram::Level, {"-k", "1.5"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-H", "8:2"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-H", "8", "--kv-heads", "3"}));  // not a multiple
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-t", "2", "--procs", "2"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"-t", "1"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--procs"}));       // no value
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--no-such"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"-Q", "1"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"stray"}));
  // An option of another binary.
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--batches", "1"}));
  EXPECT_TRUE(refused(AttnProgram::Decode, {"--miss", "1"}));
  EXPECT_TRUE(refused(AttnProgram::Ring, {"--lend", "0.5"}));
  EXPECT_TRUE(refused(AttnProgram::Kv, {"--causal", "0"}));
}

}  // namespace
}  // namespace attnperf
