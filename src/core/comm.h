// The communicator object behind attnComm_t.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attncomm.h"
#include "src/core/bootstrap.h"
#include "src/core/config.h"
#include "src/core/engine.h"
#include "src/core/executor.h"
#include "src/core/transport.h"

namespace attn { struct AttnState; struct DeviceState; }
namespace attn { class FabricModel; }
namespace attn { struct CollTopo; }

struct attnComm {
  // A second check behind the handle table (handle_registry.h): set while
  // the communicator lives, cleared when it is freed.
  static constexpr uint64_t kMagic = 0xA77C033D5EEDC0DEull;
  uint64_t magic = kMagic;
  int rank = -1;
  int nranks = 0;
  attn::CommConfig config;
  attnUniqueId id{};
  std::string prefix;  // "rank 2 (host h, pid p)" for messages

  std::unique_ptr<attn::Bootstrap> bootstrap;
  std::vector<attn::PeerInfo> peers;
  // Ranks in proximity order (rack, host, device): rings follow it.
  std::vector<int> topoOrder;
  // Fabric model: every rank's place, tiers with bandwidth/latency
  // (topology/fabric_model.h); the same on every rank.
  std::shared_ptr<attn::FabricModel> fabric;
  std::unique_ptr<attn::Engine> engine;

  std::atomic<bool> abortFlag{false};
  std::atomic<bool> ready{false};
  std::atomic<int> activeCalls{0};  // API calls inside this comm (abort waits)
  uint64_t collSeq = 0;             // collectives issued (signature checks)
  uint32_t shrinkSeq = 0;           // attnCommShrink calls (their bootstrap tags)
  // Made by attnCommShrink: the parent (compared, never dereferenced) and
  // each rank's rank in it, for attnKvPoolShrink.
  const attnComm* shrunkFrom = nullptr;
  std::vector<int> parentRanks;

  // Non-blocking communicators run their operations here.
  std::unique_ptr<attn::Executor> executor;
  std::atomic<attnResult_t> asyncError{attnSuccess};

  // Device communicators (config.device >= 0): the stream bridge and
  // staging memory (src/device); null on host communicators.
  std::shared_ptr<attn::DeviceState> device;

  // Attention collectives' state (src/attn), made on first use.
  std::shared_ptr<attn::AttnState> attnState;
  // Hierarchy and proximity ring of the collectives (src/coll), made once on
  // first use; later calls read it without a lock.
  std::shared_ptr<attn::CollTopo> collTopo;
  std::once_flag collTopoOnce;

  std::mutex errMu;
  std::string lastError;

  void recordError(const std::string& text) {
    std::lock_guard<std::mutex> g(errMu);
    lastError = text;
  }
};

namespace attn {
struct AttnState;
}

namespace attn {

// What error messages and log lines name a rank by: "rank 3 (host h, pid p)".
// Set before init starts and never changed after: API calls on other
// threads read it (ErrorContext borrows it) while a non-blocking init runs.
std::string rankPrefix(int rank);
// Joins the communicator: bootstrap, peer exchange, transport selection and
// connection. Fills comm; collective over the ranks.
attnResult_t commInit(attnComm* comm, const attnUniqueId& id, int nranks, int rank);
// Releases every resource (connections, bootstrap, executor).
void commFree(attnComm* comm);
// Same host as peer?
bool sameHost(const attnComm* comm, int peer);

}  // namespace attn
