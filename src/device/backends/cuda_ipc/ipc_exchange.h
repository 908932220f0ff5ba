// The small host-side handshakes of the cuda_ipc backend, over the
// communicator's host transport (the progress engine: shm between the
// ranks of a host). They run on the proxy thread inside a stream-bridge
// work item, where device operations are serialised in issue order, so
// every rank meets them in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attncomm.h"
#include "src/core/engine.h"

namespace attn::ipc {

// Sends toPeer[p] to every peer p and receives fromPeer[p] from each
// (fromPeer[me] = toPeer[me]). Records are fixed-size raw bytes.
attnResult_t exchangeBytes(Engine& e, const void* toPeer, void* fromPeer, size_t recordBytes);

template <class T>
attnResult_t exchangeRecords(Engine& e, const std::vector<T>& toPeer, std::vector<T>* fromPeer) {
  static_assert(std::is_trivially_copyable_v<T>);
  fromPeer->assign(toPeer.size(), T{});
  return exchangeBytes(e, toPeer.data(), fromPeer->data(), sizeof(T));
}

// The same record to every peer.
template <class T>
attnResult_t allGatherRecord(Engine& e, const T& mine, std::vector<T>* all) {
  return exchangeRecords(e, std::vector<T>(e.nranks(), mine), all);
}

// Ends a phase of an operation: every rank reports whether its part
// succeeded (mine; the thread's error text holds why when it failed), and
// none returns before all are done, so no rank frees or reuses a buffer a
// peer may still read. Returns mine when it failed (its text kept), else
// attnRemoteError naming the first failed rank, else attnSuccess.
attnResult_t settle(Engine& e, attnResult_t mine, const char* what);

}  // namespace attn::ipc
