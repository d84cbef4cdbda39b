// kernelkit/launch.h: what a thread knows about where it runs, the same on every target.
// The generated entry fills a kk_thread_ctx (CUDA: from threadIdx/blockIdx; CPU: the
// runtime fills it) and derives Metal's attributes from it in one place.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kk_dim3 {
  unsigned x, y, z;
} kk_dim3;

typedef struct kk_thread_ctx {
  kk_dim3 tid;          // thread_position_in_threadgroup
  kk_dim3 gid;          // threadgroup_position_in_grid
  kk_dim3 tg_size;      // threads_per_threadgroup: the actual size, smaller in edge groups
  kk_dim3 tg_dispatch;  // dispatch_threads_per_threadgroup: the launched group size
  kk_dim3 num_groups;   // threadgroups_per_grid
  kk_dim3 grid;         // threads_per_grid (Metal's grid, in threads)
  unsigned tindex;      // thread_index_in_threadgroup: tid linearised over tg_size (x fastest)
  void* rt;             // CPU runtime's private state for this thread (fiber); unused on CUDA
} kk_thread_ctx;

// A launch as the CPU runtime sees it.
typedef struct kk_launch_desc {
  kk_dim3 grid;         // threads per dimension
  kk_dim3 group;        // threadgroup size, already clamped to the grid
  kk_dim3 num_groups;   // ceil(grid / group)
  int uses_sync;        // 1: the kernel uses barriers or SIMD-group functions -> fibers
  const char* kernel_name;
} kk_launch_desc;

// Where a synchronising call (barrier, SIMD-group function) is in the kernel source.
// Barriers and SIMD-group rendezvous match by site: two threads meet only when they
// wait at the same (op, file, line). Built at the call site with KK_SITE("simd_sum"),
// usually as a defaulted trailing parameter, so that __builtin_FILE/__builtin_LINE
// name the user's line (the generated source's `#line 1 "body"` makes that "body:N").
// file == NULL: the site is not known; the CPU runtime then uses the return address.
typedef struct kk_site {
  const char* op;       // "simd_sum", "threadgroup_barrier", ...: for messages and identity
  const char* file;     // __builtin_FILE() at the call, or NULL
  unsigned line;        // __builtin_LINE() at the call
} kk_site;

#ifdef __cplusplus
}
// A braced list, for a parameter or variable of type kk_site: `kk::site s = KK_SITE("x")`
// or f(KK_SITE("x")). (g++ evaluates __builtin_LINE() in a defaulted parameter at the
// call only when it is not inside a typed expression such as kk_site{...}.)
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KK_SITE(op) {(op), nullptr, 0u}  // the GPU needs no sites
#else
#define KK_SITE(op) {(op), __builtin_FILE(), static_cast<unsigned>(__builtin_LINE())}
#endif
namespace kk {
typedef ::kk_dim3 dim3;
typedef ::kk_thread_ctx thread_ctx;
typedef ::kk_launch_desc launch_desc;
typedef ::kk_site site;
}  // namespace kk
#endif
