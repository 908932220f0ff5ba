#include "tests/support/attn_jobs.h"

#include <random>

#include "tests/support/level_fixtures.h"

namespace attn_test {

std::vector<float> RandomSinks(int hq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 2.0f);
  std::vector<float> s(static_cast<size_t>(hq));
  for (float& x : s) x = d(rng);
  return s;
}

void AddScenarioJobs(std::vector<AttnJob>* jobs, const attnAttnConfig_t& cfg, bool sinks, int n, uint64_t seed,
                     const std::vector<attnAttnMode_t>& modes, const std::string& tag) {
  auto add = [&](std::shared_ptr<AttnCase> c, const Placement& pl) {
    for (attnAttnMode_t m : modes) jobs->push_back({c, pl, m});
  };
  auto spec = [&](const std::vector<int32_t>& T, const std::vector<int32_t>& P) {
    AttnProblemSpec s = PrefillSpec(cfg, T, P);
    if (sinks) s.sinks = RandomSinks(cfg.num_q_heads, seed);
    return s;
  };
  {
    const std::vector<int32_t> T = {4 * n + 9, 7}, P = {11, 0};
    auto c = std::make_shared<AttnCase>(MakeCase("planned prefill " + tag, spec(T, P), MixSeed(seed, 1)));
    add(c, PlannerPlacement(*c, T, P, n));
  }
  {
    const std::vector<int32_t> T = {3 * n + 5, 2}, P = {6, 2 * n};
    auto c = std::make_shared<AttnCase>(MakeCase("random placement " + tag, spec(T, P), MixSeed(seed, 2)));
    add(c, RandomPlacement(*c, n, MixSeed(seed, 22), n > 1 ? n - 1 : -1));
  }
  {
    const std::vector<int32_t> T = {16 * n}, P = {0};
    auto c = std::make_shared<AttnCase>(MakeCase("contiguous shards " + tag, spec(T, P), MixSeed(seed, 3)));
    add(c, ContiguousPlacement(*c, n));
  }
  {
    // Decode: one query per sequence at the end, keys round robin.
    AttnProblemSpec s = spec({1, 1}, {13 * n + 3, 5});
    auto c = std::make_shared<AttnCase>(MakeCase("decode " + tag, s, MixSeed(seed, 4)));
    add(c, RoundRobinPlacement(*c, n, 1));
  }
}

void RunAttnJobs(const std::vector<AttnJob>& jobs, int rank, attnComm_t comm, const char* runner) {
  for (size_t i = 0; i < jobs.size(); ++i)
    ExpectRingAttentionExact(*jobs[i].c, jobs[i].pl, rank, comm, jobs[i].mode, true,
                             std::string(runner) + " job " + std::to_string(i));
}

}  // namespace attn_test
