// kernelkit/cpu_runtime/context.h: the fiber context switch (part of libkkrt, included by
// cpu_runtime.cpp only). A small assembly switch on x86-64 and aarch64 (callee-saved
// registers and the floating-point control state), ucontext elsewhere or with
// -DKK_RT_UCONTEXT.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(KK_RT_UCONTEXT) || !(defined(__x86_64__) || defined(__aarch64__))
#define KK_RT_USE_UCONTEXT 1
#include <ucontext.h>
#else
#define KK_RT_USE_UCONTEXT 0
#endif

namespace {

// Context switch: kk_rt_ctx_switch(&from_sp, to_sp) saves the callee-saved state
// on the current stack, stores the stack pointer in *from_sp, and resumes to_sp.
#if !KK_RT_USE_UCONTEXT
extern "C" void kk_rt_ctx_switch(void** from_sp, void* to_sp);
extern "C" void kk_rt_fiber_start();
#if defined(__x86_64__)
// Frame (low to high): MXCSR, x87 CW, r15, r14, r13, r12, rbx, rbp, return address.
// A new fiber "returns" into kk_rt_fiber_start with r12 = argument, rbx = function.
asm(R"(
  .text
  .p2align 4
  .globl kk_rt_ctx_switch
  .hidden kk_rt_ctx_switch
  .type kk_rt_ctx_switch,@function
kk_rt_ctx_switch:
  .byte 0xf3, 0x0f, 0x1e, 0xfa   # endbr64
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
  .size kk_rt_ctx_switch, .-kk_rt_ctx_switch

  .p2align 4
  .globl kk_rt_fiber_start
  .hidden kk_rt_fiber_start
  .type kk_rt_fiber_start,@function
kk_rt_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%rbx
  ud2
  .cfi_endproc
  .size kk_rt_fiber_start, .-kk_rt_fiber_start
)");
#elif defined(__aarch64__)
// Frame (low to high): x19..x28, x29 (fp), x30 (lr), d8..d15, FPCR; 176 bytes.
// FPCR (rounding mode, flush-to-zero) is written back only when it differs.
// A new fiber "returns" into kk_rt_fiber_start with x19 = argument, x20 = function.
asm(R"(
  .text
  .p2align 4
  .globl kk_rt_ctx_switch
  .hidden kk_rt_ctx_switch
  .type kk_rt_ctx_switch,%function
kk_rt_ctx_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mrs x3, fpcr
  str x3, [sp, #160]
  mov x2, sp
  str x2, [x0]
  mov sp, x1
  ldr x2, [sp, #160]
  cmp x2, x3
  b.eq 1f
  msr fpcr, x2
1:
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
  .size kk_rt_ctx_switch, .-kk_rt_ctx_switch

  .p2align 4
  .globl kk_rt_fiber_start
  .hidden kk_rt_fiber_start
  .type kk_rt_fiber_start,%function
kk_rt_fiber_start:
  .cfi_startproc
  .cfi_undefined x30
  mov x0, x19
  blr x20
  brk #0
  .cfi_endproc
  .size kk_rt_fiber_start, .-kk_rt_fiber_start
)");
#endif
#endif

struct Ctx {
#if KK_RT_USE_UCONTEXT
  ucontext_t uc;
#else
  void* sp;
#endif
};

inline void ctx_switch(Ctx* from, Ctx* to) {
#if KK_RT_USE_UCONTEXT
  swapcontext(&from->uc, &to->uc);
#else
  kk_rt_ctx_switch(&from->sp, to->sp);
#endif
}

#if KK_RT_USE_UCONTEXT
// makecontext passes ints only: the function and its argument in halves.
void uc_trampoline(unsigned fn_hi, unsigned fn_lo, unsigned arg_hi, unsigned arg_lo) {
  auto fn = reinterpret_cast<void (*)(void*)>((uintptr_t(fn_hi) << 32) | uintptr_t(fn_lo));
  fn(reinterpret_cast<void*>((uintptr_t(arg_hi) << 32) | uintptr_t(arg_lo)));
}
#endif

// Prepares c so that switching to it calls fn(arg) on the stack [lo, hi).
void ctx_make(Ctx* c, char* lo, char* hi, void (*fn)(void*), void* arg) {
#if KK_RT_USE_UCONTEXT
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = lo;
  c->uc.uc_stack.ss_size = size_t(hi - lo);
  c->uc.uc_link = nullptr;
  const uintptr_t f = reinterpret_cast<uintptr_t>(fn), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(uc_trampoline), 4, unsigned(f >> 32),
              unsigned(f & 0xffffffffu), unsigned(a >> 32), unsigned(a & 0xffffffffu));
#elif defined(__x86_64__)
  (void)lo;
  uintptr_t top = reinterpret_cast<uintptr_t>(hi) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 128);
  uint32_t fp[2] = {0, 0};
  asm volatile("stmxcsr %0" : "=m"(fp[0]));
  asm volatile("fnstcw %0" : "=m"(fp[1]));
  memcpy(&sp[0], fp, 8);
  sp[1] = sp[2] = sp[3] = nullptr;                     // r15 r14 r13
  sp[4] = arg;                                         // r12
  sp[5] = reinterpret_cast<void*>(fn);                 // rbx
  sp[6] = nullptr;                                     // rbp
  sp[7] = reinterpret_cast<void*>(&kk_rt_fiber_start);  // return address
  c->sp = sp;
#elif defined(__aarch64__)
  (void)lo;
  uintptr_t top = reinterpret_cast<uintptr_t>(hi) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 176);
  memset(sp, 0, 176);
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  sp[20] = reinterpret_cast<void*>(uintptr_t(fpcr));      // FPCR
  sp[0] = arg;                                          // x19
  sp[1] = reinterpret_cast<void*>(fn);                  // x20
  sp[11] = reinterpret_cast<void*>(&kk_rt_fiber_start);  // x30
  c->sp = sp;
#endif
}

}  // namespace
