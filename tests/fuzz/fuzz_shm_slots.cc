// The shared-memory transport's receiver reads slot headers a peer process
// writes into the ring they share: here the peer is the fuzzer. A real
// ShmConnection (tests/support/shm_far_end.h) gets a few posted receives;
// the input then publishes slots one by one (any message number, size,
// offset, chunk length, kind, and now and then rewrites a slot already
// published), with progress() run after each. Progress must end, and
// nothing may be written outside the posted buffers or into the buffer of a
// receive that has ended (it is freed then).
//
// Input: receives-1 (1 byte, mod 4), each receive's capacity (2 bytes, big
// endian, mod 4097), whether the receiver reads by CMA (1 byte, low bit),
// then slots of 9 bytes: kind / rewrite (1), message number (1), message
// size (2), offset (2), chunk bytes (2), fill (1).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fuzz/fuzz_input.h"

#include "tests/support/shm_far_end.h"

namespace {

using attn::fuzz::Input;

void drain(attn::testing::ShmFarEnd& far, std::vector<std::unique_ptr<char[]>>& bufs,
           const std::vector<std::unique_ptr<attn::Request>>& reqs) {
  for (int i = 0; i < 1000; ++i) {
    bool progressed = false;
    const bool ok = far.conn().progress(&progressed) == attnSuccess;
    for (size_t r = 0; r < reqs.size(); ++r)
      if (!reqs[r]->pending()) bufs[r].reset();
    if (!ok || !progressed) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  Input in{data, size};
  const int nrecv = 1 + in.byte() % 4;
  std::vector<size_t> caps;
  for (int i = 0; i < nrecv; ++i) caps.push_back(in.u16() % 4097);
  attn::testing::ShmFarEnd::Options o;
  o.inMode = (in.byte() & 1) ? attn::shm::kDirectCma : attn::shm::kDirectNone;
  o.sameProcess = false;  // a peer process: never trusted with addresses
  o.timeoutMs = 100;
  o.nslots = 4;
  o.slotBytes = 4096;

  // Requests outlive the connection: closing it fails those still queued.
  std::vector<std::unique_ptr<char[]>> bufs;
  std::vector<std::unique_ptr<attn::Request>> reqs;
  {
    attn::testing::ShmFarEnd far(o);
    if (!far.ok()) return 0;
    for (size_t cap : caps) {
      bufs.emplace_back(new char[cap ? cap : 1]);
      reqs.emplace_back(new attn::Request);
      (void)far.conn().postRecv(bufs.back().get(), cap, reqs.back().get());
    }
    uint64_t next = 0;  // the next slot to publish
    while (in.n >= 9) {
      const uint8_t kindByte = in.byte();
      const uint64_t msgIndex = in.byte() % 8;
      const uint64_t msgBytes = in.u16(), offset = in.u16(), chunk = in.u16();
      const uint8_t fill = in.byte();
      const bool rewrite = (kindByte & 0x80) && next > 0;
      // A sender never runs more than the ring ahead of what was consumed.
      const uint64_t tail = far.peerOut().hdr->tail.load(std::memory_order_acquire);
      if (!rewrite && next - tail >= o.nslots) {
        drain(far, bufs, reqs);
        continue;
      }
      const uint64_t i = rewrite ? next - 1 : next++;
      attn::shm::SlotHeader& s = far.slot(i);
      s.msgIndex = msgIndex;
      s.msgBytes = msgBytes;
      s.offset = offset;
      s.chunkBytes = chunk;
      s.kind = kindByte % 4;
      s.addr = uint64_t(fill) << 12;  // CMA from such an address fails: EFAULT
      std::memset(s.small, fill, sizeof(s.small));
      std::memset(far.peerOut().slotData(i), fill, far.peerOut().slotBytes);
      if (!rewrite) far.publish(i);
      drain(far, bufs, reqs);
    }
    drain(far, bufs, reqs);
    for (size_t r = 0; r < reqs.size(); ++r)
      if (reqs[r]->state.load() == attn::Request::kDone && reqs[r]->bytes > caps[r]) std::abort();
  }  // the connection closes
  return 0;
}
