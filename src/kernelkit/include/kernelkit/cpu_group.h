// kernelkit/cpu_group.h: how a CPU kernel library runs one threadgroup, and the
// exported entry points of a generated CPU kernel.
//
// The generated source ends with
//
//   static inline void kk_thread_body(const kk_args& a, const kk_thread_ctx& t) {
//     metal::custom_kernel_NAME<...>(a.x, ..., Metal attributes from t);
//   }
//   KK_CPU_ENTRY(kk_args, kk_thread_body)
//
// which exports (C, default visibility; build with -fvisibility=hidden so that
// nothing else is exported, threadgroup memory included):
//   void kk_group(const void* args, const kk_launch_desc* d, kk_dim3 gid, void* worker);
//   int  kk_launch(const void* args, const kk_launch_desc* d, char* err, size_t errlen);
//   void kk_thread(const void* args, const kk_thread_ctx* t);      // when fibers are compiled
// kk_launch(args, d, err, n) is kk_rt_launch(kk_group, args, d, err, n).
//
// Loop mode (the kernel uses no barrier and no SIMD-group function): the group's
// threads run as a plain loop, x fastest, with the body inlined, so that the
// compiler may vectorise it. kk_rt_current stays NULL: a synchronising call
// there fails the launch with a clear error instead of misbehaving.
// Fiber mode: every thread of the group is a fiber (kk_rt_run_fibers).
#pragma once

#include "cpu_runtime.h"

namespace kk {

// Number of threads of group gid in one dimension (edge groups are partial).
inline unsigned cpu_extent(unsigned grid, unsigned group, unsigned gid) {
  unsigned left = grid - gid * group;
  return left < group ? left : group;
}

// Calls f(const kk_thread_ctx&) for every existing thread of group gid, x fastest;
// or, when `only` is not NULL, for that thread alone (kk_rt_loop_only).
template <class F>
inline void cpu_group_loop(const kk_launch_desc* d, kk_dim3 gid, const kk_dim3* only, F&& f) {
  const kk_dim3 g = d->group;
  kk_thread_ctx t;
  t.gid = gid;
  t.tg_dispatch = g;
  t.num_groups = d->num_groups;
  t.grid = d->grid;
  t.rt = nullptr;
  const unsigned sx = cpu_extent(d->grid.x, g.x, gid.x);
  const unsigned sy = cpu_extent(d->grid.y, g.y, gid.y);
  const unsigned sz = cpu_extent(d->grid.z, g.z, gid.z);
  t.tg_size = kk_dim3{sx, sy, sz};
  // The x loop runs over the grid position px, which cannot wrap: the body's
  // gid.x * tg_dispatch.x + tid.x folds back to px, an affine index the
  // vectoriser understands (a 32-bit tid.x + base would not be).
  const unsigned x0 = gid.x * g.x;
  unsigned xa = x0, xb = x0 + sx, y0 = 0, y1 = sy, z0 = 0, z1 = sz;
  if (__builtin_expect(only != nullptr, 0)) {
    xa = x0 + only->x, xb = xa + 1, y0 = only->y, y1 = y0 + 1, z0 = only->z, z1 = z0 + 1;
  }
  for (unsigned z = z0; z < z1; ++z) {
    for (unsigned y = y0; y < y1; ++y) {
      const unsigned base = y * sx + z * sx * sy - x0;
      for (unsigned px = xa; px < xb; ++px) {
        t.tid = kk_dim3{px - x0, y, z};
        t.tindex = base + px;
        f(static_cast<const kk_thread_ctx&>(t));
      }
    }
  }
}

// Every thread of the group (host programs and tests that drive groups themselves).
template <class F>
inline void cpu_group_loop(const kk_launch_desc* d, kk_dim3 gid, F&& f) {
  cpu_group_loop(d, gid, nullptr, static_cast<F&&>(f));
}

}  // namespace kk

// A kernel cannot end the process: a CI job whose kernel calls exit(0) would pass. A call of
// exit, _Exit, quick_exit, _exit or abort that the kernel's unit (body, header) keeps is a
// compile error. These are glibc's own declarations (extern "C", noexcept, noreturn) with the
// error attribute added, so a header may still include <cstdlib> or <unistd.h>. A failed
// assert() (which aborts inside the C library) is a SIGABRT that the runtime turns into the
// launch's error. Host programs that include this header (tests) define KK_CPU_ALLOW_EXIT.
#if !defined(KK_CPU_ALLOW_EXIT)
#define KK_CPU_NO_EXIT(name)                                                              \
  __attribute__((noreturn, error("kernelkit: a kernel cannot end the process (" name "): " \
                                 "return from the kernel, or write an error flag to an output")))
extern "C" {
void exit(int) noexcept KK_CPU_NO_EXIT("exit");
void _Exit(int) noexcept KK_CPU_NO_EXIT("_Exit");
void quick_exit(int) noexcept KK_CPU_NO_EXIT("quick_exit");
void abort(void) noexcept KK_CPU_NO_EXIT("abort");
void _exit(int) KK_CPU_NO_EXIT("_exit");
}
#undef KK_CPU_NO_EXIT
#endif

#define KK_CPU_EXPORT extern "C" __attribute__((visibility("default")))

// BODY(const ARGS& a, const kk_thread_ctx& t) runs one thread.
//
// KK_CPU_ENTRY(ARGS, BODY): what codegen.py emits. Both modes are compiled and
// desc->uses_sync picks one per launch; define KK_CPU_SYNC to 0 or 1 before this
// point to compile only one (half the body's compile time).
// KK_CPU_KERNEL(ARGS, BODY, SYNC): one mode, SYNC = 0 (loop) or 1 (fibers),
// a literal or a macro expanding to one.
#if defined(KK_CPU_SYNC)
#define KK_CPU_ENTRY(ARGS, BODY) KK_CPU_KERNEL(ARGS, BODY, KK_CPU_SYNC)
#else
#define KK_CPU_ENTRY(ARGS, BODY)                                                             \
  KK_CPU_THREAD_FN(ARGS, BODY)                                                             \
  static void kk_group_impl(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) { \
    if (d->uses_sync) kk_rt_run_fibers(w, kk_thread_impl, a, d, gid);                      \
    else KK_CPU_LOOP(ARGS, BODY);                                                          \
  }                                                                                        \
  KK_CPU_EXPORTS_FIBERS
#endif

#define KK_CPU_KERNEL(ARGS, BODY, SYNC) KK_CPU_KERNEL_SELECT(ARGS, BODY, SYNC)
#define KK_CPU_KERNEL_SELECT(ARGS, BODY, SYNC) KK_CPU_KERNEL_##SYNC(ARGS, BODY)

#define KK_CPU_KERNEL_0(ARGS, BODY)                                                        \
  static void kk_group_impl(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) { \
    KK_CPU_LOOP(ARGS, BODY);                                                               \
  }                                                                                        \
  KK_CPU_EXPORTS

#define KK_CPU_KERNEL_1(ARGS, BODY)                                                        \
  KK_CPU_THREAD_FN(ARGS, BODY)                                                             \
  static void kk_group_impl(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) { \
    kk_rt_run_fibers(w, kk_thread_impl, a, d, gid);                                        \
  }                                                                                        \
  KK_CPU_EXPORTS_FIBERS

// The group's threads as a loop, on a local copy of the argument block (kept in
// registers: the body's pointer loads hoist out of the loop).
#define KK_CPU_LOOP(ARGS, BODY)                                                            \
  do {                                                                                     \
    ARGS kk_args_copy;                                                                     \
    __builtin_memcpy(&kk_args_copy, a, sizeof(ARGS));                                      \
    const ARGS& kk_args_ref = kk_args_copy;                                                \
    ::kk::cpu_group_loop(d, gid, kk_rt_loop_only(w),                                      \
                         [&kk_args_ref](const kk_thread_ctx& t) { BODY(kk_args_ref, t); }); \
  } while (0)

#define KK_CPU_THREAD_FN(ARGS, BODY)                                                       \
  static void kk_thread_impl(const void* a, const kk_thread_ctx* t) {                      \
    BODY(*static_cast<const ARGS*>(a), *t);                                                \
  }

// The launch passes the static kk_group_impl, never the exported symbol, so that
// no other library's kk_group can interpose.
#define KK_CPU_EXPORTS                                                                     \
  KK_CPU_EXPORT void kk_group(const void* a, const kk_launch_desc* d, kk_dim3 gid, void* w) { \
    kk_group_impl(a, d, gid, w);                                                           \
  }                                                                                        \
  KK_CPU_EXPORT int kk_launch(const void* a, const kk_launch_desc* d, char* err, size_t n) { \
    return kk_rt_launch(kk_group_impl, a, d, err, n);                                      \
  }

#define KK_CPU_EXPORTS_FIBERS                                                              \
  KK_CPU_EXPORT void kk_thread(const void* a, const kk_thread_ctx* t) { kk_thread_impl(a, t); } \
  KK_CPU_EXPORTS
