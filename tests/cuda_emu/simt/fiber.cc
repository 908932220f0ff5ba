// Fiber switching: hand-written on x86-64 (callee-saved registers, the SSE
// and x87 control words), ucontext elsewhere.
#include "tests/cuda_emu/simt/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace attn_simt {

#if defined(__x86_64__)

extern "C" void attnSimtSwitch(void** saveSp, void* loadSp);
extern "C" void attnSimtTrampoline();

// Frame on a suspended fiber's stack, from its saved sp upwards: control
// words (mxcsr, x87), r15, r14, r13, r12, rbx, rbp, return address.
asm(R"(
  .text
  .p2align 4
  .globl attnSimtSwitch
  .type attnSimtSwitch, @function
attnSimtSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size attnSimtSwitch, .-attnSimtSwitch

  .p2align 4
  .globl attnSimtTrampoline
  .type attnSimtTrampoline, @function
attnSimtTrampoline:
  movq %r13, %rdi
  callq *%r12
  ud2
  .size attnSimtTrampoline, .-attnSimtTrampoline
)");

void switchFiber(FiberContext* from, FiberContext* to) { attnSimtSwitch(&from->sp, to->sp); }

void makeFiber(FiberContext* ctx, void* stack, size_t bytes, void (*entry)(void*), void* arg) {
  // The trampoline is entered by `ret` with rsp = (return slot) + 8 and
  // must `call` with rsp 16-byte aligned: the return slot sits at 8 mod 16.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* slot = reinterpret_cast<uint64_t*>(top - 24);
  slot[0] = reinterpret_cast<uint64_t>(&attnSimtTrampoline);
  uint64_t* frame = slot - 7;
  uint32_t* cw = reinterpret_cast<uint32_t*>(frame);
  cw[0] = 0x1F80;  // mxcsr: every exception masked, round to nearest
  cw[1] = 0x037F;  // x87 control word: the same
  frame[1] = 0;                                    // r15
  frame[2] = 0;                                    // r14
  frame[3] = reinterpret_cast<uint64_t>(arg);      // r13
  frame[4] = reinterpret_cast<uint64_t>(entry);    // r12
  frame[5] = 0;                                    // rbx
  frame[6] = 0;                                    // rbp
  ctx->sp = frame;
}

#else  // portable fallback

namespace {
struct UContextFiber {
  ucontext_t uc;
};
}  // namespace

void switchFiber(FiberContext* from, FiberContext* to) {
  if (from->sp == nullptr) from->sp = new UContextFiber();  // the scheduler's own context
  swapcontext(&static_cast<UContextFiber*>(from->sp)->uc, &static_cast<UContextFiber*>(to->sp)->uc);
}

void makeFiber(FiberContext* ctx, void* stack, size_t bytes, void (*entry)(void*), void* arg) {
  auto* f = static_cast<UContextFiber*>(ctx->sp);
  if (f == nullptr) ctx->sp = f = new UContextFiber();
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = stack;
  f->uc.uc_stack.ss_size = bytes;
  f->uc.uc_link = nullptr;
  // makecontext passes int arguments: split the pointers.
  auto* call = +[](unsigned eh, unsigned el, unsigned ah, unsigned al) {
    auto fn = reinterpret_cast<void (*)(void*)>((uintptr_t(eh) << 32) | el);
    fn(reinterpret_cast<void*>((uintptr_t(ah) << 32) | al));
  };
  const uintptr_t e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&f->uc, reinterpret_cast<void (*)()>(call), 4, unsigned(e >> 32), unsigned(e),
              unsigned(a >> 32), unsigned(a));
}

#endif

FiberStacks::~FiberStacks() {
  if (base_) munmap(base_, mapped_);
}

bool FiberStacks::reserve(int count, size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t slot = ((bytes + page - 1) / page) * page + page;
  if (count <= count_ && slot <= slot_) return true;
  if (base_) munmap(base_, mapped_);
  base_ = nullptr;
  count_ = 0;
  mapped_ = slot * size_t(count);
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return false;
  for (int i = 0; i < count; ++i) mprotect(static_cast<char*>(p) + size_t(i) * slot, page, PROT_NONE);
  base_ = p;
  slot_ = slot;
  guard_ = page;
  count_ = count;
  return true;
}

}  // namespace attn_simt
