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
//   - A `mask` argument of a *_sync warp function is not a rendezvous set: the
//     lanes that reach the call (the same source line) are its active lanes,
//     whatever the others do (`if (lane < 16) v = __shfl_sync(0xffff, v, 0);`
//     with lanes 16..31 at another warp function or a barrier), as with Metal's
//     SIMD-group functions (target_cpu.h). Results are restricted to the lanes
//     in mask (ballot, votes, match). __activemask() is a rendezvous too and
//     returns the lanes that reached it.
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
//   - __noinline__ is a macro, and libstdc++ spells it too: a standard header
//     included after this one breaks (<memory> with g++ 12; <string>,
//     <algorithm>... with g++ 13), as with old nvcc. NVRTC code includes none;
//     the <cuda/std/...> stubs lift the macro around their standard include
//     (#pragma push_macro / pop_macro), and other code can do the same.
//   - __CUDA_ARCH__ and __CUDACC__ are not defined (code takes its host paths);
//     KK_CUDA_CPU is.
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
//   whole blocks: MLX launches ceil(grid / threadgroup) blocks of blockDim
//   threads each and threads past `grid` run (bodies guard `if (i < n)`), so
//   the launch's kk_launch_desc.grid is num_groups * group. With Metal-style
//   partial edge groups, a shared-memory tree reduction or a shuffle butterfly
//   reads lanes that do not exist in the last block and goes wrong.
// threadIdx & co read one thread_local pointer (kk_cuda_cpu::tls.ctx) that
// KK_CUDA_BIND_THREAD sets and every rendezvous resets (after a fiber switch);
// KK_CPU_SYNC may be defined before or after this header.
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

// What the CUDA names read, per OS thread: the running thread's context, the
// dynamic shared memory buffer, and scratch for __syncthreads_count. One
// struct, with internal linkage: the compiler then computes its TLS address
// once per group loop instead of once per thread (an `inline thread_local`
// costs 2-4x in loop mode). So the state is per translation unit: a kernel
// library is one (the generated source); a program that includes this header
// in several must run each kernel's threads within one of them.
struct thread_state {
  const kk_thread_ctx* ctx;  // the CUDA thread running on this OS thread now
  unsigned char* shared;     // dynamic shared memory (16-byte aligned; 64 here)
  size_t shared_cap;
  int sync_acc;
};
static thread_local thread_state tls;

// Loop mode: KK_CUDA_BIND_THREAD points ctx at each thread in turn. Fiber mode:
// a fiber switch happens only inside a rendezvous, so each rendezvous below
// points ctx back at the fiber's own context (kk_rt_current) when it returns.
// Either way a read of threadIdx & co is one load, in either mode.
inline const kk_thread_ctx& ctx() { return *tls.ctx; }
inline void rebind() { tls.ctx = kk_rt_current; }

struct shared_owner {  // frees the buffer when the OS thread exits
  ~shared_owner() {
    free(tls.shared);
    tls.shared = nullptr;
    tls.shared_cap = 0;
  }
};

// Grows the buffer (never shrinks): the first thread of a group does it, before
// any other thread of the group runs; groups on this OS thread run one at a time.
__attribute__((noinline)) inline void grow_shared(size_t bytes) {
  static thread_local shared_owner owner;
  (void)owner;
  const size_t cap = (bytes + 4095) & ~size_t(4095);
  void* p = aligned_alloc(64, cap);
  if (!p) kk_rt_fail(tls.ctx, "cannot allocate the dynamic shared memory");
  free(tls.shared);
  tls.shared = static_cast<unsigned char*>(p);
  tls.shared_cap = cap;
}

// (t outlives its use: the runtime runs the thread's body before t goes away.)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
inline void bind_thread(const kk_thread_ctx& t, size_t shared_bytes) {
  thread_state& st = tls;
  st.ctx = &t;
  if (__builtin_expect(shared_bytes > st.shared_cap, 0)) grow_shared(shared_bytes);
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

inline void* dynamic_shared() { return tls.shared; }

// Stops the launch with this message, naming the call site when known.
[[noreturn]] inline void fail(const char* what, const kk::site& s) {
  char msg[512];
  if (s.file)
    snprintf(msg, sizeof msg, "%s at %s:%u", what, s.file, s.line);
  else
    snprintf(msg, sizeof msg, "%s", what);
  kk_rt_fail(tls.ctx, msg);
}

// The target's rendezvous (target_cpu.h), each followed by rebind(). Every
// synchronising CUDA name goes through these.
inline void sync_block(const kk::site& s) {
  kk::threadgroup_barrier(s);
  rebind();
}
inline void sync_warp(const kk::site& s) {
  kk::simdgroup_barrier(s);
  rebind();
}
inline unsigned active_mask(const kk::site& s) {
  const unsigned m = kk::simd_active_mask(s);
  rebind();
  return m;
}
template <class T>
inline T shuffle(const T& v, unsigned src_lane, const kk::site& s) {
  const T r = kk::simd_shuffle(v, src_lane, s);
  rebind();
  return r;
}
inline unsigned ballot(bool p, const kk::site& s, unsigned* active = nullptr) {
  unsigned a;
  const unsigned r = kk::cpu_detail::ballot(p, active ? active : &a, s);
  rebind();
  return r;
}
template <class T>
inline unsigned exchange(const T& v, T* all, const kk::site& s) {
  const unsigned m = kk::simd_exchange(v, all, s);
  rebind();
  return m;
}
template <unsigned W, class T, class Op>
inline T reduce(const T& v, Op op, const kk::site& s) {
  const T r = kk::simd_reduce<W>(v, op, s);
  rebind();
  return r;
}
template <unsigned W, class T, class Op>
inline T scan(const T& v, Op op, const T& identity, bool inclusive, const kk::site& s) {
  const T r = kk::simd_scan<W>(v, op, identity, inclusive, s);
  rebind();
  return r;
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
  kk_rt_fail(::kk_cuda_cpu::tls.ctx, msg);
}
#endif

// ===========================================================================
// Synchronisation, fences, warp functions.

inline void __syncthreads(kk::site s = KK_SITE("__syncthreads")) { kk_cuda_cpu::sync_block(s); }

namespace kk_cuda_cpu {
// Three barriers: clear, add, read. The group's threads share one OS thread, so
// the accumulator needs no atomics; the next call's clear waits for every read.
template <class Op>
inline int syncthreads_fold(int p, int init, Op op, const kk::site& s) {
  sync_block(s);
  tls.sync_acc = init;
  sync_block(s);
  tls.sync_acc = op(tls.sync_acc, p);
  sync_block(s);
  return tls.sync_acc;
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
  ::kk_cuda_cpu::sync_warp(s);
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// A group's threads share one OS thread: a compiler fence orders them.
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

inline unsigned __activemask(kk::site s = KK_SITE("__activemask")) { return ::kk_cuda_cpu::active_mask(s); }

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
  return ::kk_cuda_cpu::shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_idx, unsigned(srcLane), width), s);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        kk::site s = KK_SITE("__shfl_up_sync")) {
  (void)mask;
  return ::kk_cuda_cpu::shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_up, delta, width), s);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          kk::site s = KK_SITE("__shfl_down_sync")) {
  (void)mask;
  return ::kk_cuda_cpu::shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_down, delta, width), s);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                         kk::site s = KK_SITE("__shfl_xor_sync")) {
  (void)mask;
  return ::kk_cuda_cpu::shuffle(var, kk_cuda_cpu::shfl_source(kk_cuda_cpu::shfl_bfly, unsigned(laneMask), width), s);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__ballot_sync")) {
  return ::kk_cuda_cpu::ballot(predicate != 0, s) & mask;
}
inline int __any_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__any_sync")) {
  return (::kk_cuda_cpu::ballot(predicate != 0, s) & mask) != 0;
}
inline int __all_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__all_sync")) {
  return (::kk_cuda_cpu::ballot(predicate == 0, s) & mask) == 0;
}
inline int __uni_sync(unsigned mask, int predicate, kk::site s = KK_SITE("__uni_sync")) {
  unsigned active;
  const unsigned yes = ::kk_cuda_cpu::ballot(predicate != 0, s, &active) & mask;
  return yes == 0 || yes == (active & mask);
}

#define KK_CUDA_WARP_REDUCE(NAME, T, OP)                                       \
  inline T NAME(unsigned mask, T value, kk::site s = KK_SITE(#NAME)) {         \
    (void)mask;                                                                \
    return ::kk_cuda_cpu::reduce<32>(value, kk_cuda_cpu::OP{}, s);                   \
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
  unsigned m = ::kk_cuda_cpu::exchange(value, all.data(), s) & mask, r = 0;
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
  const unsigned act = ::kk_cuda_cpu::exchange(value, all.data(), s) & mask;
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
// The rest, by theme.

#include "cuda_cpu/fp16.h"                // __half, __nv_bfloat16, pairs, their atomics
#include "cuda_cpu/math.h"                // math library, intrinsics, integer functions, min/max
#include "cuda_cpu/cooperative_groups.h"  // cooperative_groups::
#include "cuda_cpu/cuda_std.h"            // cuda::std::
