// The versioned attention config (attnAttnConfig_t): a config not started
// from ATTN_ATTN_CONFIG_INITIALIZER is refused; one from an older header
// (smaller size) gets the new fields' defaults; the LSE convention it
// names (base e or 2, token- or head-major) is the one the calls write.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attncomm.h"
#include "support/multirank.h"

namespace {

constexpr int kHq = 4, kHkv = 2, kD = 16, kRows = 13;

struct Problem {
  std::vector<float> q, k, v;
  std::vector<int32_t> off{0, kRows}, pos;
  attnSeqLayout_t layout{};
  Problem() {
    std::mt19937 g(3);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    q.resize(size_t(kRows) * kHq * kD);
    k.resize(size_t(kRows) * kHkv * kD);
    v.resize(k.size());
    for (auto* x : {&q, &k, &v})
      for (float& f : *x) f = u(g);
    for (int i = 0; i < kRows; ++i) pos.push_back(i);
    layout = {1, off.data(), pos.data(), off.data(), pos.data()};
  }
};

attnResult_t RunAttention(attnComm_t comm, const Problem& p, const attnAttnConfig_t& cfg, std::vector<float>* out,
                 std::vector<float>* lse) {
  out->assign(p.q.size(), 0.f);
  lse->assign(size_t(kRows) * kHq, 0.f);
  return attnRingAttention(p.q.data(), p.k.data(), p.v.data(), out->data(), lse->data(), &p.layout, &cfg,
                           attnModePassKV, comm, nullptr);
}

TEST(AttnConfig, LseConventionsAreTheOnesWritten) {
  attn_test::RunThreads(2, [](int, int, attnComm_t& comm) {
    const Problem p;
    attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(kHq, kHkv, kD, attnFloat32, 0.0f, 1);
    std::vector<float> o, natural, o2, l2;
    ASSERT_EQ(RunAttention(comm, p, cfg, &o, &natural), attnSuccess) << attnGetLastError(comm);
    for (attnLseBase_t base : {attnLseNatural, attnLseBase2})
      for (attnLseLayout_t layout : {attnLseTokenMajor, attnLseHeadMajor}) {
        cfg.lse_base = base;
        cfg.lse_layout = layout;
        ASSERT_EQ(RunAttention(comm, p, cfg, &o2, &l2), attnSuccess) << attnGetLastError(comm);
        EXPECT_EQ(o2, o) << "the output does not depend on the LSE convention";
        const float scale = base == attnLseBase2 ? float(1.0 / std::log(2.0)) : 1.f;
        for (int t = 0; t < kRows; ++t)
          for (int h = 0; h < kHq; ++h) {
            const size_t at = layout == attnLseTokenMajor ? size_t(t) * kHq + h : size_t(h) * kRows + t;
            ASSERT_NEAR(l2[at], natural[size_t(t) * kHq + h] * scale, 1e-5f)
                << "base " << base << " layout " << layout << " row " << t << " head " << h;
          }
      }
  });
}

TEST(AttnConfig, AConfigNotStartedFromTheInitializerIsRefused) {
  attn_test::RunThreads(2, [](int, int, attnComm_t& comm) {
    const Problem p;
    attnAttnConfig_t cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.num_q_heads = kHq;
    cfg.num_kv_heads = kHkv;
    cfg.head_dim = kD;
    cfg.dtype = attnFloat32;
    std::vector<float> o, l;
    EXPECT_EQ(RunAttention(comm, p, cfg, &o, &l), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("ATTN_ATTN_CONFIG_INITIALIZER"), std::string::npos)
        << attnGetLastError(comm);
    cfg = ATTN_ATTN_CONFIG(kHq, kHkv, kD, attnFloat32, 0.0f, 1);
    cfg.lse_base = static_cast<attnLseBase_t>(7);
    EXPECT_EQ(RunAttention(comm, p, cfg, &o, &l), attnInvalidArgument);
    EXPECT_NE(std::string(attnGetLastError(comm)).find("lse_base"), std::string::npos) << attnGetLastError(comm);
    // The communicator goes on.
    cfg.lse_base = attnLseNatural;
    EXPECT_EQ(RunAttention(comm, p, cfg, &o, &l), attnSuccess) << attnGetLastError(comm);
  });
}

TEST(AttnConfig, AnOlderHeadersConfigGetsTheNewFieldsDefaults) {
  attn_test::RunThreads(1, [](int, int, attnComm_t& comm) {
    const Problem p;
    attnAttnConfig_t cfg = ATTN_ATTN_CONFIG(kHq, kHkv, kD, attnFloat32, 0.0f, 1);
    std::vector<float> o, natural, o2, l2;
    ASSERT_EQ(RunAttention(comm, p, cfg, &o, &natural), attnSuccess) << attnGetLastError(comm);
    // A caller compiled before lse_base existed: its struct ends at causal,
    // and what follows it in memory is not the library's to read.
    cfg.size = offsetof(attnAttnConfig_t, causal) + sizeof(int);
    cfg.lse_base = attnLseBase2;
    cfg.lse_layout = attnLseHeadMajor;
    ASSERT_EQ(RunAttention(comm, p, cfg, &o2, &l2), attnSuccess) << attnGetLastError(comm);
    EXPECT_EQ(l2, natural);
    cfg.size = 8;  // smaller than any version
    EXPECT_EQ(RunAttention(comm, p, cfg, &o2, &l2), attnInvalidArgument);
  });
}

}  // namespace
