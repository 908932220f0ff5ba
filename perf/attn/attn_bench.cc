#include "perf/attn/attn_bench.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/reference_attention.h"
#include "perf/attn/seq_device.h"
#include "perf/rank_device.h"
#include "perf/timing.h"
#include "src/attn/attn_state.h"
#include "src/core/comm.h"

namespace attnperf {
namespace {

// Uniform in [-1, 1) from (seed, tensor, element): rows can be made anywhere.
float gen(uint64_t seed, uint64_t tensor, uint64_t element) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + tensor * 0xBF58476D1CE4E5B9ull + element;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>((z >> 40) * (2.0 / 16777216.0) - 1.0);
}

size_t elemSize(attnDataType_t t) { return t == attnFloat32 ? 4 : 2; }

// Rows of `heads` x `dim` elements.
void fillRows(const Batch& b, uint64_t tensor, int heads, int dim, const std::vector<int64_t>& rows, void* out) {
  const size_t w = static_cast<size_t>(heads) * dim;
  std::vector<float> tmp(w * rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < w; ++j) tmp[i * w + j] = gen(b.seed, tensor, rows[i] * w + j);
  (void)attn::cpu::convertFromFloat(out, b.cfg.dtype, tmp.data(), tmp.size());
}

bool ok(attnResult_t r, attnComm_t comm, const char* what) {
  if (r == attnSuccess) return true;
  fprintf(stderr, "%s failed: %s (%s)\n", what, attnGetErrorString(r), attnGetLastError(comm));
  return false;
}

double median(std::vector<double> v) { return summarize(std::move(v)).medianUs; }

// The Llama3-training baseline: all-gather every rank's KV (padded to the
// largest shard), then attend to all of it locally. K rows have head_dim,
// V rows and the output valueHeadDim.
bool sequentialOnce(attnComm_t comm, const Batch& b, const Shard& s, const void* q, const void* k,
                    const void* v, float* accO, float* accLse, double* computeUs) {
  int n, me;
  attnCommCount(comm, &n);
  attnCommUserRank(comm, &me);
  const int S = s.layout.num_seqs;
  const int Dv = valueHeadDim(b.cfg);
  const size_t krow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * b.cfg.head_dim;
  const size_t vrow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * Dv;
  int64_t rows = static_cast<int64_t>(s.kvPos.size()), maxRows = rows;
  if (!ok(attnAllReduce(&maxRows, &maxRows, 1, attnInt64, attnMax, comm, nullptr), comm, "max rows"))
    return false;
  // A block: [rows, kv_offsets[S+1], kv_pos[maxRows]] then K and V, maxRows each.
  const size_t meta = sizeof(int32_t) * (S + 2 + maxRows), block = meta + (krow + vrow) * maxRows;
  std::vector<char> mine(block, 0), all(block * n);
  auto* m = reinterpret_cast<int32_t*>(mine.data());
  m[0] = static_cast<int32_t>(rows);
  std::memcpy(m + 1, s.kvOffsets.data(), sizeof(int32_t) * (S + 1));
  std::memcpy(m + S + 2, s.kvPos.data(), sizeof(int32_t) * rows);
  std::memcpy(mine.data() + meta, k, krow * rows);
  std::memcpy(mine.data() + meta + krow * maxRows, v, vrow * rows);
  if (!ok(attnAllGather(mine.data(), all.data(), block, attnUint8, comm, nullptr), comm, "attnAllGather"))
    return false;
  double t0 = nowUs();
  attn::cpu::initAccumulator(accO, accLse, s.qPos.size(), b.cfg.num_q_heads, Dv);
  for (int r = 0; r < n; ++r) {
    const char* blk = all.data() + r * block;
    const auto* h = reinterpret_cast<const int32_t*>(blk);
    std::vector<attn::cpu::AttnSegment> segs(S);
    for (int i = 0; i < S; ++i) segs[i] = {s.qOffsets[i], s.qOffsets[i + 1], h[1 + i], h[2 + i]};
    attn::cpu::AttnProblem p;
    p.q = q;
    p.k = blk + meta;
    p.v = blk + meta + krow * maxRows;
    p.dtype = b.cfg.dtype;
    p.nq = static_cast<int32_t>(s.qPos.size());
    p.nk = h[0];
    p.num_q_heads = b.cfg.num_q_heads;
    p.num_kv_heads = b.cfg.num_kv_heads;
    p.head_dim = b.cfg.head_dim;
    p.head_dim_v = Dv;
    p.scale = b.cfg.softmax_scale;
    p.causal = b.cfg.causal;
    p.window_left = b.cfg.window_left;
    p.window_right = b.cfg.window_right;
    p.softcap = b.cfg.softcap;
    p.q_pos = s.qPos.data();
    p.k_pos = h + S + 2;
    p.segments = segs.data();
    p.num_segments = S;
    if (attn::cpu::attentionAccumulate(p, accO, accLse) != attnSuccess) return false;
  }
  *computeUs = nowUs() - t0;
  return true;
}

}  // namespace

bool maxOverRanks(attnComm_t comm, RankDevice& dev, std::vector<double>* v) {
  return ok(attnAllReduce(v->data(), v->data(), v->size(), attnFloat64, attnMax, comm, dev.stream()),
            comm, "attnAllReduce") &&
         dev.finish(comm, "attnAllReduce");
}

bool combineOverRanks(attnComm_t comm, RankDevice& dev, std::vector<double>* v, int average) {
  if (average == 3) return maxOverRanks(comm, dev, v);
  int n, me;
  attnCommCount(comm, &n);
  attnCommUserRank(comm, &me);
  // Rank 0's values: a sum where every other rank adds zeros (the same
  // all-reduce path as the max, no broadcast buffers to place).
  if (average == 0 && me != 0) std::fill(v->begin(), v->end(), 0.0);
  const attnRedOp_t op = average == 2 ? attnMin : attnSum;
  if (!ok(attnAllReduce(v->data(), v->data(), v->size(), attnFloat64, op, comm, dev.stream()), comm,
          "attnAllReduce") ||
      !dev.finish(comm, "attnAllReduce"))
    return false;
  if (average == 1)
    for (double& x : *v) x /= n;
  return true;
}

void Shard::finish() {
  layout.num_seqs = static_cast<int>(qOffsets.size()) - 1;
  layout.q_offsets = qOffsets.data();
  layout.q_pos = qPos.data();
  layout.kv_offsets = kvOffsets.data();
  layout.kv_pos = kvPos.data();
}

int64_t Batch::newRows() const {
  int64_t n = 0;
  for (int32_t t : newLens) n += t;
  return n;
}
int64_t Batch::fullRows() const {
  int64_t n = 0;
  for (size_t i = 0; i < newLens.size(); ++i) n += newLens[i] + cachedLens[i];
  return n;
}

void Batch::fillQ(const std::vector<int64_t>& rows, void* out) const {
  fillRows(*this, 1, cfg.num_q_heads, cfg.head_dim, rows, out);
}
void Batch::fillKV(const std::vector<int64_t>& rows, void* k, void* v) const {
  fillRows(*this, 2, cfg.num_kv_heads, cfg.head_dim, rows, k);
  fillRows(*this, 3, cfg.num_kv_heads, valueHeadDim(cfg), rows, v);
}

// Exact attention (double) for this rank's queries over the full batch.
bool checkAgainstReference(attnComm_t comm, RankDevice& dev, const Batch& b, const Shard& s, const void* q,
                           const void* out, const float* lse, double* oErr, double* lseErr) {
  const int S = s.layout.num_seqs;
  std::vector<int64_t> fullRows(b.fullRows());
  for (size_t i = 0; i < fullRows.size(); ++i) fullRows[i] = static_cast<int64_t>(i);
  const int Dv = valueHeadDim(b.cfg);
  const size_t krow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * b.cfg.head_dim;
  const size_t vrow = elemSize(b.cfg.dtype) * b.cfg.num_kv_heads * Dv;
  std::vector<char> k(krow * fullRows.size()), v(vrow * fullRows.size());
  b.fillKV(fullRows, k.data(), v.data());
  std::vector<int32_t> kpos;
  std::vector<attn::cpu::AttnSegment> segs(S);
  int32_t base = 0;
  for (int i = 0; i < S; ++i) {
    const int32_t len = b.newLens[i] + b.cachedLens[i];
    for (int32_t p = 0; p < len; ++p) kpos.push_back(p);
    segs[i] = {s.qOffsets[i], s.qOffsets[i + 1], base, base + len};
    base += len;
  }
  // O rows: [Hq, Dv].
  const size_t nq = s.qPos.size(), w = static_cast<size_t>(b.cfg.num_q_heads) * Dv;
  attn::cpu::AttnProblem p;
  p.q = q;
  p.k = k.data();
  p.v = v.data();
  p.dtype = b.cfg.dtype;
  p.nq = static_cast<int32_t>(nq);
  p.nk = base;
  p.num_q_heads = b.cfg.num_q_heads;
  p.num_kv_heads = b.cfg.num_kv_heads;
  p.head_dim = b.cfg.head_dim;
  p.head_dim_v = Dv;
  p.scale = b.cfg.softmax_scale;
  p.causal = b.cfg.causal;
  p.window_left = b.cfg.window_left;
  p.window_right = b.cfg.window_right;
  p.softcap = b.cfg.softcap;
  p.q_pos = s.qPos.data();
  p.k_pos = kpos.data();
  p.segments = segs.data();
  p.num_segments = S;
  std::vector<double> ro(nq * w), rl(nq * b.cfg.num_q_heads);
  std::vector<float> o(nq * w);
  if (attn::cpu::referenceAttention(p, ro.data(), rl.data()) != attnSuccess) return false;
  (void)attn::cpu::convertToFloat(o.data(), out, b.cfg.dtype, o.size());
  attn::cpu::AttnErrors e =
      attn::cpu::compareAttention(o.data(), lse, ro.data(), rl.data(), nq * b.cfg.num_q_heads, Dv);
  std::vector<double> errs = {e.max_o_rel, e.max_lse_abs,
                              static_cast<double>(e.nan_values + e.empty_mismatch)};
  if (!maxOverRanks(comm, dev, &errs)) return false;
  *oErr = errs[2] > 0 ? INFINITY : errs[0];
  *lseErr = errs[1];
  return true;
}

const char* modeName(int mode) {
  switch (mode) {
    case attnModeAuto: return "auto";
    case attnModePassKV: return "pass-kv";
    case attnModePassQ: return "pass-q";
    case attnModeShipQ: return "ship-q";
    case attnModeHeadParallel: return "heads";
    case attnModeAllGatherKV: return "gather-kv";
    default: return "sequential";
  }
}

int runModes(attnComm_t comm, const Batch& b, const Shard& s, const std::vector<int>& modes,
             const RunOptions& o, std::vector<ModeResult>* results) {
  const size_t nq = s.qPos.size(), nk = s.kvPos.size();
  const size_t es = elemSize(b.cfg.dtype);
  const size_t D = static_cast<size_t>(b.cfg.head_dim), Dv = static_cast<size_t>(valueHeadDim(b.cfg));
  std::vector<char> q(es * nq * b.cfg.num_q_heads * D), out(es * nq * b.cfg.num_q_heads * Dv);
  std::vector<char> k(es * nk * b.cfg.num_kv_heads * D), v(es * nk * b.cfg.num_kv_heads * Dv);
  std::vector<float> lse(nq * b.cfg.num_q_heads), accO(nq * b.cfg.num_q_heads * Dv);
  b.fillQ(s.qGlobal, q.data());
  b.fillKV(s.kvGlobal, k.data(), v.data());
  attn::AttnState& st = attn::attnStateOf(comm);
  // With --device the calls take device twins of these tensors.
  RankDevice dev;
  if (!dev.open(o.device, /*exportable=*/false)) return 1;  // attention never maps peers' buffers
  void* dq = dev.place(q.data(), q.size());
  void* dk = dev.place(k.data(), k.size());
  void* dv = dev.place(v.data(), v.size());
  void* dout = dev.place(out.data(), out.size());
  auto* dlse = static_cast<float*>(dev.place(lse.data(), sizeof(float) * lse.size()));
  if (!dq || !dk || !dv || !dout || !dlse || !dev.upload(dq, q.data(), q.size()) ||
      !dev.upload(dk, k.data(), k.size()) || !dev.upload(dv, v.data(), v.size())) {
    fprintf(stderr, "runModes: could not place the tensors\n");
    return 1;
  }

  // --layers: a model's worth of layers, each with its own copy of the KV
  // (distinct memory, as a decode step reads it); layer 0 is the tensors
  // above. Queries and outputs are shared: a layer's are made just before.
  const int layers = std::max(1, o.layers);
  std::vector<std::vector<char>> kCopy(size_t(layers - 1), k), vCopy(size_t(layers - 1), v);
  std::vector<void*> dks{dk}, dvs{dv};
  std::vector<const char*> hks{k.data()}, hvs{v.data()};
  for (int l = 1; l < layers; ++l) {
    void* lk = dev.place(kCopy[size_t(l - 1)].data(), k.size());
    void* lv = dev.place(vCopy[size_t(l - 1)].data(), v.size());
    if (!lk || !lv || !dev.upload(lk, k.data(), k.size()) || !dev.upload(lv, v.data(), v.size())) {
      fprintf(stderr, "runModes: could not place layer %d's tensors\n", l);
      return 1;
    }
    dks.push_back(lk);
    dvs.push_back(lv);
    hks.push_back(kCopy[size_t(l - 1)].data());
    hvs.push_back(vCopy[size_t(l - 1)].data());
  }

  SeqDevice seqDevice(dev, o.processes);  // --modes seq with --device
  // One step of `mode` (a call per layer, enqueued back to back, then
  // waited for); its compute time in *computeUs, AUTO's pick in *chose,
  // the library's stages summed over the layers in *sum.
  auto once = [&](int mode, double* computeUs, int* chose, attn::AttnCallStats* sum) -> bool {
    *computeUs = 0;
    *sum = attn::AttnCallStats{};
    for (int l = 0; l < layers; ++l) {
      double cu = 0;
      if (mode < 0 && dev.onDevice()) {
        if (!seqDevice.once(comm, b, s, dq, dks[size_t(l)], dvs[size_t(l)], dout, dlse, &cu)) return false;
      } else if (mode < 0) {
        if (!sequentialOnce(comm, b, s, q.data(), hks[size_t(l)], hvs[size_t(l)], accO.data(), lse.data(), &cu) ||
            attn::cpu::convertFromFloat(out.data(), b.cfg.dtype, accO.data(), accO.size()) != attnSuccess)
          return false;
      } else {
        if (!ok(attnRingAttention(dq, dks[size_t(l)], dvs[size_t(l)], dout, dlse, &s.layout, &b.cfg,
                                  static_cast<attnAttnMode_t>(mode), comm, dev.stream()),
                comm, "attnRingAttention"))
          return false;
        // Host calls have run; device ones are queued, and the proxy's
        // figures of the last are read once the stream is idle.
        if (!dev.onDevice() || l == layers - 1) {
          if (l == layers - 1 && !dev.finish(comm, "attnRingAttention")) return false;
          const attn::AttnCallStats& x = st.last;
          cu = dev.onDevice() ? x.computeUs * layers : x.computeUs;
          *chose = x.mode;
          sum->totalUs += dev.onDevice() ? x.totalUs * layers : x.totalUs;
          for (auto [to, from] : {std::pair{&sum->planUs, x.planUs}, {&sum->setupUs, x.setupUs},
                                  {&sum->waitUs, x.waitUs}, {&sum->outputUs, x.outputUs}})
            *to += dev.onDevice() ? from * layers : from;
          sum->computeUs += cu;
        }
      }
      *computeUs += cu;
    }
    return true;
  };
  // Iterations are the outer loop and modes the inner one, so background
  // load on a shared machine hits every mode alike. Each ring mode's call
  // is followed by the same call with the kernel switched off (its
  // communication alone), so the two see the same conditions; that one
  // counts at most as long as the call it follows, so comm <= time and the
  // overlap stays within [0, 1].
  const size_t m = modes.size();
  std::vector<std::vector<double>> t(m), c(m), tc(m);
  std::vector<double> sent(m, -1);  // bytes this rank sent in the mode's last call
  // --breakdown: this rank's call by stage, per iteration (kStageNames).
  static const char* const kStageNames[] = {"outside", "plan", "setup", "kernel", "wait", "output", "rest"};
  constexpr size_t kStages = sizeof(kStageNames) / sizeof(kStageNames[0]);
  std::vector<std::vector<std::vector<double>>> stage(m, std::vector<std::vector<double>>(kStages));
  std::vector<int> chose(m, -1);
  attn::AttnCallStats last, ignoredStats;
  auto call = [&](size_t j, bool commOnly, double* us, double* cu) -> bool {
    if (!ok(attnBarrier(comm, dev.stream()), comm, "attnBarrier") || !dev.finish(comm, "attnBarrier"))
      return false;
    int ignored = -1;
    st.skipCompute = commOnly;
    const double t0 = nowUs();
    const bool good = once(modes[j], cu, commOnly ? &ignored : &chose[j], commOnly ? &ignoredStats : &last);
    *us = nowUs() - t0;
    st.skipCompute = false;
    return good;
  };
  for (int i = 0; i < o.warmup + o.iters; ++i)
    for (size_t j = 0; j < m; ++j) {
      double us = 0, cu = 0, commUs = 0, ignored = 0;
      if (!call(j, false, &us, &cu)) return 1;
      if (modes[j] >= 0) sent[j] = static_cast<double>(st.last.bytesSent);
      if (modes[j] >= 0 && !call(j, true, &commUs, &ignored)) return 1;
      if (i < o.warmup) continue;
      if (o.breakdown && modes[j] >= 0) {
        const attn::AttnCallStats& x = last;
        const double parts[kStages] = {us - x.totalUs, x.planUs, x.setupUs, x.computeUs, x.waitUs, x.outputUs,
                                       x.totalUs - x.planUs - x.setupUs - x.computeUs - x.waitUs - x.outputUs};
        for (size_t k = 0; k < kStages; ++k) stage[j][k].push_back(parts[k]);
      }
      t[j].push_back(us);
      c[j].push_back(std::min(cu, us));
      tc[j].push_back(std::min(commUs, us));
    }
  for (size_t j = 0; j < m; ++j)
    if (!(combineOverRanks(comm, dev, &t[j], o.average) && combineOverRanks(comm, dev, &c[j], o.average) &&
          (tc[j].empty() || combineOverRanks(comm, dev, &tc[j], o.average))))
      return 1;
  if (!maxOverRanks(comm, dev, &sent)) return 1;
  results->assign(m, {});
  for (size_t j = 0; j < m; ++j) {
    ModeResult& r = (*results)[j];
    r.mode = modeName(modes[j]);
    r.timeUs = median(t[j]);
    r.computeUs = median(c[j]);
    r.sentBytes = sent[j];
    if (modes[j] == attnModeAuto) r.autoChose = modeName(chose[j]);
    // The baseline's communication is its all-gather: time minus compute.
    r.commUs = modes[j] >= 0 ? median(tc[j]) : r.timeUs - r.computeUs;
    r.overlap = r.timeUs > 0 ? std::max(r.computeUs, r.commUs) / r.timeUs : 0;
    if (!stage[j][0].empty())
      for (size_t k = 0; k < kStages; ++k) r.stages.emplace_back(kStageNames[k], median(stage[j][k]));
    if (o.check) {
      double cu;
      int ch;
      attn::AttnCallStats unused;
      if (!once(modes[j], &cu, &ch, &unused) || !dev.download(out.data(), dout, out.size()) ||
          !dev.download(lse.data(), dlse, sizeof(float) * lse.size()))
        return 1;
      if (!checkAgainstReference(comm, dev, b, s, q.data(), out.data(), lse.data(), &r.maxErr, &r.lseErr))
        return 1;
    }
  }
  return 0;
}

void printHeader() {
  printf("# %8s %8s %3s %7s %-10s %-8s %10s %10s %10s %7s %10s %9s\n", "T", "P", "B", "miss%", "mode",
         "auto", "time(ms)", "attn(ms)", "comm(ms)", "overlap", "max_err", "sent(MB)");
}

void printRow(int64_t T, int64_t P, int B, const ModeResult& r) {
  char err[32] = "-";
  if (r.maxErr >= 0) snprintf(err, sizeof(err), "%.2e", r.maxErr);
  char sentMb[32] = "-";
  if (r.sentBytes >= 0) snprintf(sentMb, sizeof(sentMb), "%.3f", r.sentBytes / 1e6);
  printf("  %8" PRId64 " %8" PRId64 " %3d %7.2f %-10s %-8s %10.3f %10.3f %10.3f %7.2f %10s %9s\n", T, P, B,
         T + P ? 100.0 * T / (T + P) : 0.0, r.mode.c_str(), r.autoChose.empty() ? "-" : r.autoChose.c_str(),
         r.timeUs / 1e3, r.computeUs / 1e3, r.commUs / 1e3, r.overlap, err, sentMb);
  if (!r.stages.empty()) {
    printf("#   %s, rank 0's step (median us):", r.mode.c_str());
    for (const auto& [name, us] : r.stages) printf(" %s %.1f", name.c_str(), us);
    printf("\n");
  }
  fflush(stdout);
}

std::string jsonRow(int64_t T, int64_t P, int B, int nranks, const ModeResult& r) {
  char buf[512];
  snprintf(buf, sizeof(buf),
           "{\"T\": %" PRId64 ", \"P\": %" PRId64 ", \"batch\": %d, \"nranks\": %d, \"mode\": \"%s\", "
           "\"auto_chose\": \"%s\", \"time_us\": %.3f, \"compute_us\": %.3f, \"comm_us\": %.3f, "
           "\"overlap\": %.4f, \"max_err\": %.3e, \"lse_err\": %.3e, \"sent_bytes\": %.0f}",
           T, P, B, nranks, r.mode.c_str(), r.autoChose.c_str(), r.timeUs, r.computeUs, r.commUs,
           r.overlap, r.maxErr, r.lseErr, r.sentBytes);
  return buf;
}

}  // namespace attnperf
