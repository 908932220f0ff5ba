#include "src/coll/coll_op.h"

#include "src/coll/request_set.h"

namespace attn {

attnResult_t SeqOp::start() {
  cur_ = 0;
  if (ops_.empty()) return attnSuccess;
  return ops_[0]->start();
}

attnResult_t SeqOp::step(bool* advanced) {
  while (cur_ < ops_.size()) {
    ATTN_CHECK(ops_[cur_]->step(advanced));
    if (!ops_[cur_]->finished()) return attnSuccess;
    ATTN_CHECK(ops_[cur_]->finish());
    if (++cur_ < ops_.size()) {
      ATTN_CHECK(ops_[cur_]->start());
      *advanced = true;
    }
  }
  return attnSuccess;
}

attnResult_t runOps(Engine& e, const std::vector<CollOp*>& ops) {
  for (CollOp* op : ops) {
    attnResult_t r = op->start();
    if (r != attnSuccess) {
      e.breakWith(r, threadLastError());
      return r;
    }
  }
  auto step = [&](bool* advanced) -> attnResult_t {
    for (CollOp* op : ops) ATTN_CHECK(op->step(advanced));
    return attnSuccess;
  };
  auto finished = [&] {
    for (CollOp* op : ops)
      if (!op->finished()) return false;
    return true;
  };
  ATTN_CHECK(driveUntil(e, step, finished));
  for (CollOp* op : ops) ATTN_CHECK(op->finish());
  return attnSuccess;
}

}  // namespace attn
