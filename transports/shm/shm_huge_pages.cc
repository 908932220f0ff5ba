#include "transports/shm/shm_huge_pages.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "src/core/log.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack the name
#endif

namespace attn::shm {

namespace {

double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// CPU time, not wall time: a rank preempted during a cheap collapse must not
// look like one that copied. ENOMEM from either call may only mean that the
// rounded-out range reaches past the mapping; the mapped part is still done.
int collapseRange(uintptr_t begin, size_t bytes, double* cpuSeconds) {
  void* p = reinterpret_cast<void*>(begin);
  const double t0 = threadCpuSeconds();
  int err = 0;
  if (madvise(p, bytes, MADV_HUGEPAGE) != 0 && errno != ENOMEM)
    err = errno;
  else if (madvise(p, bytes, MADV_COLLAPSE) != 0)
    err = errno;
  *cpuSeconds = threadCpuSeconds() - t0;
  return err;
}

// The THP page size, or 0 when THP is off ("never") or absent.
size_t thpPageBytes() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(enabled, modes) || modes.find("[never]") != std::string::npos) return 0;
  std::ifstream size("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  size_t bytes = 0;
  if (!(size >> bytes) || bytes == 0 || (bytes & (bytes - 1)) != 0) return 0;
  return bytes;
}

// Rounding out costs up to a huge page of memory at each end of a buffer:
// fine at 2 MiB, not at the 32-512 MiB of 16/64 KiB base pages.
constexpr size_t kMaxHugePageBytes = 2u << 20;

HugePageAdvisor* makeProcessAdvisor() {
  const size_t page = thpPageBytes();
  // An empty range still has its advice checked: EINVAL means this kernel
  // does not know MADV_COLLAPSE.
  static char probe;
  const uintptr_t basePage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* probePage = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(&probe) & ~(basePage - 1));
  if (page == 0 || page > kMaxHugePageBytes || madvise(probePage, 0, MADV_COLLAPSE) != 0) {
    ATTN_INFO(kLogShm, "no 2 MiB transparent huge pages here: CMA copies from small pages");
    return nullptr;
  }
  ATTN_INFO(kLogShm, "large buffers copied with CMA are moved to %zu KiB pages", page >> 10);
  return new HugePageAdvisor(page, collapseRange);
}

}  // namespace

HugePageAdvisor::HugePageAdvisor(size_t hugePageBytes, CollapseFn collapse)
    : page_(hugePageBytes), collapse_(std::move(collapse)) {}

HugePageAdvisor* HugePageAdvisor::process() {
  static HugePageAdvisor* advisor = makeProcessAdvisor();  // lives until exit
  return advisor;
}

bool HugePageAdvisor::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

HugePageAdvisor::Range* HugePageAdvisor::find(uintptr_t begin, uintptr_t end) {
  for (Range& r : ranges_)
    if (r.begin == begin && r.end == end) return &r;
  return nullptr;
}

void HugePageAdvisor::use(const void* buf, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(buf);
  const uintptr_t begin = addr & ~uintptr_t(page_ - 1);
  const uintptr_t last = addr + bytes - 1;
  if (last < addr) return;  // wraps the address space: not a real buffer
  const uintptr_t end = (last | uintptr_t(page_ - 1)) + 1;
  bool wasCollapsed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    Range* r = find(begin, end);
    if (r == nullptr) {
      if (ranges_.size() == kMaxRanges) ranges_.erase(ranges_.begin());
      ranges_.push_back(Range{begin, end});
      return;  // first use
    }
    if (r->skip) return;
    if (r->collapsed && r->usesToRecheck > 0) {
      --r->usesToRecheck;
      return;
    }
    wasCollapsed = r->collapsed;
  }
  // Outside the lock: a first collapse copies for milliseconds, and other
  // ranks of this process need not wait for it. Two threads collapsing the
  // same range at once is harmless.
  double cpu = 0;
  const int err = collapse_(begin, end - begin, &cpu);
  std::lock_guard<std::mutex> lock(mu_);
  Range* r = find(begin, end);
  if (r == nullptr) return;  // pushed out meanwhile
  // EAGAIN: pages busy (a peer is reading them), try next time. ENOMEM:
  // part of the range is not mapped, or no huge page was free. Anything
  // else (a file mapping, MADV_NOHUGEPAGE): leave the range be.
  if (err != 0 && err != ENOMEM) {
    if (err != EAGAIN) {
      r->skip = true;
      ATTN_TRACE(kLogShm, "huge pages for %#lx+%zu KiB refused: %s", (unsigned long)begin,
                 (size_t)(end - begin) >> 10, strerror(err));
    }
    return;
  }
  const double pages = static_cast<double>((end - begin) / page_);
  const bool realWork = cpu > kRealWorkPerPage * pages;
  if (realWork)
    ATTN_TRACE(kLogShm, "collapsed %#lx+%zu KiB to huge pages in %.2f ms", (unsigned long)begin,
               (size_t)(end - begin) >> 10, cpu * 1e3);
  r->collapsed = true;
  r->usesToRecheck = kRecheckEvery - 1;
  if (!(wasCollapsed && realWork)) return;
  // Huge before, 4 KiB again now: the buffer was freed and mapped anew.
  ++strikes_;
  if (++r->strikes >= kStrikesPerRange) r->skip = true;
  if (strikes_ >= kStrikesInAll) {
    stopped_ = true;
    ATTN_INFO(kLogShm,
              "buffers keep coming back on 4 KiB pages (allocated per call?): no more huge-page "
              "collapses in this process");
  }
}

}  // namespace attn::shm
