// Stream capture and graphs on the emulated runtime: cudaStreamBeginCapture
// records a stream's work instead of running it, cudaGraphLaunch runs the
// recording again on any stream, and CUDA's capture-mode rules refuse the
// calls a capture forbids, so library code that would break an
// application's graph capture fails here as on a GPU.
#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "tests/cuda_emu/emu_core.h"

using namespace attn_emu;

namespace attn_emu {

void Capture::add(Op op) {
  std::lock_guard<std::mutex> g(mu);
  ops.push_back(std::move(op));
}

void Capture::invalidate() {
  std::lock_guard<std::mutex> g(mu);
  invalidated = true;
}

bool Capture::isInvalidated() {
  std::lock_guard<std::mutex> g(mu);
  return invalidated;
}

namespace {

// The captures open in the process, for the capture-mode rules.
struct Captures {
  std::mutex mu;
  std::vector<std::shared_ptr<Capture>> open;
};
Captures& captures() {
  static auto* c = new Captures();
  return *c;
}

thread_local cudaStreamCaptureMode tlsMode = cudaStreamCaptureModeGlobal;

// What a graph (or an instantiated one) runs: the capture's operations.
struct Graph {
  std::shared_ptr<const std::vector<Op>> ops;
};

struct Graphs {
  std::mutex mu;
  std::set<const Graph*> graphs, execs;
};
Graphs& graphs() {
  static auto* g = new Graphs();
  return *g;
}

}  // namespace

cudaError_t unsafeCallAllowed(const char* what) {
  if (tlsMode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  std::vector<std::shared_ptr<Capture>> forbidding;
  {
    std::lock_guard<std::mutex> g(captures().mu);
    for (const auto& c : captures().open) {
      const bool mine = c->owner == std::this_thread::get_id() && c->mode != cudaStreamCaptureModeRelaxed;
      const bool global = tlsMode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal;
      if (mine || global) forbidding.push_back(c);
    }
  }
  if (forbidding.empty()) return cudaSuccess;
  for (auto& c : forbidding) c->invalidate();
  return fail(cudaErrorStreamCaptureUnsupported,
              "%s during a stream capture this thread's capture mode forbids it in (it invalidates the capture)",
              what);
}

}  // namespace attn_emu

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaStreamBeginCapture: runtime unusable");
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture on %p", (void*)s);
  if (s == nullptr || s == cudaStreamLegacy)
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the legacy stream");
  if (st->capture()) return fail(cudaErrorIllegalState, "cudaStreamBeginCapture: stream %p already captures", (void*)s);
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->owner = std::this_thread::get_id();
  {
    std::lock_guard<std::mutex> g(captures().mu);
    captures().open.push_back(c);
  }
  st->setCapture(std::move(c));
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaStreamEndCapture: runtime unusable");
  if (!graph) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture(null graph)");
  *graph = nullptr;
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture on %p", (void*)s);
  std::shared_ptr<Capture> c = st->capture();
  if (!c) return fail(cudaErrorIllegalState, "cudaStreamEndCapture: stream %p does not capture", (void*)s);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread");
  st->setCapture(nullptr);
  {
    std::lock_guard<std::mutex> g(captures().mu);
    std::erase(captures().open, c);
  }
  std::lock_guard<std::mutex> g(c->mu);
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated, "the capture on stream %p was invalidated", (void*)s);
  auto* made = new Graph{std::make_shared<const std::vector<Op>>(std::move(c->ops))};
  {
    std::lock_guard<std::mutex> gg(graphs().mu);
    graphs().graphs.insert(made);
  }
  *graph = reinterpret_cast<cudaGraph_t>(made);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaStreamIsCapturing: runtime unusable");
  if (!status) return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing(null)");
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing on %p", (void*)s);
  std::shared_ptr<Capture> c = st->capture();
  *status = !c ? cudaStreamCaptureStatusNone
               : c->isInvalidated() ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode) return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode(null)");
  std::swap(*mode, tlsMode);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaGraphInstantiate: runtime unusable");
  if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate(null)");
  std::lock_guard<std::mutex> g(graphs().mu);
  auto* from = reinterpret_cast<const Graph*>(graph);
  if (!graphs().graphs.count(from)) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate of %p, not a graph", (void*)graph);
  auto* made = new Graph{from->ops};
  graphs().execs.insert(made);
  *exec = reinterpret_cast<cudaGraphExec_t>(made);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaGraphLaunch: runtime unusable");
  std::shared_ptr<const std::vector<Op>> ops;
  {
    std::lock_guard<std::mutex> g(graphs().mu);
    auto* x = reinterpret_cast<const Graph*>(exec);
    if (!graphs().execs.count(x)) return fail(cudaErrorInvalidValue, "cudaGraphLaunch of %p, not an instantiated graph", (void*)exec);
    ops = x->ops;
  }
  // One launch runs the recording in order, as one unit of the stream.
  return enqueue(s, [ops] {
    for (const Op& op : *ops) op();
  });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> g(graphs().mu);
  auto* x = reinterpret_cast<const Graph*>(exec);
  if (!graphs().execs.erase(x)) return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy of %p", (void*)exec);
  delete x;  // launches in flight hold the operations
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> g(graphs().mu);
  auto* x = reinterpret_cast<const Graph*>(graph);
  if (!graphs().graphs.erase(x)) return fail(cudaErrorInvalidValue, "cudaGraphDestroy of %p", (void*)graph);
  delete x;
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaLaunchHostFunc: runtime unusable");
  if (!fn) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc(null function)");
  return enqueue(s, [fn, data] { fn(data); });
}

}  // extern "C"
