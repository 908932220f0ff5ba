// What head-parallel attention's host (head_parallel.cc) and device
// (src/attn/device/head_parallel_device.cc) algorithms share: the two messages
// between a pair of ranks and the gated all-to-all schedule that sends them.
//
// Between two ranks the order is: the sender's rows for the receiver's
// heads (HeadsMessage), then the receiver's outputs for the sender's rows
// (ReturnMessage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/attn/attn_call.h"
#include "src/attn/head_groups.h"
#include "src/attn/progress_thread.h"
#include "src/attn/wire.h"

namespace attn {

inline size_t roundUp64(size_t x) { return (x + 63) & ~size_t(63); }

// Bytes of one head of Q or K (D), and of V or O (Dv), in the call's dtype.
struct HeadBytes {
  size_t qk, v;
};
HeadBytes headBytesOf(const attnAttnConfig_t& cfg);

// Sizes of one rank's rows for one head group: a Q block, then (64-byte
// aligned) a KV block, both self-describing (wire.h).
struct HeadsMessage {
  RowBytes qRow, kvRow;  // the group's
  BlockLayout q, kv;
  size_t kvAt, total;
  HeadsMessage(int numSeqs, int64_t qRows, int64_t kvRows, RowBytes qRow_, RowBytes kvRow_)
      : qRow(qRow_),
        kvRow(kvRow_),
        q(BlockLayout::of(numSeqs, qRows, qRow)),
        kv(BlockLayout::of(numSeqs, kvRows, kvRow)),
        kvAt(roundUp64(q.total)),
        total(kvAt + kv.total) {}
};

// Rank `from`'s rows for rank `to`'s heads.
inline HeadsMessage headsMessage(const AttnCall& c, const std::vector<HeadGroup>& groups, int from, int to) {
  const HeadBytes hb = headBytesOf(c.cfg);
  const HeadGroup& g = groups[to];
  return HeadsMessage(c.numSeqs, c.qRowsOf[from], c.kvRowsOf[from], RowBytes::one(g.q() * hb.qk),
                      RowBytes::two(g.kv() * hb.qk, g.kv() * hb.v));
}

// Outputs of `rows` rows for a group of `heads` heads: O in the call's
// dtype, then (64-byte aligned) the lse in fp32.
struct ReturnMessage {
  size_t oBytes, lseAt, total;
  ReturnMessage(int64_t rows, int heads, int headDim, size_t elem)
      : oBytes(static_cast<size_t>(rows) * heads * headDim * elem),
        lseAt(roundUp64(oBytes)),
        total(lseAt + static_cast<size_t>(rows) * heads * sizeof(float)) {}
};

// The call narrowed to group g's heads, for the kernels. Its q.rows is the
// most rows of any rank (the room a device user kernel's partial needs: a
// group folds for every rank's queries).
AttnCall narrowedTo(const AttnCall& c, const HeadGroup& g);

// The rows of rank `from` for our heads as they arrived (data, bytes),
// checked against its card and m, the message for our group.
attnResult_t viewHeadsMessage(const AttnCall& c, int from, const char* data, size_t bytes,
                              const HeadsMessage& m, BlockView* q, BlockView* kv);

// Messages of each phase that have reached a rank.
struct Arrived {
  int of[2] = {0, 0};
};

// The pairwise all-to-all schedule: every rank queues its rows for rank+1
// first, then rank+2, ..., and sends its k-th message of a phase (rows out,
// outputs home; k from 0) only once k-1 messages of that phase have reached
// it. The ranks then send to about a permutation of each other, and a link
// carries two flows at a time, not N-1. A completed send is no proof that
// the bytes left (TCP completes it into the socket buffer); an arrival is.
// Without the gate, incast over four emulated hosts at 200 Mbit/s starved
// flows into TCP's retransmission timeouts; one flow at a time left the
// link idle between steps (perf/RESULTS.md §10).
//
// The gate cannot deadlock when every rank sends and receives the same
// number of messages per phase (every group non-empty): a rank stuck at
// its k-th message has received fewer than it sent, so some other rank has
// received more than it sent, which only a rank with nothing left to send
// can. With empty groups (Hq < N) the traffic is lopsided and the gate is
// off.
class Outbox {
 public:
  enum Phase { kRows = 0, kOutputs = 1 };
  Outbox(Engine& e, int n, bool gated) : e_(e), gated_(gated), req_(new Request[2 * n]) {}
  void queue(Phase phase, int peer, const char* data, size_t bytes) {
    items_.push_back({phase, queued_[phase]++, peer, data, bytes});
  }
  // Posts the next message when the one in flight has completed and the
  // gate is open.
  attnResult_t pump(ProgressThread& driver, Arrived arrived);
  // pump() has work: the message in flight completed, or the next may go.
  bool movable(Arrived arrived) const {
    return inflight_ >= 0 ? !req_[inflight_].pending() : open(arrived);
  }
  bool drained() const { return inflight_ < 0 && next_ == items_.size(); }
  uint64_t bytes() const;

 private:
  struct Item {
    Phase phase;
    int index;  // within its phase
    int peer;
    const char* data;
    size_t bytes;
  };
  bool open(Arrived arrived) const {
    if (next_ == items_.size()) return false;
    const Item& m = items_[next_];
    return !gated_ || arrived.of[m.phase] >= m.index - 1;
  }
  Engine& e_;
  const bool gated_;
  std::unique_ptr<Request[]> req_;  // by queue position: at most 2 per peer
  std::vector<Item> items_;
  int queued_[2] = {0, 0};
  size_t next_ = 0;
  int inflight_ = -1;
};

// What has reached this rank so far (not necessarily handled yet): rows
// for our heads (inRows[p], posted only when our group has heads) and our
// outputs from each group (outputsIn[p], posted for non-empty groups).
inline Arrived arrivedSoFar(const std::vector<HeadGroup>& groups, int me, const Request* inRows,
                            const Request* outputsIn) {
  Arrived a;
  const int n = static_cast<int>(groups.size());
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (!groups[me].empty() && !inRows[p].pending()) ++a.of[Outbox::kRows];
    if (!groups[p].empty() && !outputsIn[p].pending()) ++a.of[Outbox::kOutputs];
  }
  return a;
}

// Every group non-empty: the gate of Outbox may be on.
inline bool everyGroupHasHeads(const std::vector<HeadGroup>& groups) {
  for (const HeadGroup& g : groups)
    if (g.empty()) return false;
  return true;
}

}  // namespace attn
