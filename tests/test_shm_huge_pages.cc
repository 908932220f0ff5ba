// The huge-page advisor of the shm transport: its policy (which ranges get
// collapsed, when it gives up) against a recording collapse function, and
// the real madvise path on this kernel (contents kept, pages huge).
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "transports/shm/shm_huge_pages.h"

namespace attn::shm {
namespace {

constexpr size_t kPage = 2u << 20;

// Records every collapse; answers with `err` and `cpu` seconds per page.
struct FakeCollapse {
  struct Call {
    uintptr_t begin;
    size_t bytes;
  };
  std::vector<Call> calls;
  int err = 0;
  double cpuPerPage = 0;

  HugePageAdvisor::CollapseFn fn() {
    return [this](uintptr_t begin, size_t bytes, double* cpu) {
      calls.push_back({begin, bytes});
      *cpu = cpuPerPage * static_cast<double>(bytes / kPage);
      return err;
    };
  }
};

const void* at(uintptr_t addr) { return reinterpret_cast<const void*>(addr); }

constexpr double kCopied = 1e-3;  // per page: a collapse that copied
constexpr double kNoop = 1e-7;    // per page: the range was huge already

TEST(ShmHugePages, FirstUseNothingThenRoundedOutRange) {
  FakeCollapse fake;
  HugePageAdvisor adv(kPage, fake.fn());
  const uintptr_t base = 64 * kPage;
  adv.use(at(base + 100), 3 * kPage);  // spans 4 pages
  EXPECT_TRUE(fake.calls.empty());
  adv.use(at(base + 100), 3 * kPage);
  ASSERT_EQ(fake.calls.size(), 1u);
  EXPECT_EQ(fake.calls[0].begin, base);
  EXPECT_EQ(fake.calls[0].bytes, 4 * kPage);
  // Then every kRecheckEvery-th use asks again.
  for (uint32_t i = 1; i < HugePageAdvisor::kRecheckEvery; ++i) adv.use(at(base + 100), 3 * kPage);
  EXPECT_EQ(fake.calls.size(), 1u);
  adv.use(at(base + 100), 3 * kPage);
  EXPECT_EQ(fake.calls.size(), 2u);
}

TEST(ShmHugePages, SmallBlocksShareTheirPage) {
  FakeCollapse fake;
  HugePageAdvisor adv(kPage, fake.fn());
  const uintptr_t base = 64 * kPage;
  // Eight 256 KiB all-to-all blocks of one buffer, twice: one range.
  for (int i = 0; i < 2; ++i)
    for (int b = 0; b < 8; ++b) adv.use(at(base + b * (256u << 10)), 256u << 10);
  ASSERT_EQ(fake.calls.size(), 2u);  // at the 2nd and the 10th use
  for (const auto& c : fake.calls) {
    EXPECT_EQ(c.begin, base);
    EXPECT_EQ(c.bytes, kPage);
  }
}

TEST(ShmHugePages, EmptyAndWrappingBuffersAreIgnored) {
  FakeCollapse fake;
  HugePageAdvisor adv(kPage, fake.fn());
  for (int i = 0; i < 3; ++i) {
    adv.use(at(64 * kPage), 0);
    adv.use(at(UINTPTR_MAX - 10), 100);
  }
  EXPECT_TRUE(fake.calls.empty());
}

TEST(ShmHugePages, RangeRemappedEveryTimeIsLeftAlone) {
  FakeCollapse fake;
  fake.cpuPerPage = kCopied;  // each collapse copies: the buffer is new each time
  HugePageAdvisor adv(kPage, fake.fn());
  const void* buf = at(64 * kPage);
  adv.use(buf, kPage);  // first use
  adv.use(buf, kPage);  // first collapse: copying is expected, no strike
  for (int i = 0; i < HugePageAdvisor::kStrikesPerRange; ++i)
    for (uint32_t u = 0; u < HugePageAdvisor::kRecheckEvery; ++u) adv.use(buf, kPage);
  const size_t calls = fake.calls.size();
  EXPECT_EQ(calls, 1u + HugePageAdvisor::kStrikesPerRange);
  for (uint32_t i = 0; i < 3 * HugePageAdvisor::kRecheckEvery; ++i) adv.use(buf, kPage);
  EXPECT_EQ(fake.calls.size(), calls);
  EXPECT_FALSE(adv.stopped());
}

TEST(ShmHugePages, CheapRecollapsesAreNoStrikes) {
  FakeCollapse fake;
  fake.cpuPerPage = kNoop;
  HugePageAdvisor adv(kPage, fake.fn());
  const void* buf = at(64 * kPage);
  const uint32_t uses = 2 + 20 * HugePageAdvisor::kRecheckEvery;
  for (uint32_t i = 0; i < uses; ++i) adv.use(buf, 8 * kPage);
  EXPECT_EQ(fake.calls.size(), 21u);
}

TEST(ShmHugePages, StopsWhenBuffersKeepComingBackOnSmallPages) {
  FakeCollapse fake;
  fake.cpuPerPage = kCopied;
  HugePageAdvisor adv(kPage, fake.fn());
  int range = 0;
  while (!adv.stopped() && range < 100) {
    const void* buf = at((64 + 4 * range++) * kPage);
    const uint32_t uses = 2 + HugePageAdvisor::kStrikesPerRange * HugePageAdvisor::kRecheckEvery;
    for (uint32_t i = 0; i < uses; ++i) adv.use(buf, kPage);
  }
  EXPECT_TRUE(adv.stopped());
  EXPECT_EQ(range, HugePageAdvisor::kStrikesInAll / HugePageAdvisor::kStrikesPerRange);
  const size_t calls = fake.calls.size();
  const void* fresh = at(1024 * kPage);
  for (int i = 0; i < 3; ++i) adv.use(fresh, kPage);
  EXPECT_EQ(fake.calls.size(), calls);
}

TEST(ShmHugePages, ErrorsDecideWhetherToTryAgain) {
  const void* buf = at(64 * kPage);
  {
    FakeCollapse fake;  // busy pages: try again at the next use
    fake.err = EAGAIN;
    HugePageAdvisor adv(kPage, fake.fn());
    for (int i = 0; i < 4; ++i) adv.use(buf, kPage);
    EXPECT_EQ(fake.calls.size(), 3u);
  }
  {
    FakeCollapse fake;  // partly unmapped: the mapped part is done, as on success
    fake.err = ENOMEM;
    HugePageAdvisor adv(kPage, fake.fn());
    for (uint32_t i = 0; i < 1 + HugePageAdvisor::kRecheckEvery; ++i) adv.use(buf, kPage);
    EXPECT_EQ(fake.calls.size(), 1u);
    adv.use(buf, kPage);
    EXPECT_EQ(fake.calls.size(), 2u);
  }
  FakeCollapse fake;  // refused (a file mapping, MADV_NOHUGEPAGE): never again
  fake.err = EINVAL;
  HugePageAdvisor adv(kPage, fake.fn());
  for (uint32_t i = 0; i < 3 * HugePageAdvisor::kRecheckEvery; ++i) adv.use(buf, kPage);
  EXPECT_EQ(fake.calls.size(), 1u);
}

TEST(ShmHugePages, OldestRangeIsForgottenWhenFull) {
  FakeCollapse fake;
  HugePageAdvisor adv(kPage, fake.fn());
  const void* first = at(64 * kPage);
  adv.use(first, kPage);
  for (size_t i = 1; i <= HugePageAdvisor::kMaxRanges; ++i) adv.use(at((64 + 2 * i) * kPage), kPage);
  adv.use(first, kPage);  // seen once more, but forgotten: a first use again
  EXPECT_TRUE(fake.calls.empty());
  adv.use(first, kPage);
  EXPECT_EQ(fake.calls.size(), 1u);
}

// AnonHugePages of the mapping that holds `addr`, from /proc/self/smaps.
long anonHugeKiB(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= reinterpret_cast<uintptr_t>(addr) && reinterpret_cast<uintptr_t>(addr) < hi;
      continue;
    }
    long kib = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &kib) == 1) return kib;
  }
  return -1;
}

TEST(ShmHugePages, RealCollapseKeepsContentsAndMakesHugePages) {
  HugePageAdvisor* adv = HugePageAdvisor::process();
  if (adv == nullptr) GTEST_SKIP() << "no MADV_COLLAPSE or THP is off on this kernel";
  // 8 huge pages, aligned, filled on 4 KiB pages before anyone advises.
  const size_t bytes = 8 * kPage;
  void* raw = mmap(nullptr, bytes + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kPage - 1) &
                                          ~uintptr_t(kPage - 1));
  madvise(base, bytes, MADV_NOHUGEPAGE);  // fault in 4 KiB pages whatever the THP mode
  for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<uint8_t>(i * 7 + 3);
  const long before = anonHugeKiB(base + 2 * kPage);
  // A message in the middle: rounding out covers pages 2..5.
  uint8_t* msg = base + 2 * kPage + 4096;
  const size_t msgBytes = 3 * kPage;
  adv->use(msg, msgBytes);
  adv->use(msg, msgBytes);
  const long after = anonHugeKiB(msg);
  for (size_t i = 0; i < bytes; ++i)
    ASSERT_EQ(base[i], static_cast<uint8_t>(i * 7 + 3)) << "byte " << i;
  munmap(raw, bytes + kPage);
  EXPECT_EQ(before, 0);
  // Pages 2..5 collapsed (a busy system may refuse some: EAGAIN).
  EXPECT_GT(after, 0) << "no huge page after MADV_COLLAPSE";
}

TEST(ShmHugePages, RealAdvisorToleratesUnmappedAndReadOnlyMemory) {
  HugePageAdvisor* adv = HugePageAdvisor::process();
  if (adv == nullptr) GTEST_SKIP() << "no MADV_COLLAPSE or THP is off on this kernel";
  // A mapping with a hole: the rounded-out range reaches unmapped memory.
  void* raw = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(raw);
  munmap(p + 2 * kPage, kPage);
  std::memset(p, 1, 2 * kPage);
  for (int i = 0; i < 3; ++i) adv->use(p + 100, 2 * kPage - 200);
  EXPECT_EQ(p[kPage], 1);
  // A read-only file mapping.
  FILE* f = tmpfile();
  ASSERT_NE(f, nullptr);
  std::vector<char> data(kPage, 'x');
  ASSERT_EQ(fwrite(data.data(), 1, data.size(), f), data.size());
  fflush(f);
  void* file = mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE, fileno(f), 0);
  ASSERT_NE(file, MAP_FAILED);
  for (int i = 0; i < 3; ++i) adv->use(file, kPage);
  EXPECT_EQ(static_cast<const char*>(file)[kPage - 1], 'x');
  munmap(file, kPage);
  fclose(f);
  munmap(p, 2 * kPage);
  munmap(p + 3 * kPage, kPage);
}

}  // namespace
}  // namespace attn::shm
