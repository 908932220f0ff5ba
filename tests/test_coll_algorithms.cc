// The named tables of host collective algorithms (src/coll/coll_algorithms.h):
// every row's name parses to its algorithm, an unknown name fails listing the
// table's names, no name appears twice in a table, and each row, run through
// the table (its run function, and the public body with its name set), gives
// exact results on thread ranks.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attncomm.h"
#include "src/coll/algo_select.h"
#include "src/coll/coll_algorithms.h"
#include "tests/support/multirank.h"

using namespace attn_test;
using attn::Setting;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// One table and the reader of its setting, so each check runs over all five.
template <typename Row, typename T>
struct Table {
  const char* var;
  std::span<const Row> rows;
  attnResult_t (*read)(T*);
};
// Spelled out: clang before 17 deduces no aggregate's template arguments.
template <typename Row, typename T>
Table(const char*, std::span<const Row>, attnResult_t (*)(T*)) -> Table<Row, T>;

// "ring, hier, direct, auto": the names in their enum's order, auto last.
template <typename Row>
std::string NameList(std::span<const Row> rows) {
  std::string s;
  for (const char* n : attn::namesByAlgo(rows)) s += std::string(n) + ", ";
  return s + "auto";
}

template <typename Row, typename T>
void CheckParses(const Table<Row, T>& t) {
  for (const Row& r : t.rows) {
    ScopedEnv env(Env{{t.var, r.name}});
    T out{};
    ASSERT_EQ(t.read(&out), attnSuccess) << t.var << "=" << r.name;
    EXPECT_EQ(int(out), int(r.algo) + 1) << t.var << "=" << r.name;
  }
  for (const char* v : {"", "auto"}) {
    ScopedEnv env(Env{{t.var, v}});
    T out = static_cast<T>(1);
    ASSERT_EQ(t.read(&out), attnSuccess) << t.var << "='" << v << "'";
    EXPECT_EQ(int(out), 0) << t.var << "='" << v << "'";
  }
}

template <typename Row, typename T>
void CheckUnknownFails(const Table<Row, T>& t) {
  for (const char* v : {"bogus", "Ring", "auto "}) {
    ScopedEnv env(Env{{t.var, v}});
    T out{};
    EXPECT_EQ(t.read(&out), attnInvalidArgument) << t.var << "=" << v;
    EXPECT_EQ(std::string(attnGetLastError(nullptr)),
              std::string(t.var) + "='" + v + "' is not one of " + NameList(t.rows));
  }
}

template <typename Row, typename T>
void CheckNoDuplicates(const Table<Row, T>& t) {
  std::set<std::string> names;
  std::set<int> algos;
  for (const Row& r : t.rows) {
    EXPECT_TRUE(names.insert(r.name).second) << t.var << ": " << r.name << " twice";
    EXPECT_TRUE(algos.insert(int(r.algo)).second) << t.var << ": algorithm " << int(r.algo) << " twice";
    EXPECT_NE(r.autoFits, nullptr) << r.name;
  }
  // Auto falls back to the last row: it must always fit.
  EXPECT_TRUE(t.rows.back().autoFits(attn::AutoInputs{})) << t.var;
}

#define FOR_EACH_TABLE(CHECK)                                                                  \
  CHECK(Table{"ATTN_ALGO", attn::allGatherAlgorithms(), &attn::readAlgoSetting});              \
  CHECK(Table{"ATTN_BROADCAST_ALGO", attn::broadcastAlgorithms(), &attn::readBroadcastSetting}); \
  CHECK(Table{"ATTN_REDUCE_ALGO", attn::reduceAlgorithms(), &attn::readReduceSetting});        \
  CHECK(Table{"ATTN_ALLREDUCE_ALGO", attn::allReduceAlgorithms(), &attn::readAllReduceSetting}); \
  CHECK(Table{"ATTN_ALLTOALL", attn::allToAllSchedules(), &attn::readAllToAllSetting})

TEST(CollAlgorithms, EveryRowNameParsesToItsAlgorithm) { FOR_EACH_TABLE(CheckParses); }

TEST(CollAlgorithms, UnknownNameListsTheTable) {
  FOR_EACH_TABLE(CheckUnknownFails);
  // The wording users saw before the tables.
  ScopedEnv env(Env{{"ATTN_BROADCAST_ALGO", "ring"}});
  attn::BroadcastSetting s;
  EXPECT_EQ(attn::readBroadcastSetting(&s), attnInvalidArgument);
  EXPECT_STREQ(attnGetLastError(nullptr), "ATTN_BROADCAST_ALGO='ring' is not one of tree, chain, direct, auto");
}

TEST(CollAlgorithms, NoDuplicateNamesPerCollective) {
  FOR_EACH_TABLE(CheckNoDuplicates);
  CheckNoDuplicates(Table{"reduce-scatter", attn::reduceScatterAlgorithms(), &attn::readAlgoSetting});
  // Reduce-scatter's rows are all-gather's names (ATTN_ALGO), less direct.
  for (const auto& r : attn::reduceScatterAlgorithms())
    EXPECT_NE(attn::findAlgo(attn::allGatherAlgorithms(), r.algo), nullptr) << r.name;
}

// Every rank's input element i: exact in float32 once summed over 4 ranks.
float In(int rank, size_t i) { return float(rank * 3 + int(i % 11)); }
float Sum(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; ++r) s += In(r, i);
  return s;
}

constexpr size_t kCount = 3001;  // several 4 KiB chunks, uneven slices

void AllGatherRows(attnComm_t comm, int rank, int n) {
  // Uneven blocks: rank r holds 700 + 131 r floats.
  std::vector<attn::Block> blocks;
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    const size_t c = 700 + 131 * size_t(r);
    blocks.push_back({total * sizeof(float), c * sizeof(float)});
    total += c;
  }
  for (const auto& row : attn::allGatherAlgorithms())
    for (int via = 0; via < 2; ++via) {
      std::vector<float> buf(total, -1.f);
      for (size_t i = 0; i < blocks[rank].bytes / 4; ++i) buf[blocks[rank].offset / 4 + i] = In(rank, i);
      char* p = reinterpret_cast<char*>(buf.data());
      const auto s = static_cast<attn::AlgoSetting>(int(row.algo) + 1);
      ASSERT_EQ(via ? attn::runAllGather(comm, s, "AllGather", p, blocks, 4) : row.run(comm, p, blocks, 4),
                attnSuccess) << row.name;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < blocks[r].bytes / 4; ++i)
          ASSERT_EQ(buf[blocks[r].offset / 4 + i], In(r, i)) << row.name << " block " << r << " element " << i;
    }
}

void ReduceScatterRows(attnComm_t comm, int rank, int n) {
  const std::vector<attn::Block> blocks = attn::splitEvenly(kCount, n, 4);
  std::vector<float> in(kCount);
  for (size_t i = 0; i < kCount; ++i) in[i] = In(rank, i);
  for (const auto& row : attn::reduceScatterAlgorithms())
    for (int via = 0; via < 2; ++via) {
      std::vector<float> out(blocks[rank].bytes / 4, -1.f);
      const char* src = reinterpret_cast<const char*>(in.data());
      char* dst = reinterpret_cast<char*>(out.data());
      const auto s = static_cast<attn::AlgoSetting>(int(row.algo) + 1);
      ASSERT_EQ(via ? attn::runReduceScatter(comm, s, "ReduceScatter", src, dst, blocks, attnFloat32, attnSum)
                    : row.run(comm, src, dst, blocks, attnFloat32, attnSum),
                attnSuccess) << row.name;
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_EQ(out[i], Sum(n, blocks[rank].offset / 4 + i)) << row.name << " element " << i;
    }
}

void BroadcastRows(attnComm_t comm, int rank, int n) {
  for (const auto& row : attn::broadcastAlgorithms())
    for (int root = 0; root < n; ++root)
      for (int via = 0; via < 2; ++via) {
        std::vector<float> buf(kCount, -1.f);
        if (rank == root)
          for (size_t i = 0; i < kCount; ++i) buf[i] = In(root, i);
        char* p = reinterpret_cast<char*>(buf.data());
        const auto s = static_cast<attn::BroadcastSetting>(int(row.algo) + 1);
        ASSERT_EQ(via ? attn::runBroadcast(comm, s, root, p, kCount * 4, 4) : row.run(comm, root, p, kCount * 4, 4),
                  attnSuccess) << row.name;
        for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(buf[i], In(root, i)) << row.name << " root " << root;
      }
}

void ReduceRows(attnComm_t comm, int rank, int n) {
  std::vector<float> in(kCount);
  for (size_t i = 0; i < kCount; ++i) in[i] = In(rank, i);
  for (const auto& row : attn::reduceAlgorithms())
    for (int root = 0; root < n; ++root)
      for (int via = 0; via < 2; ++via) {
        std::vector<float> out(kCount, -1.f);
        const char* src = reinterpret_cast<const char*>(in.data());
        char* dst = rank == root ? reinterpret_cast<char*>(out.data()) : nullptr;
        const auto s = static_cast<attn::ReduceSetting>(int(row.algo) + 1);
        ASSERT_EQ(via ? attn::runReduce(comm, s, root, src, dst, kCount, attnFloat32, attnSum)
                      : row.run(comm, root, src, dst, kCount, attnFloat32, attnSum),
                  attnSuccess) << row.name;
        if (rank == root)
          for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[i], Sum(n, i)) << row.name << " root " << root;
      }
}

void AllReduceRows(attnComm_t comm, int rank, int n) {
  std::vector<float> in(kCount);
  for (size_t i = 0; i < kCount; ++i) in[i] = In(rank, i);
  for (const auto& row : attn::allReduceAlgorithms())
    for (int via = 0; via < 2; ++via) {
      std::vector<float> out(kCount, -1.f);
      const char* src = reinterpret_cast<const char*>(in.data());
      char* dst = reinterpret_cast<char*>(out.data());
      const auto s = static_cast<attn::AllReduceSetting>(int(row.algo) + 1);
      ASSERT_EQ(via ? attn::runAllReduce(comm, s, attn::AlgoSetting::kAuto, src, dst, kCount, attnFloat32, attnSum)
                    : row.run(comm, attn::AlgoSetting::kAuto, src, dst, kCount, attnFloat32, attnSum),
                attnSuccess) << row.name;
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[i], Sum(n, i)) << row.name << " element " << i;
    }
}

class CollAlgorithmRows : public ::testing::TestWithParam<int> {};

TEST_P(CollAlgorithmRows, EveryRowRunsExactlyThreads) {
  RunOptions opts;
  opts.env = {{"ATTN_CHUNK_SIZE", "4096"}};
  RunThreads(GetParam(), [](int rank, int n, attnComm_t& comm) {
    AllGatherRows(comm, rank, n);
    ReduceScatterRows(comm, rank, n);
    BroadcastRows(comm, rank, n);
    ReduceRows(comm, rank, n);
    AllReduceRows(comm, rank, n);
  }, opts);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollAlgorithmRows, ::testing::Values(1, 3, 4));

}  // namespace
