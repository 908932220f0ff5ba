// The agreement step of attnCommShrink (protocol in shrink_agreement.h).
#include "src/core/shrink_agreement.h"

#include <algorithm>
#include <string>

#include "src/core/bootstrap.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {

namespace {

enum MsgType : int32_t {
  kGreet = 1,    // leader -> each survivor of its list
  kRequest = 2,  // follower -> its leader: the digest of its list
  kRefuse = 3,   // answer to a greeting or request that does not fit the receiver's list
  kVerdict = 4,  // leader -> its survivors: agreed (with the id) or failed; and any
                 // failing rank -> the survivors of its list: failed
};
// How long a failing rank tries to reach each excluded rank.
constexpr int kExcludedTryMs = 100;

enum Outcome : int32_t { kAgreed = 0, kListsDiffer = 1, kUnreachable = 2, kNoRoot = 3, kExcluded = 4 };

// One fixed-size message for every step, so that any of them can be
// received from any peer with one recvAny.
struct ShrinkMsg {
  int32_t type;
  int32_t rank;     // the sender's rank in the parent (a check)
  int32_t count;    // kRequest: length of the sender's exclude list
  int32_t outcome;  // kVerdict
  int32_t rankA;    // kVerdict, kListsDiffer: rank A's list differs from rank B's;
  int32_t rankB;    //   kUnreachable: rank B could not reach rank A;
                    //   kExcluded: the group rank A leads formed without rank B
  uint64_t digest;  // kRequest: of the sender's sorted exclude list
  attnUniqueId id;  // kVerdict, kAgreed
};

uint64_t listDigest(const std::vector<int>& sorted) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int r : sorted) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * b));
      h *= 1099511628211ull;
    }
  }
  return h;
}

class Agreement {
 public:
  Agreement(Bootstrap& boot, int rank, int nranks, const std::vector<int>& excluded, uint32_t tag)
      : boot_(boot), rank_(rank), excluded_(excluded), tag_(tag), digest_(listDigest(excluded)) {
    for (int r = 0; r < nranks; ++r)
      if (!isExcluded(r)) survivors_.push_back(r);
    leader_ = survivors_.front();
  }

  attnResult_t run(attnUniqueId* id) {
    const attnResult_t r = rank_ == leader_ ? lead() : follow();
    if (r != attnSuccess) return r;
    *id = verdict_.id;
    return attnSuccess;
  }

 private:
  bool isExcluded(int r) const { return std::binary_search(excluded_.begin(), excluded_.end(), r); }

  ShrinkMsg message(int32_t type) const {
    ShrinkMsg m{};
    m.type = type;
    m.rank = rank_;
    m.count = static_cast<int32_t>(excluded_.size());
    m.rankA = m.rankB = -1;
    m.digest = digest_;
    return m;
  }
  attnResult_t post(int peer, const ShrinkMsg& m) { return boot_.send(peer, tag_, &m, sizeof(m)); }
  // Best effort: a peer that cannot be told finds out by itself.
  void tell(int peer, const ShrinkMsg& m) {
    if (post(peer, m) != attnSuccess) {
      ATTN_INFO(kLogInit, "attnCommShrink: rank %d could not tell rank %d: %s", rank_, peer,
                threadLastError().c_str());
      clearThreadLastError();
    }
  }

  // A greeting or request that does not fit this rank's list: its sender
  // learns at once that the lists differ instead of waiting for an answer
  // that would never come.
  void refuse(int peer, const ShrinkMsg& got) {
    ATTN_INFO(kLogInit, "attnCommShrink: rank %d refuses the %s of rank %d: their exclude lists differ", rank_,
              got.type == kGreet ? "greeting" : "request", peer);
    tell(peer, message(kRefuse));
  }

  // Records why this rank fails (the verdict it passes on) and returns the
  // error to report.
  attnResult_t failWith(int32_t outcome, int a, int b) {
    verdict_.outcome = outcome;
    verdict_.rankA = a;
    verdict_.rankB = b;
    switch (outcome) {
      case kListsDiffer:
        return setError(attnInvalidUsage,
                        "attnCommShrink: the survivors passed different exclude lists (rank %d's differs from "
                        "rank %d's)", a, b);
      case kUnreachable: {
        const std::string cause = b == rank_ ? ": " + threadLastError() : std::string();
        return setError(attnRemoteError, "attnCommShrink: rank %d could not hear from survivor rank %d%s", b, a,
                        cause.c_str());
      }
      case kExcluded:
        return setError(attnInvalidUsage,
                        "attnCommShrink: rank %d is excluded from the communicator that the survivors led by "
                        "rank %d formed (excluded ranks do not call attnCommShrink)", b, a);
      default:
        return setError(attnRemoteError, "attnCommShrink: the leader, rank %d, could not start the new "
                        "communicator's bootstrap", b);
    }
  }

  // A failing rank tells every rank (but `skip`, which cannot be reached):
  // a follower waits on its leader alone, and a leader that excludes it
  // may have left before its request came. Only ranks that count the
  // sender as a survivor act on it, so a group that agrees is never
  // failed by an outsider. The excluded ranks may be dead: each gets a
  // short try, after the survivors.
  attnResult_t failAll(attnResult_t r, int skip) {
    const std::string why = threadLastError();
    verdict_.type = kVerdict;
    verdict_.rank = rank_;
    for (int s : survivors_)
      if (s != rank_ && s != skip) tell(s, verdict_);
    for (int x : excluded_)
      if (x != skip && boot_.sendWithin(x, tag_, &verdict_, sizeof(verdict_), kExcludedTryMs) != attnSuccess)
        clearThreadLastError();
    return restoreError(r, why);
  }

  // A failure verdict from a survivor of this list: its lists differ from
  // some survivor's, so ours cannot all agree.
  attnResult_t passOn(const ShrinkMsg& got) {
    switch (got.outcome) {
      case kListsDiffer:
      case kUnreachable:
      case kExcluded:
        return failWith(got.outcome, got.rankA, got.rankB);
      default:
        return failWith(kNoRoot, -1, got.rankB);
    }
  }

  // An excluded rank that calls anyway (the API forbids it) after the
  // group formed would hear from nobody and wait for the timeout: the
  // notice waits in its mailbox and fails its call at once. Each gets a
  // short try, as it may be dead; the survivors already have the id.
  void tellTheExcluded() {
    ShrinkMsg notice = message(kVerdict);
    notice.outcome = kExcluded;
    notice.rankA = rank_;
    for (int x : excluded_) {
      notice.rankB = x;
      if (boot_.sendWithin(x, tag_, &notice, sizeof(notice), kExcludedTryMs) != attnSuccess) clearThreadLastError();
    }
  }

  attnResult_t lead() {
    std::vector<int> pending(survivors_.begin() + 1, survivors_.end());
    for (int m : pending)
      if (post(m, message(kGreet)) != attnSuccess) return failAll(failWith(kUnreachable, m, rank_), m);
    while (!pending.empty()) {
      ShrinkMsg got{};
      int from = -1;
      if (boot_.recvAny(tag_, &got, sizeof(got), pending, &from) != attnSuccess)
        return failAll(failWith(kUnreachable, pending.front(), rank_), -1);
      if (isExcluded(from)) {
        if (got.type == kGreet || got.type == kRequest) refuse(from, got);
        continue;
      }
      auto it = std::find(pending.begin(), pending.end(), from);
      if (got.type == kRequest && it != pending.end() && got.rank == from && got.digest == digest_ &&
          got.count == static_cast<int32_t>(excluded_.size())) {
        pending.erase(it);
      } else if (got.type == kVerdict && got.outcome != kAgreed) {
        return failAll(passOn(got), -1);
      } else if (got.type == kRequest || got.type == kGreet || got.type == kRefuse) {
        // A survivor of this list sent another list, leads its own, or
        // refused our greeting.
        return failAll(failWith(kListsDiffer, from, rank_), -1);
      }
    }
    verdict_ = message(kVerdict);
    verdict_.outcome = kAgreed;
    if (bootstrapCreateRoot(&verdict_.id) != attnSuccess) return failAll(failWith(kNoRoot, -1, rank_), -1);
    // A survivor that misses this waits for the timeout: nothing better is
    // left to do once the others may have joined.
    for (size_t i = 1; i < survivors_.size(); ++i)
      if (post(survivors_[i], verdict_) != attnSuccess)
        ATTN_WARN(kLogInit, "attnCommShrink: the unique id did not reach rank %d", survivors_[i]);
    tellTheExcluded();
    clearThreadLastError();
    return attnSuccess;
  }

  attnResult_t follow() {
    if (post(leader_, message(kRequest)) != attnSuccess)
      return failAll(failWith(kUnreachable, leader_, rank_), leader_);
    const std::vector<int> awaited = {leader_};
    for (;;) {
      ShrinkMsg got{};
      int from = -1;
      if (boot_.recvAny(tag_, &got, sizeof(got), awaited, &from) != attnSuccess)
        return failAll(failWith(kUnreachable, leader_, rank_), leader_);
      if (from == leader_) {
        if (got.type == kVerdict && got.outcome == kAgreed) {
          verdict_ = got;
          return attnSuccess;
        }
        if (got.type == kVerdict) return failAll(passOn(got), -1);
        if (got.type == kRefuse || got.type == kRequest) return failAll(failWith(kListsDiffer, rank_, from), -1);
        continue;  // its greeting
      }
      if (got.type == kGreet || got.type == kRequest) {
        refuse(from, got);
      } else if (got.type == kVerdict && got.outcome != kAgreed && !isExcluded(from)) {
        return failAll(passOn(got), -1);
      }
    }
  }

  Bootstrap& boot_;
  const int rank_;
  const std::vector<int>& excluded_;
  const uint32_t tag_;
  const uint64_t digest_;
  std::vector<int> survivors_;
  int leader_ = 0;
  ShrinkMsg verdict_{};  // the leader's, as sent or received; or why this rank failed
};

}  // namespace

attnResult_t agreeOnShrinkId(Bootstrap& boot, int rank, int nranks, const std::vector<int>& excluded,
                             uint32_t tag, attnUniqueId* id) {
  return Agreement(boot, rank, nranks, excluded, tag).run(id);
}

}  // namespace attn
