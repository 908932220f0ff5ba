// Stream capture and graphs on the emulated runtime: cudaStreamBeginCapture
// records a stream's work instead of running it, cudaGraphLaunch runs the
// recording again on any stream, and CUDA's capture-mode rules refuse the
// calls a capture forbids, so library code that would break an
// application's graph capture fails here as on a GPU.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "tests/cuda_emu/emu_core.h"

using namespace attn_emu;

namespace attn_emu {

void Capture::add(const Stream* s, Op op) {
  std::lock_guard<std::mutex> g(mu);
  ops.push_back(std::move(op));
  ++nodes[s];
}

uint64_t Capture::nodesOf(const Stream* s) {
  std::lock_guard<std::mutex> g(mu);
  auto it = nodes.find(s);
  return it == nodes.end() ? 0 : it->second;
}

void Capture::addWait(const Wait& w) {
  std::lock_guard<std::mutex> g(mu);
  waits.push_back(w);
}

const Stream* Capture::unjoined() {
  std::lock_guard<std::mutex> g(mu);
  // needed[s]: how many of s's first nodes the end depends on. The end
  // follows all of the origin's nodes and the waits made after the last.
  std::map<const Stream*, uint64_t> needed;
  const uint64_t originEnd = nodes[origin] + 1;
  needed[origin] = originEnd;
  for (bool grew = true; grew;) {
    grew = false;
    for (const Wait& w : waits) {
      auto to = needed.find(w.to);
      if (to == needed.end() || to->second <= w.toNodes) continue;
      uint64_t& from = needed[w.from];
      if (w.from != origin && from < w.fromNodes) {
        from = w.fromNodes;
        grew = true;
      }
    }
  }
  for (const auto& [s, n] : nodes)
    if (s != origin && n > 0 && needed[s] < n) return s;
  return nullptr;
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

// A cudaUserObject_t: its destructor runs when the last reference goes
// (the caller's, or those of the graphs that retain it).
struct UserObject {
  void* ptr;
  cudaHostFn_t destroy;
  std::atomic<unsigned> refs;
};

void unref(void* object, unsigned n) {
  auto* o = static_cast<UserObject*>(object);
  if (o->refs.fetch_sub(n) != n) return;
  o->destroy(o->ptr);
  delete o;
}

// What a graph (and its instantiations, and their launches in flight)
// holds: the capture's operations and the user objects it retains.
struct Recording {
  std::vector<Op> ops;
  std::vector<std::pair<void*, unsigned>> objects;
  ~Recording() {
    for (auto& [o, n] : objects) unref(o, n);
  }
};

struct Graph {
  std::shared_ptr<Recording> rec;
};

struct Graphs {
  std::mutex mu;
  std::set<const Graph*> graphs, execs;  // live handles
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
  c->origin = st.get();
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
  if (c->origin != st.get())
    return fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture on a stream forked into the capture");
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread");
  const Stream* loose = c->unjoined();
  st->setCapture(nullptr);
  {
    std::lock_guard<std::mutex> g(c->mu);
    for (auto& w : c->forked)
      if (std::shared_ptr<Stream> f = w.lock(); f && f->capture() == c) f->setCapture(nullptr);
  }
  {
    std::lock_guard<std::mutex> g(captures().mu);
    std::erase(captures().open, c);
  }
  std::lock_guard<std::mutex> g(c->mu);
  auto rec = std::make_shared<Recording>();
  rec->ops = std::move(c->ops);
  rec->objects = std::move(c->userObjects);
  // An unjoined or invalidated capture's graph is discarded, with its
  // references; the capture has ended all the same.
  if (loose)
    return fail(cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture: stream %p, forked into the capture, was not "
                "joined back", (const void*)loose);
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated, "the capture on stream %p was invalidated", (void*)s);
  auto* made = new Graph{std::move(rec)};
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
  auto* made = new Graph{from->rec};
  graphs().execs.insert(made);
  *exec = reinterpret_cast<cudaGraphExec_t>(made);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaGraphLaunch: runtime unusable");
  std::shared_ptr<const Recording> rec;
  {
    std::lock_guard<std::mutex> g(graphs().mu);
    auto* x = reinterpret_cast<const Graph*>(exec);
    if (!graphs().execs.count(x)) return fail(cudaErrorInvalidValue, "cudaGraphLaunch of %p, not an instantiated graph", (void*)exec);
    rec = x->rec;
  }
  // One launch runs the recording in order, as one unit of the stream, and
  // keeps it (and its user objects) until it has run.
  return enqueue(s, [rec] {
    for (const Op& op : rec->ops) op();
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

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* ndeps) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaStreamGetCaptureInfo: runtime unusable");
  if (!status) return fail(cudaErrorInvalidValue, "cudaStreamGetCaptureInfo(null status)");
  if (deps || edges || ndeps) return fail(cudaErrorNotSupported, "cudaStreamGetCaptureInfo: dependencies are not emulated");
  std::shared_ptr<Stream> st = resolve(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle, "cudaStreamGetCaptureInfo on %p", (void*)s);
  std::shared_ptr<Capture> c = st->capture();
  *status = !c ? cudaStreamCaptureStatusNone
               : c->isInvalidated() ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  // The graph being built is named by its capture while it is open.
  if (id) *id = c ? reinterpret_cast<uintptr_t>(c.get()) : 0;
  if (graph) *graph = c ? reinterpret_cast<cudaGraph_t>(c.get()) : nullptr;
  return cudaSuccess;
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* out, void* ptr, cudaHostFn_t destroy, unsigned int refs,
                                 unsigned int flags) {
  if (!out || !destroy || refs == 0 || flags != cudaUserObjectNoDestructorSync)
    return fail(cudaErrorInvalidValue, "cudaUserObjectCreate: bad arguments");
  *out = reinterpret_cast<cudaUserObject_t>(new UserObject{ptr, destroy, refs});
  return cudaSuccess;
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  if (!object || count == 0) return fail(cudaErrorInvalidValue, "cudaUserObjectRelease: bad arguments");
  unref(object, count);
  return cudaSuccess;
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count,
                                      unsigned int flags) {
  if (!object || count == 0 || (flags & ~unsigned(cudaGraphUserObjectMove)))
    return fail(cudaErrorInvalidValue, "cudaGraphRetainUserObject: bad arguments");
  auto* o = reinterpret_cast<UserObject*>(object);
  if (!(flags & cudaGraphUserObjectMove)) o->refs.fetch_add(count);
  {
    std::lock_guard<std::mutex> g(captures().mu);
    for (const auto& c : captures().open)
      if (reinterpret_cast<cudaGraph_t>(c.get()) == graph) {
        std::lock_guard<std::mutex> cg(c->mu);
        c->userObjects.emplace_back(o, count);
        return cudaSuccess;
      }
  }
  std::lock_guard<std::mutex> g(graphs().mu);
  auto* x = reinterpret_cast<Graph*>(graph);
  if (!graphs().graphs.count(x)) {
    if (!(flags & cudaGraphUserObjectMove)) o->refs.fetch_sub(count);
    return fail(cudaErrorInvalidValue, "cudaGraphRetainUserObject on %p, not a graph", (void*)graph);
  }
  x->rec->objects.emplace_back(o, count);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (cudaError_t e = enter(); e != cudaSuccess) return fail(e, "cudaLaunchHostFunc: runtime unusable");
  if (!fn) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc(null function)");
  return enqueue(s, [fn, data] { fn(data); });
}

}  // extern "C"
