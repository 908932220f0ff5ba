// Fibers for the SIMT simulator: each simulated GPU thread runs on its own
// small stack, and the block scheduler switches between them at barriers
// and warp collectives. A switch saves only what the ABI says a call
// preserves, so it costs a few nanoseconds (ucontext's swapcontext makes a
// system call per switch, which would dominate the simulation).
#pragma once

#include <cstddef>

namespace attn_simt {

struct FiberContext {
  void* sp = nullptr;
};

// Saves the running context into `from` and resumes `to`.
void switchFiber(FiberContext* from, FiberContext* to);

// Prepares `ctx` to run entry(arg) on the stack [stack, stack + bytes) at
// its first switchFiber. entry must never return: it switches away for good.
void makeFiber(FiberContext* ctx, void* stack, size_t bytes, void (*entry)(void*), void* arg);

// Stacks for up to `count` fibers of `bytes` each, each below a guard page
// (an overflow faults instead of corrupting a neighbour), reused between
// blocks.
class FiberStacks {
 public:
  FiberStacks() = default;
  ~FiberStacks();
  FiberStacks(const FiberStacks&) = delete;
  FiberStacks& operator=(const FiberStacks&) = delete;
  // False when the memory cannot be mapped.
  bool reserve(int count, size_t bytes);
  void* stack(int i) const { return static_cast<char*>(base_) + size_t(i) * slot_ + guard_; }
  size_t stackBytes() const { return slot_ - guard_; }

 private:
  void* base_ = nullptr;
  size_t mapped_ = 0, slot_ = 0, guard_ = 0;
  int count_ = 0;
};

}  // namespace attn_simt
