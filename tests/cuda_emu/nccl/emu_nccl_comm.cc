// The emulated NCCL's communicators: ids, init, split, shrink, abort,
// destroy, queries and error texts. Blocking calls, as NCCL's with a
// default config.
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>

#include "tests/cuda_emu/emu_core.h"
#include "tests/cuda_emu/nccl/emu_nccl.h"

namespace attn_emu::nccl {
namespace {

thread_local std::string tlsLastError;

constexpr char kIdMagic[] = "attn-emu-nccl";

struct IdBody {
  char magic[sizeof(kIdMagic)];
  pid_t pid;
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES, "the id holds its body");

// ncclCommInitRank's meeting place: an id's clique until all its ranks came.
struct Pending {
  std::shared_ptr<Clique> clique;
  int joined = 0;
};
std::mutex gInitMu;
std::condition_variable gInitCv;
std::map<std::string, Pending> gPending;

bool validComm(ncclComm_t c) { return c != nullptr && c->st != nullptr; }

ncclComm_t wrap(std::shared_ptr<RankState> st) { return new ncclComm{std::move(st)}; }

}  // namespace

ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  tlsLastError = buf;
  return r;
}

std::string Clique::broken(const std::vector<int>& ranks) const {
  if (!abortedBy.empty()) return abortedBy;
  for (int r : ranks)
    if (gone[size_t(r)]) return "rank " + std::to_string(r) + " aborted its communicator";
  return "";
}

void RankState::failAsync(ncclResult_t r, const std::string& why) {
  int none = ncclSuccess;
  if (!asyncError.compare_exchange_strong(none, r)) return;
  std::lock_guard<std::mutex> g(textMu);
  asyncText = "rank " + std::to_string(rank) + ": " + why;
}

std::vector<int> everyRank(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) v[static_cast<size_t>(r)] = r;
  return v;
}

std::shared_ptr<RankState> makeRank(std::shared_ptr<Clique> clique, int rank, int device) {
  auto st = std::make_shared<RankState>();
  st->sendSeq.assign(size_t(clique->nranks), 0);
  st->recvSeq.assign(size_t(clique->nranks), 0);
  st->clique = std::move(clique);
  st->rank = rank;
  st->device = device;
  return st;
}

}  // namespace attn_emu::nccl

using namespace attn_emu::nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (validComm(comm) && comm->st->asyncError.load() != ncclSuccess) {
    thread_local std::string copy;
    std::lock_guard<std::mutex> g(comm->st->textMu);
    copy = comm->st->asyncText;
    return copy.c_str();
  }
  return tlsLastError.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  IdBody b{};
  std::memcpy(b.magic, kIdMagic, sizeof(kIdMagic));
  b.pid = getpid();
  b.nonce = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, &b, sizeof(b));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
  IdBody b;
  std::memcpy(&b, id.internal, sizeof(b));
  if (std::memcmp(b.magic, kIdMagic, sizeof(kIdMagic)) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
  if (b.pid != getpid())
    return fail(ncclInvalidUsage, "ncclCommInitRank: the emulated NCCL joins threads of one process; this id "
                "was made by process %d", int(b.pid));
  const int device = attn_emu::currentDevice();
  const std::string key(id.internal, sizeof(IdBody));
  std::unique_lock<std::mutex> g(gInitMu);
  Pending& p = gPending[key];
  if (!p.clique) p.clique = std::make_shared<Clique>(nranks);
  std::shared_ptr<Clique> clique = p.clique;
  if (clique->nranks != nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d, but another rank said %d", nranks, clique->nranks);
  *comm = wrap(makeRank(clique, rank, device));
  if (++p.joined == nranks) {
    gPending.erase(key);
    gInitCv.notify_all();
  } else {
    gInitCv.wait(g, [&] { return gPending.count(key) == 0 || gPending[key].clique != clique; });
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

// Several ranks on one device are allowed: that is what the emulation is
// for (attncomm lets ranks share a GPU; NCCL builds that refuse it make the
// tests skip on a GPU).
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: comms NULL or ndev %d", ndev);
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist ? devlist[i] : i;
    if (d < 0 || d >= attn_emu::deviceCount())
      return fail(ncclInvalidArgument, "ncclCommInitAll: device %d of %d", d, attn_emu::deviceCount());
  }
  auto clique = std::make_shared<Clique>(ndev);
  for (int i = 0; i < ndev; ++i) comms[i] = wrap(makeRank(clique, i, devlist ? devlist[i] : i));
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!validComm(comm) || !count) return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
  *count = comm->st->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!validComm(comm) || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
  *rank = comm->st->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!validComm(comm) || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  *device = comm->st->device;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!validComm(comm) || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  *asyncError = static_cast<ncclResult_t>(comm->st->asyncError.load());
  return ncclSuccess;
}

// Operations already queued keep the rank's state and run to their end.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!validComm(comm)) return fail(ncclInvalidArgument, "ncclCommFinalize: NULL comm");
  return ncclSuccess;
}

// The peers' waits for this rank fail (ncclRemoteError, asynchronously),
// and so do this rank's own.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->st) {
    Clique& c = *comm->st->clique;
    std::lock_guard<std::mutex> g(c.mu);
    c.gone[size_t(comm->st->rank)] = true;
    c.cv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (!validComm(comm) || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: NULL argument");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color %d is negative", color);
  *newcomm = nullptr;
  RankState& me = *comm->st;
  Clique& c = *me.clique;
  const uint64_t seq = me.mgmtSeq++;
  const std::vector<int> all = everyRank(c.nranks);
  std::unique_lock<std::mutex> g(c.mu);
  Clique::MgmtSlot& s = c.mgmt[seq];
  if (s.color.empty()) {
    s.color.assign(size_t(c.nranks), -2);
    s.key.assign(size_t(c.nranks), 0);
    s.expected = c.nranks;
  }
  s.color[size_t(me.rank)] = color;
  s.key[size_t(me.rank)] = key;
  if (++s.arrived == s.expected) {
    // Members of each color by (key, parent rank), as NCCL orders them.
    std::map<int, std::vector<std::pair<int, int>>> byColor;
    for (int r = 0; r < c.nranks; ++r)
      if (s.color[size_t(r)] != NCCL_SPLIT_NOCOLOR) byColor[s.color[size_t(r)]].push_back({s.key[size_t(r)], r});
    for (auto& [col, members] : byColor) {
      std::sort(members.begin(), members.end());
      std::vector<int> order;
      for (auto& m : members) order.push_back(m.second);
      s.children[col] = {std::make_shared<Clique>(int(order.size())), order};
    }
    s.built = true;
    c.cv.notify_all();
  }
  std::string why;
  c.cv.wait(g, [&] { return s.built || !(why = c.broken(all)).empty(); });
  if (!s.built) return fail(ncclRemoteError, "ncclCommSplit: %s", why.c_str());
  if (color != NCCL_SPLIT_NOCOLOR) {
    auto& [clique, order] = s.children[color];
    const int newRank = int(std::find(order.begin(), order.end(), me.rank) - order.begin());
    *newcomm = wrap(makeRank(clique, newRank, me.device));
  }
  if (++s.left == s.expected) c.mgmt.erase(seq);
  return ncclSuccess;
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t*, int shrinkFlags) {
  if (!validComm(comm) || !newcomm || (excludeRanksCount > 0 && !excludeRanksList) || excludeRanksCount < 0)
    return fail(ncclInvalidArgument, "ncclCommShrink: NULL argument or negative count");
  *newcomm = nullptr;
  RankState& me = *comm->st;
  Clique& c = *me.clique;
  std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
  std::sort(excluded.begin(), excluded.end());
  for (size_t i = 0; i < excluded.size(); ++i)
    if (excluded[i] < 0 || excluded[i] >= c.nranks || (i && excluded[i] == excluded[i - 1]) ||
        excluded[i] == me.rank)
      return fail(ncclInvalidArgument, "ncclCommShrink: bad exclusion list (rank %d of %d; caller %d)", excluded[i],
                  c.nranks, me.rank);
  std::vector<int> survivors;
  for (int r = 0; r < c.nranks; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) survivors.push_back(r);
  const uint64_t seq = me.mgmtSeq++;
  std::unique_lock<std::mutex> g(c.mu);
  if (shrinkFlags & NCCL_SHRINK_ABORT) {
    // Ongoing operations of the parent end; the shrink itself goes on.
    c.abortedBy = "operations ended by ncclCommShrink(NCCL_SHRINK_ABORT)";
    c.cv.notify_all();
  }
  Clique::MgmtSlot& s = c.mgmt[seq];
  if (s.expected == 0) {
    s.excluded = excluded;
    s.expected = int(survivors.size());
  } else if (s.excluded != excluded && s.mismatch.empty()) {
    s.mismatch = "ranks passed different exclusion lists";
  }
  if (++s.arrived == s.expected) {
    s.children[0] = {std::make_shared<Clique>(int(survivors.size())), survivors};
    s.built = true;
    c.cv.notify_all();
  }
  std::string why;
  // Only the survivors' aborts matter here: the excluded may be dead.
  c.cv.wait(g, [&] {
    if (s.built) return true;
    for (int r : survivors)
      if (c.gone[size_t(r)]) return !(why = "rank " + std::to_string(r) + " aborted its communicator").empty();
    return false;
  });
  const bool built = s.built;
  const std::string mismatch = s.mismatch;
  std::shared_ptr<Clique> child = built ? s.children[0].first : nullptr;
  if (built && ++s.left == s.expected) c.mgmt.erase(seq);
  if (!built) return fail(ncclRemoteError, "ncclCommShrink: %s", why.c_str());
  if (!mismatch.empty()) return fail(ncclInvalidArgument, "ncclCommShrink: %s", mismatch.c_str());
  const int newRank = int(std::find(survivors.begin(), survivors.end(), me.rank) - survivors.begin());
  *newcomm = wrap(makeRank(child, newRank, me.device));
  return ncclSuccess;
}

}  // extern "C"
