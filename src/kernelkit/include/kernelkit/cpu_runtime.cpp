// kernelkit CPU runtime (libkkrt): the C ABI of cpu_runtime.h, on the parts in cpu_runtime/:
//   context.h    the fiber context switch
//   stacks.h     the stacks kernel threads run on (KERNELKIT_CPU_STACK_SIZE)
//   worker.h     the state of a launch, its participants and their fibers
//   messages.h   the launch's error and the texts that explain it
//   scheduler.h  the fibers of a threadgroup: barriers and SIMD-group rendezvous
//   faults.h     faults in kernels (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT)
//   pool.h       the pool of workers and how a participant runs its groups
// One translation unit, built once per machine and cached:
//   g++ -std=c++17 -O2 -fPIC -shared -pthread cpu_runtime.cpp -o libkkrt.so
// (add -DKK_RT_UCONTEXT to use the portable ucontext switch instead of assembly).
#if __has_include("cpu_runtime.h")  // compiled in place
#include "cpu_runtime.h"
#define KK_RT_PARTS "cpu_runtime/pool.h"
#else  // compiled from a copy, with -I .../include
#include <kernelkit/cpu_runtime.h>
#define KK_RT_PARTS <kernelkit/cpu_runtime/pool.h>
#endif

#include <fenv.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <string>

extern "C" {
__attribute__((visibility("default"))) __thread const kk_thread_ctx* kk_rt_current = nullptr;
}

#include KK_RT_PARTS

#define KK_RT_API extern "C" __attribute__((visibility("default")))

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
  if (stack_setting().error[0]) {
    copy_error(err, errlen, ("kernel '" + std::string(kernel_name(d)) + "': " +
                             stack_setting().error).c_str());
    return 1;
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
  if (!w->ensure(n)) {
    char m[256];
    snprintf(m, sizeof m, "cannot reserve %u stacks of %zu KiB for the threadgroup's fibers; set "
             "KERNELKIT_CPU_STACK_SIZE lower", n, stack_setting().bytes / 1024);
    fail_here(nullptr, m);
  }
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
        f.t.tindex = x + y * sx + z * sx * sy;
        f.t.rt = &f;
        f.w = w;
        f.state = kRunnable;
        SimdGroup& S = w->sg[f.t.tindex >> 5];
        S.live |= 1u << (f.t.tindex & 31u);
        S.fiber[f.t.tindex & 31u] = short(i);
        char *lo, *hi;
        w->stacks.get(i, &lo, &hi);
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

KK_RT_API const kk_dim3* kk_rt_loop_only(void* worker) {
  return worker ? static_cast<Worker*>(worker)->only : nullptr;
}

KK_RT_API void kk_rt_fail(const kk_thread_ctx* t, const char* message) {
  fail_here(t, message ? message : "kk_rt_fail");
}

