// Batches of attention checks every mode runs through: one config over the
// scenarios the feature tests share (planned prefill with cached keys, an
// arbitrary placement with an empty rank, contiguous shards, decode rows),
// each compared with the double reference on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attncomm.h"
#include "tests/support/attn_fixtures.h"

namespace attn_test {

struct AttnJob {
  std::shared_ptr<AttnCase> c;
  Placement pl;
  attnAttnMode_t mode;
};

inline uint64_t MixSeed(uint64_t a, uint64_t b) { return a * 0x9E3779B97F4A7C15ull + b; }

// hq attention-sink logits in [-1, 2), seeded.
std::vector<float> RandomSinks(int hq, uint64_t seed);

// cfg (with sinks when `sinks`) over the four scenarios on n ranks, in
// each of `modes`; `tag` names the cases.
void AddScenarioJobs(std::vector<AttnJob>* jobs, const attnAttnConfig_t& cfg, bool sinks, int n, uint64_t seed,
                     const std::vector<attnAttnMode_t>& modes, const std::string& tag);

// Every job on this rank, each expected exact (with the LSE).
void RunAttnJobs(const std::vector<AttnJob>& jobs, int rank, attnComm_t comm, const char* runner);

}  // namespace attn_test
