// The SIMT simulator's block scheduler: the threads of one block are fibers
// on the host thread that runs the kernel. Each runs until it blocks at a
// barrier or warp collective (or ends); when every live thread of a block
// (or warp) has arrived, the barrier opens. Nothing runnable and no barrier
// to open is a deadlock, which a GPU would hang on: here it is a fault.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/cuda_emu/simt/fiber.h"
#include "tests/cuda_emu/simt/simt.h"

namespace attn_simt {
namespace {

constexpr size_t kStackBytes = 64 << 10;
constexpr int kWarp = 32;
constexpr size_t kExchangeBytes = 4096;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes;
  unsigned group;
};

struct SimThread {
  FiberContext ctx;
  ThreadIds ids{};
  State state = State::kRunnable;
  unsigned warpOps = 0;    // full-warp collectives entered: picks the exchange buffer
  unsigned waitMask = 0;   // the lanes of the warp barrier it waits at
  unsigned committed = 0;  // copy groups committed; the open group's index
  std::vector<PendingCopy> copies;
};

struct Warp {
  alignas(16) unsigned char exchange[2][kExchangeBytes];
};

// One host thread's simulator: the block it runs, reused for the next.
struct Runner {
  FiberStacks stacks;
  std::vector<SimThread> threads;
  std::vector<Warp> warps;
  FiberContext scheduler;
  SimThread* current = nullptr;
  const std::function<void()>* body = nullptr;
  int live = 0, blockArrived = 0;
  std::string fault;
};

thread_local Runner* tRunner = nullptr;

Runner& runner() { return *tRunner; }
SimThread& self() { return *tRunner->current; }

void applyCopies(SimThread& t, unsigned below) {
  size_t kept = 0;
  for (PendingCopy& c : t.copies) {
    if (c.group < below) std::memcpy(c.dst, c.src, c.bytes);
    else t.copies[kept++] = c;
  }
  t.copies.resize(kept);
}

void threadMain(void* arg) {
  auto* t = static_cast<SimThread*>(arg);
  Runner& r = runner();
  (*r.body)();
  applyCopies(*t, ~0u);  // a GPU completes them after the thread ends
  t->state = State::kDone;
  --r.live;
  switchFiber(&t->ctx, &r.scheduler);
  __builtin_unreachable();
}

void park(State s) {
  SimThread& t = self();
  t.state = s;
  switchFiber(&t.ctx, &runner().scheduler);
}

std::string describeDeadlock(const Runner& r) {
  int atBlock = 0, atWarp = 0, done = 0;
  for (const SimThread& t : r.threads) {
    atBlock += t.state == State::kAtBlockBarrier;
    atWarp += t.state == State::kAtWarpBarrier;
    done += t.state == State::kDone;
  }
  return "deadlock: " + std::to_string(atBlock) + " threads wait at __syncthreads, " +
         std::to_string(atWarp) + " at a warp collective, " + std::to_string(done) +
         " have ended (a barrier not every live thread reaches)";
}

// Opens the barriers every live participant has reached; false if none.
bool openBarriers(Runner& r) {
  bool opened = false;
  if (r.blockArrived > 0 && r.blockArrived == r.live) {
    for (SimThread& t : r.threads)
      if (t.state == State::kAtBlockBarrier) t.state = State::kRunnable;
    r.blockArrived = 0;
    opened = true;
  }
  // A warp barrier opens when every live lane of its mask waits at it with
  // that mask (several groups of one warp may wait at once, as __syncwarp
  // with partial masks allows).
  const size_t n = r.threads.size();
  for (size_t w0 = 0; w0 < n; w0 += kWarp) {
    SimThread* lanes = &r.threads[w0];
    const size_t width = std::min<size_t>(kWarp, n - w0);
    unsigned live = 0;
    for (size_t l = 0; l < width; ++l)
      if (lanes[l].state != State::kDone) live |= 1u << l;
    for (size_t l = 0; l < width; ++l) {
      if (lanes[l].state != State::kAtWarpBarrier) continue;
      const unsigned mask = lanes[l].waitMask & live;
      bool all = true;
      for (size_t k = 0; k < width && all; ++k)
        if (mask & (1u << k))
          all = lanes[k].state == State::kAtWarpBarrier && lanes[k].waitMask == lanes[l].waitMask;
      if (!all) continue;
      for (size_t k = 0; k < width; ++k)
        if (mask & (1u << k)) lanes[k].state = State::kRunnable;
      opened = true;
    }
  }
  return opened;
}

// Runs one block to its end; the order alternates between blocks so that
// a missing barrier shows whichever way round the race goes.
void runBlock(Runner& r, bool reverse) {
  const int n = int(r.threads.size());
  while (r.live > 0 && r.fault.empty()) {
    bool ran = false;
    for (int k = 0; k < n && r.fault.empty(); ++k) {
      SimThread& t = r.threads[size_t(reverse ? n - 1 - k : k)];
      if (t.state != State::kRunnable) continue;
      r.current = &t;
      switchFiber(&r.scheduler, &t.ctx);
      ran = true;
    }
    if (!r.fault.empty()) return;
    if (!openBarriers(r) && !ran && r.live > 0) r.fault = describeDeadlock(r);
  }
}

}  // namespace

const ThreadIds& ids() { return self().ids; }

void blockBarrier() {
  ++runner().blockArrived;
  park(State::kAtBlockBarrier);
}

void warpBarrier(unsigned mask) {
  SimThread& t = self();
  if (!(mask & (1u << t.ids.lane))) trap("__syncwarp: the calling lane is not in the mask");
  if (mask == 0xffffffffu) ++t.warpOps;  // only full-warp collectives exchange data
  t.waitMask = mask;
  park(State::kAtWarpBarrier);
}

unsigned char* warpExchange() {
  SimThread& t = self();
  return runner().warps[t.ids.warp].exchange[t.warpOps & 1];
}

void copyAsync(void* dst, const void* src, size_t bytes) {
  SimThread& t = self();
  std::memset(dst, 0xFF, bytes);  // NaN in every floating type until waited for
  t.copies.push_back({dst, src, bytes, t.committed});
}

void commitCopies() { ++self().committed; }

void waitCopiesPrior(unsigned newest) {
  SimThread& t = self();
  if (t.committed > newest) applyCopies(t, t.committed - newest);
}

void trap(const char* why) {
  Runner& r = runner();
  SimThread& t = self();
  char where[96];
  std::snprintf(where, sizeof where, " (thread %u,%u,%u)", t.ids.threadIdx.x, t.ids.threadIdx.y,
                t.ids.threadIdx.z);
  r.fault = std::string(why) + where;
  t.state = State::kDone;
  switchFiber(&t.ctx, &r.scheduler);
  __builtin_unreachable();
}

std::string runGrid(dim3 grid, dim3 block, SharedMemoryOf smemOf, size_t dynamicSmem,
                    const std::function<void()>& body) {
  thread_local Runner mine;
  Runner& r = mine;
  Runner* outer = tRunner;
  if (outer != nullptr) return "a kernel launched from device code";
  tRunner = &r;
  const int n = int(block.x * block.y * block.z);
  if (!r.stacks.reserve(n, kStackBytes)) {
    tRunner = nullptr;
    return "cannot map " + std::to_string(n) + " fiber stacks";
  }
  unsigned char* smem = smemOf();
  r.body = &body;
  r.threads.resize(size_t(n));
  r.warps.resize(size_t((n + kWarp - 1) / kWarp));
  std::string fault;
  for (unsigned bz = 0; bz < grid.z && fault.empty(); ++bz)
    for (unsigned by = 0; by < grid.y && fault.empty(); ++by)
      for (unsigned bx = 0; bx < grid.x && fault.empty(); ++bx) {
        if (dynamicSmem) std::memset(smem, 0xFF, dynamicSmem);
        r.live = n;
        r.blockArrived = 0;
        r.fault.clear();
        for (int i = 0; i < n; ++i) {
          SimThread& t = r.threads[size_t(i)];
          t.state = State::kRunnable;
          t.warpOps = t.committed = t.waitMask = 0;
          t.copies.clear();
          t.ids.threadIdx = uint3{unsigned(i) % block.x, (unsigned(i) / block.x) % block.y,
                                  unsigned(i) / (block.x * block.y)};
          t.ids.blockIdx = uint3{bx, by, bz};
          t.ids.blockDim = block;
          t.ids.gridDim = grid;
          t.ids.lane = unsigned(i) % kWarp;
          t.ids.warp = unsigned(i) / kWarp;
          makeFiber(&t.ctx, r.stacks.stack(i), r.stacks.stackBytes(), &threadMain, &t);
        }
        runBlock(r, ((bx + by + bz) & 1) != 0);
        if (!r.fault.empty())
          fault = "block (" + std::to_string(bx) + "," + std::to_string(by) + "," +
                  std::to_string(bz) + "): " + r.fault;
      }
  tRunner = nullptr;
  return fault;
}

}  // namespace attn_simt
