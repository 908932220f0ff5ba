// The other process behind a connection: can we read its memory
// (cross-memory attach, process_vm_readv)? Whether it is still alive is
// src/core/process_watch.h.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace attn::shm {

// A random value unique to this process and the address it lives at: a peer
// that reads it back through CMA proves both that CMA is permitted and that
// the pid it used names this very process (no pid-namespace confusion).
struct ProcessProbe {
  uint64_t token;
  uint64_t address;
};
ProcessProbe processProbe();

// Lets any process of ours read this one's memory where the Yama LSM would
// otherwise forbid it (ptrace_scope 1): PR_SET_PTRACER_ANY, process-wide,
// for the rest of its life (Yama keeps one ptracer per process, so the peers
// cannot be named one by one). Done once per process, only there; the shm
// transport asks only when a peer is another process.
void allowCmaReaders();
// Whether allowCmaReaders ran in this process (whatever Yama's setting).
bool cmaReadersRequested();

// True when process_vm_readv from `pid` at probe.address yields probe.token.
bool cmaProbe(pid_t pid, const ProcessProbe& probe);

// Copies `bytes` from `remoteAddr` in process `pid` into `dst`. Returns 0 or
// an errno (ESRCH: the process is gone, EFAULT: bad remote range).
int cmaRead(pid_t pid, void* dst, uint64_t remoteAddr, size_t bytes);

}  // namespace attn::shm
