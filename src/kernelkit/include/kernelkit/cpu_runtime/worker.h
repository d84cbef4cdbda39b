// kernelkit/cpu_runtime/worker.h: the state of a launch, of the OS threads that run it
// (participants: the pool's workers and the calling thread), and of their fibers (part of
// libkkrt).
#pragma once

#include <fenv.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "context.h"
#include "stacks.h"

namespace {

constexpr unsigned kMaxGroupThreads = 1024;
constexpr unsigned kStacksPerMap = 16;  // fiber stacks reserved together
constexpr size_t kErrLen = 4096;

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
  // The participant's loop: it runs on loop_stack (so that loop-mode kernels get the same
  // stack size as fibers), entered from os_ctx.
  Stacks loop_stack{1};
  Ctx os_ctx, loop_ctx;
  void (*loop_fn)(Worker*) = nullptr;
  // Loop mode: the one thread to run of the next group (kk_rt_loop_only), while a fault is
  // traced to its thread; NULL: all of them.
  const kk_dim3* only = nullptr;
  // Fiber mode state (one group at a time).
  Stacks stacks{kStacksPerMap};
  Fiber* fibers = nullptr;   // kMaxGroupThreads
  Ctx sched;
  SimdGroup sg[kMaxGroupThreads / 32];
  unsigned nsg = 0, nfibers = 0, live = 0;
  unsigned dirty = 0;       // SIMD-groups whose fibers blocked or returned in this pass
  unsigned at_barrier = 0;  // fibers waiting at a threadgroup barrier
  unsigned runlist[kMaxGroupThreads];
  unsigned run_pos = 0, run_count = 0;
  bool abort = false;
  // Faults (faults.h): in_kernel while groups run on this thread; the handler fills fault_*
  // before it jumps back to participate().
  volatile sig_atomic_t in_kernel = 0;
  void* volatile fault_addr = nullptr;
  volatile int fault_sig = 0;
  volatile int fault_code = 0;
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
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

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
  // Fibers and stacks for a group of n threads.
  bool ensure(unsigned n) {
    if (!fibers) fibers = new (std::nothrow) Fiber[kMaxGroupThreads];
    return fibers && stacks.ensure(n);
  }
  bool in_guard_page(uintptr_t addr) const {
    return stacks.in_guard_page(addr) || loop_stack.in_guard_page(addr);
  }
};

thread_local Worker* tls_worker = nullptr;

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

}  // namespace
