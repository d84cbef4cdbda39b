// kernelkit/cpu_runtime/pool.h: the participants of a launch (the pool's workers and the
// calling thread) and how each runs its share of the groups (part of libkkrt).
//
// kk_rt_launch hands out threadgroup indices from an atomic counter to the calling thread and,
// for launches that are big enough, to a persistent pool of workers. Each participant runs
// whole groups, one at a time, through the kernel library's kk_group, on its loop stack
// (stacks.h). So a group never leaves the OS thread that started it, and a
// `static thread_local` variable in the kernel is that group's threadgroup memory.
// Errors (a rendezvous that cannot complete, kk_rt_fail, a fault) set the launch's error once;
// the other participants stop taking groups.
#pragma once

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "faults.h"
#include "scheduler.h"

namespace {

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
      w->gid = gid;  // for the error text of a fault
      L->fn(L->args, L->d, gid, w);
    }
  }
}

void run_group(Worker* w) { w->launch->fn(w->launch->args, w->launch->d, w->gid, w); }
void run_chunks(Worker* w) { participate_chunks(w->launch, w); }

void loop_main(void* p) {
  Worker* w = static_cast<Worker*>(p);
  bool threw = false;
  try {
    w->loop_fn(w);
  } catch (...) {
    threw = true;
  }
  if (threw) fail_here(nullptr, "a C++ exception escaped the kernel");
  ctx_switch(&w->loop_ctx, &w->os_ctx);
  __builtin_trap();  // never resumed
}

// Runs fn(w) on w's loop stack; false when the stack cannot be reserved.
bool on_loop_stack(Worker* w, void (*fn)(Worker*)) {
  if (!w->loop_stack.ensure(1)) return false;
  char *lo, *hi;
  w->loop_stack.get(0, &lo, &hi);
  w->loop_fn = fn;
  ctx_make(&w->loop_ctx, lo, hi, loop_main, w);
  ctx_switch(&w->os_ctx, &w->loop_ctx);
  return true;
}

void no_stack_error(Launch* L) {
  std::string msg;
  append(msg, "kernel '%s': cannot reserve %zu KiB of address space for a kernel thread's "
         "stack; set KERNELKIT_CPU_STACK_SIZE lower", kernel_name(L->d),
         stack_setting().bytes / 1024);
  set_error(L, msg.c_str());
}

// Loop mode does not know which thread of group w->gid faulted: runs the group again, one
// thread at a time in the loop's order, until one faults with the same signal, and returns it
// in *t. (The launch failed: what the threads write again does not matter. A group that runs
// differently the second time leaves the thread unknown.)
bool trace_loop_thread(Launch* L, Worker* w, int sig, kk_thread_ctx* t) {
  const kk_launch_desc* d = L->d;
  const kk_dim3 g = d->group, gid = w->gid;
  const unsigned sx = std::min(g.x, d->grid.x - gid.x * g.x);
  const unsigned sy = std::min(g.y, d->grid.y - gid.y * g.y);
  const unsigned sz = std::min(g.z, d->grid.z - gid.z * g.z);
  static thread_local kk_dim3 one;
  static thread_local unsigned k;  // survives the jump back
  k = 0;
  w->fault_sig = 0;
  w->only = &one;
  if (sigsetjmp(w->jb, 0) == 0) {
    w->in_kernel = 1;
    for (; k < sx * sy * sz; ++k) {
      one = kk_dim3{k % sx, (k / sx) % sy, k / (sx * sy)};
      if (!on_loop_stack(w, run_group)) break;
    }
  }
  w->in_kernel = 0;
  w->only = nullptr;
  const int again = w->fault_sig;
  if (again) unblock_signal(again);
  w->fault_sig = 0;
  if (again != sig) return false;
  t->tid = one;
  t->gid = gid;
  t->tg_size = kk_dim3{sx, sy, sz};
  t->tg_dispatch = g;
  t->num_groups = d->num_groups;
  t->grid = d->grid;
  t->tindex = one.x + one.y * sx + one.z * sx * sy;
  t->rt = nullptr;
  return true;
}

// After the handler jumped back: the launch's error for the fault, and the group's fibers
// abandoned (their stacks are reused by the next group).
void fault_error(Launch* L, Worker* w) {
  const int sig = w->fault_sig;
  unblock_signal(sig);
  std::string what, cause;
  describe_fault(w, &what, &cause);
  const kk_thread_ctx* t = *w->current;  // the running fiber (NULL in loop mode)
  kk_thread_ctx traced;
  if (!t && !L->d->uses_sync && trace_loop_thread(L, w, sig, &traced)) t = &traced;
  std::string msg;
  append(msg, "kernel '%s': ", kernel_name(L->d));
  msg += what + " in " + (t ? thread_text(*t) : group_text(w)) +
         " (the CPU backend stopped the launch; " + cause + ")";
  set_error(L, msg.c_str());
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
    if (!on_loop_stack(w, run_chunks)) no_stack_error(L);
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
  std::string msg;
  append(msg, "kernel '%s': %s", kernel_name(w->launch->d), message);
  if (!t && f) t = &f->t;
  if (t) msg += " (" + thread_text(*t) + ")";
  set_error(w->launch, msg.c_str());
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
