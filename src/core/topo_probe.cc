// ATTN_TOPO_PROBE=1: measure each tier between one representative pair —
// the first rank of the proximity order and its nearest rank at that tier —
// with ping-pongs (latency: half the median round trip) and a few bulk
// transfers (bandwidth: the best of them, less the latency). The measuring
// rank then shares its figures through the bootstrap, so every rank ends up
// with the same model.
#include <algorithm>
#include <chrono>
#include <vector>

#include "src/core/comm.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/topo_init.h"
#include "topology/fabric_model.h"
#include "topology/fabric_print.h"

namespace attn {

namespace {

constexpr int kPings = 16;
constexpr int kBulkReps = 3;
constexpr size_t kBulkBytes = size_t(4) << 20;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

attnResult_t sendRecv(Engine& e, int peer, bool sendFirst, const void* sbuf, size_t sbytes, void* rbuf,
                      size_t rcap) {
  Request reqs[2];
  if (sendFirst) {
    ATTN_CHECK(e.isend(peer, sbuf, sbytes, &reqs[0]));
    ATTN_CHECK(e.irecv(peer, rbuf, rcap, &reqs[1]));
  } else {
    ATTN_CHECK(e.irecv(peer, rbuf, rcap, &reqs[1]));
    ATTN_CHECK(e.wait(&reqs[1]));
    ATTN_CHECK(e.isend(peer, sbuf, sbytes, &reqs[0]));
    return e.wait(&reqs[0]);
  }
  return e.waitAll(reqs, 2);
}

// The measuring side (`a`) returns bandwidth and latency; the other side
// (`b`) only answers.
attnResult_t probePair(Engine& e, int peer, bool measure, double* bw, double* lat) {
  char ping[8] = {}, pong[8] = {};
  std::vector<double> rtts;
  for (int i = 0; i < kPings + 1; ++i) {  // the first one warms up
    double t0 = now();
    ATTN_CHECK(sendRecv(e, peer, measure, ping, sizeof(ping), pong, sizeof(pong)));
    if (i > 0) rtts.push_back(now() - t0);
  }
  std::vector<char> bulk(kBulkBytes);
  double best = 0;
  // A Request is single-use: every post gets a fresh one.
  auto send = [&](const void* buf, size_t bytes) {
    Request req;
    ATTN_CHECK(e.isend(peer, buf, bytes, &req));
    return e.wait(&req);
  };
  auto recv = [&](void* buf, size_t cap) {
    Request req;
    ATTN_CHECK(e.irecv(peer, buf, cap, &req));
    return e.wait(&req);
  };
  for (int i = 0; i < kBulkReps; ++i) {
    double t0 = now();
    if (measure) {
      ATTN_CHECK(send(bulk.data(), bulk.size()));
      ATTN_CHECK(recv(pong, sizeof(pong)));  // the receiver's ack
      double t = now() - t0;
      if (best == 0 || t < best) best = t;
    } else {
      ATTN_CHECK(recv(bulk.data(), bulk.size()));
      ATTN_CHECK(send(ping, sizeof(ping)));
    }
  }
  if (measure) {
    std::sort(rtts.begin(), rtts.end());
    *lat = rtts[rtts.size() / 2] / 2;
    double t = std::max(best - 2 * *lat, best * 0.1);  // the ack's round trip is not bandwidth
    *bw = double(kBulkBytes) / t;
  }
  return attnSuccess;
}

}  // namespace

attnResult_t topoProbe(attnComm* comm) {
  FabricModel& m = *comm->fabric;
  Engine& e = *comm->engine;
  struct Figures {
    double bw[kTierCount];
    double lat[kTierCount];
  };
  std::vector<Figures> all(size_t(comm->nranks));
  Figures& mine = all[size_t(comm->rank)];
  for (int t = 0; t < kTierCount; ++t) mine.bw[t] = mine.lat[t] = 0;
  int measurer = -1;
  for (int t = 0; t < kTierCount; ++t) {
    int a = -1, b = -1;
    if (m.tiers[t].fromFile || !m.representativePair(Tier(t), &a, &b)) continue;
    measurer = a;
    if (comm->rank == a) ATTN_CHECK(probePair(e, b, true, &mine.bw[t], &mine.lat[t]));
    else if (comm->rank == b) ATTN_CHECK(probePair(e, a, false, nullptr, nullptr));
  }
  ATTN_CHECK(comm->bootstrap->allGather(all.data(), sizeof(Figures)));
  if (measurer < 0) return attnSuccess;  // one rank, or nothing to measure
  const Figures& f = all[size_t(measurer)];
  for (int t = 0; t < kTierCount; ++t) {
    if (f.bw[t] <= 0) continue;
    m.tiers[t] = {f.bw[t], f.lat[t], "probe"};
    ATTN_INFO(kLogTopo, "probe %s tier (ranks %d..): %s, %s", tierName(Tier(t)), measurer,
              formatBandwidth(f.bw[t]).c_str(), formatLatency(f.lat[t]).c_str());
  }
  return attnSuccess;
}

}  // namespace attn
