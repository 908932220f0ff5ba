#include "src/attn/attn_call.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/merge.h"
#include "src/attn/attn_config.h"
#include "src/core/datatype.h"
#include "src/core/error.h"

namespace attn {

attnResult_t checkKernelOut(const AttnState& st, const attnAttnConfig_t& cfg) {
  if (st.userKernel == nullptr) return attnSuccess;
  if (attnHasWindowOrSoftcap(cfg) && st.userKernelVersion < ATTN_VERSION(0, 3, 0))
    return setError(attnNotSupported,
                    "this call has a sliding window (%d, %d) or a softcap (%g), but the engine's attention kernel "
                    "was set by attnCommSetAttnKernel or from a header older than 0.3, so it may not apply them: "
                    "register it with attnCommSetAttnKernelEx from a 0.3 header, reading cfg->window_left, "
                    "window_right and softcap",
                    cfg.window_left, cfg.window_right, double(cfg.softcap));
  if (cfg.head_dim_v != cfg.head_dim && st.userKernelVersion < ATTN_VERSION(0, 4, 0))
    return setError(attnNotSupported,
                    "this call's V head dim (%d) differs from its Q/K head dim (%d), but the engine's attention "
                    "kernel was registered from a header older than 0.4, so it cannot know: register it with "
                    "attnCommSetAttnKernelEx from a 0.4 header, reading cfg->head_dim_v",
                    cfg.head_dim_v, cfg.head_dim);
  const attnDataType_t t = st.userOutDtype;
  if (t == attnFloat32 || t == cfg.dtype) return attnSuccess;
  return setError(attnInvalidArgument,
                  "the attention kernel set by attnCommSetAttnKernelEx writes out_dtype %s, which is neither "
                  "float32 nor this call's cfg.dtype %s",
                  dataTypeName(t), dataTypeName(cfg.dtype));
}

// The built-in kernel's problem for one (queries, keys) pair of blocks: one
// segment per sequence, rows of sequence i against keys of sequence i.
cpu::AttnProblem problemOf(const AttnCall& c, const RowsRef& qs, const RowsRef& kvs,
                           std::vector<cpu::AttnSegment>* segs) {
  segs->resize(c.numSeqs);
  for (int i = 0; i < c.numSeqs; ++i)
    (*segs)[i] = {qs.offsets[i], qs.offsets[i + 1], kvs.offsets[i], kvs.offsets[i + 1]};
  cpu::AttnProblem p;
  p.q = qs.t0;
  p.k = kvs.t0;
  p.v = kvs.t1;
  p.dtype = c.cfg.dtype;
  p.nq = qs.rows;
  p.nk = kvs.rows;
  p.num_q_heads = c.cfg.num_q_heads;
  p.num_kv_heads = c.cfg.num_kv_heads;
  p.head_dim = c.cfg.head_dim;
  p.head_dim_v = c.cfg.head_dim_v;
  p.scale = c.cfg.softmax_scale;
  p.causal = c.cfg.causal != 0;
  p.window_left = c.cfg.window_left;
  p.window_right = c.cfg.window_right;
  p.softcap = c.cfg.softcap;
  p.q_pos = qs.pos;
  p.k_pos = kvs.pos;
  p.segments = segs->data();
  p.num_segments = c.numSeqs;
  return p;
}

BlockExpect cardBlock(const AttnCall& c, int from, int origin, bool kv) {
  BlockExpect w;
  w.from = from;
  w.nranks = c.comm->nranks;
  w.origin = origin;
  w.numSeqs = c.numSeqs;
  w.maxRows = (kv ? c.kvRowsOf : c.qRowsOf)[size_t(origin)];
  w.exactRows = !(kv && c.vis.active());  // a window may trim KV blocks
  w.rowBytes = kv ? c.kvRow() : c.qRow();
  w.what = kv ? "key/value block" : "query block";
  return w;
}

size_t packVisibleKv(const AttnCall& c, const std::vector<int>& readers, char* out) {
  if (!c.vis.active())
    return packBlockInto(c.comm->rank, c.numSeqs, c.kvOffsets.data(), c.kv.pos, c.kv.rows, c.kv.t0, c.kv.t1,
                         c.kvRow(), out)
        .total;
  int64_t lo, hi;
  c.vis.keysSeenBy(readers, &lo, &hi);
  std::vector<int32_t> rows, offsets{0}, pos;
  for (int s = 0; s < c.numSeqs; ++s) {
    for (int32_t j = c.kvOffsets[s]; j < c.kvOffsets[s + 1]; ++j)
      if (c.kv.pos[j] >= lo && c.kv.pos[j] <= hi) {
        rows.push_back(j);
        pos.push_back(c.kv.pos[j]);
      }
    offsets.push_back(static_cast<int32_t>(rows.size()));
  }
  const BlockLayout l = packBlockMeta(c.comm->rank, c.numSeqs, offsets.data(), pos.data(),
                                      static_cast<int64_t>(rows.size()), c.kvRow(), out);
  const char* k = static_cast<const char*>(c.kv.t0);
  const char* v = static_cast<const char*>(c.kv.t1);
  char* ko = out + l.t0At;
  char* vo = out + l.t1At;
  const size_t kb = c.kRowBytes, vb = c.vRowBytes;
  // Runs of consecutive rows in one copy (a window keeps a contiguous tail).
  for (size_t i = 0; i < rows.size();) {
    size_t e = i + 1;
    while (e < rows.size() && rows[e] == rows[e - 1] + 1) ++e;
    std::memcpy(ko + i * kb, k + size_t(rows[i]) * kb, (e - i) * kb);
    std::memcpy(vo + i * vb, v + size_t(rows[i]) * vb, (e - i) * vb);
    i = e;
  }
  return l.total;
}

BlockExpect anyCardBlock(const AttnCall& c, int from, bool kv) {
  BlockExpect w = cardBlock(c, from, 0, kv);
  w.origin = -1;
  w.maxRows = INT32_MAX;
  w.exactRows = false;
  return w;
}

namespace {

attnResult_t callUserKernel(const AttnCall& c, const RowsRef& qs, const RowsRef& kvs, void* o,
                            float* lse) {
  ATTN_CHECK(checkKernelOut(*c.state, c.cfg));
  attnAttnKernelArgs_t a;
  a.q = qs.t0;
  a.k = kvs.t0;
  a.v = kvs.t1;
  a.out = static_cast<float*>(o);  // in out_dtype (attncomm.h)
  a.lse = lse;
  a.num_seqs = c.numSeqs;
  a.q_offsets = qs.offsets;
  a.q_pos = qs.pos;
  a.kv_offsets = kvs.offsets;
  a.kv_pos = kvs.pos;
  a.cfg = &c.cfg;
  a.out_dtype = c.state->userOutDtype;
  a.lse_base = c.state->userLseBase;
  a.lse_layout = c.state->userLseLayout;
  attnResult_t r = c.state->userKernel(&a, c.state->userData, nullptr);
  if (r != attnSuccess) return setError(r, "the attention kernel set by attnCommSetAttnKernel failed");
  return attnSuccess;
}

// The kernel's partial of qs over kvs folded into (o, lse) as the kernel
// wrote it: the merge reads its dtype and LSE convention (no fp32 round trip).
attnResult_t foldUserKernel(const AttnCall& c, const RowsRef& qs, const RowsRef& kvs, float* o, float* lse) {
  const AttnState& st = *c.state;
  const size_t rows = static_cast<size_t>(qs.rows) * c.cfg.num_q_heads;
  const size_t oBytes = rows * c.cfg.head_dim_v * dataTypeSize(st.userOutDtype);
  std::vector<float> po((oBytes + sizeof(float) - 1) / sizeof(float)), pl(rows);
  ATTN_CHECK(callUserKernel(c, qs, kvs, po.data(), pl.data()));
  const cpu::AttnPartialRef ref{po.data(), st.userOutDtype, pl.data(), st.userLseBase, st.userLseLayout,
                                c.cfg.num_q_heads};
  return cpu::foldPartial(o, lse, ref, rows, c.cfg.head_dim_v);
}

}  // namespace

attnResult_t AttnCall::partial(const RowsRef& qs, const RowsRef& kvs, float* o, float* lse) {
  auto t0 = Clock::now();
  attnResult_t r;
  if (state->skipCompute) {
    cpu::initAccumulator(o, lse, qs.rows, cfg.num_q_heads, cfg.head_dim_v);
    r = attnSuccess;
  } else if (state->userKernel && state->kernelWritesAccumulatorForm()) {
    r = callUserKernel(*this, qs, kvs, o, lse);
  } else if (state->userKernel) {
    // A native partial becomes the fp32 one by folding into an empty one.
    cpu::initAccumulator(o, lse, qs.rows, cfg.num_q_heads, cfg.head_dim_v);
    r = foldUserKernel(*this, qs, kvs, o, lse);
  } else {
    std::vector<cpu::AttnSegment> segs;
    cpu::AttnExec ex;
    ex.threads = state->kernelThreads;
    ex.pool = state->pool.get();
    r = cpu::attentionPartial(problemOf(*this, qs, kvs, &segs), o, lse, ex);
  }
  stats.computeUs += usSince(t0);
  return r;
}

attnResult_t AttnCall::accumulate(const RowsRef& qs, const RowsRef& kvs, float* o, float* lse) {
  if (kvs.rows == 0 || qs.rows == 0 || state->skipCompute) return attnSuccess;
  if (state->userKernel) {
    auto t0 = Clock::now();
    attnResult_t r = foldUserKernel(*this, qs, kvs, o, lse);
    stats.computeUs += usSince(t0);
    return r;
  }
  auto t0 = Clock::now();
  std::vector<cpu::AttnSegment> segs;
  cpu::AttnExec ex;
  ex.threads = state->kernelThreads;
  ex.pool = state->pool.get();
  attnResult_t r = cpu::attentionAccumulate(problemOf(*this, qs, kvs, &segs), o, lse, ex);
  stats.computeUs += usSince(t0);
  return r;
}

attnResult_t AttnCall::fold(const float* o, const float* lse) {
  if (q.rows == 0) return attnSuccess;
  auto t0 = Clock::now();
  cpu::AttnPartialRef ref{o, attnFloat32, lse};
  attnResult_t r = cpu::foldPartial(accO.data(), accLse.data(), ref,
                                    static_cast<size_t>(q.rows) * cfg.num_q_heads, cfg.head_dim_v);
  stats.computeUs += usSince(t0);
  return r;
}

double largestKernelMacs(const AttnCall& c) {
  int64_t q = 0, kv = 0;
  for (int64_t r : c.qRowsOf) q = std::max(q, r);
  for (int64_t r : c.kvRowsOf) kv = std::max(kv, r);
  return double(q) * double(kv) * c.cfg.num_q_heads * (c.cfg.head_dim + c.cfg.head_dim_v);  // QK^T and PV
}

}  // namespace attn
