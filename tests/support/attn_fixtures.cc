#include "tests/support/attn_fixtures.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/reference_attention.h"
#include "tests/support/multirank.h"

namespace attn_test {
namespace {

constexpr double kNinf = -std::numeric_limits<double>::infinity();

float loadElem(const void* base, attnDataType_t t, size_t i) {
  switch (t) {
    case attnFloat16: return attn::cpu::halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case attnBfloat16: return attn::cpu::bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void storeElem(void* base, attnDataType_t t, size_t i, float v) {
  switch (t) {
    case attnFloat16: static_cast<uint16_t*>(base)[i] = attn::cpu::floatToHalf(v); break;
    case attnBfloat16: static_cast<uint16_t*>(base)[i] = attn::cpu::floatToBf16(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

void fillRandom(std::vector<uint8_t>* buf, attnDataType_t t, size_t count, float lo, float hi,
                std::mt19937_64& rng) {
  buf->assign(count * AttnElemSize(t), 0);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < count; ++i) storeElem(buf->data(), t, i, dist(rng));
}

}  // namespace

size_t AttnElemSize(attnDataType_t t) { return t == attnFloat32 ? 4 : 2; }

const char* AttnDtypeName(attnDataType_t t) {
  switch (t) {
    case attnFloat32: return "fp32";
    case attnFloat16: return "fp16";
    case attnBfloat16: return "bf16";
    default: return "?";
  }
}

std::string CfgName(const attnAttnConfig_t& cfg) {
  std::ostringstream os;
  os << "Hq" << cfg.num_q_heads << "/Hkv" << cfg.num_kv_heads << " D" << cfg.head_dim;
  if (ValueDim(cfg) != cfg.head_dim) os << "/Dv" << ValueDim(cfg);
  os << " " << AttnDtypeName(cfg.dtype) << (cfg.causal ? " causal" : " full");
  return os.str();
}

const char* ModeName(attnAttnMode_t m) {
  switch (m) {
    case attnModeAuto: return "auto";
    case attnModePassKV: return "pass-KV";
    case attnModePassQ: return "pass-Q";
    case attnModeShipQ: return "ship-Q";
    case attnModeHeadParallel: return "head-parallel";
    case attnModeAllGatherKV: return "all-gather-KV";
  }
  return "?";
}

AttnProblemSpec PrefillSpec(const attnAttnConfig_t& cfg, const std::vector<int32_t>& new_lens,
                            const std::vector<int32_t>& cached_lens) {
  AttnProblemSpec s;
  s.cfg = cfg;
  const size_t S = new_lens.size();
  s.q_pos.resize(S);
  s.kv_pos.resize(S);
  for (size_t i = 0; i < S; ++i) {
    const int32_t P = cached_lens.empty() ? 0 : cached_lens[i], T = new_lens[i];
    for (int32_t p = 0; p < P + T; ++p) s.kv_pos[i].push_back(p);
    for (int32_t t = 0; t < T; ++t) s.q_pos[i].push_back(P + t);
  }
  return s;
}

attnAttnConfig_t AttnCfg(int hq, int hkv, int d, attnDataType_t t, bool causal, float scale) {
  attnAttnConfig_t c = ATTN_ATTN_CONFIG_INITIALIZER;
  c.num_q_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.dtype = t;
  c.softmax_scale = scale;
  c.causal = causal ? 1 : 0;
  return c;
}

RunOptions AttnRunOptions(int deadline_ms) {
  static const attnConfig_t cfg = [] {
    attnConfig_t c = ATTN_CONFIG_INITIALIZER;
    c.timeout_ms = 60000;
    return c;
  }();
  RunOptions o;
  o.deadline_ms = deadline_ms;
  o.config = &cfg;
  return o;
}

AttnCase MakeCase(const std::string& name, const AttnProblemSpec& spec, uint64_t seed) {
  AttnCase c;
  c.name = name;
  c.cfg = spec.cfg;
  c.num_seqs = static_cast<int>(spec.q_pos.size());
  c.q_off.push_back(0);
  c.kv_off.push_back(0);
  for (int s = 0; s < c.num_seqs; ++s) {
    for (int32_t p : spec.q_pos[s]) {
      c.q_pos.push_back(p);
      c.q_seq.push_back(s);
    }
    for (int32_t p : spec.kv_pos[s]) {
      c.kv_pos.push_back(p);
      c.kv_seq.push_back(s);
    }
    c.q_off.push_back(static_cast<int32_t>(c.q_pos.size()));
    c.kv_off.push_back(static_cast<int32_t>(c.kv_pos.size()));
  }
  const attnAttnConfig_t& cfg = c.cfg;
  std::mt19937_64 rng(seed);
  const size_t qElems = c.q_pos.size() * cfg.num_q_heads * cfg.head_dim;
  const size_t kElems = c.kv_pos.size() * cfg.num_kv_heads * cfg.head_dim;
  const size_t vElems = c.kv_pos.size() * cfg.num_kv_heads * ValueDim(cfg);
  fillRandom(&c.q, cfg.dtype, qElems, -spec.q_scale, spec.q_scale, rng);
  fillRandom(&c.k, cfg.dtype, kElems, -1.0f, 1.0f, rng);
  fillRandom(&c.v, cfg.dtype, vElems, -1.0f, 1.0f, rng);

  std::vector<attn::cpu::AttnSegment> segs;
  attn::cpu::AttnProblem p = ProblemFor(c, c.num_seqs, cfg, &segs);
  c.ref_o.assign(c.q_pos.size() * cfg.num_q_heads * ValueDim(cfg), 0.0);
  c.ref_lse.assign(c.q_pos.size() * cfg.num_q_heads, kNinf);
  c.cfg.sinks = nullptr;
  c.sinks = spec.sinks;
  if (!c.sinks.empty() && c.sinks.size() != size_t(cfg.num_q_heads))
    ADD_FAILURE() << "case " << name << ": sinks of the wrong length";
  // With sinks, exp(sink) joins each row's denominator (the reference adds
  // it from the definition).
  const attnResult_t r = c.sinks.empty()
                             ? attn::cpu::referenceAttention(p, c.ref_o.data(), c.ref_lse.data())
                             : attn::cpu::referenceAttention(p, c.sinks.data(), c.ref_o.data(), c.ref_lse.data());
  if (r != attnSuccess) ADD_FAILURE() << "referenceAttention rejected case " << name;
  return c;
}

// ---------------------------------------------------------------------------
// Placements

Placement PlannerPlacement(const AttnCase& c, const std::vector<int32_t>& new_lens,
                           const std::vector<int32_t>& cached_lens, int nranks) {
  Placement pl;
  pl.nranks = nranks;
  pl.q_rows.resize(nranks);
  pl.kv_rows.resize(nranks);
  attnBatchSpec_t b;
  b.num_seqs = static_cast<int>(new_lens.size());
  b.new_lens = new_lens.data();
  b.cached_lens = cached_lens.empty() ? nullptr : cached_lens.data();
  attnPlan_t plan = nullptr;
  attnResult_t r = attnPlanPrefill(&b, nranks, &plan);
  if (r != attnSuccess) {
    ADD_FAILURE() << "attnPlanPrefill -> " << ResultName(r) << ": " << attnGetLastError(nullptr);
    return pl;
  }
  for (int rank = 0; rank < nranks; ++rank) {
    attnShard_t sh;
    r = attnPlanGetShard(plan, rank, &sh);
    if (r != attnSuccess) {
      ADD_FAILURE() << "attnPlanGetShard(" << rank << ") -> " << ResultName(r);
      continue;
    }
    pl.q_rows[rank].assign(sh.q_index, sh.q_index + sh.q_rows);
    pl.kv_rows[rank].assign(sh.kv_index, sh.kv_index + sh.kv_rows);
    // The plan's layout must describe the same rows.
    EXPECT_EQ(sh.layout.num_seqs, c.num_seqs);
    bool ok = sh.layout.q_offsets[0] == 0 && sh.layout.kv_offsets[0] == 0;
    for (int64_t i = 0; ok && i < sh.q_rows; ++i) {
      const int64_t g = sh.q_index[i];
      ok = g >= 0 && g < c.q_rows() && sh.layout.q_pos[i] == c.q_pos[g];
      const int s = c.q_seq[g];
      ok = ok && i >= sh.layout.q_offsets[s] && i < sh.layout.q_offsets[s + 1];
    }
    for (int64_t i = 0; ok && i < sh.kv_rows; ++i) {
      const int64_t g = sh.kv_index[i];
      ok = g >= 0 && g < c.kv_rows() && sh.layout.kv_pos[i] == c.kv_pos[g];
      const int s = c.kv_seq[g];
      ok = ok && i >= sh.layout.kv_offsets[s] && i < sh.layout.kv_offsets[s + 1];
    }
    ok = ok && sh.layout.q_offsets[c.num_seqs] == sh.q_rows &&
         sh.layout.kv_offsets[c.num_seqs] == sh.kv_rows;
    EXPECT_TRUE(ok) << c.name << ": the plan's layout of rank " << rank
                    << " does not match its q_index / kv_index";
  }
  attnPlanDestroy(plan);
  return pl;
}

namespace {
// Sorts each rank's rows by sequence (stable) after shuffling within.
void groupBySeq(std::vector<int64_t>* rows, const std::vector<int32_t>& seqOf, std::mt19937_64& rng,
                bool shuffle) {
  if (shuffle) std::shuffle(rows->begin(), rows->end(), rng);
  std::stable_sort(rows->begin(), rows->end(),
                   [&](int64_t a, int64_t b) { return seqOf[a] < seqOf[b]; });
}
}  // namespace

Placement RandomPlacement(const AttnCase& c, int nranks, uint64_t seed, int empty_rank) {
  Placement pl;
  pl.nranks = nranks;
  pl.q_rows.resize(nranks);
  pl.kv_rows.resize(nranks);
  std::mt19937_64 rng(seed);
  std::vector<int> ranks;
  for (int r = 0; r < nranks; ++r)
    if (r != empty_rank || nranks == 1) ranks.push_back(r);
  std::uniform_int_distribution<size_t> pick(0, ranks.size() - 1);
  for (int64_t i = 0; i < c.q_rows(); ++i) pl.q_rows[ranks[pick(rng)]].push_back(i);
  for (int64_t j = 0; j < c.kv_rows(); ++j) pl.kv_rows[ranks[pick(rng)]].push_back(j);
  for (int r = 0; r < nranks; ++r) {
    groupBySeq(&pl.q_rows[r], c.q_seq, rng, true);
    groupBySeq(&pl.kv_rows[r], c.kv_seq, rng, true);
  }
  return pl;
}

Placement RoundRobinPlacement(const AttnCase& c, int nranks, int shift) {
  Placement pl;
  pl.nranks = nranks;
  pl.q_rows.resize(nranks);
  pl.kv_rows.resize(nranks);
  for (int64_t i = 0; i < c.q_rows(); ++i) pl.q_rows[i % nranks].push_back(i);
  for (int64_t j = 0; j < c.kv_rows(); ++j) pl.kv_rows[(j + shift) % nranks].push_back(j);
  return pl;
}

// ---------------------------------------------------------------------------
// Shards

RankShard GatherShard(const AttnCase& c, const Placement& pl, int rank) {
  RankShard sh;
  const attnAttnConfig_t& cfg = c.cfg;
  const size_t esz = AttnElemSize(cfg.dtype);
  const size_t qRow = esz * cfg.num_q_heads * cfg.head_dim;
  const size_t kRow = esz * cfg.num_kv_heads * cfg.head_dim;
  const size_t vRow = esz * cfg.num_kv_heads * ValueDim(cfg);
  const auto& qr = pl.q_rows[rank];
  const auto& kr = pl.kv_rows[rank];
  sh.q_off.assign(c.num_seqs + 1, 0);
  sh.kv_off.assign(c.num_seqs + 1, 0);
  for (int64_t g : qr) ++sh.q_off[c.q_seq[g] + 1];
  for (int64_t g : kr) ++sh.kv_off[c.kv_seq[g] + 1];
  for (int s = 0; s < c.num_seqs; ++s) {
    sh.q_off[s + 1] += sh.q_off[s];
    sh.kv_off[s + 1] += sh.kv_off[s];
  }
  sh.q.resize(qr.size() * qRow);
  sh.k.resize(kr.size() * kRow);
  sh.v.resize(kr.size() * vRow);
  for (size_t i = 0; i < qr.size(); ++i) {
    const int64_t g = qr[i];
    if (i > 0 && c.q_seq[qr[i - 1]] > c.q_seq[g])
      ADD_FAILURE() << "placement of rank " << rank << " not grouped by sequence";
    sh.q_pos.push_back(c.q_pos[g]);
    sh.q_global.push_back(g);
    std::memcpy(sh.q.data() + i * qRow, c.q.data() + g * qRow, qRow);
  }
  for (size_t i = 0; i < kr.size(); ++i) {
    const int64_t g = kr[i];
    sh.kv_pos.push_back(c.kv_pos[g]);
    std::memcpy(sh.k.data() + i * kRow, c.k.data() + g * kRow, kRow);
    std::memcpy(sh.v.data() + i * vRow, c.v.data() + g * vRow, vRow);
  }
  sh.layout.num_seqs = c.num_seqs;
  sh.layout.q_offsets = sh.q_off.data();
  sh.layout.kv_offsets = sh.kv_off.data();
  sh.layout.q_pos = sh.q_pos.empty() ? nullptr : sh.q_pos.data();
  sh.layout.kv_pos = sh.kv_pos.empty() ? nullptr : sh.kv_pos.data();
  return sh;
}

// ---------------------------------------------------------------------------
// Comparison

void AttnErrorStats::Merge(const AttnErrorStats& o) {
  max_o_rel = std::max(max_o_rel, o.max_o_rel);
  max_lse_abs = std::max(max_lse_abs, o.max_lse_abs);
  max_o_abs = std::max(max_o_abs, o.max_o_abs);
  nan_rows += o.nan_rows;
  empty_mismatch += o.empty_mismatch;
  rows += o.rows;
  sum_o_rel += o.sum_o_rel;
  compared += o.compared;
}

std::string AttnErrorStats::Describe() const {
  std::ostringstream os;
  os << "max_o_rel " << max_o_rel << ", max_lse_abs " << max_lse_abs << ", nan_rows " << nan_rows
     << ", empty_mismatch " << empty_mismatch << " over " << rows << " rows";
  return os.str();
}

AttnErrorStats CompareShard(const AttnCase& c, const RankShard& sh, const void* out,
                            const float* lse) {
  AttnErrorStats e;
  const int Hq = c.cfg.num_q_heads, D = ValueDim(c.cfg);  // of the outputs
  for (size_t i = 0; i < sh.q_global.size(); ++i) {
    const int64_t g = sh.q_global[i];
    for (int h = 0; h < Hq; ++h) {
      ++e.rows;
      const size_t loc = (i * Hq + h), ref = (size_t(g) * Hq + h);
      bool nan = lse && std::isnan(lse[loc]);
      bool zero = true;
      double diff = 0, mag = 0;
      for (int d = 0; d < D; ++d) {
        const double a = loadElem(out, c.cfg.dtype, loc * D + d);
        const double b = c.ref_o[ref * D + d];
        if (std::isnan(a)) nan = true;
        if (a != 0) zero = false;
        diff = std::max(diff, std::fabs(a - b));
        mag = std::max(mag, std::fabs(b));
      }
      if (nan) {
        ++e.nan_rows;
        continue;
      }
      const bool refEmpty = c.ref_lse[ref] == kNinf;
      const bool gotEmpty = lse ? (std::isinf(lse[loc]) && lse[loc] < 0) : false;
      if (refEmpty || gotEmpty) {
        if (!(refEmpty && zero && (lse == nullptr || gotEmpty))) ++e.empty_mismatch;
        continue;
      }
      const double rel = mag > 0 ? diff / mag : diff;
      e.max_o_rel = std::max(e.max_o_rel, rel);
      e.max_o_abs = std::max(e.max_o_abs, diff);
      e.sum_o_rel += rel;
      ++e.compared;
      if (lse) {
        const double err = std::fabs(double(lse[loc]) - c.ref_lse[ref]) /
                           std::max(1.0, std::fabs(c.ref_lse[ref]));
        e.max_lse_abs = std::max(e.max_lse_abs, err);
      }
    }
  }
  return e;
}

double OutBound(attnDataType_t t) { return t == attnFloat32 ? 1e-5 : 1e-2; }
double LseBound(attnDataType_t t) { return t == attnFloat32 ? 1e-5 : 1e-2; }

::testing::AssertionResult WithinBounds(const AttnErrorStats& e, attnDataType_t t,
                                        const std::string& what) {
  if (e.nan_rows == 0 && e.empty_mismatch == 0 && e.max_o_rel <= OutBound(t) &&
      e.max_lse_abs <= LseBound(t))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << e.Describe() << " (bounds: o "
                                       << OutBound(t) << ", lse " << LseBound(t) << ")";
}

RankRun RunRingAttentionRank(const AttnCase& c, const Placement& pl, int rank, attnComm_t comm,
                             attnAttnMode_t mode, bool with_lse) {
  RankRun run;
  RankShard sh = GatherShard(c, pl, rank);
  const size_t qn = sh.q_global.size();
  const size_t oBytes = qn * c.cfg.num_q_heads * ValueDim(c.cfg) * AttnElemSize(c.cfg.dtype);
  std::vector<uint8_t> out(oBytes, 0xFF);  // NaN in every dtype: unwritten rows show
  std::vector<float> lse(qn * c.cfg.num_q_heads, std::numeric_limits<float>::quiet_NaN());
  const bool noQ = qn == 0, noKv = sh.kv_pos.empty();
  const attnAttnConfig_t cfg = c.runCfg();
  run.rc = attnRingAttention(noQ ? nullptr : sh.q.data(), noKv ? nullptr : sh.k.data(),
                             noKv ? nullptr : sh.v.data(), noQ ? nullptr : out.data(),
                             (with_lse && !noQ) ? lse.data() : nullptr, &sh.layout, &cfg, mode,
                             comm, nullptr);
  if (run.rc != attnSuccess) {
    run.error = attnGetLastError(comm);
    return run;
  }
  run.stats = CompareShard(c, sh, out.data(), with_lse ? lse.data() : nullptr);
  return run;
}

void ExpectRingAttentionExact(const AttnCase& c, const Placement& pl, int rank, attnComm_t comm,
                              attnAttnMode_t mode, bool with_lse, const std::string& what,
                              AttnErrorStats* stats_out) {
  RankRun run = RunRingAttentionRank(c, pl, rank, comm, mode, with_lse);
  const std::string where = what + " [" + c.name + ", " + CfgName(c.cfg) + ", " + ModeName(mode) +
                            (with_lse ? ", lse" : ", no lse") + ", rank " + std::to_string(rank) +
                            "/" + std::to_string(pl.nranks) + "]";
  EXPECT_EQ(run.rc, attnSuccess) << where << " -> " << ResultName(run.rc) << ": " << run.error;
  if (run.rc == attnSuccess) EXPECT_TRUE(WithinBounds(run.stats, c.cfg.dtype, where));
  if (stats_out) *stats_out = run.stats;
}

// ---------------------------------------------------------------------------
// A user kernel

attnResult_t LoopAttentionKernel(const attnAttnKernelArgs_t* a, void* user_data, attnStream_t) {
  if (!a || !a->cfg) return attnInvalidArgument;
  auto* counter = static_cast<AttnKernelCounter*>(user_data);
  const attnAttnConfig_t& cfg = *a->cfg;
  const int Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim, Dv = ValueDim(cfg);
  const int group = Hq / Hkv;
  const double scale = cfg.softmax_scale != 0 ? cfg.softmax_scale : 1.0 / std::sqrt(double(D));
  const attn::cpu::VisibleSpan span = attn::cpu::visibleSpan(cfg.causal != 0, cfg.window_left, cfg.window_right);
  const int64_t qRows = a->num_seqs ? a->q_offsets[a->num_seqs] - a->q_offsets[0] : 0;
  if (counter) {
    if (counter->calls) counter->calls->fetch_add(1);
    if (counter->q_rows) counter->q_rows->fetch_add(qRows);
  }
  for (int64_t i = 0; i < qRows * Hq; ++i) {
    a->lse[i] = -std::numeric_limits<float>::infinity();
    for (int d = 0; d < Dv; ++d) a->out[i * Dv + d] = 0.0f;
  }
  std::vector<double> s, acc(Dv);
  for (int sq = 0; sq < a->num_seqs; ++sq) {
    for (int32_t i = a->q_offsets[sq]; i < a->q_offsets[sq + 1]; ++i) {
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / group;
        double mx = kNinf;
        s.assign(a->kv_offsets[sq + 1] - a->kv_offsets[sq], kNinf);
        for (int32_t j = a->kv_offsets[sq]; j < a->kv_offsets[sq + 1]; ++j) {
          if (!span.sees(a->q_pos[i], a->kv_pos[j])) continue;
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(loadElem(a->q, cfg.dtype, (size_t(i) * Hq + h) * D + d)) *
                   loadElem(a->k, cfg.dtype, (size_t(j) * Hkv + kh) * D + d);
          double sc = dot * scale;
          if (cfg.softcap > 0) sc = cfg.softcap * std::tanh(sc / cfg.softcap);
          s[j - a->kv_offsets[sq]] = sc;
          mx = std::max(mx, sc);
        }
        if (mx == kNinf) continue;
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int32_t j = a->kv_offsets[sq]; j < a->kv_offsets[sq + 1]; ++j) {
          const double sc = s[j - a->kv_offsets[sq]];
          if (sc == kNinf) continue;
          const double w = std::exp(sc - mx);
          sum += w;
          for (int d = 0; d < Dv; ++d)
            acc[d] += w * loadElem(a->v, cfg.dtype, (size_t(j) * Hkv + kh) * Dv + d);
        }
        float* o = a->out + (size_t(i) * Hq + h) * Dv;
        for (int d = 0; d < Dv; ++d) o[d] = float(acc[d] / sum);
        a->lse[size_t(i) * Hq + h] = float(mx + std::log(sum));
      }
    }
  }
  return attnSuccess;
}

}  // namespace attn_test
