// A kernel library shaped like the generated CPU source (DESIGN.md), written by
// hand on the target layer alone: built with -DSYNC=0 (loop mode: y = 2x + 1),
// -DSYNC=1 (fiber mode: per-group sums through simd_sum and threadgroup memory)
// or -DSYNC=2 (KK_CPU_ENTRY: both, chosen per launch by desc->uses_sync), and
// loaded by ctypes_driver.py after libkkrt (RTLD_GLOBAL).
#define KK_TARGET_CPU 1
#include <kernelkit/target_cpu.h>
#include <kernelkit/cpu_group.h>

#ifndef TG_FLOATS
#define TG_FLOATS 32
#endif

namespace metal {
struct plus {
  float operator()(float a, float b) const { return a + b; }
};

template <typename T>
KK_FN void custom_kernel_k(const T* inp, T* out, unsigned n, unsigned gid, unsigned lid,
                           unsigned tg_threads, unsigned group_id) {
#if SYNC == 2
  const bool fibers = kk_rt_current != nullptr;  // the launch's uses_sync picked the mode
#else
  const bool fibers = SYNC != 0;
#endif
  if (fibers) {  // per-group sums
    KK_THREADGROUP T partial[TG_FLOATS];  // one per SIMD-group
    T v = gid < n ? inp[gid] : T(0);
    T s = kk::simd_reduce<32>(v, plus(), KK_SITE("simd_sum"));
    if (lid % 32 == 0) partial[lid / 32] = s;
    kk::threadgroup_barrier();
    if (lid == 0) {
      T total = 0;
      for (unsigned k = 0; k < (tg_threads + 31) / 32; ++k) total += partial[k];
      out[group_id] = total;
    }
  } else if (gid < n) {  // y = 2x + 1
    out[gid] = inp[gid] * T(2) + T(1);
  }
}
}  // namespace metal

struct kk_args {
  const float* inp;
  float* out;
  unsigned n;
};

static inline void kk_thread_body(const kk_args& a, const kk_thread_ctx& t) {
  const unsigned gid = t.gid.x * t.tg_dispatch.x + t.tid.x;
  if (gid >= t.grid.x) return;  // never true on the CPU: such threads do not exist
  metal::custom_kernel_k<float>(a.inp, a.out, a.n, gid, t.tindex, t.tg_size.x, t.gid.x);
}

#if SYNC == 2  // both modes, chosen per launch by desc->uses_sync, as codegen.py emits
KK_CPU_ENTRY(kk_args, kk_thread_body)
#else
KK_CPU_KERNEL(kk_args, kk_thread_body, SYNC)
#endif
