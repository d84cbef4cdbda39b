// kernelkit/cuda_cpu.h: CUDA C++ kernel bodies on the CPU backend.
//
// `kk.cuda_kernel` bodies are CUDA C++. On the GPU they compile against the real
// CUDA headers (NVRTC); on the CPU against this header, which gives the names a
// kernel body uses their CUDA meaning on top of the CPU target layer
// (target_cpu.h: fibers, SIMD-group rendezvous, atomics) and MSL's 16-bit floats
// (metal/half.h). The generated source includes it through kernelkit/cuda.h.
//
// Mapping (CUDA -> CPU backend)
//   thread block                 threadgroup: one OS thread runs it, its threads as
//                                fibers (any synchronising name used) or as a loop
//   warp (32 lanes)              SIMD-group: lanes tindex & 31 of the block, as CUDA
//   threadIdx/blockIdx/...       the current thread's kk_thread_ctx (macros)
//   __shared__                   `thread_local`: per group (static at block scope)
//   extern __shared__ T x[]      KK_EXTERN_SHARED(T, x) (the front end rewrites it):
//                                a per-OS-thread buffer of the launch's shared_memory
//   __syncthreads, cg sync       kk::threadgroup_barrier (one rendezvous)
//   __shfl*_sync, votes,         one kk::simd_* rendezvous each, CUDA's lane rules
//   __reduce_*_sync, match         (width sub-sections, out-of-range lanes...)
//   atomic*                      kk::atomic_* (real atomics: groups run in parallel)
//   __half / __nv_bfloat16       metal::half / metal::bfloat (2 bytes, float math
//                                rounded to nearest even)
//   math, intrinsics             <math.h> plus what CUDA adds (rsqrtf, sinpif,
//                                erfinvf, __expf, __fadd_rz, __popc, __byte_perm...)
//   cooperative_groups           thread_block, tiles of 1..32, coalesced_group,
//                                grid_group (ranks only), reduce, scans, memcpy_async
//
// Supported with a difference
//   - A `mask` argument of a *_sync warp function is not a rendezvous set: every
//     live lane of the warp (one that has not returned) must reach the same call
//     (the same source line), as with Metal's SIMD-group functions. A call
//     reached by only some lanes (e.g. `if (lane < 16) __shfl_sync(0xffff, ...)`)
//     stops the launch with an error naming the line; it never hangs. Results are
//     then restricted to the lanes in mask (ballot, votes, match). __activemask()
//     is a rendezvous too and returns the live lanes.
//   - __syncwarp and a tile's sync() are a rendezvous of the whole warp.
//   - Reading a lane that does not exist (a partial last warp) gives the
//     caller's own value (CUDA: undefined).
//   - The fast intrinsics (__expf, __sinf...) are the precise functions.
// Not supported
//   - cooperative_groups::grid_group::sync() (needs a cooperative launch; it stops
//     the launch with an error), multi-grid and cluster groups, thread_block_tile
//     larger than 32, the dynamic cg::tiled_partition(group, n).
//   - Textures and surfaces, inline PTX (asm), warp matrix functions (mma.h,
//     wmma), the 8-bit float types (cuda_fp8.h), curand, __nanosleep timing.
//   - Partial-mask warp calls (above); __noinline__ breaks libstdc++'s <memory>
//     if that is included after this header (as with old nvcc).
//   - #pragma unroll is ignored (g++ warns with -Wunknown-pragmas).
//
// Synchronising names (the generated code's KK_CPU_SYNC must be 1 when the body
// or the header uses any): __syncthreads*, __syncwarp, __shfl*_sync,
// __ballot_sync, __any_sync, __all_sync, __uni_sync, __activemask,
// __reduce_*_sync, __match_*_sync, and cooperative_groups (cg::...).
//
// Contract with the generated code (kernelkit/cuda.h and the entry):
//   KK_CUDA_BIND_THREAD(t, shared_bytes)   first statement of every thread
//   KK_EXTERN_SHARED(T, name)              `extern __shared__ T name[];`
// If KK_CPU_SYNC is already defined (0 or 1) when this header is included, the
// thread context is read without testing the mode (faster loop-mode kernels);
// otherwise each read tests kk_rt_current (NULL in loop mode).
#pragma once

#define KK_CUDA_CPU 1

#ifndef KK_TARGET_DEFINED
#include "target_cpu.h"
#endif

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "metal/traits.h"  // metal/half.h needs metal's traits
#include "metal/half.h"

// ===========================================================================
// Qualifiers

#define __global__
#define __device__
#define __host__
#define __managed__
#define __constant__  // program-scope data the kernel only reads
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __maxnreg__(n)
#define __cluster_dims__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __device_builtin__
#define __cudart_builtin__
// A group runs on one OS thread, its fibers on it, one group at a time: a
// thread_local is per-group memory. (At block scope thread_local implies static,
// so `__shared__ float s[32];` and `static __shared__ float s[32];` both work.)
#define __shared__ thread_local
#define KK_EXTERN_SHARED(T, name) T* const name = static_cast<T*>(::kk_cuda_cpu::dynamic_shared())
#define KK_CUDA_BIND_THREAD(t, shared_bytes) ::kk_cuda_cpu::bind_thread((t), (shared_bytes))

#if defined(__has_builtin)
#if !__has_builtin(__builtin_assume)
#define __builtin_assume(x) ((void)0)
#endif
#endif

// ===========================================================================
// Vector types (plain aggregates with CUDA's sizes and alignments; CUDA gives
// them no arithmetic operators) and make_<type>(...).

typedef ::kk_dim3 uint3;  // what threadIdx and blockIdx are

#define KK_CUDA_VEC1(T, N) \
  struct N##1 { T x; };
#define KK_CUDA_VEC2(T, N, A) \
  struct __attribute__((aligned(A))) N##2 { T x, y; };
#define KK_CUDA_VEC3(T, N) \
  struct N##3 { T x, y, z; };
#define KK_CUDA_VEC4(T, N, A) \
  struct __attribute__((aligned(A))) N##4 { T x, y, z, w; };
#define KK_CUDA_MAKE(T, N)                                                                           \
  inline constexpr N##1 make_##N##1(T x) { return N##1{x}; }                                         \
  inline constexpr N##2 make_##N##2(T x, T y) { return N##2{x, y}; }                                 \
  inline constexpr N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }                         \
  inline constexpr N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
#define KK_CUDA_VECS(T, N, A2, A4) \
  KK_CUDA_VEC1(T, N) KK_CUDA_VEC2(T, N, A2) KK_CUDA_VEC3(T, N) KK_CUDA_VEC4(T, N, A4) KK_CUDA_MAKE(T, N)

KK_CUDA_VECS(signed char, char, 2, 4)
KK_CUDA_VECS(unsigned char, uchar, 2, 4)
KK_CUDA_VECS(short, short, 4, 8)
KK_CUDA_VECS(unsigned short, ushort, 4, 8)
KK_CUDA_VECS(int, int, 8, 16)
KK_CUDA_VECS(long, long, 2 * sizeof(long), 16)
KK_CUDA_VECS(unsigned long, ulong, 2 * sizeof(long), 16)
KK_CUDA_VECS(long long, longlong, 16, 16)
KK_CUDA_VECS(unsigned long long, ulonglong, 16, 16)
KK_CUDA_VECS(float, float, 8, 16)
KK_CUDA_VECS(double, double, 16, 16)
// uint: uint3 is kk_dim3 (above)
KK_CUDA_VEC1(unsigned, uint)
KK_CUDA_VEC2(unsigned, uint, 8)
KK_CUDA_VEC4(unsigned, uint, 16)
KK_CUDA_MAKE(unsigned, uint)
#undef KK_CUDA_VECS
#undef KK_CUDA_MAKE
#undef KK_CUDA_VEC4
#undef KK_CUDA_VEC3
#undef KK_CUDA_VEC2
#undef KK_CUDA_VEC1

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ===========================================================================
// The current thread, shared memory, failing the launch.

namespace kk_cuda_cpu {

// Loop mode: the context of the thread the loop is running (KK_CUDA_BIND_THREAD).
// Fiber mode reads kk_rt_current, which the runtime sets before a fiber resumes.
inline thread_local const kk_thread_ctx* tl_ctx = nullptr;

inline const kk_thread_ctx& ctx() {
#if defined(KK_CPU_SYNC) && KK_CPU_SYNC == 1
  return *kk_rt_current;
#elif defined(KK_CPU_SYNC) && KK_CPU_SYNC == 0
  return *tl_ctx;
#else
  const kk_thread_ctx* c = kk_rt_current;
  return c ? *c : *tl_ctx;
#endif
}

// Dynamic shared memory: one buffer per OS thread (so per running group), grown
// by the first thread of a group, before any other thread of the group runs.
inline thread_local unsigned char* tl_shared = nullptr;
inline thread_local size_t tl_shared_cap = 0;

struct shared_owner {  // frees the buffer when the OS thread exits
  ~shared_owner() {
    free(tl_shared);
    tl_shared = nullptr;
    tl_shared_cap = 0;
  }
};

__attribute__((noinline)) inline void grow_shared(size_t bytes) {
  static thread_local shared_owner owner;
  (void)owner;
  const size_t cap = (bytes + 4095) & ~size_t(4095);
  void* p = aligned_alloc(64, cap);
  if (!p) kk_rt_fail(kk_rt_current ? kk_rt_current : tl_ctx, "cannot allocate the dynamic shared memory");
  free(tl_shared);
  tl_shared = static_cast<unsigned char*>(p);
  tl_shared_cap = cap;
}

inline void bind_thread(const kk_thread_ctx& t, size_t shared_bytes) {
  tl_ctx = &t;
  if (__builtin_expect(shared_bytes > tl_shared_cap || !tl_shared, 0)) grow_shared(shared_bytes ? shared_bytes : 16);
}

inline void* dynamic_shared() { return tl_shared; }

// Stops the launch with this message, naming the call site when known.
[[noreturn]] inline void fail(const char* what, const kk::site& s) {
  char msg[512];
  if (s.file)
    snprintf(msg, sizeof msg, "%s at %s:%u", what, s.file, s.line);
  else
    snprintf(msg, sizeof msg, "%s", what);
  kk_rt_fail(&ctx(), msg);
}

inline unsigned lane_id() { return ctx().tindex & 31u; }
inline dim3 to_dim3(const kk_dim3& d) { return dim3(d.x, d.y, d.z); }

}  // namespace kk_cuda_cpu

#define threadIdx (::kk_cuda_cpu::ctx().tid)
#define blockIdx (::kk_cuda_cpu::ctx().gid)
#define blockDim (::kk_cuda_cpu::to_dim3(::kk_cuda_cpu::ctx().tg_dispatch))
#define gridDim (::kk_cuda_cpu::to_dim3(::kk_cuda_cpu::ctx().num_groups))
constexpr int warpSize = 32;
#ifndef WARP_SIZE
#define WARP_SIZE 32
#endif

// kernel-side assert(): stops the launch with the failed condition and its line
// instead of aborting the process (glibc's assert calls __assert_fail).
#if defined(__GLIBC__) && !defined(KK_CUDA_CPU_NO_ASSERT_HOOK)
extern "C" __attribute__((visibility("hidden"), noreturn)) inline void __assert_fail(
    const char* assertion, const char* file, unsigned int line, const char* function) noexcept {
  char msg[512];
  snprintf(msg, sizeof msg, "assertion `%s' failed at %s:%u (in %s)", assertion, file, line, function);
  kk_rt_fail(kk_rt_current ? kk_rt_current : ::kk_cuda_cpu::tl_ctx, msg);
}
#endif

// ===========================================================================
// Synchronisation, fences, warp functions.

inline void __syncthreads(kk::site s = KK_SITE("__syncthreads")) { kk::threadgroup_barrier(s); }

namespace kk_cuda_cpu {
// Three barriers: clear, add, read. The group's threads share one OS thread, so
// the counter needs no atomics; the next call's clear waits for every read.
inline thread_local int tl_sync_acc;
template <class Op>
inline int syncthreads_fold(int p, int init, Op op, const kk::site& s) {
  kk::threadgroup_barrier(s);
  tl_sync_acc = init;
  kk::threadgroup_barrier(s);
  tl_sync_acc = op(tl_sync_acc, p);
  kk::threadgroup_barrier(s);
  return tl_sync_acc;
}
}  // namespace kk_cuda_cpu

inline int __syncthreads_count(int p, kk::site s = KK_SITE("__syncthreads_count")) {
  return kk_cuda_cpu::syncthreads_fold(p != 0, 0, [](int a, int b) { return a + b; }, s);
}
inline int __syncthreads_and(int p, kk::site s = KK_SITE("__syncthreads_and")) {
  return kk_cuda_cpu::syncthreads_fold(p != 0, 1, [](int a, int b) { return a & b; }, s);
}
inline int __syncthreads_or(int p, kk::site s = KK_SITE("__syncthreads_or")) {
  return kk_cuda_cpu::syncthreads_fold(p != 0, 0, [](int a, int b) { return a | b; }, s);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, kk::site s = KK_SITE("__syncwarp")) {
  (void)mask;
  kk::simdgroup_barrier(s);
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// A group's threads share one OS thread: a compiler fence orders them.
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

inline unsigned __activemask(kk::site s = KK_SITE("__activemask")) { return kk::simd_active_mask(s); }

namespace kk_cuda_cpu {
// Source lane of PTX shfl.sync (the PTX ISA's pseudo-code): c packs the segment
// mask (bits 12:8) and the clamp (bits 4:0); a lane out of range reads itself.
enum shfl_mode { shfl_idx, shfl_up, shfl_down, shfl_bfly };
inline unsigned shfl_source(shfl_mode mode, unsigned b, int width) {
  const int lane = int(lane_id());
  const int bval = int(b & 31u);
  const int segmask = (32 - width) & 31;
  const int cval = mode == shfl_up ? 0 : 31;
  const int max_lane = (lane & segmask) | (cval & ~segmask);
  const int min_lane = lane & segmask;
  int j;
  bool ok;
  switch (mode) {
    case shfl_up: j = lane - bval; ok = j >= max_lane; break;
    case shfl_down: j = lane + bval; ok = j <= max_lane; break;
    case shfl_bfly: j = lane ^ bval; ok = j <= max_lane; break;
    default: j = min_lane | (bval & ~segmask); ok = j <= max_lane; break;
  }
  return unsigned(ok ? j : lane);
}

// One rendezvous: the active lanes and every lane's predicate.
inline unsigned vote(bool p, unsigned* active, const kk::site& s) {
  kk::cpu_detail::lanes<bool> all;
  unsigned mask = kk::simd_exchange(p, all.data(), s), r = 0;
  for (unsigned m = mask; m; m &= m - 1) {
    unsigned lane = unsigned(__builtin_ctz(m));
    if (all.get(lane)) r |= 1u << lane;
  }
  *active = mask;
  return r;
}

template <class T>
inline bool same_bits(const T& a, const T& b) { return memcmp(&a, &b, sizeof(T)) == 0; }

struct op_add { template <class T> T operator()(T a, T b) const { return T(a + b); } };
struct op_min { template <class T> T operator()(T a, T b) const { return b < a ? b : a; } };
struct op_max { template <class T> T operator()(T a, T b) const { return a < b ? b : a; } };
struct op_and { template <class T> T operator()(T a, T b) const { return T(a & b); } };
struct op_or { template <class T> T operator()(T a, T b) const { return T(a | b); } };
struct op_xor { template <class T> T operator()(T a, T b) const { return T(a ^ b); } };
}  // namespace kk_cuda_cpu

// Any trivially copyable T (CUDA: the arithmetic types, __half, __half2...).
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,
                     kk::site s = KK_SITE("__shfl_sync")) {
  (void)mask;
  return kk::simd_shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_idx, unsigned(srcLane), width), s);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        kk::site s = KK_SITE("__shfl_up_sync")) {
  (void)mask;
  return kk::simd_shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_up, delta, width), s);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          kk::site s = KK_SITE("__shfl_down_sync")) {
  (void)mask;
  return kk::simd_shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_down, delta, width), s);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                         kk::site s = KK_SITE("__shfl_xor_sync")) {
  (void)mask;
  return kk::simd_shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_bfly, unsigned(laneMask), width), s);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__ballot_sync")) {
  return kk::simd_ballot(predicate != 0, s) & mask;
}
inline int __any_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__any_sync")) {
  return (kk::simd_ballot(predicate != 0, s) & mask) != 0;
}
inline int __all_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__all_sync")) {
  return (kk::simd_ballot(predicate == 0, s) & mask) == 0;
}
inline int __uni_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__uni_sync")) {
  unsigned active;
  const unsigned yes = kk_cuda_cpu::vote(predicate != 0, &active, s) & mask;
  return yes == 0 || yes == (active & mask);
}

#define KK_CUDA_WARP_REDUCE(NAME, T, OP)                                       \
  inline T NAME(unsigned mask, T value, kk::site s = KK_SITE(#NAME)) {         \
    (void)mask;                                                                \
    return kk::simd_reduce<32>(value, kk_cuda_cpu::OP{}, s);                   \
  }
KK_CUDA_WARP_REDUCE(__reduce_add_sync, unsigned, op_add)
KK_CUDA_WARP_REDUCE(__reduce_add_sync, int, op_add)
KK_CUDA_WARP_REDUCE(__reduce_min_sync, unsigned, op_min)
KK_CUDA_WARP_REDUCE(__reduce_min_sync, int, op_min)
KK_CUDA_WARP_REDUCE(__reduce_max_sync, unsigned, op_max)
KK_CUDA_WARP_REDUCE(__reduce_max_sync, int, op_max)
KK_CUDA_WARP_REDUCE(__reduce_and_sync, unsigned, op_and)
KK_CUDA_WARP_REDUCE(__reduce_or_sync, unsigned, op_or)
KK_CUDA_WARP_REDUCE(__reduce_xor_sync, unsigned, op_xor)
#undef KK_CUDA_WARP_REDUCE

// Lanes of mask (and live) whose value has the same bits as this lane's.
template <class T>
inline unsigned __match_any_sync(unsigned mask, T value, kk::site s = KK_SITE("__match_any_sync")) {
  kk::cpu_detail::lanes<T> all;
  unsigned m = kk::simd_exchange(value, all.data(), s) & mask, r = 0;
  for (; m; m &= m - 1) {
    unsigned lane = unsigned(__builtin_ctz(m));
    if (kk_cuda_cpu::same_bits(all.get(lane), value)) r |= 1u << lane;
  }
  return r;
}
// mask (its live lanes) when they all hold the same value (*pred = 1), else 0.
template <class T>
inline unsigned __match_all_sync(unsigned mask, T value, int* pred, kk::site s = KK_SITE("__match_all_sync")) {
  kk::cpu_detail::lanes<T> all;
  const unsigned act = kk::simd_exchange(value, all.data(), s) & mask;
  bool same = true;
  for (unsigned m = act; m; m &= m - 1)
    same = same && kk_cuda_cpu::same_bits(all.get(unsigned(__builtin_ctz(m))), value);
  *pred = same;
  return same ? act : 0u;
}

// ===========================================================================
// Atomics (kk::atomic_*: relaxed, real atomics), with CUDA's overloads. The
// _block and _system variants are the same operations.

#define KK_CUDA_ATOMIC(NAME, T, EXPR)                 \
  inline T NAME(T* address, T val) { return EXPR; }   \
  inline T NAME##_block(T* address, T val) { return EXPR; } \
  inline T NAME##_system(T* address, T val) { return EXPR; }

KK_CUDA_ATOMIC(atomicAdd, int, kk::atomic_fetch_add(address, val))
KK_CUDA_ATOMIC(atomicAdd, unsigned, kk::atomic_fetch_add(address, val))
KK_CUDA_ATOMIC(atomicAdd, unsigned long long, kk::atomic_fetch_add(address, val))
KK_CUDA_ATOMIC(atomicAdd, float, kk::atomic_fetch_add(address, val))
KK_CUDA_ATOMIC(atomicAdd, double, kk::atomic_fetch_add(address, val))
KK_CUDA_ATOMIC(atomicSub, int, kk::atomic_fetch_sub(address, val))
KK_CUDA_ATOMIC(atomicSub, unsigned, kk::atomic_fetch_sub(address, val))
KK_CUDA_ATOMIC(atomicExch, int, kk::atomic_exchange(address, val))
KK_CUDA_ATOMIC(atomicExch, unsigned, kk::atomic_exchange(address, val))
KK_CUDA_ATOMIC(atomicExch, unsigned long long, kk::atomic_exchange(address, val))
KK_CUDA_ATOMIC(atomicExch, float, kk::atomic_exchange(address, val))
#define KK_CUDA_ATOMIC_INTS(NAME, FN)                     \
  KK_CUDA_ATOMIC(NAME, int, FN(address, val))             \
  KK_CUDA_ATOMIC(NAME, unsigned, FN(address, val))        \
  KK_CUDA_ATOMIC(NAME, long long, FN(address, val))       \
  KK_CUDA_ATOMIC(NAME, unsigned long long, FN(address, val))
KK_CUDA_ATOMIC_INTS(atomicMin, kk::atomic_fetch_min)
KK_CUDA_ATOMIC_INTS(atomicMax, kk::atomic_fetch_max)
KK_CUDA_ATOMIC_INTS(atomicAnd, kk::atomic_fetch_and)
KK_CUDA_ATOMIC_INTS(atomicOr, kk::atomic_fetch_or)
KK_CUDA_ATOMIC_INTS(atomicXor, kk::atomic_fetch_xor)
#undef KK_CUDA_ATOMIC_INTS

// ((old >= val) ? 0 : old + 1) and (((old == 0) || (old > val)) ? val : old - 1).
KK_CUDA_ATOMIC(atomicInc, unsigned,
               kk::cpu_detail::cas_update(address, [val](unsigned o) { return o >= val ? 0u : o + 1u; }))
KK_CUDA_ATOMIC(atomicDec, unsigned,
               kk::cpu_detail::cas_update(address, [val](unsigned o) { return (o == 0u || o > val) ? val : o - 1u; }))

#define KK_CUDA_ATOMIC_CAS(T)                                                     \
  inline T atomicCAS(T* address, T compare, T val) {                              \
    kk::atomic_compare_exchange(address, &compare, val);                          \
    return compare; /* the old value, whether or not it was swapped */            \
  }                                                                               \
  inline T atomicCAS_block(T* a, T c, T v) { return atomicCAS(a, c, v); }        \
  inline T atomicCAS_system(T* a, T c, T v) { return atomicCAS(a, c, v); }
KK_CUDA_ATOMIC_CAS(int)
KK_CUDA_ATOMIC_CAS(unsigned)
KK_CUDA_ATOMIC_CAS(unsigned long long)
KK_CUDA_ATOMIC_CAS(unsigned short)
#undef KK_CUDA_ATOMIC_CAS

// float2 / float4 (sm_90): each component is one atomic.
inline float2 atomicAdd(float2* address, float2 val) {
  return float2{kk::atomic_fetch_add(&address->x, val.x), kk::atomic_fetch_add(&address->y, val.y)};
}
inline float4 atomicAdd(float4* address, float4 val) {
  return float4{kk::atomic_fetch_add(&address->x, val.x), kk::atomic_fetch_add(&address->y, val.y),
                kk::atomic_fetch_add(&address->z, val.z), kk::atomic_fetch_add(&address->w, val.w)};
}

// ===========================================================================
// 16-bit floats: __half and __nv_bfloat16 are MSL's half and bfloat (2 bytes,
// trivially copyable; + - * / in float, rounded to nearest even, which is
// correctly rounded; half op float gives float).

typedef metal::half __half;
typedef metal::bfloat __nv_bfloat16;
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

namespace kk_cuda_cpu {
template <class H>
struct alignas(4) f16x2 {
  H x, y;
  f16x2() = default;
  constexpr f16x2(const H& a, const H& b) : x(a), y(b) {}
};
template <class H>
struct is_f16 : std::false_type {};
template <> struct is_f16<__half> : std::true_type {};
template <> struct is_f16<__nv_bfloat16> : std::true_type {};
}  // namespace kk_cuda_cpu

typedef kk_cuda_cpu::f16x2<__half> __half2;
typedef kk_cuda_cpu::f16x2<__nv_bfloat16> __nv_bfloat162;
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

// Bit-level views, as CUDA's __half_raw / __nv_bfloat16_raw.
struct __half_raw {
  unsigned short x;
  __half_raw() = default;
  constexpr __half_raw(unsigned short v) : x(v) {}
  constexpr __half_raw(const __half& h) : x(h.bits) {}
  constexpr operator __half() const { return __half::from_bits(x); }
};
struct __nv_bfloat16_raw {
  unsigned short x;
  __nv_bfloat16_raw() = default;
  constexpr __nv_bfloat16_raw(unsigned short v) : x(v) {}
  constexpr __nv_bfloat16_raw(const __nv_bfloat16& h) : x(h.bits) {}
  constexpr operator __nv_bfloat16() const { return __nv_bfloat16::from_bits(x); }
};
struct __half2_raw {
  unsigned short x, y;
  constexpr operator __half2() const { return __half2(__half::from_bits(x), __half::from_bits(y)); }
};
struct __nv_bfloat162_raw {
  unsigned short x, y;
  constexpr operator __nv_bfloat162() const {
    return __nv_bfloat162(__nv_bfloat16::from_bits(x), __nv_bfloat16::from_bits(y));
  }
};

namespace kk_cuda_cpu {
// float -> F with a rounding mode: 'n' nearest even, 'z' toward zero, 'd' down, 'u' up.
// Round to nearest, then step one unit where that went the wrong way.
template <class H>
inline unsigned short f16_step(unsigned short b, bool up) {  // next value up or down
  const bool neg = b & 0x8000u;
  const unsigned short mag = b & 0x7fffu;
  if (mag == 0) return up ? 0x0001u : 0x8001u;
  return static_cast<unsigned short>((up != neg) ? b + 1 : b - 1);
}
template <class H>
inline H f16_from_float(float f, char mode) {
  const H h = H(f);
  if (mode == 'n' || f != f) return h;
  const float back = float(h);
  bool step, up;
  if (mode == 'u') {
    step = back < f, up = true;
  } else if (mode == 'd') {
    step = back > f, up = false;
  } else {  // 'z'
    step = fabsf(back) > fabsf(f), up = back < 0;
  }
  return step ? H::from_bits(f16_step<H>(h.bits, up)) : h;
}

// double -> float rounded to odd (the last bit set when inexact): rounding that
// to a 16-bit float then is correct rounding of the double (float keeps more
// than two extra bits).
inline float float_round_odd(double d) {
  float f = float(d);
  if (double(f) == d || d != d || std::isinf(f)) return f;  // exact, NaN, overflow
  uint32_t u;
  memcpy(&u, &f, 4);
  if (fabs(double(f)) > fabs(d)) u -= 1;  // truncate toward zero...
  u |= 1u;                                 // ...and mark inexact
  memcpy(&f, &u, 4);
  return f;
}
// hi + lo (|lo| below half an ulp of hi) rounded to odd in double.
inline double double_round_odd(double hi, double lo) {
  if (lo == 0 || hi != hi || std::isinf(hi)) return hi;
  uint64_t u;
  memcpy(&u, &hi, 8);
  if ((u & 1u) == 0) hi = nextafter(hi, lo > 0 ? INFINITY : -INFINITY);
  return hi;
}
template <class H>
inline H f16_from_double(double d) { return H(float_round_odd(d)); }
// a * b + c, rounded once.
template <class H>
inline H f16_fma(H a, H b, H c) {
  const double p = double(float(a)) * double(float(b));  // exact (at most 22 bits)
  const double cc = double(float(c));
  const double s = p + cc;                                // TwoSum: s + e == p + c exactly
  const double bb = s - p;
  const double e = (p - (s - bb)) + (cc - bb);
  return f16_from_double<H>(double_round_odd(s, e));
}

template <class H>
inline H f16_sat(H a) {  // clamp to [0, 1], NaN -> 0
  const float f = float(a);
  return f > 0.0f ? (f < 1.0f ? a : H(1.0f)) : H(0.0f);
}
template <class I, class H>
inline I f16_to_int(H h, char mode) {  // saturating, NaN -> 0, as the GPU converts
  float f = float(h);
  if (f != f) return I(0);
  f = mode == 'n' ? nearbyintf(f) : mode == 'z' ? truncf(f) : mode == 'd' ? floorf(f) : ceilf(f);
  if (f <= float(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (f >= float(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(f);
}
template <class H, class I>
inline H int_to_f16(I v, char mode) {
  const double d = double(v);  // exact up to 2^53; the 16-bit range is far below
  return f16_from_float<H>(float(d), mode);
}
}  // namespace kk_cuda_cpu

// Conversions
#define KK_CUDA_F16_CONVERSIONS(H, F2H, H2F, SFX)                                                   \
  inline H F2H(float f) { return H(f); }                                                           \
  inline H F2H##_rn(float f) { return H(f); }                                                      \
  inline H F2H##_rz(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'z'); }                    \
  inline H F2H##_rd(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'd'); }                    \
  inline H F2H##_ru(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'u'); }                    \
  inline float H2F(H h) { return float(h); }                                                       \
  inline H __double2##SFX(double d) { return kk_cuda_cpu::f16_from_double<H>(d); }                 \
  inline unsigned short __##SFX##_as_ushort(H h) { return h.bits; }                                \
  inline short __##SFX##_as_short(H h) { return short(h.bits); }                                   \
  inline H __ushort_as_##SFX(unsigned short b) { return H::from_bits(b); }                         \
  inline H __short_as_##SFX(short b) { return H::from_bits(static_cast<unsigned short>(b)); }
KK_CUDA_F16_CONVERSIONS(__half, __float2half, __half2float, half)
KK_CUDA_F16_CONVERSIONS(__nv_bfloat16, __float2bfloat16, __bfloat162float, bfloat16)
#undef KK_CUDA_F16_CONVERSIONS

#define KK_CUDA_F16_INT(H, SFX, I, ISFX)                                                             \
  inline I __##SFX##2##ISFX##_rn(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'n'); }                 \
  inline I __##SFX##2##ISFX##_rz(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'z'); }                 \
  inline I __##SFX##2##ISFX##_rd(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'd'); }                 \
  inline I __##SFX##2##ISFX##_ru(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'u'); }                 \
  inline H __##ISFX##2##SFX##_rn(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'n'); }                 \
  inline H __##ISFX##2##SFX##_rz(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'z'); }                 \
  inline H __##ISFX##2##SFX##_rd(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'd'); }                 \
  inline H __##ISFX##2##SFX##_ru(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'u'); }
#define KK_CUDA_F16_INTS(H, SFX)                    \
  KK_CUDA_F16_INT(H, SFX, int, int)                 \
  KK_CUDA_F16_INT(H, SFX, unsigned, uint)           \
  KK_CUDA_F16_INT(H, SFX, short, short)             \
  KK_CUDA_F16_INT(H, SFX, unsigned short, ushort)   \
  KK_CUDA_F16_INT(H, SFX, long long, ll)            \
  KK_CUDA_F16_INT(H, SFX, unsigned long long, ull)
KK_CUDA_F16_INTS(__half, half)
KK_CUDA_F16_INTS(__nv_bfloat16, bfloat16)
#undef KK_CUDA_F16_INTS
#undef KK_CUDA_F16_INT
inline signed char __half2char_rz(__half h) { return kk_cuda_cpu::f16_to_int<signed char>(h, 'z'); }
inline unsigned char __half2uchar_rz(__half h) { return kk_cuda_cpu::f16_to_int<unsigned char>(h, 'z'); }

// Arithmetic and comparisons (the same names for both types, as CUDA).
#define KK_CUDA_F16_OPS(H)                                                                          \
  inline H __hadd(H a, H b) { return H(float(a) + float(b)); }                                     \
  inline H __hsub(H a, H b) { return H(float(a) - float(b)); }                                     \
  inline H __hmul(H a, H b) { return H(float(a) * float(b)); }                                     \
  inline H __hdiv(H a, H b) { return H(float(a) / float(b)); }                                     \
  inline H __hadd_rn(H a, H b) { return __hadd(a, b); }                                             \
  inline H __hsub_rn(H a, H b) { return __hsub(a, b); }                                             \
  inline H __hmul_rn(H a, H b) { return __hmul(a, b); }                                             \
  inline H __hfma(H a, H b, H c) { return kk_cuda_cpu::f16_fma(a, b, c); }                          \
  inline H __hneg(H a) { return H::from_bits(static_cast<unsigned short>(a.bits ^ 0x8000u)); }      \
  inline H __habs(H a) { return H::from_bits(static_cast<unsigned short>(a.bits & 0x7fffu)); }      \
  inline H __hadd_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hadd(a, b)); }                      \
  inline H __hsub_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hsub(a, b)); }                      \
  inline H __hmul_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hmul(a, b)); }                      \
  inline H __hfma_sat(H a, H b, H c) { return kk_cuda_cpu::f16_sat(__hfma(a, b, c)); }              \
  inline H __hfma_relu(H a, H b, H c) {                                                             \
    H r = __hfma(a, b, c);                                                                          \
    return float(r) < 0.0f ? H(0.0f) : r;                                                           \
  }                                                                                                 \
  inline H __hmax(H a, H b) { return H(fmaxf(float(a), float(b))); }                               \
  inline H __hmin(H a, H b) { return H(fminf(float(a), float(b))); }                               \
  inline H __hmax_nan(H a, H b) { return (a != a || b != b) ? H(NAN) : __hmax(a, b); }             \
  inline H __hmin_nan(H a, H b) { return (a != a || b != b) ? H(NAN) : __hmin(a, b); }             \
  inline bool __heq(H a, H b) { return float(a) == float(b); }                                      \
  inline bool __hne(H a, H b) { return float(a) < float(b) || float(a) > float(b); }                \
  inline bool __hlt(H a, H b) { return float(a) < float(b); }                                       \
  inline bool __hle(H a, H b) { return float(a) <= float(b); }                                      \
  inline bool __hgt(H a, H b) { return float(a) > float(b); }                                       \
  inline bool __hge(H a, H b) { return float(a) >= float(b); }                                      \
  inline bool __hequ(H a, H b) { return !(float(a) < float(b) || float(a) > float(b)); }            \
  inline bool __hneu(H a, H b) { return !(float(a) == float(b)); }                                  \
  inline bool __hltu(H a, H b) { return !(float(a) >= float(b)); }                                  \
  inline bool __hleu(H a, H b) { return !(float(a) > float(b)); }                                   \
  inline bool __hgtu(H a, H b) { return !(float(a) <= float(b)); }                                  \
  inline bool __hgeu(H a, H b) { return !(float(a) < float(b)); }                                   \
  inline bool __hisnan(H a) { return (a.bits & 0x7fffu) > H(INFINITY).bits; }                    \
  inline int __hisinf(H a) {                                                                        \
    return (a.bits & 0x7fffu) == H(INFINITY).bits ? ((a.bits & 0x8000u) ? -1 : 1) : 0;             \
  }                                                                                                 \
  inline H hexp(H a) { return H(expf(float(a))); }                                                  \
  inline H hexp2(H a) { return H(exp2f(float(a))); }                                                \
  inline H hexp10(H a) { return H(exp10f(float(a))); }                                              \
  inline H hlog(H a) { return H(logf(float(a))); }                                                  \
  inline H hlog2(H a) { return H(log2f(float(a))); }                                                \
  inline H hlog10(H a) { return H(log10f(float(a))); }                                              \
  inline H hsqrt(H a) { return H(sqrtf(float(a))); }                                                \
  inline H hrsqrt(H a) { return H(1.0f / sqrtf(float(a))); }                                        \
  inline H hrcp(H a) { return H(1.0f / float(a)); }                                                 \
  inline H hsin(H a) { return H(sinf(float(a))); }                                                  \
  inline H hcos(H a) { return H(cosf(float(a))); }                                                  \
  inline H htanh(H a) { return H(tanhf(float(a))); }                                                \
  inline H htanh_approx(H a) { return htanh(a); }                                                   \
  inline H hfloor(H a) { return H(floorf(float(a))); }                                              \
  inline H hceil(H a) { return H(ceilf(float(a))); }                                                \
  inline H htrunc(H a) { return H(truncf(float(a))); }                                              \
  inline H hrint(H a) { return H(nearbyintf(float(a))); }
KK_CUDA_F16_OPS(__half)
KK_CUDA_F16_OPS(__nv_bfloat16)
#undef KK_CUDA_F16_OPS

// Pairs: __half2 and __nv_bfloat162 (element-wise, same names for both).
#define KK_CUDA_F16X2_MAP1(NAME, F)                                                           \
  template <class H> inline kk_cuda_cpu::f16x2<H> NAME(kk_cuda_cpu::f16x2<H> a) {             \
    return kk_cuda_cpu::f16x2<H>(F(a.x), F(a.y));                                             \
  }
#define KK_CUDA_F16X2_MAP2(NAME, F)                                                                         \
  template <class H> inline kk_cuda_cpu::f16x2<H> NAME(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {  \
    return kk_cuda_cpu::f16x2<H>(F(a.x, b.x), F(a.y, b.y));                                                 \
  }
KK_CUDA_F16X2_MAP2(__hadd2, __hadd)
KK_CUDA_F16X2_MAP2(__hsub2, __hsub)
KK_CUDA_F16X2_MAP2(__hmul2, __hmul)
KK_CUDA_F16X2_MAP2(__h2div, __hdiv)
KK_CUDA_F16X2_MAP2(__hadd2_sat, __hadd_sat)
KK_CUDA_F16X2_MAP2(__hsub2_sat, __hsub_sat)
KK_CUDA_F16X2_MAP2(__hmul2_sat, __hmul_sat)
KK_CUDA_F16X2_MAP2(__hmax2, __hmax)
KK_CUDA_F16X2_MAP2(__hmin2, __hmin)
KK_CUDA_F16X2_MAP2(__hmax2_nan, __hmax_nan)
KK_CUDA_F16X2_MAP2(__hmin2_nan, __hmin_nan)
KK_CUDA_F16X2_MAP1(__hneg2, __hneg)
KK_CUDA_F16X2_MAP1(__habs2, __habs)
KK_CUDA_F16X2_MAP1(h2exp, hexp)
KK_CUDA_F16X2_MAP1(h2exp2, hexp2)
KK_CUDA_F16X2_MAP1(h2exp10, hexp10)
KK_CUDA_F16X2_MAP1(h2log, hlog)
KK_CUDA_F16X2_MAP1(h2log2, hlog2)
KK_CUDA_F16X2_MAP1(h2log10, hlog10)
KK_CUDA_F16X2_MAP1(h2sqrt, hsqrt)
KK_CUDA_F16X2_MAP1(h2rsqrt, hrsqrt)
KK_CUDA_F16X2_MAP1(h2rcp, hrcp)
KK_CUDA_F16X2_MAP1(h2sin, hsin)
KK_CUDA_F16X2_MAP1(h2cos, hcos)
KK_CUDA_F16X2_MAP1(h2tanh, htanh)
KK_CUDA_F16X2_MAP1(h2floor, hfloor)
KK_CUDA_F16X2_MAP1(h2ceil, hceil)
KK_CUDA_F16X2_MAP1(h2trunc, htrunc)
KK_CUDA_F16X2_MAP1(h2rint, hrint)
#undef KK_CUDA_F16X2_MAP1
#undef KK_CUDA_F16X2_MAP2
template <class H>
inline kk_cuda_cpu::f16x2<H> __hfma2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b, kk_cuda_cpu::f16x2<H> c) {
  return kk_cuda_cpu::f16x2<H>(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
// Comparisons: __hb*2 are true when both halves compare true; __h*2 give 1.0 or 0.0 per half.
#define KK_CUDA_F16X2_CMP(OP, CMP)                                                                  \
  template <class H> inline bool __hb##OP##2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {    \
    return CMP(a.x, b.x) && CMP(a.y, b.y);                                                          \
  }                                                                                                 \
  template <class H>                                                                                \
  inline kk_cuda_cpu::f16x2<H> __h##OP##2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {       \
    return kk_cuda_cpu::f16x2<H>(H(CMP(a.x, b.x) ? 1.0f : 0.0f), H(CMP(a.y, b.y) ? 1.0f : 0.0f));  \
  }
KK_CUDA_F16X2_CMP(eq, __heq)
KK_CUDA_F16X2_CMP(ne, __hne)
KK_CUDA_F16X2_CMP(lt, __hlt)
KK_CUDA_F16X2_CMP(le, __hle)
KK_CUDA_F16X2_CMP(gt, __hgt)
KK_CUDA_F16X2_CMP(ge, __hge)
#undef KK_CUDA_F16X2_CMP

namespace kk_cuda_cpu {
// Operators of the pairs (found by argument-dependent lookup).
#define KK_CUDA_F16X2_OP(OP, FN)                                                                  \
  template <class H> inline f16x2<H> operator OP(f16x2<H> a, f16x2<H> b) { return FN(a, b); }    \
  template <class H> inline f16x2<H>& operator OP##=(f16x2<H>& a, f16x2<H> b) { return a = FN(a, b); }
KK_CUDA_F16X2_OP(+, ::__hadd2)
KK_CUDA_F16X2_OP(-, ::__hsub2)
KK_CUDA_F16X2_OP(*, ::__hmul2)
KK_CUDA_F16X2_OP(/, ::__h2div)
#undef KK_CUDA_F16X2_OP
template <class H> inline f16x2<H> operator-(f16x2<H> a) { return ::__hneg2(a); }
template <class H> inline f16x2<H> operator+(f16x2<H> a) { return a; }
template <class H> inline bool operator==(f16x2<H> a, f16x2<H> b) { return ::__hbeq2(a, b); }
template <class H> inline bool operator!=(f16x2<H> a, f16x2<H> b) { return ::__hbne2(a, b); }
template <class H> inline bool operator<(f16x2<H> a, f16x2<H> b) { return ::__hblt2(a, b); }
template <class H> inline bool operator<=(f16x2<H> a, f16x2<H> b) { return ::__hble2(a, b); }
template <class H> inline bool operator>(f16x2<H> a, f16x2<H> b) { return ::__hbgt2(a, b); }
template <class H> inline bool operator>=(f16x2<H> a, f16x2<H> b) { return ::__hbge2(a, b); }
}  // namespace kk_cuda_cpu

// Building and taking apart pairs.
inline __half2 make_half2(__half x, __half y) { return __half2(x, y); }
inline __half2 __halves2half2(__half x, __half y) { return __half2(x, y); }
inline __half2 __half2half2(__half x) { return __half2(x, x); }
inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
inline __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 x) { return __nv_bfloat162(x, x); }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __nv_bfloat162(__nv_bfloat16(f), __nv_bfloat16(f)); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b)); }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162(__nv_bfloat16(f.x), __nv_bfloat16(f.y)); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
template <class H> inline float __low2float(kk_cuda_cpu::f16x2<H> h) { return float(h.x); }
template <class H> inline float __high2float(kk_cuda_cpu::f16x2<H> h) { return float(h.y); }
template <class H> inline kk_cuda_cpu::f16x2<H> __lows2half2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {
  return kk_cuda_cpu::f16x2<H>(a.x, b.x);
}
template <class H> inline kk_cuda_cpu::f16x2<H> __highs2half2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {
  return kk_cuda_cpu::f16x2<H>(a.y, b.y);
}
template <class H> inline kk_cuda_cpu::f16x2<H> __low2half2(kk_cuda_cpu::f16x2<H> a) { return kk_cuda_cpu::f16x2<H>(a.x, a.x); }
template <class H> inline kk_cuda_cpu::f16x2<H> __high2half2(kk_cuda_cpu::f16x2<H> a) { return kk_cuda_cpu::f16x2<H>(a.y, a.y); }
template <class H> inline kk_cuda_cpu::f16x2<H> __lowhigh2highlow(kk_cuda_cpu::f16x2<H> a) {
  return kk_cuda_cpu::f16x2<H>(a.y, a.x);
}
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __lows2half2(a, b); }
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __highs2half2(a, b); }
inline __nv_bfloat162 __low2bfloat162(__nv_bfloat162 a) { return __low2half2(a); }
inline __nv_bfloat162 __high2bfloat162(__nv_bfloat162 a) { return __high2half2(a); }

// Atomics on 16-bit floats: a CAS loop, arithmetic in float rounded back.
inline __half atomicAdd(__half* address, __half val) { return kk::atomic_fetch_add(address, val); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 val) { return kk::atomic_fetch_add(address, val); }
template <class H>
inline kk_cuda_cpu::f16x2<H> atomicAdd(kk_cuda_cpu::f16x2<H>* address, kk_cuda_cpu::f16x2<H> val) {
  return kk::cpu_detail::cas_update(address, [val](kk_cuda_cpu::f16x2<H> o) { return __hadd2(o, val); });
}

// Limits and constants of cuda_fp16.h / cuda_bf16.h.
#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_FP16 __ushort_as_half((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_NEG_ZERO_FP16 __ushort_as_half((unsigned short)0x8000U)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)
#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_BF16 __ushort_as_bfloat16((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_NEG_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x8000U)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)

// ===========================================================================
// Math. The C functions (expf, sinf, fmaxf...) and C++ overloads come from
// <math.h>; below are CUDA's additions.

// C++ math on a 16-bit float: CUDA converts it to float (one conversion); here
// half converts to float and double, so these overloads pick float.
#define KK_CUDA_F16_MATH1(NAME, RET)                                                             \
  inline RET NAME(__half x) { return std::NAME(float(x)); }                                    \
  inline RET NAME(__nv_bfloat16 x) { return std::NAME(float(x)); }
KK_CUDA_F16_MATH1(exp, float)
KK_CUDA_F16_MATH1(exp2, float)
KK_CUDA_F16_MATH1(expm1, float)
KK_CUDA_F16_MATH1(log, float)
KK_CUDA_F16_MATH1(log2, float)
KK_CUDA_F16_MATH1(log10, float)
KK_CUDA_F16_MATH1(log1p, float)
KK_CUDA_F16_MATH1(sqrt, float)
KK_CUDA_F16_MATH1(cbrt, float)
KK_CUDA_F16_MATH1(sin, float)
KK_CUDA_F16_MATH1(cos, float)
KK_CUDA_F16_MATH1(tan, float)
KK_CUDA_F16_MATH1(asin, float)
KK_CUDA_F16_MATH1(acos, float)
KK_CUDA_F16_MATH1(atan, float)
KK_CUDA_F16_MATH1(sinh, float)
KK_CUDA_F16_MATH1(cosh, float)
KK_CUDA_F16_MATH1(tanh, float)
KK_CUDA_F16_MATH1(asinh, float)
KK_CUDA_F16_MATH1(acosh, float)
KK_CUDA_F16_MATH1(atanh, float)
KK_CUDA_F16_MATH1(erf, float)
KK_CUDA_F16_MATH1(erfc, float)
KK_CUDA_F16_MATH1(tgamma, float)
KK_CUDA_F16_MATH1(lgamma, float)
KK_CUDA_F16_MATH1(fabs, float)
KK_CUDA_F16_MATH1(floor, float)
KK_CUDA_F16_MATH1(ceil, float)
KK_CUDA_F16_MATH1(round, float)
KK_CUDA_F16_MATH1(trunc, float)
KK_CUDA_F16_MATH1(rint, float)
KK_CUDA_F16_MATH1(isnan, bool)
KK_CUDA_F16_MATH1(isinf, bool)
KK_CUDA_F16_MATH1(isfinite, bool)
KK_CUDA_F16_MATH1(signbit, bool)
#undef KK_CUDA_F16_MATH1
namespace kk_cuda_cpu {
template <class... A>
constexpr bool f16_args = (... || is_f16<std::decay_t<A>>::value) &&
                          (... && (is_f16<std::decay_t<A>>::value || std::is_arithmetic<std::decay_t<A>>::value));
}  // namespace kk_cuda_cpu
#define KK_CUDA_F16_MATH2(NAME)                                                                       \
  template <class A, class B, std::enable_if_t<kk_cuda_cpu::f16_args<A, B>, int> = 0>                 \
  inline float NAME(A a, B b) { return std::NAME(static_cast<float>(a), static_cast<float>(b)); }
KK_CUDA_F16_MATH2(pow)
KK_CUDA_F16_MATH2(atan2)
KK_CUDA_F16_MATH2(fmod)
KK_CUDA_F16_MATH2(fmin)
KK_CUDA_F16_MATH2(fmax)
KK_CUDA_F16_MATH2(hypot)
KK_CUDA_F16_MATH2(copysign)
KK_CUDA_F16_MATH2(fdim)
#undef KK_CUDA_F16_MATH2

namespace kk_cuda_cpu {
constexpr double pi = 3.14159265358979323846;

// sin(pi x) and cos(pi x) with exact argument reduction: x = n/2 + f, |f| <= 1/4.
inline void sincospi(double x, double* s, double* c) {
  if (std::isinf(x) || x != x) {
    *s = *c = NAN;
    return;
  }
  const double n = nearbyint(2.0 * x);
  const double f = x - 0.5 * n;  // exact
  const double sf = sin(pi * f), cf = cos(pi * f);
  const long q = long(fmod(n, 4.0)) & 3;  // fmod is exact
  switch (q) {
    case 0: *s = sf; *c = cf; break;
    case 1: *s = cf; *c = -sf; break;
    case 2: *s = -sf; *c = -cf; break;
    default: *s = -cf; *c = sf; break;
  }
  if (*s == 0) *s = copysign(0.0, x);  // sinpi(-n) is -0 (and +0 for +n)
  if (*c == 0) *c = 0.0;               // cospi(n + 1/2) is +0
}

// erfinv and erfcinv: a first guess (Giles, "Approximating the erfinv
// function"), then Newton steps on erf(x) = y near 0 and on log(erfc(x)) =
// log(1 - y) in the tails, in double.
inline double erfinv_guess(double a) {  // 0 <= a < 1
  double w = -log((1.0 - a) * (1.0 + a)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  return p * a;
}
// x >= 0 with erfc(x) = t, 0 < t <= 1, from the guess x.
inline double erfc_solve(double x, double t) {
  const double k = 2.0 / sqrt(pi), lt = log(t);
  for (int i = 0; i < 8; ++i) {
    const double ec = erfc(x);
    if (!(ec > 0)) break;
    const double step = (log(ec) - lt) / (-k * exp(-x * x) / ec);
    x -= step;
    if (fabs(step) <= 1e-17 * x) break;
  }
  return x;
}
inline double erfinv(double y) {
  if (y != y || y < -1 || y > 1) return NAN;
  if (y == 1 || y == -1) return copysign(INFINITY, y);
  if (y == 0) return y;
  const double a = fabs(y);
  double x = erfinv_guess(a);
  if (a < 0.5) {
    const double k = 2.0 / sqrt(pi);
    for (int i = 0; i < 3; ++i) x -= (erf(x) - a) / (k * exp(-x * x));
  } else {
    x = erfc_solve(x, 1.0 - a);  // 1 - a is exact (Sterbenz)
  }
  return copysign(x, y);
}
inline double erfcinv(double z) {  // z in [0, 2]
  if (z != z || z < 0 || z > 2) return NAN;
  if (z == 0) return INFINITY;
  if (z == 2) return -INFINITY;
  if (z > 1) return -erfcinv(2.0 - z);  // 2 - z is exact
  if (z > 0.5) return erfinv(1.0 - z);  // exact
  double x;
  if (z > 1e-15) {
    x = erfinv_guess(1.0 - z);
  } else {  // erfc(x) ~ exp(-x^2) / (x sqrt(pi))
    x = sqrt(-log(z));
    x = sqrt(fmax(-log(z) - log(x * sqrt(pi)), 0.25));
  }
  return erfc_solve(x, z);
}

// exp(x^2) erfc(x), with the asymptotic series where exp(x^2) overflows.
inline double erfcx(double x) {
  if (x < 25.0) return exp(x * x) * erfc(x);
  const double r = 1.0 / (2.0 * x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 10; ++k) {
    term *= -(2.0 * k - 1.0) * r;
    sum += term;
  }
  return sum / (x * sqrt(pi));
}

// A float result of the exact value hi + lo (|lo| below half an ulp of hi, or
// hi exact), rounded with mode 'n', 'z', 'u' or 'd'.
inline float round_float(double hi, double lo, char mode) {
  float f = float(hi);
  if (hi != hi || std::isinf(hi)) return f;
  const double d = double(f) - hi;
  // sign of f - (hi + lo): d when nonzero (|d| >= one ulp of hi > |lo|), else -lo
  const int above = d > 0 ? 1 : d < 0 ? -1 : (lo < 0 ? 1 : lo > 0 ? -1 : 0);
  if (above == 0) return f;  // exact
  if (mode == 'n') {
    // hi a midpoint of two floats and lo breaking the tie the other way
    if (lo != 0) {
      const float g = nextafterf(f, above > 0 ? -INFINITY : INFINITY);
      if (!std::isinf(g) && double(f) - hi == hi - double(g) && d != 0) return (lo > 0) == (g > f) ? g : f;
    }
    return f;
  }
  const double exact_sign = hi != 0 ? hi : lo;
  bool toward_up;
  if (mode == 'u') {
    if (above > 0) return f;
    toward_up = true;
  } else if (mode == 'd') {
    if (above < 0) return f;
    toward_up = false;
  } else {  // 'z': the result must not be larger in magnitude
    if ((exact_sign > 0 && above < 0) || (exact_sign < 0 && above > 0)) return f;
    toward_up = exact_sign < 0;
  }
  return nextafterf(f, toward_up ? INFINITY : -INFINITY);
}
inline void two_sum(double a, double b, double* s, double* e) {
  *s = a + b;
  const double bb = *s - a;
  *e = (a - (*s - bb)) + (b - bb);
}
inline float fadd(float a, float b, char m) {
  double s, e;
  two_sum(a, b, &s, &e);
  return round_float(s, e, m);
}
inline float fmul(float a, float b, char m) { return round_float(double(a) * double(b), 0.0, m); }
inline float ffma(float a, float b, float c, char m) {
  double s, e;
  two_sum(double(a) * double(b), c, &s, &e);
  return round_float(s, e, m);
}
inline float fdiv(float a, float b, char m) {
  const double q = double(a) / double(b);
  if (q != q || std::isinf(q) || q == 0) return round_float(q, 0.0, m);
  const double r = fma(-q, double(b), double(a));  // exact remainder
  return round_float(q, r / double(b), m);
}
inline float fsqrt(float x, char m) {
  const double s = sqrt(double(x));
  if (s != s || std::isinf(s) || s == 0) return float(s);
  return round_float(s, fma(-s, s, double(x)) / (2.0 * s), m);
}
// An opaque copy: keeps a *_rn result from being fused into a neighbouring fma.
template <class T>
inline T opaque(T v) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  __asm__ volatile("" : "+m"(v));
#endif
  return v;
}

template <class I, class F>
inline I float_to_int(F f, char mode) {  // saturating, NaN -> 0, as the GPU converts
  if (f != f) return I(0);
  f = mode == 'n' ? std::nearbyint(f) : mode == 'z' ? std::trunc(f) : mode == 'd' ? std::floor(f) : std::ceil(f);
  if (f <= F(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (f >= F(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(f);
}
template <class To, class From>
inline To bits(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "sizes differ");
  To t;
  memcpy(&t, &f, sizeof t);
  return t;
}
}  // namespace kk_cuda_cpu

// Functions CUDA adds to the C library, float and double (and C++ overloads).
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rsqrt(float x) { return rsqrtf(x); }
inline float rcbrtf(float x) { return float(1.0 / cbrt(double(x))); }
inline double rcbrt(double x) { return 1.0 / cbrt(x); }
inline float rcbrt(float x) { return rcbrtf(x); }
inline float exp10(float x) { return exp10f(x); }
inline void sincos(float x, float* s, float* c) { sincosf(x, s, c); }
inline void sincospi(double x, double* s, double* c) { kk_cuda_cpu::sincospi(x, s, c); }
inline void sincospif(float x, float* s, float* c) {
  double ds, dc;
  kk_cuda_cpu::sincospi(x, &ds, &dc);
  *s = float(ds);
  *c = float(dc);
}
inline void sincospi(float x, float* s, float* c) { sincospif(x, s, c); }
inline double sinpi(double x) { double s, c; kk_cuda_cpu::sincospi(x, &s, &c); return s; }
inline double cospi(double x) { double s, c; kk_cuda_cpu::sincospi(x, &s, &c); return c; }
inline float sinpif(float x) { return float(sinpi(double(x))); }
inline float cospif(float x) { return float(cospi(double(x))); }
inline float sinpi(float x) { return sinpif(x); }
inline float cospi(float x) { return cospif(x); }
inline double erfinv(double y) { return kk_cuda_cpu::erfinv(y); }
inline float erfinvf(float y) { return float(kk_cuda_cpu::erfinv(y)); }
inline float erfinv(float y) { return erfinvf(y); }
inline double erfcinv(double z) { return kk_cuda_cpu::erfcinv(z); }
inline float erfcinvf(float z) { return float(kk_cuda_cpu::erfcinv(z)); }
inline float erfcinv(float z) { return erfcinvf(z); }
inline double erfcx(double x) { return kk_cuda_cpu::erfcx(x); }
inline float erfcxf(float x) { return float(kk_cuda_cpu::erfcx(x)); }
inline float erfcx(float x) { return erfcxf(x); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }
inline float normcdff(float x) { return float(normcdf(double(x))); }
inline float normcdf(float x) { return normcdff(x); }
inline double normcdfinv(double p) { return -1.41421356237309504880 * kk_cuda_cpu::erfcinv(2.0 * p); }
inline float normcdfinvf(float p) { return float(normcdfinv(double(p))); }
inline float normcdfinv(float p) { return normcdfinvf(p); }
inline float fdividef(float x, float y) { return x / y; }
inline double rhypot(double x, double y) { return 1.0 / hypot(x, y); }
inline float rhypotf(float x, float y) { return float(rhypot(x, y)); }
inline float rhypot(float x, float y) { return rhypotf(x, y); }
inline double norm3d(double a, double b, double c) { return sqrt(a * a + b * b + c * c); }
inline float norm3df(float a, float b, float c) { return float(norm3d(a, b, c)); }
inline double rnorm3d(double a, double b, double c) { return 1.0 / norm3d(a, b, c); }
inline float rnorm3df(float a, float b, float c) { return float(rnorm3d(a, b, c)); }
inline double norm4d(double a, double b, double c, double d) { return sqrt(a * a + b * b + c * c + d * d); }
inline float norm4df(float a, float b, float c, float d) { return float(norm4d(a, b, c, d)); }
inline double rnorm4d(double a, double b, double c, double d) { return 1.0 / norm4d(a, b, c, d); }
inline float rnorm4df(float a, float b, float c, float d) { return float(rnorm4d(a, b, c, d)); }
inline double norm(int dim, const double* p) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += p[i] * p[i];
  return sqrt(s);
}
inline float normf(int dim, const float* p) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += double(p[i]) * p[i];
  return float(sqrt(s));
}
inline double rnorm(int dim, const double* p) { return 1.0 / norm(dim, p); }
inline float rnormf(int dim, const float* p) { return 1.0f / normf(dim, p); }

// Intrinsics. The fast approximations (__expf...) are the precise functions here.
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline float __tanhf(float x) { return tanhf(x); }

// Arithmetic with an explicit rounding mode (never fused with other operations).
#define KK_CUDA_ROUNDED(SFX, M)                                                                        \
  inline float __fadd_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fadd(a, b, M)); }  \
  inline float __fsub_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fadd(a, -b, M)); } \
  inline float __fmul_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fmul(a, b, M)); }  \
  inline float __fdiv_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fdiv(a, b, M)); }  \
  inline float __fmaf_##SFX(float a, float b, float c) { return kk_cuda_cpu::ffma(a, b, c, M); }          \
  inline float __frcp_##SFX(float a) { return kk_cuda_cpu::fdiv(1.0f, a, M); }                            \
  inline float __fsqrt_##SFX(float a) { return kk_cuda_cpu::fsqrt(a, M); }                                \
  inline float __int2float_##SFX(int i) { return kk_cuda_cpu::round_float(double(i), 0.0, M); }          \
  inline float __uint2float_##SFX(unsigned i) { return kk_cuda_cpu::round_float(double(i), 0.0, M); }    \
  inline float __double2float_##SFX(double d) { return kk_cuda_cpu::round_float(d, 0.0, M); }            \
  inline int __float2int_##SFX(float f) { return kk_cuda_cpu::float_to_int<int>(f, M); }                 \
  inline unsigned __float2uint_##SFX(float f) { return kk_cuda_cpu::float_to_int<unsigned>(f, M); }      \
  inline long long __float2ll_##SFX(float f) { return kk_cuda_cpu::float_to_int<long long>(f, M); }      \
  inline unsigned long long __float2ull_##SFX(float f) {                                                 \
    return kk_cuda_cpu::float_to_int<unsigned long long>(f, M);                                          \
  }                                                                                                      \
  inline int __double2int_##SFX(double f) { return kk_cuda_cpu::float_to_int<int>(f, M); }               \
  inline unsigned __double2uint_##SFX(double f) { return kk_cuda_cpu::float_to_int<unsigned>(f, M); }    \
  inline long long __double2ll_##SFX(double f) { return kk_cuda_cpu::float_to_int<long long>(f, M); }    \
  inline unsigned long long __double2ull_##SFX(double f) {                                               \
    return kk_cuda_cpu::float_to_int<unsigned long long>(f, M);                                          \
  }
KK_CUDA_ROUNDED(rn, 'n')
KK_CUDA_ROUNDED(rz, 'z')
KK_CUDA_ROUNDED(rd, 'd')
KK_CUDA_ROUNDED(ru, 'u')
#undef KK_CUDA_ROUNDED
inline float __fmaf_ieee_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frsqrt_rn(float x) { return float(1.0 / sqrt(double(x))); }
inline float __ll2float_rn(long long i) { return float(i); }
inline float __ull2float_rn(unsigned long long i) { return float(i); }
inline double __int2double_rn(int i) { return double(i); }
inline double __uint2double_rn(unsigned i) { return double(i); }
inline double __ll2double_rn(long long i) { return double(i); }
inline double __ull2double_rn(unsigned long long i) { return double(i); }
inline double __dadd_rn(double a, double b) { return kk_cuda_cpu::opaque(a + b); }
inline double __dsub_rn(double a, double b) { return kk_cuda_cpu::opaque(a - b); }
inline double __dmul_rn(double a, double b) { return kk_cuda_cpu::opaque(a * b); }
inline double __ddiv_rn(double a, double b) { return kk_cuda_cpu::opaque(a / b); }
inline double __drcp_rn(double a) { return kk_cuda_cpu::opaque(1.0 / a); }
inline double __dsqrt_rn(double a) { return sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

// Bit casts.
inline int __float_as_int(float f) { return kk_cuda_cpu::bits<int>(f); }
inline unsigned __float_as_uint(float f) { return kk_cuda_cpu::bits<unsigned>(f); }
inline float __int_as_float(int i) { return kk_cuda_cpu::bits<float>(i); }
inline float __uint_as_float(unsigned i) { return kk_cuda_cpu::bits<float>(i); }
inline long long __double_as_longlong(double d) { return kk_cuda_cpu::bits<long long>(d); }
inline double __longlong_as_double(long long i) { return kk_cuda_cpu::bits<double>(i); }
inline int __double2hiint(double d) { return int(kk_cuda_cpu::bits<unsigned long long>(d) >> 32); }
inline int __double2loint(double d) { return int(kk_cuda_cpu::bits<unsigned long long>(d) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
  return kk_cuda_cpu::bits<double>((static_cast<unsigned long long>(unsigned(hi)) << 32) | unsigned(lo));
}

// Integer intrinsics.
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll(static_cast<unsigned long long>(x)) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(unsigned(x))) << 32) | __brev(unsigned(x >> 32));
}
inline int __mulhi(int a, int b) { return int((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((static_cast<unsigned long long>(a) * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) { return (long long)((__int128)a * b >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}
inline int __mul24(int a, int b) {
  const int x = int(unsigned(a) << 8) >> 8, y = int(unsigned(b) << 8) >> 8;  // low 24 bits, signed
  return int(unsigned(x) * unsigned(y));
}
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __sad(int x, int y, unsigned z) {
  return z + (x > y ? unsigned(x) - unsigned(y) : unsigned(y) - unsigned(x));
}
inline unsigned __usad(unsigned x, unsigned y, unsigned z) { return z + (x > y ? x - y : y - x); }
inline int __hadd(int a, int b) { return int((static_cast<long long>(a) + b) >> 1); }
inline int __rhadd(int a, int b) { return int((static_cast<long long>(a) + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return unsigned((static_cast<unsigned long long>(a) + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) {
  return unsigned((static_cast<unsigned long long>(a) + b + 1) >> 1);
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y, x} (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift < 32u ? shift : 32u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift & 31u));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift < 32u ? shift : 32u));
}
// Dot products of the four bytes (two halves) of a and b, plus c.
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int(static_cast<signed char>(a >> (8 * i))) * int(static_cast<signed char>(b >> (8 * i)));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
  return c;
}

// CUDA's global min and max overloads (math_functions.hpp), and umin & co.
#define KK_CUDA_MINMAX(R, A, B)                                       \
  inline R min(A a, B b) {                                            \
    const R x = static_cast<R>(a), y = static_cast<R>(b);             \
    return y < x ? y : x;                                             \
  }                                                                   \
  inline R max(A a, B b) {                                            \
    const R x = static_cast<R>(a), y = static_cast<R>(b);             \
    return x < y ? y : x;                                             \
  }
KK_CUDA_MINMAX(int, int, int)
KK_CUDA_MINMAX(unsigned, unsigned, unsigned)
KK_CUDA_MINMAX(unsigned, int, unsigned)
KK_CUDA_MINMAX(unsigned, unsigned, int)
KK_CUDA_MINMAX(long, long, long)
KK_CUDA_MINMAX(unsigned long, unsigned long, unsigned long)
KK_CUDA_MINMAX(unsigned long, long, unsigned long)
KK_CUDA_MINMAX(unsigned long, unsigned long, long)
KK_CUDA_MINMAX(long long, long long, long long)
KK_CUDA_MINMAX(unsigned long long, unsigned long long, unsigned long long)
KK_CUDA_MINMAX(unsigned long long, long long, unsigned long long)
KK_CUDA_MINMAX(unsigned long long, unsigned long long, long long)
#undef KK_CUDA_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(double(a), b); }
inline double max(float a, double b) { return fmax(double(a), b); }
inline double min(double a, float b) { return fmin(a, double(b)); }
inline double max(double a, float b) { return fmax(a, double(b)); }
inline unsigned umin(unsigned a, unsigned b) { return min(a, b); }
inline unsigned umax(unsigned a, unsigned b) { return max(a, b); }
inline long long llmin(long long a, long long b) { return min(a, b); }
inline long long llmax(long long a, long long b) { return max(a, b); }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return min(a, b); }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return max(a, b); }

// ===========================================================================
// Memory access hints, clocks, traps.

template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }
inline long long clock64() {  // nanoseconds of a monotonic clock
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
inline void __nanosleep(unsigned) {}
inline void __prof_trigger(int) {}
[[noreturn]] inline void __trap(kk::site s = KK_SITE("__trap()")) { kk_cuda_cpu::fail("__trap()", s); }
[[noreturn]] inline void __brkpt(kk::site s = KK_SITE("__brkpt()")) { kk_cuda_cpu::fail("__brkpt()", s); }

// ===========================================================================
// cooperative_groups (<cooperative_groups.h>, reduce.h, scan.h, memcpy_async.h).

namespace cuda {
// cuda::aligned_size_t<N>(bytes): a byte count promised to be a multiple of N.
template <size_t N>
struct aligned_size_t {
  size_t value;
  constexpr explicit aligned_size_t(size_t v) : value(v) {}
  constexpr operator size_t() const { return value; }
};
}  // namespace cuda

namespace cooperative_groups {

namespace details {
enum group_kind : unsigned { kind_block, kind_tile, kind_coalesced, kind_grid };
}  // namespace details

// Any group (CUDA's thread_group): the base of the others.
class thread_group {
 public:
  unsigned long long size() const { return num_threads(); }
  unsigned long long num_threads() const {
    switch (kind_) {
      case details::kind_block: return block_threads();
      case details::kind_grid: return block_threads() * grid_blocks();
      case details::kind_coalesced: return unsigned(__builtin_popcount(mask_));
      default: return tile_;
    }
  }
  unsigned long long thread_rank() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    switch (kind_) {
      case details::kind_block: return t.tindex;
      case details::kind_grid: return block_rank() * block_threads() + t.tindex;
      case details::kind_coalesced: return unsigned(__builtin_popcount(mask_ & ((1u << (t.tindex & 31u)) - 1u)));
      default: return t.tindex & (tile_ - 1u);
    }
  }
  void sync(kk::site s = KK_SITE("thread_group::sync")) const {
    if (kind_ == details::kind_block) kk::threadgroup_barrier(s);
    else if (kind_ == details::kind_grid) grid_sync_error(s);
    else kk::simdgroup_barrier(s);
  }
  bool is_valid() const { return kind_ != details::kind_grid; }

 protected:
  constexpr thread_group(details::group_kind kind, unsigned tile = 0, unsigned mask = 0)
      : kind_(kind), tile_(tile), mask_(mask) {}
  static unsigned long long block_threads() {
    const kk_dim3 b = ::kk_cuda_cpu::ctx().tg_dispatch;
    return static_cast<unsigned long long>(b.x) * b.y * b.z;
  }
  static unsigned long long grid_blocks() {
    const kk_dim3 n = ::kk_cuda_cpu::ctx().num_groups;
    return static_cast<unsigned long long>(n.x) * n.y * n.z;
  }
  static unsigned long long block_rank() {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return (static_cast<unsigned long long>(t.gid.z) * t.num_groups.y + t.gid.y) * t.num_groups.x + t.gid.x;
  }
  [[noreturn]] static void grid_sync_error(const kk::site& s) {
    ::kk_cuda_cpu::fail(
        "cooperative_groups::grid_group::sync() needs a cooperative launch, which kk.cuda_kernel does not "
        "make (split the kernel into two launches)",
        s);
  }
  details::group_kind kind_;
  unsigned tile_;
  unsigned mask_;
};

class thread_block : public thread_group {
 public:
  constexpr thread_block() : thread_group(details::kind_block) {}
  void sync(kk::site s = KK_SITE("thread_block::sync")) const { kk::threadgroup_barrier(s); }
  unsigned thread_rank() const { return ::kk_cuda_cpu::ctx().tindex; }
  unsigned size() const { return unsigned(block_threads()); }
  unsigned num_threads() const { return unsigned(block_threads()); }
  dim3 group_index() const { return dim3(::kk_cuda_cpu::ctx().gid); }
  dim3 thread_index() const { return dim3(::kk_cuda_cpu::ctx().tid); }
  dim3 group_dim() const { return dim3(::kk_cuda_cpu::ctx().tg_dispatch); }
  dim3 dim_threads() const { return group_dim(); }
};
inline thread_block this_thread_block() { return thread_block(); }

class grid_group : public thread_group {
 public:
  constexpr grid_group() : thread_group(details::kind_grid) {}
  // CUDA needs a cooperative launch for this; kk.cuda_kernel launches are not.
  void sync(kk::site s = KK_SITE("grid_group::sync")) const { grid_sync_error(s); }
  bool is_valid() const { return false; }
  unsigned long long thread_rank() const { return block_rank() * block_threads() + ::kk_cuda_cpu::ctx().tindex; }
  unsigned long long size() const { return block_threads() * grid_blocks(); }
  unsigned long long num_threads() const { return size(); }
  unsigned long long block_rank() const { return thread_group::block_rank(); }
  unsigned long long num_blocks() const { return grid_blocks(); }
  dim3 group_dim() const { return dim3(::kk_cuda_cpu::ctx().tg_dispatch); }
  dim3 dim_blocks() const { return dim3(::kk_cuda_cpu::ctx().num_groups); }
  dim3 block_index() const { return dim3(::kk_cuda_cpu::ctx().gid); }
  dim3 dim_threads() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return dim3(t.tg_dispatch.x * t.num_groups.x, t.tg_dispatch.y * t.num_groups.y, t.tg_dispatch.z * t.num_groups.z);
  }
  dim3 thread_index() const {
    const kk_thread_ctx& t = ::kk_cuda_cpu::ctx();
    return dim3(t.gid.x * t.tg_dispatch.x + t.tid.x, t.gid.y * t.tg_dispatch.y + t.tid.y,
                t.gid.z * t.tg_dispatch.z + t.tid.z);
  }
};
inline grid_group this_grid() { return grid_group(); }

// N consecutive threads of the block (by thread_rank), N a power of two <= 32:
// within one warp, lanes aligned to N.
template <unsigned N, class Parent = void>
class thread_block_tile;

template <unsigned N>
class thread_block_tile<N, void> : public thread_group {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0,
                "thread_block_tile<N>: the CPU backend supports N = 1, 2, 4, 8, 16, 32");

 public:
  static constexpr unsigned numThreads = N;
  thread_block_tile(unsigned meta_rank, unsigned meta_size)
      : thread_group(details::kind_tile, N), meta_rank_(meta_rank), meta_size_(meta_size) {}

  static constexpr unsigned size() { return N; }
  static constexpr unsigned num_threads() { return N; }
  unsigned thread_rank() const { return ::kk_cuda_cpu::ctx().tindex & (N - 1u); }
  unsigned meta_group_rank() const { return meta_rank_; }
  unsigned meta_group_size() const { return meta_size_; }
  void sync(kk::site s = KK_SITE("thread_block_tile::sync")) const { kk::simdgroup_barrier(s); }

  template <class T>
  T shfl(T var, int src_rank, kk::site s = KK_SITE("thread_block_tile::shfl")) const {
    return __shfl_sync(0xffffffffu, var, src_rank, int(N), s);
  }
  template <class T>
  T shfl_up(T var, unsigned delta, kk::site s = KK_SITE("thread_block_tile::shfl_up")) const {
    return __shfl_up_sync(0xffffffffu, var, delta, int(N), s);
  }
  template <class T>
  T shfl_down(T var, unsigned delta, kk::site s = KK_SITE("thread_block_tile::shfl_down")) const {
    return __shfl_down_sync(0xffffffffu, var, delta, int(N), s);
  }
  template <class T>
  T shfl_xor(T var, unsigned lane_mask, kk::site s = KK_SITE("thread_block_tile::shfl_xor")) const {
    return __shfl_xor_sync(0xffffffffu, var, int(lane_mask), int(N), s);
  }
  // Votes: bit i of ballot is the tile's rank i.
  unsigned ballot(int predicate, kk::site s = KK_SITE("thread_block_tile::ballot")) const {
    return (kk::simd_ballot(predicate != 0, s) >> base()) & lanes();
  }
  int any(int predicate, kk::site s = KK_SITE("thread_block_tile::any")) const {
    return ((kk::simd_ballot(predicate != 0, s) >> base()) & lanes()) != 0;
  }
  int all(int predicate, kk::site s = KK_SITE("thread_block_tile::all")) const {
    return ((kk::simd_ballot(predicate == 0, s) >> base()) & lanes()) == 0;
  }
  template <class T>
  unsigned match_any(T value, kk::site s = KK_SITE("thread_block_tile::match_any")) const {
    return (__match_any_sync(lanes() << base(), value, s) >> base());
  }
  template <class T>
  unsigned match_all(T value, int& pred, kk::site s = KK_SITE("thread_block_tile::match_all")) const {
    return (__match_all_sync(lanes() << base(), value, &pred, s) >> base());
  }

 private:
  static unsigned base() { return ::kk_cuda_cpu::lane_id() & ~(N - 1u); }
  static constexpr unsigned lanes() { return N == 32 ? 0xffffffffu : (1u << N) - 1u; }
  unsigned meta_rank_, meta_size_;
};

template <unsigned N, class Parent>
class thread_block_tile : public thread_block_tile<N, void> {
 public:
  using thread_block_tile<N, void>::thread_block_tile;
};

template <unsigned N>
inline thread_block_tile<N, thread_block> tiled_partition(const thread_block&) {
  const unsigned threads = unsigned(thread_block().size());
  return thread_block_tile<N, thread_block>(::kk_cuda_cpu::ctx().tindex / N, (threads + N - 1) / N);
}
template <unsigned N, unsigned M, class P>
inline thread_block_tile<N, thread_block_tile<M, P>> tiled_partition(const thread_block_tile<M, P>& parent) {
  static_assert(N <= M, "tiled_partition: a tile of a tile must be smaller");
  return thread_block_tile<N, thread_block_tile<M, P>>(parent.thread_rank() / N, M / N);
}

// The live lanes of the warp (here: every lane that has not returned).
class coalesced_group : public thread_group {
 public:
  explicit coalesced_group(unsigned mask) : thread_group(details::kind_coalesced, 0, mask) {}
  unsigned size() const { return unsigned(__builtin_popcount(mask_)); }
  unsigned num_threads() const { return size(); }
  unsigned thread_rank() const {
    return unsigned(__builtin_popcount(mask_ & ((1u << ::kk_cuda_cpu::lane_id()) - 1u)));
  }
  unsigned meta_group_rank() const { return 0; }
  unsigned meta_group_size() const { return 1; }
  void sync(kk::site s = KK_SITE("coalesced_group::sync")) const { kk::simdgroup_barrier(s); }
  template <class T>
  T shfl(T var, unsigned src_rank, kk::site s = KK_SITE("coalesced_group::shfl")) const {
    return kk::simd_shuffle(var, lane_of(src_rank % size()), s);
  }
  template <class T>
  T shfl_up(T var, unsigned delta, kk::site s = KK_SITE("coalesced_group::shfl_up")) const {
    const unsigned r = thread_rank();
    return kk::simd_shuffle(var, r >= delta ? lane_of(r - delta) : ::kk_cuda_cpu::lane_id(), s);
  }
  template <class T>
  T shfl_down(T var, unsigned delta, kk::site s = KK_SITE("coalesced_group::shfl_down")) const {
    const unsigned r = thread_rank();
    return kk::simd_shuffle(var, r + delta < size() ? lane_of(r + delta) : ::kk_cuda_cpu::lane_id(), s);
  }
  unsigned ballot(int predicate, kk::site s = KK_SITE("coalesced_group::ballot")) const {
    return compact(kk::simd_ballot(predicate != 0, s) & mask_);
  }
  int any(int predicate, kk::site s = KK_SITE("coalesced_group::any")) const {
    return (kk::simd_ballot(predicate != 0, s) & mask_) != 0;
  }
  int all(int predicate, kk::site s = KK_SITE("coalesced_group::all")) const {
    return (kk::simd_ballot(predicate == 0, s) & mask_) == 0;
  }

 private:
  unsigned lane_of(unsigned rank) const {  // the rank-th set bit of the mask
    unsigned m = mask_;
    for (unsigned i = 0; i < rank; ++i) m &= m - 1;
    return unsigned(__builtin_ctz(m));
  }
  unsigned compact(unsigned bits) const {  // bit i: the lane of rank i
    unsigned r = 0, i = 0;
    for (unsigned m = mask_; m; m &= m - 1, ++i)
      if (bits & (1u << __builtin_ctz(m))) r |= 1u << i;
    return r;
  }
};
inline coalesced_group coalesced_threads(kk::site s = KK_SITE("coalesced_threads")) {
  return coalesced_group(kk::simd_active_mask(s));
}

template <class Group>
inline void sync(const Group& g, kk::site s = KK_SITE("cooperative_groups::sync")) { g.sync(s); }
template <class Group>
inline void synchronize(const Group& g, kk::site s = KK_SITE("cooperative_groups::synchronize")) { g.sync(s); }
template <class Group>
inline unsigned long long thread_rank(const Group& g) { return g.thread_rank(); }
template <class Group>
inline unsigned long long group_size(const Group& g) { return g.size(); }

// Reduction operators (reduce.h).
template <class T = void> struct plus { T operator()(const T& a, const T& b) const { return a + b; } };
template <class T = void> struct less { T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <class T = void> struct greater { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <class T = void> struct bit_and { T operator()(const T& a, const T& b) const { return a & b; } };
template <class T = void> struct bit_or { T operator()(const T& a, const T& b) const { return a | b; } };
template <class T = void> struct bit_xor { T operator()(const T& a, const T& b) const { return a ^ b; } };
template <> struct plus<void> { template <class T> T operator()(const T& a, const T& b) const { return a + b; } };
template <> struct less<void> { template <class T> T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <> struct greater<void> { template <class T> T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <> struct bit_and<void> { template <class T> T operator()(const T& a, const T& b) const { return a & b; } };
template <> struct bit_or<void> { template <class T> T operator()(const T& a, const T& b) const { return a | b; } };
template <> struct bit_xor<void> { template <class T> T operator()(const T& a, const T& b) const { return a ^ b; } };

namespace details {
template <unsigned N, class P>
constexpr unsigned tile_width(const thread_block_tile<N, P>*) { return N; }
constexpr unsigned tile_width(const coalesced_group*) { return 32; }  // the active lanes of the warp
}  // namespace details

// The value folded over the group's threads (tiles and coalesced groups), in rank order.
template <class Group, class T, class Op>
inline std::decay_t<T> reduce(const Group& g, T&& value, Op&& op, kk::site s = KK_SITE("cooperative_groups::reduce")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return kk::simd_reduce<W>(V(value), op, s);
}
// Prefix over the ranks up to this one (inclusive_scan) or before it (exclusive_scan;
// rank 0 gets V(), which CUDA leaves unspecified).
template <class Group, class T, class Op>
inline std::decay_t<T> inclusive_scan(const Group& g, T&& value, Op&& op,
                                      kk::site s = KK_SITE("cooperative_groups::inclusive_scan")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return kk::simd_scan<W>(V(value), op, V(), true, s);
}
template <class Group, class T>
inline std::decay_t<T> inclusive_scan(const Group& g, T&& value,
                                      kk::site s = KK_SITE("cooperative_groups::inclusive_scan")) {
  return inclusive_scan(g, static_cast<T&&>(value), plus<std::decay_t<T>>(), s);
}
template <class Group, class T, class Op>
inline std::decay_t<T> exclusive_scan(const Group& g, T&& value, Op&& op,
                                      kk::site s = KK_SITE("cooperative_groups::exclusive_scan")) {
  using V = std::decay_t<T>;
  constexpr unsigned W = details::tile_width(static_cast<const Group*>(nullptr));
  (void)g;
  return kk::simd_scan<W>(V(value), op, V(), false, s);
}
template <class Group, class T>
inline std::decay_t<T> exclusive_scan(const Group& g, T&& value,
                                      kk::site s = KK_SITE("cooperative_groups::exclusive_scan")) {
  return exclusive_scan(g, static_cast<T&&>(value), plus<std::decay_t<T>>(), s);
}

// memcpy_async: a synchronous copy shared by the group's threads; wait() is the
// group's sync (which makes the copy visible to the group, as on the GPU).
template <class Group>
inline void memcpy_async(const Group& g, void* dst, const void* src, size_t bytes) {
  const size_t n = size_t(g.size()), r = size_t(g.thread_rank());
  const size_t chunk = (bytes + n - 1) / n, begin = r * chunk < bytes ? r * chunk : bytes;
  const size_t end = begin + chunk < bytes ? begin + chunk : bytes;
  memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
}
template <class Group, size_t A>
inline void memcpy_async(const Group& g, void* dst, const void* src, cuda::aligned_size_t<A> bytes) {
  memcpy_async(g, dst, src, size_t(bytes));
}
template <class Group, class T>
inline void memcpy_async(const Group& g, T* dst, size_t dst_count, const T* src, size_t src_count) {
  memcpy_async(g, static_cast<void*>(dst), static_cast<const void*>(src),
               sizeof(T) * (dst_count < src_count ? dst_count : src_count));
}
template <class Group>
inline void wait(const Group& g, kk::site s = KK_SITE("cooperative_groups::wait")) { g.sync(s); }
template <unsigned Count, class Group>
inline void wait_prior(const Group& g, kk::site s = KK_SITE("cooperative_groups::wait_prior")) { g.sync(s); }

}  // namespace cooperative_groups

// ===========================================================================
// cuda::std (libcu++): the C++ standard library, with numeric_limits of the
// 16-bit floats.

namespace cuda {
namespace std {
using namespace ::std;
template <class T>
struct numeric_limits : ::std::numeric_limits<T> {};
namespace kk_detail {
template <class H, unsigned short Min, unsigned short Max, unsigned short Lowest, unsigned short Eps,
          unsigned short Denorm, int Digits>
struct f16_limits {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true;
  static constexpr bool is_iec559 = true, is_bounded = true, is_modulo = false;
  static constexpr int digits = Digits, radix = 2;
  static constexpr H min() noexcept { return H::from_bits(Min); }
  static constexpr H max() noexcept { return H::from_bits(Max); }
  static constexpr H lowest() noexcept { return H::from_bits(Lowest); }
  static constexpr H epsilon() noexcept { return H::from_bits(Eps); }
  static constexpr H round_error() noexcept { return H(0.5f); }
  static constexpr H denorm_min() noexcept { return H::from_bits(Denorm); }
};
}  // namespace kk_detail
template <>
struct numeric_limits<__half> : kk_detail::f16_limits<__half, 0x0400, 0x7bff, 0xfbff, 0x1400, 0x0001, 11> {
  static constexpr int digits10 = 3, max_digits10 = 5, min_exponent = -13, max_exponent = 16;
  static constexpr __half infinity() noexcept { return __half::from_bits(0x7c00); }
  static constexpr __half quiet_NaN() noexcept { return __half::from_bits(0x7e00); }
  static constexpr __half signaling_NaN() noexcept { return __half::from_bits(0x7d00); }
};
template <>
struct numeric_limits<__nv_bfloat16>
    : kk_detail::f16_limits<__nv_bfloat16, 0x0080, 0x7f7f, 0xff7f, 0x3c00, 0x0001, 8> {
  static constexpr int digits10 = 2, max_digits10 = 4, min_exponent = -125, max_exponent = 128;
  static constexpr __nv_bfloat16 infinity() noexcept { return __nv_bfloat16::from_bits(0x7f80); }
  static constexpr __nv_bfloat16 quiet_NaN() noexcept { return __nv_bfloat16::from_bits(0x7fc0); }
  static constexpr __nv_bfloat16 signaling_NaN() noexcept { return __nv_bfloat16::from_bits(0x7fa0); }
};
}  // namespace std
}  // namespace cuda
