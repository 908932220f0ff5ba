// Ring reduce-scatter, pipelined by chunks. The partial result of the block
// owned by ring position o starts at o+1 and travels o+1 -> o+2 -> ... -> o,
// each hop adding its own contribution. Received chunks land in one of two
// staging buffers (alternating by step), are reduced in place with the local
// input, and are forwarded from there; the last hop reduces into `out`.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/reduce.h"
#include "src/coll/coll.h"
#include "src/coll/coll_op.h"
#include "src/coll/request_set.h"
#include "src/core/datatype.h"

namespace attn {
namespace {

class RingReduceScatterOp final : public CollOp {
 public:
  RingReduceScatterOp(Engine& e, const Ring& ring, const char* in, char* out, std::vector<Block> blocks,
                      attnDataType_t type, attnRedOp_t op, size_t chunk, char* staging)
      : e_(e), ring_(ring), in_(in), out_(out), blocks_(std::move(blocks)), type_(type), op_(op),
        esz_(dataTypeSize(type)) {
    const int n = ring_.size();
    size_t maxBytes = 0;
    for (const Block& b : blocks_) maxBytes = std::max(maxBytes, b.bytes);
    if (!staging && n > 1) staging = e_.scratch(2 * maxBytes);
    stage_[0] = staging;
    stage_[1] = staging ? staging + maxBytes : nullptr;
    // Step s sends the partial of block pos-s-1 and receives that of pos-s-2;
    // so receive step s and send step s+1 carry the same block.
    sendStart_.assign(n, 0);
    recvStart_.assign(n, 0);
    for (int s = 0; s < n - 1; ++s) {
      const int sb = wrap(ring_.pos - s - 1), rb = wrap(ring_.pos - s - 2);
      sendStart_[s] = sends_.size();
      recvStart_[s] = recvs_.size();
      for (size_t c = 0; c * chunk < blocks_[sb].bytes; ++c)
        sends_.push_back({s, c, sb, c * chunk, std::min(chunk, blocks_[sb].bytes - c * chunk)});
      for (size_t c = 0; c * chunk < blocks_[rb].bytes; ++c)
        recvs_.push_back({s, c, rb, c * chunk, std::min(chunk, blocks_[rb].bytes - c * chunk)});
    }
    if (n > 1) {
      sendStart_[n - 1] = sends_.size();
      recvStart_[n - 1] = recvs_.size();
    }
    sreq_ = std::make_unique<RequestSet>(sends_.size());
    rreq_ = std::make_unique<RequestSet>(recvs_.size());
    reduced_.assign(recvs_.size(), false);
  }

  attnResult_t start() override {
    if (ring_.size() == 1) {
      const Block& mine = blocks_[ring_.pos];
      if (out_ != in_ + mine.offset) std::memmove(out_, in_ + mine.offset, mine.bytes);
      return attnSuccess;
    }
    bool advanced = false;
    return step(&advanced);
  }

  attnResult_t step(bool* advanced) override {
    const int n = ring_.size();
    if (n == 1) return attnSuccess;
    const int prev = ring_.prev();
    // Fold arrived chunks into the staging buffer (or into out, last step).
    while (nextReduce_ < nextRecv_) {
      bool ok;
      ATTN_CHECK(rreq_->done(nextReduce_, &ok));
      if (!ok) break;
      const Piece& r = recvs_[nextReduce_];
      if (rreq_->at(nextReduce_)->bytes != r.len)
        return setError(attnInvalidUsage,
                        "reduce-scatter: peer %d sent %zu bytes where %zu were expected "
                        "(ranks called the collective with different counts?)",
                        prev, rreq_->at(nextReduce_)->bytes, r.len);
      char* st = stage_[r.step % 2] + r.off;
      const char* mineIn = in_ + blocks_[r.block].offset + r.off;
      if (r.step == n - 2)
        cpu::reduce2(out_ + r.off, mineIn, st, r.len / esz_, type_, op_);
      else
        cpu::reduceInto(st, mineIn, r.len / esz_, type_, op_);
      reduced_[nextReduce_++] = true;
      *advanced = true;
    }
    // A receive of step s >= 2 overwrites the staging region that the send
    // of step s-1 (same chunk index) forwards from.
    while (nextRecv_ < recvs_.size()) {
      const Piece& r = recvs_[nextRecv_];
      if (r.step >= 2 && r.chunk < sendsOfStep(r.step - 1)) {
        bool ok;
        ATTN_CHECK(sreq_->done(sendStart_[r.step - 1] + r.chunk, &ok));
        if (!ok) break;
      }
      ATTN_CHECK(e_.irecv(prev, stage_[r.step % 2] + r.off, r.len, rreq_->at(nextRecv_)));
      rreq_->markPosted(nextRecv_++);
      *advanced = true;
    }
    // A send of step s >= 1 forwards the reduced chunk received at step s-1.
    while (nextSend_ < sends_.size()) {
      const Piece& s = sends_[nextSend_];
      const char* src;
      if (s.step == 0) {
        src = in_ + blocks_[s.block].offset + s.off;
      } else {
        if (!reduced_[recvStart_[s.step - 1] + s.chunk]) break;
        src = stage_[(s.step - 1) % 2] + s.off;
      }
      ATTN_CHECK(e_.isend(ring_.next(), src, s.len, sreq_->at(nextSend_)));
      sreq_->markPosted(nextSend_++);
      *advanced = true;
    }
    return attnSuccess;
  }

  bool finished() const override {
    if (nextSend_ < sends_.size() || nextReduce_ < recvs_.size()) return false;
    for (size_t i = 0; i < sends_.size(); ++i)
      if (sreq_->at(i)->pending()) return false;
    return true;
  }

  attnResult_t finish() override {
    for (size_t i = 0; i < sends_.size(); ++i) {
      bool ok;
      ATTN_CHECK(sreq_->done(i, &ok));
    }
    return attnSuccess;
  }

 private:
  struct Piece {
    int step;
    size_t chunk;
    int block;
    size_t off, len;
  };
  int wrap(int p) const { return ((p % ring_.size()) + ring_.size()) % ring_.size(); }
  size_t sendsOfStep(int s) const { return sendStart_[s + 1] - sendStart_[s]; }

  Engine& e_;
  Ring ring_;
  const char* in_;
  char* out_;
  std::vector<Block> blocks_;
  attnDataType_t type_;
  attnRedOp_t op_;
  size_t esz_;
  char* stage_[2] = {nullptr, nullptr};
  std::vector<Piece> sends_, recvs_;
  std::vector<size_t> sendStart_, recvStart_;
  std::unique_ptr<RequestSet> sreq_, rreq_;
  std::vector<bool> reduced_;
  size_t nextSend_ = 0, nextRecv_ = 0, nextReduce_ = 0;
};

}  // namespace

std::unique_ptr<CollOp> makeRingReduceScatterOp(Engine& e, const Ring& ring, const char* in, char* out,
                                                std::vector<Block> blocks, attnDataType_t type,
                                                attnRedOp_t op, size_t chunk, char* staging) {
  return std::make_unique<RingReduceScatterOp>(e, ring, in, out, std::move(blocks), type, op, chunk,
                                               staging);
}

attnResult_t ringReduceScatterv(Engine& e, const Ring& ring, const char* in, char* out,
                                const std::vector<Block>& blocks, attnDataType_t type,
                                attnRedOp_t op, size_t chunk, char* staging) {
  RingReduceScatterOp rs(e, ring, in, out, blocks, type, op, chunk, staging);
  if (ring.size() == 1) return rs.start();
  return runOps(e, {&rs});
}

}  // namespace attn
