// kernelkit/cpu_runtime.h: the C ABI of the CPU runtime (libkkrt, built from
// cpu_runtime.cpp and its parts in cpu_runtime/). Kernel libraries call it; Python calls kk_launch in a kernel
// library (which calls kk_rt_launch). libkkrt must be loaded with RTLD_GLOBAL
// before any kernel library so that these symbols resolve against it.
//
// Model: a launch spreads its threadgroups over a persistent pool of worker
// threads (the calling thread works too). A threadgroup runs entirely on one OS
// thread, one group at a time per OS thread: either as a plain loop over its
// threads (a kernel with no barrier or SIMD-group function) or as one fiber per
// thread, scheduled round-robin, which block at barriers and SIMD rendezvous.
// Every kernel thread runs on a stack of KERNELKIT_CPU_STACK_SIZE bytes (default
// 8 MiB, committed as it is touched).
#pragma once

#include <stddef.h>

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KK_RT_ABI_VERSION 2

// Runs ONE thread of the kernel (fiber mode).
typedef void (*kk_thread_fn)(const void* args, const kk_thread_ctx* t);
// Runs ONE threadgroup: gid is its position; worker is the runtime's opaque state
// of the OS thread running it (pass it on to kk_rt_run_fibers).
typedef void (*kk_group_fn)(const void* args, const kk_launch_desc* d, kk_dim3 gid, void* worker);

// Runs every threadgroup of the launch and returns when all are done: 0, or
// nonzero with the error text (NUL-terminated, truncated to errlen) in err.
// Thread-safe; small launches run on the calling thread alone.
int kk_rt_launch(kk_group_fn group, const void* args, const kk_launch_desc* d, char* err,
                 size_t errlen);

// Runs the existing threads of group gid as fibers calling fn, until all have
// returned or the launch failed. Only from inside a kk_group_fn.
void kk_rt_run_fibers(void* worker, kk_thread_fn fn, const void* args, const kk_launch_desc* d,
                      kk_dim3 gid);

// Loop mode (from inside a kk_group_fn): NULL to run every thread of the group, or
// the one thread to run (the runtime runs a group again one thread at a time to
// find which thread faulted).
const kk_dim3* kk_rt_loop_only(void* worker);

// The context of the fiber running on this OS thread (NULL outside fiber mode).
// Set by the runtime before every fiber resumes.
extern __thread const kk_thread_ctx* kk_rt_current;

// threadgroup_barrier: rendezvous of the live threads of t's threadgroup at one
// site. simdgroup_barrier: of the lanes of t's SIMD-group at one site, as
// kk_rt_simd_exchange. site may be NULL (then the return address identifies the
// call site).
void kk_rt_threadgroup_barrier(const kk_thread_ctx* t, const kk_site* site);
void kk_rt_simdgroup_barrier(const kk_thread_ctx* t, const kk_site* site);

// Rendezvous of the lanes of t's SIMD-group at one site: the live lanes waiting at
// this site when every live lane of the group is blocked (at a SIMD site, a barrier)
// or has returned are the call's active lanes (Metal's and CUDA's active-lane
// semantics). Returns their mask and fills all_out[lane*size .. +size) with each of
// their `in` (slots of other lanes are unspecified). size may be 0.
unsigned kk_rt_simd_exchange(const kk_thread_ctx* t, const kk_site* site, const void* in,
                             void* all_out, size_t size);

// Stops the launch with this error; never returns into the kernel. The text
// comes back as "kernel 'NAME': MESSAGE (thread (x,y,z) of threadgroup (a,b,c),
// grid position (i,j,k))" (the position when t is not NULL, or in fiber mode).
// t may be NULL (e.g. in loop mode).
void kk_rt_fail(const kk_thread_ctx* t, const char* message)
#ifdef __GNUC__
    __attribute__((noreturn))
#endif
    ;

// Total parallelism of a launch: pool workers + the calling thread. Set by the
// environment variable KERNELKIT_NUM_THREADS (default: the CPUs this process may use).
int kk_rt_num_threads(void);
// KK_RT_ABI_VERSION of the library, to check a cached libkkrt against this header.
int kk_rt_abi_version(void);

#ifdef __cplusplus
}
#endif
