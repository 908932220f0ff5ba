// Whether a stream of this process may be parked on a proxy, for the frees
// that wait for the whole device (cudaFree, cudaFreeHost).
//
// A stream with a device communicator's operation queued waits
// (cuStreamWaitValue32) until that rank's proxy has run it, and the proxy
// may wait for a peer rank's next call. When ranks share a GPU and that
// peer's thread makes a device-wide free, the free waits for the parked
// stream and the stream for the thread: neither ends. Such a free is safe
// only while no bridge of the process has work queued or running, and
// while none can start one: whileNoneParked checks the first and holds
// off StreamBridge::enqueue for the second. A launch of a CUDA graph that
// holds a bridge's captured operations cannot be held off, so while such
// graphs exist the bridge counts as parked.
#pragma once

#include <functional>
#include <mutex>

namespace attn {

class StreamBridge;

namespace parked {

// Each StreamBridge is registered while it lives.
void add(const StreamBridge* bridge);
void remove(const StreamBridge* bridge);

// Held by StreamBridge::enqueue while it parks a stream.
std::mutex& enqueueGate();

// Runs `fn` with enqueues held off, if no registered bridge has work queued
// or running; returns whether it ran. Never waits for a bridge.
bool whileNoneParked(const std::function<void()>& fn);

}  // namespace parked
}  // namespace attn
