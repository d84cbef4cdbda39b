// kernelkit CPU runtime (libkkrt): the worker pool, the fibers, the barrier and
// SIMD-group rendezvous, and the launch's error state. The C ABI is in
// cpu_runtime.h. Built once per machine and cached:
//   g++ -std=c++17 -O2 -fPIC -shared -pthread [-I .../include] cpu_runtime.cpp -o libkkrt.so
// (add -DKK_RT_UCONTEXT to use the portable ucontext switch instead of assembly).
//
// How a launch runs
//   kk_rt_launch hands out threadgroup indices from an atomic counter to the
//   calling thread and, for launches that are big enough, to a persistent pool
//   of workers. Each participant runs whole groups, one at a time, through the
//   kernel library's kk_group. So a group never leaves the OS thread that started
//   it, and a `static thread_local` variable in the kernel is that group's
//   threadgroup memory.
//
// How a group runs in fiber mode (kk_rt_run_fibers)
//   One fiber per existing thread, each on its own stack. The scheduler runs a
//   pass: every runnable fiber runs, in thread order, until it blocks at a
//   rendezvous or returns (a blocking fiber switches straight to the next one).
//   When the pass ends every live fiber is blocked, and the scheduler resolves:
//     - a SIMD-group whose live lanes all wait at one SIMD site completes (the
//       exchange is gathered, the lanes become runnable);
//     - a SIMD-group whose live lanes wait at different sites, one of them a SIMD
//       site, can never complete: error (divergent SIMD-group function);
//     - if no SIMD-group completed, every live thread waits at a threadgroup
//       barrier: one site releases them all, several sites are an error.
//   Returned threads are not live: they count for no rendezvous.
//
// Errors (deadlock, divergence, kk_rt_fail) set the launch's error once; other
// participants stop taking groups; the failing group's fibers are dropped (their
// stacks are reused). In loop mode kk_rt_fail longjmps back to the participant.
//
// Invalid memory accesses (SIGSEGV, SIGBUS)
//   Handlers are installed once (SA_SIGINFO | SA_ONSTACK; the previous ones are
//   kept) and every participant thread has an alternate signal stack, so that a
//   fiber that overflows its stack into the guard page is caught too. While a
//   participant runs groups (Worker::in_kernel, set after the sigsetjmp in
//   participate()), a fault records its address and signal and siglongjmps back
//   to the participant, which unblocks the signal, turns the fault into the
//   launch's error (with the running fiber's thread, or the group in loop mode)
//   and stops; in fiber mode the group's fibers are abandoned as for kk_rt_fail.
//   Any other fault goes to the previous handler as it would have without us
//   (Python's faulthandler, or the default action: death by the signal).

#if __has_include("cpu_runtime.h")  // compiled in place
#include "cpu_runtime.h"
#else  // compiled from a copy, with -I .../include
#include <kernelkit/cpu_runtime.h>
#endif

#include <errno.h>
#include <fenv.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if defined(KK_RT_UCONTEXT) || !(defined(__x86_64__) || defined(__aarch64__))
#define KK_RT_USE_UCONTEXT 1
#include <ucontext.h>
#else
#define KK_RT_USE_UCONTEXT 0
#endif

#define KK_RT_API extern "C" __attribute__((visibility("default")))

extern "C" {
__attribute__((visibility("default"))) __thread const kk_thread_ctx* kk_rt_current = nullptr;
}

namespace {

constexpr size_t kStackSize = 256 * 1024;  // usable bytes per fiber stack
constexpr unsigned kMaxGroupThreads = 1024;
constexpr unsigned kStacksPerMap = 16;     // stacks allocated together
constexpr size_t kErrLen = 4096;

// ---------------------------------------------------------------------------
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
std::atomic<void (*)(void*)> g_uc_entry{nullptr};  // makecontext passes ints only
void uc_trampoline(unsigned hi, unsigned lo) {
  g_uc_entry.load(std::memory_order_relaxed)(
      reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
#endif

// Prepares c so that switching to it calls fn(arg) on the stack [lo, hi).
void ctx_make(Ctx* c, char* lo, char* hi, void (*fn)(void*), void* arg) {
#if KK_RT_USE_UCONTEXT
  g_uc_entry.store(fn, std::memory_order_relaxed);  // the same function every time
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = lo;
  c->uc.uc_stack.ss_size = size_t(hi - lo);
  c->uc.uc_link = nullptr;
  uintptr_t a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(uc_trampoline), 2, unsigned(a >> 32),
              unsigned(a & 0xffffffffu));
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

// ---------------------------------------------------------------------------
// Launches, workers, fibers.

struct Launch {
  kk_group_fn fn;
  const void* args;
  const kk_launch_desc* d;
  size_t total = 0, chunk = 1;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  int refs = 0;  // pool workers inside; guarded by Pool::mu
  fenv_t fenv;   // the caller's floating-point environment, for the workers
  char err[kErrLen];
};

enum : unsigned char { kRunnable, kAtBarrier, kAtSimd, kDone };

struct Worker;

struct Fiber {
  Ctx ctx;
  kk_thread_ctx t;
  Worker* w;
  unsigned char state;
  // where it waits (identity of the rendezvous): kind = state
  const char* op;
  const char* file;
  unsigned line;
  const void* ra;
  // SIMD exchange
  const void* xin;
  void* xout;
  size_t xsize;
  unsigned xmask;
};

struct SimdGroup {
  unsigned live;      // lanes not returned
  short fiber[32];    // lane -> fiber index, -1: no such thread
};

struct Worker {
  Launch* launch = nullptr;
  sigjmp_buf jb;
  const kk_thread_ctx** current = nullptr;  // &kk_rt_current of this OS thread
  // Fiber mode state (one group at a time).
  std::vector<char*> maps;   // stack mappings, kStacksPerMap stacks each
  Fiber* fibers = nullptr;   // kMaxGroupThreads
  unsigned nstacks = 0;
  Ctx sched;
  SimdGroup sg[kMaxGroupThreads / 32];
  unsigned nsg = 0, nfibers = 0, live = 0;
  unsigned dirty = 0;       // SIMD-groups whose fibers blocked or returned in this pass
  unsigned at_barrier = 0;  // fibers waiting at a threadgroup barrier
  unsigned runlist[kMaxGroupThreads];
  unsigned run_pos = 0, run_count = 0;
  bool abort = false;
  // Invalid memory access (see the top): in_kernel while groups run on this
  // thread; the handler fills fault_* before it jumps back to participate().
  volatile sig_atomic_t in_kernel = 0;
  void* volatile fault_addr = nullptr;
  volatile int fault_sig = 0;
  void* altstack = nullptr;  // the alternate signal stack we installed (or none)
  size_t altstack_size = 0;
  kk_thread_fn fn = nullptr;
  const void* args = nullptr;
  const kk_launch_desc* d = nullptr;
  kk_dim3 gid{0, 0, 0};
  std::vector<unsigned char> gather;

  Worker() {
    current = &kk_rt_current;
    install_altstack();
  }
  ~Worker() {
    size_t map_size = kStacksPerMap * (kStackSize + page_size());
    for (char* m : maps) munmap(m, map_size);
    delete[] fibers;
    if (altstack) {
      stack_t cur;
      if (sigaltstack(nullptr, &cur) == 0 && cur.ss_sp == altstack && !(cur.ss_flags & SS_ONSTACK)) {
        stack_t off;
        memset(&off, 0, sizeof off);
        off.ss_flags = SS_DISABLE;
        sigaltstack(&off, nullptr);
        munmap(altstack, altstack_size);
      }  // else someone else's is in place now: leave ours mapped
    }
  }
  // An alternate signal stack for this OS thread, unless it has one already
  // (Python's faulthandler installs one on the main thread).
  void install_altstack() {
    stack_t cur;
    if (sigaltstack(nullptr, &cur) != 0 || !(cur.ss_flags & SS_DISABLE)) return;
    size_t size = std::max<size_t>(size_t(SIGSTKSZ), 64 * 1024);
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = m;
    ss.ss_size = size;
    if (sigaltstack(&ss, nullptr) != 0) {
      munmap(m, size);
      return;
    }
    altstack = m;
    altstack_size = size;
  }
  // Whether addr lies in the guard page of one of this thread's fiber stacks.
  bool in_guard_page(uintptr_t addr) {
    const size_t slot = kStackSize + page_size();
    for (char* m : maps) {
      uintptr_t b = reinterpret_cast<uintptr_t>(m);
      if (addr < b || addr >= b + kStacksPerMap * slot) continue;
      return (addr - b) % slot < page_size();
    }
    return false;
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  static size_t page_size() {
    static const size_t p = size_t(sysconf(_SC_PAGESIZE));
    return p;
  }
  // Stack i: [lo, hi), with a guard page below lo.
  void stack(unsigned i, char** lo, char** hi) {
    size_t slot = kStackSize + page_size();
    char* base = maps[i / kStacksPerMap] + (i % kStacksPerMap) * slot;
    *lo = base + page_size();
    // Stagger the tops so that the hot frames of the fibers do not all fall in
    // the same L1 sets.
    *hi = base + slot - (i % 63) * 64;
  }
  bool ensure(unsigned n) {
    if (!fibers) fibers = new (std::nothrow) Fiber[kMaxGroupThreads];
    if (!fibers) return false;
    size_t slot = kStackSize + page_size();
    while (nstacks < n) {
      size_t len = kStacksPerMap * slot;
      int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
      flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
      flags |= MAP_STACK;
#endif
      void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (m == MAP_FAILED) return false;
      for (unsigned k = 0; k < kStacksPerMap; ++k)
        mprotect(static_cast<char*>(m) + k * slot, page_size(), PROT_NONE);
      maps.push_back(static_cast<char*>(m));
      nstacks += kStacksPerMap;
    }
    return true;
  }
};

struct Pool {
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::vector<Launch*> active;
  std::atomic<unsigned> epoch{0};
  bool started = false;
  int nthreads = 1;  // participants of a launch: workers + the caller
};

Pool* g_pool = new Pool;  // never destroyed: workers may outlive static destructors
std::once_flag g_atfork_once;

int detect_threads() {
  if (const char* e = getenv("KERNELKIT_NUM_THREADS")) {
    int n = atoi(e);
    if (n >= 1) return std::min(n, 1024);
  }
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

// ---------------------------------------------------------------------------
// Errors.

void append(std::string& s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s += buf;
}

const char* kernel_name(const kk_launch_desc* d) {
  return d && d->kernel_name ? d->kernel_name : "?";
}

// Records the launch's first error.
void set_error(Launch* L, const char* msg) {
  if (L->failed.exchange(true)) return;
  size_t n = std::min(strlen(msg), kErrLen - 1);
  memcpy(L->err, msg, n);
  L->err[n] = 0;
}

// "0-15, 20, 22-23" for a sorted list; long lists are cut.
std::string ranges(const std::vector<unsigned>& v) {
  std::string s;
  int shown = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (shown == 8) {
      s += ", ...";
      break;
    }
    if (shown++) s += ", ";
    if (j == i) append(s, "%u", v[i]);
    else append(s, "%u-%u", v[i], v[j]);
    i = j + 1;
  }
  return s;
}

std::string who(const char* singular, const char* plural, const std::vector<unsigned>& v) {
  return std::string(v.size() == 1 ? singular : plural) + " " + ranges(v);
}

std::string site_text(const Fiber& f) {
  std::string s = f.op ? f.op : "?";
  if (f.file) append(s, " at %s:%u", f.file, f.line);
  else if (f.ra) append(s, " (called from %p)", f.ra);
  return s;
}

bool same_site(const Fiber& a, const Fiber& b) {
  if (a.state != b.state || a.line != b.line || a.ra != b.ra) return false;
  if (a.op != b.op && (!a.op || !b.op || strcmp(a.op, b.op))) return false;
  if (a.file != b.file && (!a.file || !b.file || strcmp(a.file, b.file))) return false;
  return true;
}

std::string group_text(const Worker* w) {
  std::string s;
  append(s, "threadgroup (%u,%u,%u)", w->gid.x, w->gid.y, w->gid.z);
  return s;
}

// Fibers grouped by the site they wait at, in order of first appearance.
struct Cluster {
  unsigned first;  // fiber index
  std::vector<unsigned> ids;
};

std::vector<Cluster> clusters(Worker* w, const std::vector<unsigned>& fibers, bool lanes) {
  std::vector<Cluster> cs;
  for (unsigned i : fibers) {
    const Fiber& f = w->fibers[i];
    unsigned id = lanes ? (f.t.tindex & 31u) : f.t.tindex;
    Cluster* c = nullptr;
    for (Cluster& k : cs)
      if (same_site(w->fibers[k.first], f)) c = &k;
    if (!c) {
      cs.push_back(Cluster{i, {}});
      c = &cs.back();
    }
    c->ids.push_back(id);
  }
  return cs;
}

void divergence_error(Worker* w, unsigned s) {
  std::vector<unsigned> fibers;
  const SimdGroup& S = w->sg[s];
  for (unsigned m = S.live; m; m &= m - 1) fibers.push_back(unsigned(S.fiber[__builtin_ctz(m)]));
  std::vector<Cluster> cs = clusters(w, fibers, true);
  size_t subject = 0;
  while (w->fibers[cs[subject].first].state != kAtSimd) ++subject;
  std::string msg;
  append(msg, "kernel '%s': ", kernel_name(w->d));
  msg += site_text(w->fibers[cs[subject].first]) + " reached by " +
         who("lane", "lanes", cs[subject].ids);
  append(msg, " of SIMD-group %u in ", s);
  msg += group_text(w) + " while ";
  int n = 0;
  for (size_t k = 0; k < cs.size(); ++k) {
    if (k == subject) continue;
    if (n++) msg += " and ";
    msg += who("lane", "lanes", cs[k].ids) + (cs[k].ids.size() == 1 ? " waits at " : " wait at ") +
           site_text(w->fibers[cs[k].first]);
  }
  msg += "; Metal requires all active lanes of a SIMD-group to call a SIMD-group function "
         "together (or lanes to have returned)";
  set_error(w->launch, msg.c_str());
}

void barrier_error(Worker* w) {
  std::vector<unsigned> fibers;
  for (unsigned i = 0; i < w->nfibers; ++i)
    if (w->fibers[i].state != kDone) fibers.push_back(i);
  std::vector<Cluster> cs = clusters(w, fibers, false);
  std::string msg;
  append(msg, "kernel '%s': ", kernel_name(w->d));
  msg += site_text(w->fibers[cs[0].first]) + " in " + group_text(w) + " cannot complete: " +
         who("thread", "threads", cs[0].ids) + (cs[0].ids.size() == 1 ? " waits" : " wait") +
         " there while ";
  for (size_t k = 1; k < cs.size(); ++k) {
    if (k > 1) msg += " and ";
    msg += who("thread", "threads", cs[k].ids) + (cs[k].ids.size() == 1 ? " waits at " : " wait at ") +
           site_text(w->fibers[cs[k].first]);
  }
  msg += " (threads numbered by thread_index_in_threadgroup); every live thread of a threadgroup "
         "must reach the same threadgroup_barrier (threads that have returned do not count)";
  set_error(w->launch, msg.c_str());
}

// ---------------------------------------------------------------------------
// The fiber scheduler.

thread_local Worker* tls_worker = nullptr;

[[noreturn]] void fail_here(const kk_thread_ctx* t, const char* message);

// Leaves the running fiber `self` (blocked or finished) for the next runnable
// fiber of this pass, or for the scheduler when the pass is over.
inline void yield_next(Worker* w, Fiber* self) {
  Ctx* to;
  const kk_thread_ctx* t;
  if (++w->run_pos < w->run_count) {
    Fiber* n = &w->fibers[w->runlist[w->run_pos]];
    to = &n->ctx;
    t = &n->t;
  } else {
    to = &w->sched;
    t = nullptr;
  }
  *w->current = t;
  ctx_switch(&self->ctx, to);
}

void fiber_main(void* p) {
  Fiber* f = static_cast<Fiber*>(p);
  Worker* w = f->w;
  bool threw = false;
  try {
    w->fn(w->args, &f->t);
  } catch (...) {
    threw = true;
  }
  if (threw) fail_here(&f->t, "a C++ exception escaped the kernel");
  f->state = kDone;
  w->live--;
  w->sg[f->t.tindex >> 5].live &= ~(1u << (f->t.tindex & 31u));
  w->dirty |= 1u << (f->t.tindex >> 5);
  yield_next(w, f);
  __builtin_trap();  // a finished fiber is never resumed
}

// Completes the rendezvous of SIMD-group S, whose live lanes all wait at one site.
void complete_simd(Worker* w, SimdGroup& S, unsigned* cnt) {
  const Fiber& first = w->fibers[S.fiber[__builtin_ctz(S.live)]];
  size_t size = first.xsize;
  if (size) {
    if (w->gather.size() < 32 * size) w->gather.resize(32 * size);
    unsigned char* g = w->gather.data();
    for (unsigned m = S.live; m; m &= m - 1) {
      unsigned lane = unsigned(__builtin_ctz(m));
      const Fiber& f = w->fibers[S.fiber[lane]];
      memcpy(g + lane * size, f.xin, std::min(size, f.xsize));
    }
    unsigned lo = unsigned(__builtin_ctz(S.live)), hi = 31u - unsigned(__builtin_clz(S.live));
    for (unsigned m = S.live; m; m &= m - 1) {
      Fiber& f = w->fibers[S.fiber[__builtin_ctz(m)]];
      if (f.xout && f.xsize == size)
        memcpy(static_cast<unsigned char*>(f.xout) + lo * size, g + lo * size, (hi - lo + 1) * size);
    }
  }
  for (unsigned m = S.live; m; m &= m - 1) {
    unsigned i = unsigned(S.fiber[__builtin_ctz(m)]);
    w->fibers[i].xmask = S.live;
    w->fibers[i].state = kRunnable;
    w->runlist[(*cnt)++] = i;
  }
}

// Called when every live fiber is blocked: fills the next run list, or records
// an error and returns false.
// Only the SIMD-groups touched in the pass can have changed: an untouched one
// with lanes at a SIMD site would have completed or failed before.
bool resolve(Worker* w) {
  unsigned cnt = 0;
  const unsigned dirty = w->dirty;
  w->dirty = 0;
  for (unsigned d = dirty; d; d &= d - 1) {
    const unsigned s = unsigned(__builtin_ctz(d));
    SimdGroup& S = w->sg[s];
    if (!S.live) continue;
    const Fiber* first = nullptr;
    unsigned waiting = 0;
    bool same = true;
    for (unsigned m = S.live; m; m &= m - 1) {
      unsigned lane = unsigned(__builtin_ctz(m));
      const Fiber& f = w->fibers[S.fiber[lane]];
      if (f.state != kAtSimd) continue;
      waiting |= 1u << lane;
      if (!first) first = &f;
      else if (!same_site(*first, f)) same = false;
    }
    if (!waiting) continue;
    if (waiting != S.live || !same) {
      divergence_error(w, s);
      return false;
    }
    complete_simd(w, S, &cnt);
  }
  if (cnt) {
    w->run_count = cnt;
    return true;
  }
  // Every live fiber waits at a threadgroup barrier.
  if (w->at_barrier != w->live) {
    char msg[256];
    snprintf(msg, sizeof msg, "kernel '%s': internal error in the fiber scheduler (%u of %u live "
             "threads at a barrier in %s)", kernel_name(w->d), w->at_barrier, w->live,
             group_text(w).c_str());
    set_error(w->launch, msg);
    return false;
  }
  w->at_barrier = 0;
  const Fiber* first = nullptr;
  for (unsigned i = 0; i < w->nfibers; ++i) {
    Fiber& f = w->fibers[i];
    if (f.state == kDone) continue;
    if (!first) first = &f;
    else if (!same_site(*first, f)) {
      barrier_error(w);
      return false;
    }
    w->runlist[cnt++] = i;
  }
  for (unsigned k = 0; k < cnt; ++k) w->fibers[w->runlist[k]].state = kRunnable;
  w->run_count = cnt;
  return cnt != 0;
}

[[noreturn]] void not_in_fiber(const kk_thread_ctx* t, const kk_site* site, const char* what) {
  char msg[512];
  const char* op = site && site->op ? site->op : what;
  if (site && site->file)
    snprintf(msg, sizeof msg, "%s at %s:%u needs the fiber runtime, but this kernel was compiled in "
             "loop mode (its use of barriers or SIMD-group functions was not detected)",
             op, site->file, site->line);
  else
    snprintf(msg, sizeof msg, "%s needs the fiber runtime, but this kernel was compiled in loop "
             "mode (its use of barriers or SIMD-group functions was not detected)", op);
  fail_here(t, msg);
}

inline Fiber* fiber_of(const kk_thread_ctx* t, const kk_site* site, const char* what) {
  if (__builtin_expect(t == nullptr || t->rt == nullptr, 0)) not_in_fiber(t, site, what);
  return static_cast<Fiber*>(t->rt);
}

// Blocks the running fiber at a rendezvous until the scheduler releases it.
inline void block(Fiber* f, unsigned char state, const kk_site* site, const char* what,
                  const void* ra) {
  if (site && site->file) {
    f->op = site->op ? site->op : what;
    f->file = site->file;
    f->line = site->line;
    f->ra = nullptr;
  } else {
    f->op = site && site->op ? site->op : what;
    f->file = nullptr;
    f->line = 0;
    f->ra = ra;
  }
  f->state = state;
  f->w->dirty |= 1u << (f->t.tindex >> 5);
  if (state == kAtBarrier) f->w->at_barrier++;
  yield_next(f->w, f);
}

void participate_chunks(Launch* L, Worker* w) {
  const kk_dim3 n = L->d->num_groups;
  for (;;) {
    size_t g0 = L->next.fetch_add(L->chunk, std::memory_order_relaxed);
    if (g0 >= L->total) return;
    size_t g1 = std::min(g0 + L->chunk, L->total);
    for (size_t g = g0; g < g1; ++g) {
      if (L->failed.load(std::memory_order_relaxed)) return;
      size_t q = g / n.x;
      kk_dim3 gid{unsigned(g - q * n.x), unsigned(q % n.y), unsigned(q / n.y)};
      w->gid = gid;  // for the error text of an invalid memory access
      L->fn(L->args, L->d, gid, w);
    }
  }
}

// ---------------------------------------------------------------------------
// Invalid memory accesses.

std::atomic<int> g_in_launch{0};  // participants inside participate(), all threads
struct sigaction g_prev_segv, g_prev_bus;
std::once_flag g_signals_once;

// Hands a fault that is not ours to the handler that was installed before ours,
// as it would have run without us.
void chain_signal(int sig, siginfo_t* si, void* uc) {
  const struct sigaction* p = sig == SIGBUS ? &g_prev_bus : &g_prev_segv;
  const bool fault = si && si->si_code > 0;  // raised by the kernel, not by kill()/raise()
  if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
    p->sa_sigaction(sig, si, uc);
    return;
  }
  if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler == SIG_IGN) {
    if (!fault) return;  // a fault cannot be ignored: the kernel would kill the process
  } else if ((p->sa_flags & SA_SIGINFO) || p->sa_handler != SIG_DFL) {
    p->sa_handler(sig);
    return;
  }
  // The default action: restore it and raise again (delivered when this handler
  // returns; a fault would also recur on the faulting instruction).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

void fault_handler(int sig, siginfo_t* si, void* uc) {
  if (g_in_launch.load(std::memory_order_relaxed) > 0) {
    Worker* w = tls_worker;
    if (w && w->in_kernel) {
      w->in_kernel = 0;
      w->fault_addr = si ? si->si_addr : nullptr;
      w->fault_sig = sig;
      siglongjmp(w->jb, 2);  // to participate(); the mask is restored there
    }
  }
  int saved = errno;
  chain_signal(sig, si, uc);
  errno = saved;
}

void install_signal_handlers() {
  std::call_once(g_signals_once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}

// After the handler jumped back: the launch's error for the fault, and the
// group's fibers abandoned (their stacks are reused by the next group).
void fault_error(Launch* L, Worker* w) {
  const int sig = w->fault_sig;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // blocked while the handler ran
  const uintptr_t addr = reinterpret_cast<uintptr_t>(w->fault_addr);
  const kk_thread_ctx* t = *w->current;  // the running fiber (NULL in loop mode)
  const bool overflow = w->nfibers && w->in_guard_page(addr);
  char msg[1024];
  int n = snprintf(msg, sizeof msg, "kernel '%s': ", kernel_name(L->d));
  if (overflow)
    n += snprintf(msg + n, sizeof msg - size_t(n),
                  "stack overflow (invalid memory access at address 0x%llx in the guard page of "
                  "the thread's %zu KiB stack, %s)",
                  (unsigned long long)addr, kStackSize / 1024, sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
  else
    n += snprintf(msg + n, sizeof msg - size_t(n), "invalid memory access at address 0x%llx (%s)",
                  (unsigned long long)addr, sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
  if (t)
    n += snprintf(msg + n, sizeof msg - size_t(n), " in thread (%u,%u,%u) of threadgroup (%u,%u,%u)",
                  t->tid.x, t->tid.y, t->tid.z, t->gid.x, t->gid.y, t->gid.z);
  else
    n += snprintf(msg + n, sizeof msg - size_t(n), " in threadgroup (%u,%u,%u)", w->gid.x,
                  w->gid.y, w->gid.z);
  snprintf(msg + n, sizeof msg - size_t(n), " (the CPU backend stopped the launch; %s)",
           overflow ? "deep recursion or large local arrays are the usual cause"
                    : "an out-of-bounds index is the usual cause");
  set_error(L, msg);
  w->nfibers = 0;
  w->live = 0;
  w->run_count = 0;
  w->abort = false;
}

// Runs groups of L on this OS thread until none is left or the launch failed.
void participate(Launch* L, Worker* w) {
  w->launch = L;
  g_in_launch.fetch_add(1, std::memory_order_relaxed);
  if (sigsetjmp(w->jb, 0) == 0) {  // 1: kk_rt_fail, 2: a fault (the handler set fault_sig)
    w->in_kernel = 1;
    participate_chunks(L, w);
  }
  w->in_kernel = 0;
  if (w->fault_sig) {
    fault_error(L, w);
    w->fault_sig = 0;
  }
  g_in_launch.fetch_sub(1, std::memory_order_relaxed);
  w->launch = nullptr;
  *w->current = nullptr;
}

Launch* pick(Pool* P) {
  for (Launch* L : P->active)
    if (!L->failed.load(std::memory_order_relaxed) &&
        L->next.load(std::memory_order_relaxed) < L->total)
      return L;
  return nullptr;
}

void worker_main(Pool* P) {
  Worker w;
  tls_worker = &w;
  std::unique_lock<std::mutex> lk(P->mu);
  for (;;) {
    if (Launch* L = pick(P)) {
      L->refs++;
      lk.unlock();
      fenv_t own;
      fegetenv(&own);
      fesetenv(&L->fenv);
      participate(L, &w);
      fesetenv(&own);
      lk.lock();
      if (--L->refs == 0) P->cv_done.notify_all();
      continue;
    }
    // Nothing to do: spin briefly (back-to-back launches), then sleep.
    unsigned e = P->epoch.load();
    lk.unlock();
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    bool news = false;
    for (int k = 0; !news; ++k) {
      for (int j = 0; j < 64 && !news; ++j) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
        news = P->epoch.load(std::memory_order_relaxed) != e;
      }
      if (std::chrono::steady_clock::now() > until) break;
    }
    lk.lock();
    if (!news) P->cv_work.wait(lk, [&] { return P->epoch.load() != e; });
  }
}

void atfork_child() {
  g_pool = new Pool;  // the workers did not survive the fork; the old pool is abandoned
}

Pool* pool() {
  std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, atfork_child); });
  Pool* P = g_pool;
  std::lock_guard<std::mutex> lk(P->mu);
  if (!P->started) {
    P->started = true;
    P->nthreads = detect_threads();
    for (int i = 1; i < P->nthreads; ++i) {
      try {
        std::thread(worker_main, P).detach();
      } catch (...) {
        P->nthreads = i;
        break;
      }
    }
  }
  return P;
}

Worker* caller_worker() {
  thread_local Worker* w = nullptr;
  thread_local struct Holder {
    Worker** p;
    ~Holder() { delete *p; }
  } holder{&w};
  if (!w) {
    install_signal_handlers();
    w = new Worker;
  }
  tls_worker = w;
  (void)holder;
  return w;
}

// Stops the launch from kernel code (a fiber, or a loop-mode group): no object
// with a destructor may be alive here, the frames are abandoned.
[[noreturn]] void fail_here(const kk_thread_ctx* t, const char* message) {
  Worker* w = tls_worker;
  const kk_thread_ctx* cur = kk_rt_current;
  Fiber* f = cur && cur->rt ? static_cast<Fiber*>(cur->rt) : nullptr;
  if (!w || !w->launch) {
    fprintf(stderr, "kernelkit: %s (outside a launch)\n", message);
    abort();
  }
  char msg[kErrLen];
  int n = snprintf(msg, sizeof msg, "kernel '%s': %s", kernel_name(w->launch->d), message);
  if (!t && f) t = &f->t;
  if (t && n > 0 && size_t(n) < sizeof msg)
    snprintf(msg + n, sizeof msg - size_t(n), " (thread (%u,%u,%u) of threadgroup (%u,%u,%u))",
             t->tid.x, t->tid.y, t->tid.z, t->gid.x, t->gid.y, t->gid.z);
  set_error(w->launch, msg);
  if (f && f->w == w) {  // fiber mode: back to the scheduler, the fiber is dropped
    w->abort = true;
    *w->current = nullptr;
    ctx_switch(&f->ctx, &w->sched);
    __builtin_trap();
  }
  siglongjmp(w->jb, 1);  // loop mode: back to participate()
}

bool check_desc(const kk_launch_desc* d, std::string* why) {
  const kk_dim3 g = d->grid, b = d->group, n = d->num_groups;
  if (!b.x || !b.y || !b.z) {
    append(*why, "threadgroup size (%u,%u,%u) has a zero dimension", b.x, b.y, b.z);
    return false;
  }
  auto cdiv = [](unsigned a, unsigned b) { return a / b + (a % b != 0); };
  if (n.x != cdiv(g.x, b.x) || n.y != cdiv(g.y, b.y) || n.z != cdiv(g.z, b.z)) {
    append(*why,
           "launch descriptor: num_groups (%u,%u,%u) is not ceil(grid (%u,%u,%u) / "
           "threadgroup (%u,%u,%u))",
           n.x, n.y, n.z, g.x, g.y, g.z, b.x, b.y, b.z);
    return false;
  }
  return true;
}

void copy_error(char* err, size_t errlen, const char* msg) {
  if (!err || !errlen) return;
  size_t n = std::min(strlen(msg), errlen - 1);
  memcpy(err, msg, n);
  err[n] = 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// C ABI.

KK_RT_API int kk_rt_abi_version(void) { return KK_RT_ABI_VERSION; }

KK_RT_API int kk_rt_num_threads(void) { return pool()->nthreads; }

KK_RT_API int kk_rt_launch(kk_group_fn group, const void* args, const kk_launch_desc* d, char* err,
                           size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!group || !d) {
    copy_error(err, errlen, "kk_rt_launch: no group function or launch descriptor");
    return 1;
  }
  if (!d->grid.x || !d->grid.y || !d->grid.z) return 0;  // nothing to run
  {
    std::string why;
    if (!check_desc(d, &why)) {
      copy_error(err, errlen, ("kernel '" + std::string(kernel_name(d)) + "': " + why).c_str());
      return 1;
    }
  }
  Worker* w = caller_worker();
  if (w->launch) {
    copy_error(err, errlen, "kk_rt_launch: called from inside a running kernel");
    return 1;
  }
  Launch launch;
  Launch* L = &launch;
  L->fn = group;
  L->args = args;
  L->d = d;
  L->total = size_t(d->num_groups.x) * d->num_groups.y * d->num_groups.z;
  L->err[0] = 0;
  size_t threads = size_t(d->grid.x) * d->grid.y * d->grid.z;
  // Small launches stay on the calling thread: no hand-off, no wake-up.
  bool parallel = L->total >= 2 && threads >= (d->uses_sync ? 512u : 4096u);
  Pool* P = parallel ? pool() : nullptr;
  if (P && P->nthreads < 2) P = nullptr;
  if (P) {
    L->chunk = std::max<size_t>(1, L->total / (size_t(P->nthreads) * 8));
    fegetenv(&L->fenv);
    {
      std::lock_guard<std::mutex> lk(P->mu);
      P->active.push_back(L);
      P->epoch.fetch_add(1);
    }
    P->cv_work.notify_all();
  } else {
    L->chunk = L->total;
  }
  participate(L, w);
  if (P) {
    std::unique_lock<std::mutex> lk(P->mu);
    P->active.erase(std::find(P->active.begin(), P->active.end(), L));
    P->cv_done.wait(lk, [&] { return L->refs == 0; });
  }
  if (L->failed.load()) {
    copy_error(err, errlen, L->err[0] ? L->err : "launch failed");
    return 1;
  }
  return 0;
}

KK_RT_API void kk_rt_run_fibers(void* worker, kk_thread_fn fn, const void* args,
                                const kk_launch_desc* d, kk_dim3 gid) {
  Worker* w = static_cast<Worker*>(worker);
  const kk_dim3 g = d->group;
  const unsigned sx = std::min(g.x, d->grid.x - gid.x * g.x);
  const unsigned sy = std::min(g.y, d->grid.y - gid.y * g.y);
  const unsigned sz = std::min(g.z, d->grid.z - gid.z * g.z);
  const size_t dispatch = size_t(g.x) * g.y * g.z;
  if (dispatch > kMaxGroupThreads) {
    char m[256];
    snprintf(m, sizeof m, "a threadgroup of %zu threads (%u,%u,%u) exceeds the maximum of %u",
             dispatch, g.x, g.y, g.z, kMaxGroupThreads);
    fail_here(nullptr, m);
  }
  const unsigned n = sx * sy * sz;
  if (!w->ensure(n)) fail_here(nullptr, "out of memory for fiber stacks");
  w->fn = fn;
  w->args = args;
  w->d = d;
  w->gid = gid;
  w->abort = false;
  w->dirty = 0;
  w->at_barrier = 0;
  w->nsg = unsigned((dispatch + 31) / 32);
  for (unsigned s = 0; s < w->nsg; ++s) {
    w->sg[s].live = 0;
    memset(w->sg[s].fiber, 0xff, sizeof w->sg[s].fiber);
  }
  kk_thread_ctx t;
  t.gid = gid;
  t.tg_size = kk_dim3{sx, sy, sz};
  t.tg_dispatch = g;
  t.num_groups = d->num_groups;
  t.grid = d->grid;
  unsigned i = 0;
  for (unsigned z = 0; z < sz; ++z)
    for (unsigned y = 0; y < sy; ++y)
      for (unsigned x = 0; x < sx; ++x, ++i) {
        Fiber& f = w->fibers[i];
        f.t = t;
        f.t.tid = kk_dim3{x, y, z};
        f.t.tindex = x + y * g.x + z * g.x * g.y;
        f.t.rt = &f;
        f.w = w;
        f.state = kRunnable;
        SimdGroup& S = w->sg[f.t.tindex >> 5];
        S.live |= 1u << (f.t.tindex & 31u);
        S.fiber[f.t.tindex & 31u] = short(i);
        char *lo, *hi;
        w->stack(i, &lo, &hi);
        ctx_make(&f.ctx, lo, hi, fiber_main, &f);
        w->runlist[i] = i;
      }
  w->nfibers = n;
  w->live = n;
  w->run_count = n;
  while (w->run_count) {
    w->run_pos = 0;
    Fiber* first = &w->fibers[w->runlist[0]];
    *w->current = &first->t;
    ctx_switch(&w->sched, &first->ctx);
    *w->current = nullptr;
    if (w->abort || w->live == 0 || !resolve(w)) break;
  }
  w->nfibers = 0;
}

KK_RT_API void kk_rt_threadgroup_barrier(const kk_thread_ctx* t, const kk_site* site) {
  Fiber* f = fiber_of(t, site, "threadgroup_barrier");
  block(f, kAtBarrier, site, "threadgroup_barrier", __builtin_return_address(0));
}

KK_RT_API void kk_rt_simdgroup_barrier(const kk_thread_ctx* t, const kk_site* site) {
  Fiber* f = fiber_of(t, site, "simdgroup_barrier");
  f->xin = nullptr;
  f->xout = nullptr;
  f->xsize = 0;
  block(f, kAtSimd, site, "simdgroup_barrier", __builtin_return_address(0));
}

KK_RT_API unsigned kk_rt_simd_exchange(const kk_thread_ctx* t, const kk_site* site, const void* in,
                                       void* all_out, size_t size) {
  Fiber* f = fiber_of(t, site, "SIMD-group function");
  f->xin = in;
  f->xout = all_out;
  f->xsize = size;
  block(f, kAtSimd, site, "SIMD-group function", __builtin_return_address(0));
  return f->xmask;
}

KK_RT_API void kk_rt_fail(const kk_thread_ctx* t, const char* message) {
  fail_here(t, message ? message : "kk_rt_fail");
}
