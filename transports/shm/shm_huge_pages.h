// Transparent huge pages under the user buffers a peer process copies with
// CMA.
//
// process_vm_readv pins the source pages and copies them one page at a
// time, and on 4 KiB pages the pinning is a large part of the cost
// (sendrecv_perf -p 2 over shm, 4 / 16 / 64 MiB: 6.1 / 3.1 / 3.2 GB/s on
// 4 KiB pages, 7.8 / 4.4 / 4.4 GB/s on 2 MiB pages; perf/RESULTS.md).
// Debian's default THP mode is "madvise", so malloc'd buffers sit on 4 KiB
// pages unless someone asks. We ask, for the buffers of large direct sends
// and receives: MADV_HUGEPAGE marks the range and MADV_COLLAPSE (Linux 6.1)
// rebuilds its pages as huge pages now, contents unchanged.
//
// The range is rounded out to whole huge pages, since all-to-all blocks are
// often smaller than one. That touches only our own process's memory and
// keeps it intact; it is what khugepaged does to any memory under THP
// "always". A collapse copies the range once (about 1 ms per 2 MiB here),
// so the policy pays it only for buffers that come back:
// - the first use of a range does nothing (a buffer used once is not worth
//   a copy);
// - the second use collapses it, and every kRecheckEvery-th use after that
//   collapses again, which costs about a microsecond once the range is huge
//   (two system calls: not on every message, they weigh on 64 KiB ones);
// - a collapse that costs real work again means the range was freed and
//   mapped anew (a caller allocating per call). After kStrikesPerRange of
//   those the range is left alone, after kStrikesInAll the advisor stops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace attn::shm {

class HugePageAdvisor {
 public:
  // Collapses [begin, begin + bytes) to huge pages. Returns 0 and the CPU
  // seconds it took, or an errno.
  using CollapseFn = std::function<int(uintptr_t begin, size_t bytes, double* cpuSeconds)>;

  static constexpr int kStrikesPerRange = 2;
  static constexpr int kStrikesInAll = 16;
  static constexpr size_t kMaxRanges = 256;
  static constexpr uint32_t kRecheckEvery = 8;
  // Above this many CPU seconds per huge page a collapse did real work; a
  // no-op takes ~1 µs for a whole range, a real one ~1 ms per page.
  static constexpr double kRealWorkPerPage = 50e-6;

  HugePageAdvisor(size_t hugePageBytes, CollapseFn collapse);

  // The process-wide advisor, or null when the kernel has no MADV_COLLAPSE,
  // THP is "never", or its pages are larger than 2 MiB.
  static HugePageAdvisor* process();

  // The caller is about to have a peer process copy [buf, buf + bytes).
  void use(const void* buf, size_t bytes);

  bool stopped() const;

 private:
  struct Range {
    uintptr_t begin, end;
    bool collapsed = false;
    uint32_t usesToRecheck = 0;  // uses left before the next collapse
    int strikes = 0;
    bool skip = false;
  };
  Range* find(uintptr_t begin, uintptr_t end);

  const size_t page_;
  const CollapseFn collapse_;
  mutable std::mutex mu_;
  std::vector<Range> ranges_;  // oldest first
  int strikes_ = 0;
  bool stopped_ = false;
};

}  // namespace attn::shm
