#include "src/attn/head_groups.h"

namespace attn {

std::vector<HeadGroup> headGroups(int hq, int hkv, int nranks) {
  const int g = hq / hkv;  // query heads per KV head
  std::vector<HeadGroup> out(nranks);
  if (hkv >= nranks) {
    for (int r = 0; r < nranks; ++r) {
      HeadGroup& h = out[r];
      h.kvBegin = static_cast<int>(static_cast<long long>(r) * hkv / nranks);
      h.kvEnd = static_cast<int>(static_cast<long long>(r + 1) * hkv / nranks);
      h.qBegin = h.kvBegin * g;
      h.qEnd = h.kvEnd * g;
    }
    return out;
  }
  // Ranks [first, last) share KV head k: first = k * N / Hkv.
  for (int k = 0; k < hkv; ++k) {
    const int first = static_cast<int>(static_cast<long long>(k) * nranks / hkv);
    const int last = static_cast<int>(static_cast<long long>(k + 1) * nranks / hkv);
    const int m = last - first;
    for (int j = 0; j < m; ++j) {
      HeadGroup& h = out[first + j];
      h.qBegin = k * g + j * g / m;
      h.qEnd = k * g + (j + 1) * g / m;
      if (h.empty()) continue;  // more ranks than query heads here
      h.kvBegin = k;
      h.kvEnd = k + 1;
    }
  }
  return out;
}

}  // namespace attn
