// The tables of coll_algorithms.h. Each lists its collective's algorithms
// in the order auto tries them (the first whose autoFits holds runs); the
// setting's names keep settings.def's order, checked below.
#include "src/coll/coll_algorithms.h"

#include <array>
#include <string_view>

#include "src/coll/coll_runners.h"
#include "src/core/error.h"

namespace attn {

namespace {

bool always(const AutoInputs&) { return true; }

// Hier where the hierarchy is regular, has more than one useful tier, and
// the cost model says it beats the flat ring.
bool hierFits(const AutoInputs& in) {
  return in.hier->regular && in.hier->worthwhile() &&
         hierSeconds(*in.hier, in.bytes, *in.rates) < flatRingSeconds(*in.hier, in.bytes, *in.rates);
}

constexpr std::array kAllGather{
    // One host over single-copy shm, blocks within the direct limit; or
    // small blocks among few ranks over any transport.
    AllGatherRow{"direct", CollAlgo::kDirect, allGatherDirect, "direct",
                 [](const AutoInputs& in) {
                   return (in.singleCopy && !in.hier->worthwhile() && in.maxBlock <= in.limit) ||
                          (in.maxBlock <= kAllGatherDirectSmallMax && in.nranks <= kAllGatherDirectMaxRanks);
                 }},
    AllGatherRow{"hier", CollAlgo::kHier, allGatherHier, "hier", hierFits},
    AllGatherRow{"ring", CollAlgo::kRing, allGatherRing, "ring", always},
};

constexpr std::array kReduceScatter{
    ReduceScatterRow{"hier", CollAlgo::kHier, reduceScatterHier, "hier", hierFits},
    ReduceScatterRow{"ring", CollAlgo::kRing, reduceScatterRing, "ring", always},
};

// perf/RESULTS.md §1, Broadcast.
constexpr std::array kBroadcast{
    BroadcastRow{"direct", BroadcastAlgo::kDirect, broadcastDirect, "direct",
                 [](const AutoInputs& in) {
                   return in.bytes <= kBroadcastSmallMax ? in.nranks <= kBroadcastDirectMaxRanks
                                                         : in.peersAreProcesses && in.bytes <= in.limit;
                 }},
    BroadcastRow{"tree", BroadcastAlgo::kTree, broadcastTree, "binomial tree",
                 [](const AutoInputs& in) { return in.bytes <= kBroadcastSmallMax; }},
    BroadcastRow{"chain", BroadcastAlgo::kChain, broadcastChain, "chain", always},
};

// perf/RESULTS.md §1, Reduce: between 3+ ranks.
constexpr std::array kReduce{
    ReduceRow{"direct", ReduceAlgo::kDirect, reduceDirect, "direct",
              [](const AutoInputs& in) {
                return in.nranks > 2 && in.singleCopy && in.nranks <= kReduceDirectMaxRanks &&
                       in.bytes <= kReduceDirectMax;
              }},
    ReduceRow{"tree", ReduceAlgo::kTree, reduceTree, "binomial tree",
              [](const AutoInputs& in) { return in.nranks > 2 && in.bytes <= kReduceTreeMax; }},
    ReduceRow{"scatter", ReduceAlgo::kScatter, reduceScatterGather, "reduce-scatter + gather",
              [](const AutoInputs& in) {
                return in.nranks > 2 && in.singleCopy && in.bytes >= kReduceScatterMin &&
                       in.bytes <= kReduceScatterMax;
              }},
    ReduceRow{"chain", ReduceAlgo::kChain, reduceChain, "chain", always},
};

// perf/RESULTS.md §1, All-reduce.
constexpr std::array kAllReduce{
    AllReduceRow{"doubling", AllReduceAlgo::kDoubling, allReduceDoubling, "recursive doubling",
                 [](const AutoInputs& in) {
                   return in.bytes <= (in.singleCopy ? kAllReduceDoublingShmMax : kAllReduceDoublingMax);
                 }},
    AllReduceRow{"scatter", AllReduceAlgo::kScatter, allReduceScatter, "reduce-scatter + all-gather", always},
};

// Stepped off shm for large blocks (perf/RESULTS.md §1).
constexpr std::array kAllToAll{
    AllToAllRow{"stepped", AllToAllSchedule::kStepped, nullptr, "stepped",
                [](const AutoInputs& in) { return !in.allShm && in.maxBlock >= kSteppedMinBlock; }},
    AllToAllRow{"concurrent", AllToAllSchedule::kConcurrent, nullptr, "concurrent", always},
};

constexpr int choiceCount(Setting s) {
  int n = 1;
  for (const char* p = settingInfo(s).text; *p; ++p) n += *p == ',';
  return n;
}

// settings.def spells the setting's choices "auto" then each algorithm in
// its enum's order; the table must name the same ones.
template <typename Row, size_t N>
constexpr bool matchesSetting(Setting s, const std::array<Row, N>& rows) {
  if (choiceCount(s) != int(N) + 1 || settingChoiceIndex(s, "auto") != 0) return false;
  for (const Row& r : rows)
    if (settingChoiceIndex(s, r.name) != int(r.algo) + 1) return false;
  return true;
}

static_assert(matchesSetting(Setting::kAlgo, kAllGather));
static_assert(matchesSetting(Setting::kBroadcastAlgo, kBroadcast));
static_assert(matchesSetting(Setting::kReduceAlgo, kReduce));
static_assert(matchesSetting(Setting::kAllReduceAlgo, kAllReduce));
static_assert(matchesSetting(Setting::kAllToAll, kAllToAll));
static_assert(settingChoiceIndex(Setting::kAlgo, "auto") == int(AlgoSetting::kAuto) &&
              settingChoiceIndex(Setting::kBroadcastAlgo, "auto") == int(BroadcastSetting::kAuto) &&
              settingChoiceIndex(Setting::kReduceAlgo, "auto") == int(ReduceSetting::kAuto) &&
              settingChoiceIndex(Setting::kAllReduceAlgo, "auto") == int(AllReduceSetting::kAuto) &&
              settingChoiceIndex(Setting::kAllToAll, "auto") == int(AllToAllSetting::kAuto));
// The setting enums are the algorithm enums shifted by one (auto first).
static_assert(int(AlgoSetting::kDirect) == int(CollAlgo::kDirect) + 1 &&
              int(BroadcastSetting::kDirect) == int(BroadcastAlgo::kDirect) + 1 &&
              int(ReduceSetting::kDirect) == int(ReduceAlgo::kDirect) + 1 &&
              int(AllReduceSetting::kScatter) == int(AllReduceAlgo::kScatter) + 1 &&
              int(AllToAllSetting::kStepped) == int(AllToAllSchedule::kStepped) + 1);

}  // namespace

std::span<const AllGatherRow> allGatherAlgorithms() { return kAllGather; }
std::span<const ReduceScatterRow> reduceScatterAlgorithms() { return kReduceScatter; }
std::span<const BroadcastRow> broadcastAlgorithms() { return kBroadcast; }
std::span<const ReduceRow> reduceAlgorithms() { return kReduce; }
std::span<const AllReduceRow> allReduceAlgorithms() { return kAllReduce; }
std::span<const AllToAllRow> allToAllSchedules() { return kAllToAll; }

attnResult_t readAlgoName(Setting s, const std::vector<const char*>& namesByAlgo, int* index) {
  *index = 0;
  const std::optional<std::string> v = settingString(s);
  if (!v || *v == "auto") return attnSuccess;
  for (size_t i = 0; i < namesByAlgo.size(); ++i)
    if (namesByAlgo[i] && *v == namesByAlgo[i]) {
      *index = int(i) + 1;
      return attnSuccess;
    }
  // "ATTN_ALGO='x' is not one of ring, hier, direct, auto", as settingEnum says it.
  std::string names;
  for (const char* n : namesByAlgo)
    if (n) names += std::string(n) + ", ";
  return setError(attnInvalidArgument, "%s='%s' is not one of %sauto", settingName(s), v->c_str(), names.c_str());
}

}  // namespace attn
