// The table of attention modes (src/attn/attn_algorithms.h) that
// attnRingAttention dispatches through, host and device alike.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "attncomm.h"
#include "src/attn/attn_algorithms.h"

namespace {

TEST(AttnAlgorithms, EveryModeHasOneRowWithAHostRun) {
  std::set<int> modes;
  std::set<std::string> names;
  for (const attn::AttnAlgorithm& a : attn::attnAlgorithms()) {
    SCOPED_TRACE(a.name);
    EXPECT_TRUE(modes.insert(int(a.mode)).second) << "mode listed twice";
    EXPECT_TRUE(names.insert(a.name).second) << "name listed twice";
    EXPECT_NE(a.host, nullptr);
    // Device runs exist exactly in builds with the CUDA path, but for
    // all-gather KV's, which has none yet (a device communicator refuses it).
    EXPECT_EQ(a.device != nullptr, bool(ATTN_HAVE_CUDA) && a.mode != attnModeAllGatherKV);
    EXPECT_EQ(attn::findAttnAlgorithm(a.mode), &a);
    EXPECT_EQ(attn::findAttnAlgorithm(std::string(a.name)), &a);
  }
  for (attnAttnMode_t m :
       {attnModePassKV, attnModePassQ, attnModeShipQ, attnModeHeadParallel, attnModeAllGatherKV})
    EXPECT_NE(attn::findAttnAlgorithm(m), nullptr) << "mode " << int(m) << " has no row";
  // AUTO is resolved by the selector before the table is read.
  EXPECT_EQ(attn::findAttnAlgorithm(attnModeAuto), nullptr);
  EXPECT_EQ(attn::findAttnAlgorithm(static_cast<attnAttnMode_t>(99)), nullptr);
  EXPECT_EQ(attn::findAttnAlgorithm(std::string("all_gather")), nullptr);
}

TEST(AttnAlgorithms, AModeOutsideTheTableIsRefused) {
  attnComm_t comm = nullptr;
  ASSERT_EQ(attnCommInitAll(&comm, 1, nullptr), attnSuccess);  // host memory
  attnAttnConfig_t cfg = ATTN_ATTN_CONFIG_INITIALIZER;
  cfg.num_q_heads = 1;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 8;
  cfg.dtype = attnFloat32;
  float q[8] = {}, kv[8] = {}, out[8] = {};
  int32_t off[2] = {0, 1}, pos[1] = {0};
  cfg.causal = 1;
  attnSeqLayout_t lay = {};
  lay.num_seqs = 1;
  lay.q_offsets = off;
  lay.kv_offsets = off;
  lay.q_pos = pos;
  lay.kv_pos = pos;
  EXPECT_EQ(attnRingAttention(q, kv, kv, out, nullptr, &lay, &cfg, static_cast<attnAttnMode_t>(42), comm, nullptr),
            attnInvalidArgument);
  EXPECT_NE(std::string(attnGetLastError(comm)).find("unknown attention mode 42"), std::string::npos)
      << attnGetLastError(comm);
  EXPECT_EQ(attnRingAttention(q, kv, kv, out, nullptr, &lay, &cfg, attnModePassKV, comm, nullptr), attnSuccess)
      << attnGetLastError(comm);
  attnCommDestroy(comm);
}

}  // namespace
