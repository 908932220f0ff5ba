// A collective as a step machine, so one thread can drive several at once:
// the hierarchical algorithms run the slow cross-host exchange of one
// segment while the host-local rings work on the segment before it.
//
// Ops driven together must talk to disjoint sets of peers (the engine
// matches a peer's messages in posting order, with no tags); ops that share
// peers go in a SeqOp, which runs them one after another.
#pragma once

#include <memory>
#include <vector>

#include "attncomm.h"
#include "src/core/engine.h"

namespace attn {

class CollOp {
 public:
  virtual ~CollOp() = default;
  // Posts what can go at once (receives, first sends).
  virtual attnResult_t start() = 0;
  // Posts whatever became ready since; *advanced when something did.
  virtual attnResult_t step(bool* advanced) = 0;
  // Every request posted and complete.
  virtual bool finished() const = 0;
  // After finished(): surfaces failed requests and size mismatches.
  virtual attnResult_t finish() = 0;
};

// Runs its ops in order: the next starts when the previous has finished.
class SeqOp final : public CollOp {
 public:
  void add(std::unique_ptr<CollOp> op) { ops_.push_back(std::move(op)); }
  attnResult_t start() override;
  attnResult_t step(bool* advanced) override;
  bool finished() const override { return cur_ >= ops_.size(); }
  attnResult_t finish() override { return attnSuccess; }

 private:
  std::vector<std::unique_ptr<CollOp>> ops_;
  size_t cur_ = 0;
};

// Starts every op, drives the engine until all have finished, then finishes
// them. A failure breaks the engine (peers learn of it) and is returned.
attnResult_t runOps(Engine& e, const std::vector<CollOp*>& ops);

}  // namespace attn
