// Planning one attention collective, shared by attnRingAttention,
// attnSelectMode and attnLevelAttention: argument checks, the card every
// rank all-gathers (sizes and the call's shape, which must agree), the
// agreed cost model, and the AttnCall the algorithms run on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/attn/attn_call.h"
#include "src/attn/selector.h"

namespace attn {

attnResult_t checkConfig(const attnAttnConfig_t* cfg);
// offs[0] == 0 and non-decreasing; *rows = offs[numSeqs] (0 without sequences).
attnResult_t checkOffsets(const char* what, int numSeqs, const int32_t* offs, int64_t* rows);

// Mode value on the card of an attnLevelAttention call: a rank calling
// attnRingAttention while its peers call attnLevelAttention is caught.
constexpr int32_t kLevelCallMode = 100;

// What ranks exchange before running: their sizes, and the call's shape,
// which must agree.
struct AttnCard {
  int64_t qRows, kvRows;
  int32_t numSeqs, mode, hq, hkv, d, dv, dtype, causal;
  float scale;
  int32_t overridesRates;  // ATTN_MODEL_* or attnCommSetCostModel on this rank
  float keep[4];           // attnLevelAttention's keep fractions by tier (1 otherwise)
  int32_t status;          // attnSuccess, or why this rank refused the call (refuseCall)
  int32_t windowLeft, windowRight, sinks;  // the config's (sinks: 0 / 1)
  float softcap;
  // With a window, the range of this rank's positions: every rank decides
  // from the same cards which blocks the window hides (visibility.h), so a
  // sender and its receiver agree.
  PosRanges pos;
};

AttnCard cardOf(attnComm* comm, int64_t qRows, int64_t kvRows, int numSeqs, int32_t mode,
                const attnAttnConfig_t& cfg, const float* keep /* [4] or NULL: all 1 */);
// A peer's card, whose shape equals `mine`: its row counts are what the API
// allows a rank (0 .. 2^31 - 1) and the blocks and partials they size fit
// in memory's sizes. Pure; attnRemoteError naming `peer` otherwise.
attnResult_t checkPeerCard(const AttnCard& mine, const AttnCard& card, int peer);
// All-gathers the cards; fails unless every rank's shape equals ours. A
// refused card fails the call everywhere: on its rank with the status it
// carries (the text already set there), on the others naming that rank.
attnResult_t exchangeCards(attnComm* comm, const AttnCard& mine, std::vector<AttnCard>* all);
// A call this rank refuses (bad arguments: `status`, whose text is the
// thread's last error) still takes part in the call's card exchange, with a
// refused card (mode `cardMode`): the other ranks then fail it too, naming
// this rank, instead of taking this rank's next call for this one, and every
// rank stays in step. The exchange is queued as the call would have been
// (in a group, on a non-blocking communicator's queue, on a device stream);
// returns `status`, its text kept.
attnResult_t refuseCall(attnComm* comm, attnStream_t stream, attnResult_t status, int32_t cardMode);
// The same for a call that runs on the calling thread (attnSelectMode).
attnResult_t refuseCallHere(attnComm* comm, attnResult_t status, int32_t cardMode);
// The rates AUTO decides with, the same on every rank.
attnResult_t agreedModel(attnComm* comm, const attnAttnConfig_t& cfg,
                         const std::vector<AttnCard>& cards, attnCostModel_t* model);
// The selector's input for `comm`: totals from the cards, and which modes
// can run here (all-gather KV has no device run yet).
ModelInput modelInputOf(attnComm* comm, const std::vector<AttnCard>& cards, int numSeqs);

// Plans one call on host-side metadata: checks the layout, rebases the
// offsets, learns every rank's row counts and agrees on the mode (AUTO
// resolved). Collective. The tensors are only recorded: host pointers on a
// host communicator, device pointers on a device one. A level call passes
// its `keep` fractions ([4]): they go on its card (mode kLevelCallMode) and
// *mode is left alone.
attnResult_t planCall(attnComm* comm, const void* q, const void* k, const void* v,
                      const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg,
                      attnAttnMode_t* mode, AttnCall* out, const float* keep = nullptr);

// Runs a planned call on host memory (c.q, c.kv host pointers): the fp32
// accumulator, the algorithm, then out (cfg.dtype) and lse (may be NULL).
attnResult_t runHostCall(AttnCall& c, const std::function<attnResult_t(AttnCall&)>& algo,
                         void* out, float* lse);

// The checks every attention call makes on its pointers and layout before
// anything moves: *qRows / *kvRows are this rank's row counts. In two
// halves for a device layout read when the call runs
// (src/attn/device/device_layout.h): the shape reads no layout array, the
// rows read them all (host copies).
attnResult_t checkCallShape(const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg);
attnResult_t checkLayoutRows(const void* q, const void* k, const void* v, const void* out,
                             const attnSeqLayout_t& layout, const attnAttnConfig_t& cfg, int64_t* qRows,
                             int64_t* kvRows);
attnResult_t checkCallArgs(const void* q, const void* k, const void* v, const void* out,
                           const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                           int64_t* qRows, int64_t* kvRows);

// A copy of a call's layout (host memory the caller may reuse once the call
// returns) for a device communicator's work, which runs later on its proxy.
struct LayoutCopy {
  std::vector<int32_t> qOff, qPos, kvOff, kvPos;
  attnSeqLayout_t layout{};
};
std::shared_ptr<const LayoutCopy> copyLayout(const attnSeqLayout_t& lay, int64_t qRows, int64_t kvRows);

// Keeps the call's figures as the communicator's last (read by perf/).
void recordStats(AttnCall& c, attnAttnMode_t mode, Clock::time_point t0);

}  // namespace attn
