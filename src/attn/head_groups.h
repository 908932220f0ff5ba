// Which heads each rank attends to in head-parallel attention (CSPS SP-NTP,
// DeepSpeed-Ulysses): the query heads are split into one contiguous range
// per rank, and a range never cuts a GQA group across two KV heads, so each
// rank's share is itself a GQA problem (its query heads over its KV heads).
//
//   Hkv >= N: the KV heads are split as evenly as ranges allow and each rank
//             takes the query heads of its KV heads.
//   Hkv <  N: each KV head is shared by N/Hkv ranks (give or take one), which
//             split its query heads; that KV head goes to each of them. A rank
//             may get no head at all (Hq < N): it only sends and receives.
#pragma once

#include <vector>

namespace attn {

struct HeadGroup {
  int qBegin = 0, qEnd = 0;    // query heads [qBegin, qEnd)
  int kvBegin = 0, kvEnd = 0;  // the KV heads they read
  int q() const { return qEnd - qBegin; }
  int kv() const { return kvEnd - kvBegin; }
  bool empty() const { return qEnd == qBegin; }
};

// One group per rank; every query head is in exactly one group. Requires
// hq % hkv == 0, hkv >= 1, nranks >= 1.
std::vector<HeadGroup> headGroups(int hq, int hkv, int nranks);

}  // namespace attn
