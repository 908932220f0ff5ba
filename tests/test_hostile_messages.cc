// A peer that sends crafted messages cannot make a rank allocate what it
// announces, read past a block, or wait for ever. First the parsers alone
// (src/attn/kv_wire.h, the attention cards): each count beyond its bytes or
// beyond what the local call allows is attnRemoteError naming the peer,
// counts near 2^32 and sizes near 2^63 included, with nothing allocated by
// them. Then real groups (threads): rank 1 plays a hostile peer with the
// engine and the internal helpers, rank 0 makes the real call, which must
// fail with attnRemoteError naming rank 1. The wire structs below restate
// the formats the library sends (kv_exchange.cc, kv_migrate.cc,
// kv_attention.cc, wire.h), so these tests pin the format too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/attn/kv_wire.h"
#include "src/attn/plan_call.h"
#include "src/attn/wire.h"
#include "src/coll/coll.h"
#include "src/core/comm.h"
#include "src/core/error.h"
#include "tests/support/kv_fixtures.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

// The KV collectives' fixed header, sent to every peer before any payload.
struct ExchangeHeader {
  int32_t status;
  int32_t reserved;
  uint64_t bytes;
};
// attnKvAttention's per-peer header (after the release list).
struct QueryHeader {
  int32_t numQHeads;
  int32_t causal;
  float scale;
  uint32_t entries;
  int32_t windowLeft = -1, windowRight = -1;
  float softcap = 0.0f;
};

attnConfig_t ShortTimeout() {
  attnConfig_t c = ATTN_CONFIG_INITIALIZER;
  c.timeout_ms = 20000;  // a hang becomes a failure, not a stuck suite
  return c;
}

// Rank 1's side of the KV exchange's header round: announces `announce`
// bytes; returns what rank 0 announced.
uint64_t TradeHeaders(attnComm_t comm, uint64_t announce) {
  attn::Engine& e = *comm->engine;
  ExchangeHeader mine{attnSuccess, 0, announce}, theirs{};
  attn::Request s, r;
  EXPECT_EQ(e.irecv(0, &theirs, sizeof(theirs), &r), attnSuccess);
  EXPECT_EQ(e.isend(0, &mine, sizeof(mine), &s), attnSuccess);
  EXPECT_EQ(e.wait(&s), attnSuccess);
  EXPECT_EQ(e.wait(&r), attnSuccess);
  return theirs.bytes;
}

// Rank 1's payload round: takes rank 0's payload (so its send completes)
// and sends `payload`.
void TradePayloads(attnComm_t comm, uint64_t theirBytes, const std::vector<char>& payload) {
  attn::Engine& e = *comm->engine;
  std::vector<char> in(theirBytes);
  attn::Request s, r;
  if (theirBytes) EXPECT_EQ(e.irecv(0, in.data(), in.size(), &r), attnSuccess);
  if (!payload.empty()) EXPECT_EQ(e.isend(0, payload.data(), payload.size(), &s), attnSuccess);
  if (!payload.empty()) EXPECT_EQ(e.wait(&s), attnSuccess);
  if (theirBytes) EXPECT_EQ(e.wait(&r), attnSuccess);
}

template <typename T>
void Put(std::vector<char>* out, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

// ---------------------------------------------------------------------------
// The parsers alone

// Refused as rank 3's fault: attnRemoteError, and the text names it.
#define EXPECT_REFUSED_FROM_RANK3(call)                                                  \
  do {                                                                                   \
    EXPECT_EQ((call), attnRemoteError) << #call;                                         \
    EXPECT_NE(attn::threadLastError().find("rank 3"), std::string::npos)                 \
        << #call << ": " << attn::threadLastError();                                     \
  } while (0)

attn::KvPeerLimits Limits() {
  attn::KvPeerLimits lim;
  lim.peer = 3;
  lim.what = "test";
  lim.maxReleases = 4;
  lim.maxMoves = 2;
  lim.maxEntries = 2;
  lim.numKvHeads = 2;
  lim.headDim = 8;
  lim.dtype = attnFloat16;
  return lim;
}

TEST(KvWire, ExchangeHeaderBoundsTheAnnouncedSize) {
  attn::KvExchangeHeader h{attnSuccess, 0, 100}, out{};
  const char* b = reinterpret_cast<const char*>(&h);
  EXPECT_EQ(attn::parseKvExchangeHeader(b, sizeof(h), 3, 100, "test", &out), attnSuccess);
  EXPECT_EQ(out.bytes, 100u);
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvExchangeHeader(b, sizeof(h), 3, 99, "test", &out));
  for (uint64_t huge : {uint64_t(1) << 40, (uint64_t(1) << 63) + 5, UINT64_MAX}) {
    h.bytes = huge;
    EXPECT_REFUSED_FROM_RANK3(attn::parseKvExchangeHeader(b, sizeof(h), 3, uint64_t(1) << 30, "test", &out));
  }
  h = {attnInvalidArgument, 0, 0};
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvExchangeHeader(b, sizeof(h), 3, 100, "test", &out));
  h = {1234567, 0, 0};  // not a result code: still a failure, no table read
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvExchangeHeader(b, sizeof(h), 3, 100, "test", &out));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvExchangeHeader(b, sizeof(h) - 1, 3, 100, "test", &out));
}

TEST(KvWire, MigrateRequestCountsAreBoundedByBytesAndBooks) {
  const attn::KvPeerLimits lim = Limits();
  attn::KvMigrateRequest out;
  std::vector<char> ok;
  Put(&ok, uint32_t(1));
  Put(&ok, int64_t(77));
  Put(&ok, uint32_t(2));
  Put(&ok, attn::TryMove{3, 0, 5, 1});
  Put(&ok, attn::TryMove{0, 0, 6, 2});
  ASSERT_EQ(attn::parseKvMigrateRequest(ok.data(), ok.size(), lim, &out), attnSuccess) << attn::threadLastError();
  EXPECT_EQ(out.releases, std::vector<int64_t>{77});
  ASSERT_EQ(out.moves.size(), 2u);
  EXPECT_EQ(out.moves[1].blocks, 2);
  EXPECT_LE(ok.size(), attn::kvMigrateRequestBound(lim));

  std::vector<char> lying;  // 2^32 - 1 moves in 8 bytes
  Put(&lying, uint32_t(0));
  Put(&lying, uint32_t(0xFFFFFFFFu));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvMigrateRequest(lying.data(), lying.size(), lim, &out));
  std::vector<char> lyingReleases;  // 2^32 - 1 releases
  Put(&lyingReleases, uint32_t(0xFFFFFFFFu));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvMigrateRequest(lyingReleases.data(), lyingReleases.size(), lim, &out));
  std::vector<char> tooMany;  // 3 well-formed moves from a peer whose pool has 2 blocks
  Put(&tooMany, uint32_t(0));
  Put(&tooMany, uint32_t(3));
  for (int i = 0; i < 3; ++i) Put(&tooMany, attn::TryMove{3, 0, i, 1});
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvMigrateRequest(tooMany.data(), tooMany.size(), lim, &out));
  std::vector<char> trailing = ok;
  trailing.push_back(0);
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvMigrateRequest(trailing.data(), trailing.size(), lim, &out));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvMigrateRequest(ok.data(), 3, lim, &out));

  attn::KvPeerLimits huge = lim;  // bounds saturate instead of wrapping
  huge.maxReleases = huge.maxMoves = UINT64_MAX / 2;
  EXPECT_EQ(attn::kvMigrateRequestBound(huge), UINT64_MAX);
}

// attnKvAttention's queries: 2 requests of 1 and 2 rows, 4 heads x 8 fp16.
std::vector<char> Queries(uint32_t entries, int32_t heads, std::vector<int32_t> rows, int32_t windowLeft = -1,
                          float softcap = 0.0f) {
  std::vector<char> m;
  Put(&m, uint32_t(0));
  Put(&m, QueryHeader{heads, 1, 0.5f, entries, windowLeft, -1, softcap});
  for (size_t i = 0; i < rows.size(); ++i) Put(&m, attn::QueryEntry{int64_t(10 + i), rows[i], 0});
  for (int32_t r : rows)
    if (r > 0 && r < 1000) m.insert(m.end(), size_t(r) * (4 + size_t(heads) * 8 * 2), '\x01');
  return m;
}

TEST(KvWire, QueryRequestCountsAreBoundedByBytesAndBooks) {
  const attn::KvPeerLimits lim = Limits();
  attn::KvQueryRequest out;
  const std::vector<char> ok = Queries(2, 4, {1, 2});
  ASSERT_EQ(attn::parseKvQueryRequest(ok.data(), ok.size(), lim, &out), attnSuccess) << attn::threadLastError();
  ASSERT_EQ(out.entries.size(), 2u);
  EXPECT_EQ(out.rows, 3);
  EXPECT_EQ(out.entries[1].req, 11);

  const std::vector<char> lying = Queries(0xFFFFFFFFu, 4, {});  // 2^32 - 1 entries in no bytes
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(lying.data(), lying.size(), lim, &out));
  const std::vector<char> notHeld = Queries(3, 4, {1, 1, 1});  // 3 requests, 2 held here
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(notHeld.data(), notHeld.size(), lim, &out));
  attn::KvPeerLimits none = lim;
  none.maxEntries = 0;  // no block of the peer's here: not one query
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(ok.data(), ok.size(), none, &out));
  EXPECT_LT(attn::kvQueryRequestBound(none), ok.size());
  const std::vector<char> overflowRows = Queries(2, 4, {INT32_MAX, 5});  // more than 2^31 - 1 in all
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(overflowRows.data(), overflowRows.size(), lim, &out));
  // rows x (2^31 - 2 heads x 8 x 2 bytes) passes 2^63: refused from the
  // bytes, not allocated.
  const std::vector<char> hugeRows = Queries(1, INT32_MAX - 1, {INT32_MAX});
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(hugeRows.data(), hugeRows.size(), lim, &out));
  const std::vector<char> badHeads = Queries(2, 3, {1, 2});  // not a multiple of the pool's 2 kv heads
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(badHeads.data(), badHeads.size(), lim, &out));
  const std::vector<char> negative = Queries(1, 4, {-1});
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(negative.data(), negative.size(), lim, &out));
  // The window and softcap the queries carry (issue 48): a window of 7 and
  // a cap of 30 are fine; a window below -1 or a NaN / negative cap is not.
  const std::vector<char> windowed = Queries(2, 4, {1, 2}, 7, 30.0f);
  ASSERT_EQ(attn::parseKvQueryRequest(windowed.data(), windowed.size(), lim, &out), attnSuccess)
      << attn::threadLastError();
  EXPECT_EQ(out.header.windowLeft, 7);
  EXPECT_EQ(out.header.softcap, 30.0f);
  for (const auto& bad : {Queries(2, 4, {1, 2}, -2), Queries(2, 4, {1, 2}, -1, NAN), Queries(2, 4, {1, 2}, -1, -1.0f)})
    EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(bad.data(), bad.size(), lim, &out));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvQueryRequest(ok.data(), ok.size() - 1, lim, &out));
}

TEST(KvWire, ShrinkClaimsAndAnswersAreBounded) {
  std::vector<std::pair<int64_t, int64_t>> claims;
  std::vector<char> ok;
  Put(&ok, uint32_t(1));
  Put(&ok, int64_t(5));
  Put(&ok, uint32_t(2));
  Put(&ok, int64_t(0));
  Put(&ok, int64_t(3));
  ASSERT_EQ(attn::parseKvClaims(ok.data(), ok.size(), 3, 4, &claims), attnSuccess) << attn::threadLastError();
  EXPECT_EQ(claims.size(), 2u);
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvClaims(ok.data(), ok.size(), 3, 1, &claims));  // more than held
  std::vector<char> lying;
  Put(&lying, uint32_t(1));
  Put(&lying, int64_t(5));
  Put(&lying, uint32_t(0xFFFFFFFFu));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvClaims(lying.data(), lying.size(), 3, uint64_t(1) << 40, &claims));
  std::vector<char> negative;
  Put(&negative, uint32_t(1));
  Put(&negative, int64_t(5));
  Put(&negative, uint32_t(1));
  Put(&negative, int64_t(-4));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvClaims(negative.data(), negative.size(), 3, 4, &claims));

  std::vector<int64_t> ids;
  std::vector<char> answer;
  Put(&answer, uint32_t(2));
  Put(&answer, int64_t(7));
  Put(&answer, int64_t(8));
  ASSERT_EQ(attn::parseKvLostList(answer.data(), answer.size(), 3, 2, &ids), attnSuccess);
  EXPECT_EQ(ids, (std::vector<int64_t>{7, 8}));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvLostList(answer.data(), answer.size(), 3, 1, &ids));
  EXPECT_REFUSED_FROM_RANK3(attn::parseKvLostList(answer.data(), 5, 3, 2, &ids));
}

TEST(AttentionCards, RowCountsBeyondTheApiOrOverflowingAreRefused) {
  const attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(8, 2, 128, attnFloat16, 0.0f, 1);
  attn::AttnCard mine{};
  mine.qRows = 10;
  mine.kvRows = 10;
  mine.numSeqs = 2;
  mine.hq = cfg.num_q_heads;
  mine.hkv = cfg.num_kv_heads;
  mine.d = cfg.head_dim;
  mine.dtype = cfg.dtype;
  attn::AttnCard peer = mine;
  EXPECT_EQ(attn::checkPeerCard(mine, peer, 3), attnSuccess);
  peer.qRows = INT32_MAX;
  peer.kvRows = INT32_MAX;
  EXPECT_EQ(attn::checkPeerCard(mine, peer, 3), attnSuccess);  // what the API allows
  for (int64_t bad : {int64_t(INT32_MAX) + 1, int64_t(1) << 40, INT64_MAX, int64_t(-1), INT64_MIN}) {
    peer = mine;
    peer.kvRows = bad;
    EXPECT_REFUSED_FROM_RANK3(attn::checkPeerCard(mine, peer, 3));
    peer = mine;
    peer.qRows = bad;
    EXPECT_REFUSED_FROM_RANK3(attn::checkPeerCard(mine, peer, 3));
  }
  // Legal rows whose blocks overflow a 64-bit size: 2^31 rows of 2^34-byte rows.
  mine.hq = mine.hkv = 1 << 24;
  mine.d = 256;
  mine.dtype = attnFloat32;
  peer = mine;
  peer.kvRows = INT32_MAX;
  EXPECT_REFUSED_FROM_RANK3(attn::checkPeerCard(mine, peer, 3));
}

// ---------------------------------------------------------------------------
// Real groups: rank 1 is the hostile peer

// The failure rank 0 must see: a remote error that names rank 1.
void ExpectBlamesRank1(attnResult_t rc, attnComm_t comm, const char* call) {
  const std::string why = attnGetLastError(comm);
  EXPECT_EQ(rc, attnRemoteError) << call << ": " << why;
  EXPECT_NE(why.find("rank 1"), std::string::npos) << call << ": " << why;
}

// A KV pool on both ranks; rank 0 owns request 7 (all of it at home).
attnKvPool_t MakePool(attnComm_t comm, int rank) {
  const attnKvPoolConfig_t cfg = PoolCfg(4, 16);
  attnKvPool_t pool = nullptr;
  EXPECT_EQ(attnKvPoolCreate(comm, &cfg, &pool), attnSuccess) << attnGetLastError(comm);
  if (rank == 0 && pool) {
    KvTokens t = RequestTokens(attnFloat32, 0, 7, 9);
    EXPECT_EQ(attnKvAppend(pool, 7, t.k.data(), t.v.data(), t.pos.data(), 9, nullptr), attnSuccess);
  }
  return pool;
}

// A peer announcing a payload just under the old 1 TiB bound, far beyond
// anything a migration between 16-block pools can carry: refused before
// anything is allocated for it.
TEST(HostileKv, MigrateAnnouncingATerabyteIsRefused) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    attnKvPool_t pool = MakePool(comm, rank);
    ASSERT_NE(pool, nullptr);
    if (rank == 0) {
      const attnResult_t rc = attnKvMigrate(pool, nullptr, 0, nullptr, nullptr);
      ExpectBlamesRank1(rc, comm, "attnKvMigrate");
    } else {
      TradeHeaders(comm, (uint64_t(1) << 40) - 1);
    }
    EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
  }, {.config = &cfg});
}

// Three ranks: rank 1 announces a terabyte to rank 0 only and is correct
// with rank 2. Rank 0 refuses it; rank 2, which did nothing wrong, must not
// be left waiting for rank 0's payload until its timeout: rank 0's refusal
// breaks its links, so rank 2 fails at once too.
TEST(HostileKv, HonestRanksFailPromptlyWhenOneRankRefusesAPeer) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(3, [](int rank, int, attnComm_t& comm) {
    attnKvPool_t pool = MakePool(comm, rank);
    ASSERT_NE(pool, nullptr);
    if (rank == 0) {
      ExpectBlamesRank1(attnKvMigrate(pool, nullptr, 0, nullptr, nullptr), comm, "attnKvMigrate");
    } else if (rank == 2) {
      const attnResult_t rc = attnKvMigrate(pool, nullptr, 0, nullptr, nullptr);
      EXPECT_NE(rc, attnSuccess);
      EXPECT_NE(rc, attnTimeout) << "rank 2 waited out its timeout: " << attnGetLastError(comm);
    } else {
      attn::Engine& e = *comm->engine;
      ExchangeHeader to0{attnSuccess, 0, (uint64_t(1) << 40) - 1}, to2{attnSuccess, 0, 8}, from0{}, from2{};
      attn::Request r[4];
      (void)e.irecv(0, &from0, sizeof(from0), &r[0]);
      (void)e.irecv(2, &from2, sizeof(from2), &r[1]);
      (void)e.isend(0, &to0, sizeof(to0), &r[2]);
      (void)e.isend(2, &to2, sizeof(to2), &r[3]);
      for (auto& q : r) (void)e.wait(&q);
      std::vector<char> payload;  // no releases, no moves
      Put(&payload, uint32_t(0));
      Put(&payload, uint32_t(0));
      std::vector<char> in(from2.bytes);
      attn::Request s2, r2;
      (void)e.isend(2, payload.data(), payload.size(), &s2);
      (void)e.irecv(2, in.data(), in.size(), &r2);
      (void)e.wait(&s2);
      (void)e.wait(&r2);
    }
    EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
  }, {.config = &cfg});
}

// A well-sized migration request whose move count claims 2^32 - 1 moves in
// 8 bytes: the count is checked against the bytes (and the peer's pool)
// before any vector is sized by it.
TEST(HostileKv, MigrateMoveCountBeyondItsBytesIsRefused) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    attnKvPool_t pool = MakePool(comm, rank);
    ASSERT_NE(pool, nullptr);
    if (rank == 0) {
      const attnResult_t rc = attnKvMigrate(pool, nullptr, 0, nullptr, nullptr);
      ExpectBlamesRank1(rc, comm, "attnKvMigrate");
    } else {
      std::vector<char> payload;
      Put(&payload, uint32_t(0));           // no releases
      Put(&payload, uint32_t(0xFFFFFFFFu));  // moves "to follow"
      const uint64_t theirs = TradeHeaders(comm, payload.size());
      TradePayloads(comm, theirs, payload);
    }
    EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
  }, {.config = &cfg});
}

// Queries claiming 2^32 - 1 request entries (and holding no block of rank
// 0's pool at all): refused from the header, no 64 GiB entry table.
TEST(HostileKv, AttentionEntryCountBeyondItsBytesIsRefused) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    attnKvPool_t pool = MakePool(comm, rank);
    ASSERT_NE(pool, nullptr);
    if (rank == 0) {
      const KvQueries qs = MakeKvQueries(0, {{7, 9, 1}}, attnFloat32, false);
      std::vector<uint8_t> out(qs.q.size());
      const attnResult_t rc = attnKvAttention(pool, 1, qs.ids.data(), qs.offs.data(), qs.q.data(),
                                              qs.qpos.data(), out.data(), nullptr, &qs.cfg, nullptr);
      ExpectBlamesRank1(rc, comm, "attnKvAttention");
    } else {
      std::vector<char> payload;
      Put(&payload, uint32_t(0));  // no releases
      Put(&payload, QueryHeader{4, 0, 1.0f, 0xFFFFFFFFu});
      const uint64_t theirs = TradeHeaders(comm, payload.size());
      TradePayloads(comm, theirs, payload);
    }
    EXPECT_EQ(attnKvPoolDestroy(pool), attnSuccess);
  }, {.config = &cfg});
}

// A peer's pool report (attnKvPoolCreate's all-gather) with a negative
// capacity: every later bound on what that peer may send rests on it.
TEST(HostileKv, PoolCreateWithANegativePeerCapacityIsRefused) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    const attnKvPoolConfig_t good = PoolCfg(4, 16);
    if (rank == 0) {
      attnKvPool_t pool = nullptr;
      const attnResult_t rc = attnKvPoolCreate(comm, &good, &pool);
      ExpectBlamesRank1(rc, comm, "attnKvPoolCreate");
      EXPECT_EQ(pool, nullptr);
      if (pool) attnKvPoolDestroy(pool);
    } else {
      struct Report {
        int32_t status, reserved;
        attnKvPoolConfig_t body;
      };
      std::vector<Report> all(2);
      all[1] = {attnSuccess, 0, good};
      all[1].body.capacity_blocks = -5;
      std::vector<attn::Block> blocks = {{0, sizeof(Report)}, {sizeof(Report), sizeof(Report)}};
      EXPECT_EQ(attn::ringAllGatherv(*comm->engine, attn::Ring::identity(1, 2),
                                     reinterpret_cast<char*>(all.data()), blocks, attn::chunkBytes(1)),
                attnSuccess);
    }
  }, {.config = &cfg});
}

// Ring attention's card with 2^34 key rows (the API allows at most 2^31 - 1
// per rank): refused at the card, before buffers are sized by it.
TEST(HostileAttention, CardWithMoreRowsThanTheApiAllowsIsRefused) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [](int rank, int, attnComm_t& comm) {
    const attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(2, 2, 8, attnFloat32, 0.0f, 0);
    std::vector<int32_t> offs = {0, 3}, pos = {0, 1, 2};
    std::vector<float> q(3 * 2 * 8, 0.5f), k(q), v(q), out(q.size());
    if (rank == 0) {
      const attnSeqLayout_t lay{1, offs.data(), pos.data(), offs.data(), pos.data()};
      const attnResult_t rc =
          attnRingAttention(q.data(), k.data(), v.data(), out.data(), nullptr, &lay, &acfg, attnModePassKV, comm, nullptr);
      ExpectBlamesRank1(rc, comm, "attnRingAttention");
    } else {
      const attn::AttnCard mine = attn::cardOf(comm, 3, int64_t(1) << 34, 1, attnModePassKV, acfg, nullptr);
      std::vector<attn::AttnCard> all;
      (void)attn::exchangeCards(comm, mine, &all);
    }
  }, {.config = &cfg});
}

// What rank 1 sends in place of its true KV block, its card being true.
enum class BadKvBlock {
  oneSequence,  // one sequence of 4 rows where the call has two
  twoRows,      // two rows where its card announced four
  narrowValues, // V rows of 2 where the call's V head dim is 4 (MLA)
};

// Rank 0 runs `mode` on 2 sequences of 2 rows (heads 2/2, D 8, Dv 4);
// rank 1 takes part in the card exchange, then sends `bad` as its KV block
// and expects nothing back. Rank 0 refuses it, naming rank 1: read with
// the call's shape, the block would read past its offsets or its rows.
void RunHostileKvBlock(attnAttnMode_t mode, BadKvBlock bad) {
  const attnConfig_t cfg = ShortTimeout();
  RunThreads(2, [mode, bad](int rank, int, attnComm_t& comm) {
    attnAttnConfig_t acfg = ATTN_ATTN_CONFIG(2, 2, 8, attnFloat32, 0.0f, 0);
    acfg.head_dim_v = 4;
    const size_t kRow = 2 * 8 * sizeof(float), vRow = 2 * 4 * sizeof(float);
    std::vector<int32_t> offs = {0, 2, 4}, pos = {0, 1, 0, 1};
    std::vector<float> q(4 * 2 * 8, 0.25f), k(q), v(q), out(q.size());
    const attnSeqLayout_t lay{2, offs.data(), pos.data(), offs.data(), pos.data()};
    if (rank == 0) {
      const attnResult_t rc =
          attnRingAttention(q.data(), k.data(), v.data(), out.data(), nullptr, &lay, &acfg, mode, comm, nullptr);
      ExpectBlamesRank1(rc, comm, "attnRingAttention");
      return;
    }
    const attn::AttnCard mine = attn::cardOf(comm, 4, 4, 2, mode, acfg, nullptr);
    std::vector<attn::AttnCard> all;
    ASSERT_EQ(attn::exchangeCards(comm, mine, &all), attnSuccess);
    const std::vector<int32_t> oneSeq = {0, 4}, twoRows = {0, 1, 2};
    std::vector<char> block;
    switch (bad) {
      case BadKvBlock::oneSequence:
        attn::packBlock(1, 1, oneSeq.data(), pos.data(), 4, k.data(), v.data(), attn::RowBytes::two(kRow, vRow), &block);
        break;
      case BadKvBlock::twoRows:
        attn::packBlock(1, 2, twoRows.data(), pos.data(), 2, k.data(), v.data(), attn::RowBytes::two(kRow, vRow), &block);
        break;
      case BadKvBlock::narrowValues:
        attn::packBlock(1, 2, offs.data(), pos.data(), 4, k.data(), v.data(), attn::RowBytes::two(kRow, vRow / 2),
                        &block);
        break;
    }
    std::vector<char> theirs(attn::BlockLayout::of(2, 4, attn::RowBytes::two(kRow, vRow)).total);
    attn::Engine& e = *comm->engine;
    attn::Request s, r;
    ASSERT_EQ(e.irecv(0, theirs.data(), theirs.size(), &r), attnSuccess);
    ASSERT_EQ(e.isend(0, block.data(), block.size(), &s), attnSuccess);
    (void)e.wait(&s);
    (void)e.wait(&r);
  }, {.config = &cfg});
}

TEST(HostileAttention, PassKvBlockOfAnotherShapeIsRefused) {
  for (BadKvBlock bad : {BadKvBlock::oneSequence, BadKvBlock::narrowValues}) {
    SCOPED_TRACE(bad == BadKvBlock::oneSequence ? "one sequence of two" : "V rows narrower than Dv");
    RunHostileKvBlock(attnModePassKV, bad);
  }
}

// All-gather KV: the one block rank 1 sends rank 0 is self-consistent and
// unlike its card.
TEST(HostileAttention, AllGatherKvBlockUnlikeTheCardIsRefused) {
  for (BadKvBlock bad : {BadKvBlock::oneSequence, BadKvBlock::twoRows, BadKvBlock::narrowValues}) {
    SCOPED_TRACE(int(bad));
    RunHostileKvBlock(attnModeAllGatherKV, bad);
  }
}

}  // namespace
}  // namespace attn_test
