// attnGroupStart / attnGroupEnd: operations issued in between are queued per
// communicator and run at the outermost attnGroupEnd. Point-to-point
// operations of one communicator are all posted before any is waited for, so
// any send/recv order works; several communicators run side by side (one
// thread each), like NCCL's single-thread multi-rank groups.
//
// Device communicators queue their sends and receives apart (devP2p): each
// communicator's become one stream operation (src/device/device_group.h).
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/core/api_call.h"
#include "src/core/log.h"
#include "src/device/device_group.h"
#include "src/device/device_route.h"
#include "src/device/backends/nccl/nccl_bridge.h"

namespace attn {
namespace {

struct CommWork {
  attnComm* comm;
  std::vector<P2pOp> p2p;
  std::vector<CommOp> colls;
  std::vector<P2pOp> devP2p;  // device communicators, with their streams
};

struct GroupState {
  int depth = 0;
  std::vector<CommWork> work;
  CommWork& of(attnComm* comm) {
    for (auto& w : work)
      if (w.comm == comm) return w;
    work.push_back({comm, {}, {}, {}});
    return work.back();
  }
};
thread_local GroupState tlsGroup;

// Self sends and receives of a group pair up in order. A group whose self
// operations do not pair up is refused, but only after its messages to
// peers have run: the peers posted theirs and must not be left waiting.
attnResult_t checkSelf(const std::vector<P2pOp>& ops, int self,
                       std::vector<std::pair<const P2pOp*, const P2pOp*>>* pairs) {
  std::vector<const P2pOp*> sends, recvs;
  for (const auto& op : ops)
    if (op.peer == self) (op.isSend ? sends : recvs).push_back(&op);
  if (sends.size() != recvs.size())
    return setError(attnInvalidUsage, "group has %zu send(s) to self but %zu receive(s) from self",
                    sends.size(), recvs.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i]->bytes != recvs[i]->bytes)
      return setError(attnInvalidUsage, "send to self of %zu bytes met a receive of %zu bytes",
                      sends[i]->bytes, recvs[i]->bytes);
    pairs->emplace_back(sends[i], recvs[i]);
  }
  return attnSuccess;
}

attnResult_t runP2p(attnComm* comm, const std::vector<P2pOp>& ops) {
  std::vector<std::pair<const P2pOp*, const P2pOp*>> selfPairs;
  const attnResult_t selfResult = checkSelf(ops, comm->rank, &selfPairs);
  const std::string selfWhy = selfResult == attnSuccess ? std::string() : threadLastError();
  Engine& e = *comm->engine;
  std::unique_ptr<Request[]> reqs(new Request[ops.size() + 1]);
  attnResult_t r = attnSuccess;
  for (size_t i = 0; i < ops.size() && r == attnSuccess; ++i) {
    const P2pOp& op = ops[i];
    if (op.peer == comm->rank) {
      reqs[i].complete(op.bytes);
      continue;
    }
    r = op.isSend ? e.isend(op.peer, op.buf, op.bytes, &reqs[i])
                  : e.irecv(op.peer, op.buf, op.bytes, &reqs[i]);
  }
  if (r != attnSuccess) {
    e.breakWith(r, threadLastError());  // posted requests must not outlive reqs
    return r;
  }
  for (const auto& [send, recv] : selfPairs) std::memmove(recv->buf, send->buf, send->bytes);
  ATTN_CHECK(e.waitAll(reqs.get(), ops.size()));
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].isSend && reqs[i].bytes != ops[i].bytes)
      return setError(attnInvalidUsage, "receive from peer %d expected %zu bytes but %zu arrived",
                      ops[i].peer, ops[i].bytes, reqs[i].bytes);
  return selfResult == attnSuccess ? attnSuccess : restoreError(selfResult, selfWhy);
}

attnResult_t runWork(CommWork& w) {
  ApiCall call(w.comm);  // destroyed since it was queued: refused, not run
  ATTN_CHECK(call.checkHandle());
  attnResult_t r = attnSuccess;
  if (!w.p2p.empty()) r = runGuarded([&] { return runP2p(w.comm, w.p2p); });
  for (auto& c : w.colls) {
    if (r != attnSuccess) break;
    r = c();
  }
  return call.finish(r);
}

// Enqueues the device communicators' sends and receives while the group is
// still open, so those on NCCL-backed communicators join this thread's NCCL
// group with the group's collectives; launches that group; only then can the
// other streams wait for the group's stream.
attnResult_t launchDeviceP2p(std::vector<CommWork>& work, std::string* why) {
  attnResult_t first = attnSuccess;
  auto note = [&](attnResult_t r) {
    if (r != attnSuccess && first == attnSuccess) {
      first = r;
      *why = threadLastError();
    }
  };
  std::vector<std::pair<attnComm*, StreamJoin>> joins;
  for (CommWork& w : work) {
    if (w.devP2p.empty()) continue;
    ApiCall call(w.comm);
    StreamJoin join;
    attnResult_t r = call.checkHandle();
    if (r == attnSuccess)
      r = call.finish(runGuarded([&] { return deviceP2pGroup(w.comm, std::move(w.devP2p), &join); }));
    note(r);
    if (r == attnSuccess) joins.emplace_back(w.comm, std::move(join));
  }
  note(ncclGroupFlush());
  for (auto& [comm, join] : joins) {
    ApiCall call(comm);
    note(call.finish(deviceJoinAfter(comm, join)));
  }
  return first;
}

}  // namespace

bool inGroup() { return tlsGroup.depth > 0; }
void groupAddP2p(attnComm* comm, const P2pOp& op) { tlsGroup.of(comm).p2p.push_back(op); }
void groupAddDeviceP2p(attnComm* comm, const P2pOp& op) { tlsGroup.of(comm).devP2p.push_back(op); }
void groupAddColl(attnComm* comm, CommOp op) { tlsGroup.of(comm).colls.push_back(std::move(op)); }

}  // namespace attn

using namespace attn;

extern "C" attnResult_t attnGroupStart(void) {
  return guardedEntry([&]() -> attnResult_t {
    ++tlsGroup.depth;
    return attnSuccess;
  });
}

extern "C" attnResult_t attnGroupEnd(void) {
  return guardedEntry([&]() -> attnResult_t {
    if (tlsGroup.depth == 0) {
      ErrorContext ctx("-");
      return setError(attnInvalidUsage, "attnGroupEnd without attnGroupStart");
    }
    if (tlsGroup.depth > 1) {
      --tlsGroup.depth;
      return attnSuccess;
    }
    std::string deviceWhy;
    const attnResult_t deviceResult = launchDeviceP2p(tlsGroup.work, &deviceWhy);
    tlsGroup.depth = 0;
    std::vector<CommWork> work;
    for (CommWork& w : tlsGroup.work)
      if (!w.p2p.empty() || !w.colls.empty()) work.push_back(std::move(w));
    tlsGroup.work.clear();
    // A device failure is reported after the host work ran (its peers wait
    // for it), with its own text.
    auto withDevice = [&](attnResult_t r) {
      if (deviceResult == attnSuccess) return r;
      ErrorContext none("-");
      return setError(deviceResult, "%s", deviceWhy.c_str());
    };
    if (work.empty()) return withDevice(attnSuccess);
    // Non-blocking communicators take their share on their executor.
    bool async = false;
    for (auto& w : work)
      if (!w.comm->config.blocking) async = true;
    if (async) {
      if (work.size() > 1) {
        ErrorContext ctx(work[0].comm->prefix);
        return setError(attnInvalidUsage,
                        "a group over several non-blocking communicators is not supported");
      }
      auto shared = std::make_shared<CommWork>(std::move(work[0]));
      shared->comm->executor->submit([shared] { return runWork(*shared); });
      return withDevice(attnInProgress);
    }
    if (work.size() == 1) return withDevice(runWork(work[0]));
    std::vector<attnResult_t> results(work.size(), attnSuccess);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < work.size(); ++i)
      threads.emplace_back([&, i] { results[i] = runWork(work[i]); });
    for (auto& t : threads) t.join();
    for (attnResult_t r : results)
      if (r != attnSuccess) return withDevice(r);
    return withDevice(attnSuccess);
  });
}
