// Ring all-gather, pipelined by chunks: at step s a rank forwards the block it
// received at step s-1, chunk by chunk, as soon as each chunk has arrived.
#include <algorithm>

#include "src/coll/coll.h"
#include "src/coll/coll_op.h"
#include "src/coll/request_set.h"

namespace attn {
namespace {

class RingAllGatherOp final : public CollOp {
 public:
  RingAllGatherOp(Engine& e, const Ring& ring, char* buf, std::vector<Block> blocks, size_t chunk)
      : e_(e), ring_(ring), buf_(buf), blocks_(std::move(blocks)), chunk_(chunk) {
    const int n = ring_.size();
    // Step s sends the block of ring position pos-s and receives pos-s-1.
    for (int s = 0; s < n - 1; ++s) {
      const int sb = wrap(ring_.pos - s), rb = wrap(ring_.pos - s - 1);
      for (size_t c = 0; c < chunksOf(sb); ++c) sends_.push_back({sb, c});
      for (size_t c = 0; c < chunksOf(rb); ++c) recvs_.push_back({rb, c});
    }
    own_ = n > 1 ? chunksOf(ring_.pos) : 0;
    sreq_ = std::make_unique<RequestSet>(sends_.size());
    rreq_ = std::make_unique<RequestSet>(recvs_.size());
  }

  attnResult_t start() override {
    if (ring_.size() == 1) return attnSuccess;
    for (size_t i = 0; i < recvs_.size(); ++i) {
      size_t off, len;
      slice(recvs_[i], &off, &len);
      ATTN_CHECK(e_.irecv(ring_.prev(), buf_ + off, len, rreq_->at(i)));
      rreq_->markPosted(i);
    }
    bool advanced = false;
    return step(&advanced);
  }

  // Sends of step s >= 1 wait for the same chunk of step s-1 to arrive; the
  // step-0 sends (own block) go at once. Recvs are listed in send order of
  // the previous step, so send i (step s>=1) depends on recv i - own.
  attnResult_t step(bool* advanced) override {
    while (nextSend_ < sends_.size()) {
      if (nextSend_ >= own_) {
        bool ok;
        ATTN_CHECK(rreq_->done(nextSend_ - own_, &ok));
        if (!ok) break;
      }
      size_t off, len;
      slice(sends_[nextSend_], &off, &len);
      ATTN_CHECK(e_.isend(ring_.next(), buf_ + off, len, sreq_->at(nextSend_)));
      sreq_->markPosted(nextSend_);
      ++nextSend_;
      *advanced = true;
    }
    return attnSuccess;
  }

  bool finished() const override {
    if (nextSend_ < sends_.size()) return false;
    for (size_t i = 0; i < sends_.size(); ++i)
      if (sreq_->at(i)->pending()) return false;
    for (size_t i = 0; i < recvs_.size(); ++i)
      if (rreq_->at(i)->pending()) return false;
    return true;
  }

  // Surfaces failures of requests that completed in error, and short blocks.
  attnResult_t finish() override {
    for (size_t i = 0; i < sends_.size(); ++i) {
      bool ok;
      ATTN_CHECK(sreq_->done(i, &ok));
    }
    for (size_t i = 0; i < recvs_.size(); ++i) {
      bool ok;
      ATTN_CHECK(rreq_->done(i, &ok));
      size_t off, len;
      slice(recvs_[i], &off, &len);
      if (rreq_->at(i)->bytes != len)
        return setError(attnInvalidUsage,
                        "all-gather: peer %d sent %zu bytes where %zu were expected "
                        "(ranks called the collective with different counts?)",
                        ring_.prev(), rreq_->at(i)->bytes, len);
    }
    return attnSuccess;
  }

 private:
  struct Piece {
    int block;
    size_t chunk;
  };
  int wrap(int p) const { return ((p % ring_.size()) + ring_.size()) % ring_.size(); }
  size_t chunksOf(int b) const { return (blocks_[b].bytes + chunk_ - 1) / chunk_; }
  void slice(const Piece& p, size_t* off, size_t* len) const {
    const Block& b = blocks_[p.block];
    *off = b.offset + p.chunk * chunk_;
    *len = std::min(chunk_, b.bytes - p.chunk * chunk_);
  }

  Engine& e_;
  Ring ring_;
  char* buf_;
  std::vector<Block> blocks_;
  size_t chunk_;
  std::vector<Piece> sends_, recvs_;
  size_t own_ = 0, nextSend_ = 0;
  std::unique_ptr<RequestSet> sreq_, rreq_;
};

}  // namespace

std::unique_ptr<CollOp> makeRingAllGatherOp(Engine& e, const Ring& ring, char* buf,
                                            std::vector<Block> blocks, size_t chunk) {
  return std::make_unique<RingAllGatherOp>(e, ring, buf, std::move(blocks), chunk);
}

attnResult_t ringAllGatherv(Engine& e, const Ring& ring, char* buf,
                            const std::vector<Block>& blocks, size_t chunk) {
  if (ring.size() == 1) return attnSuccess;
  RingAllGatherOp op(e, ring, buf, blocks, chunk);
  return runOps(e, {&op});
}

}  // namespace attn
