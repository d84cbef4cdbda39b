// kernelkit/tensor_ops/base.h: what every tensor-op header needs: a few type traits (NVRTC has no
// <type_traits>), where the calling thread sits in its threadgroup, and the one cross-lane
// primitive the layer is built on. Written on the target contract (DESIGN.md), for both targets
// and both dialects.
#pragma once

// Call sites of the operations that meet other lanes (the CPU runtime matches lanes by site;
// see kernelkit/launch.h). A defaulted trailing parameter names the user's line.
// (The GPU ignores sites; the path report, KK_TOPS_REPORT, prints their lines on both targets.)
#define KK_TOPS_SITE(op) {(op), __builtin_FILE(), static_cast<unsigned>(__builtin_LINE())}

// Loops over a cooperative tensor's elements: unrolled on the GPU, where an element indexed by a
// run-time value puts the whole tensor in local memory (and, next to wgmma, spills).
#if defined(KK_TARGET_CUDA)
#define KK_TOPS_UNROLL _Pragma("unroll")
#else
#define KK_TOPS_UNROLL
#endif

#if !defined(KK_TARGET_CUDA)
#include <stdio.h>  // snprintf (check_scope), printf (KK_TOPS_REPORT)
#endif

namespace kk {
namespace tops {

using usize = decltype(sizeof(0));

template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { using type = T; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;
template <bool B, class T, class F> struct conditional { using type = T; };
template <class T, class F> struct conditional<false, T, F> { using type = F; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;
template <class A, class B> inline constexpr bool is_same_v = false;
template <class A> inline constexpr bool is_same_v<A, A> = true;
template <class T> struct remove_const { using type = T; };
template <class T> struct remove_const<const T> { using type = T; };
template <class T> using remove_const_t = typename remove_const<T>::type;
template <class T> struct remove_reference { using type = T; };
template <class T> struct remove_reference<T&> { using type = T; };
template <class T> struct remove_reference<T&&> { using type = T; };
template <class T> using remove_reference_t = typename remove_reference<T>::type;
template <class T> struct remove_cvref { using type = T; };
template <class T> struct remove_cvref<const T> { using type = T; };
template <class T> struct remove_cvref<T&> : remove_cvref<T> {};
template <class T> struct remove_cvref<T&&> : remove_cvref<T> {};
template <class T> using remove_cvref_t = typename remove_cvref<T>::type;
template <class T> inline constexpr bool is_integer_v = false;
template <> inline constexpr bool is_integer_v<signed char> = true;
template <> inline constexpr bool is_integer_v<unsigned char> = true;
template <> inline constexpr bool is_integer_v<char> = true;
template <> inline constexpr bool is_integer_v<short> = true;
template <> inline constexpr bool is_integer_v<unsigned short> = true;
template <> inline constexpr bool is_integer_v<int> = true;
template <> inline constexpr bool is_integer_v<unsigned> = true;
template <> inline constexpr bool is_integer_v<long> = true;
template <> inline constexpr bool is_integer_v<unsigned long> = true;
template <> inline constexpr bool is_integer_v<long long> = true;
template <> inline constexpr bool is_integer_v<unsigned long long> = true;
template <class> inline constexpr bool always_false_v = false;
template <class T> struct type_identity { using type = T; };
template <class T> using type_identity_t = typename type_identity<T>::type;

constexpr KK_FN int ceil_div(int a, int b) { return (a + b - 1) / b; }
constexpr KK_FN int min_int(int a, int b) { return a < b ? a : b; }
constexpr KK_FN int max_int(int a, int b) { return a > b ? a : b; }

// The calling thread's lane in its SIMD-group (the hardware's: PTX fragments are laid out by it),
// and the SIMD-group's index in the threadgroup (Metal's thread_index_in_threadgroup / 32).
KK_FN unsigned lane_id() { return kk::hw_lane(); }
KK_FN unsigned simdgroup_id() {
#if defined(KK_TARGET_CUDA)
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
#else
  return kk_rt_current->tindex >> 5;
#endif
}

// Is this the first thread of the launch (the one that reports)?
KK_FN bool first_thread() {
#if defined(KK_TARGET_CUDA)
  return (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
#else
  const kk_thread_ctx* t = kk_rt_current;
  return (t->gid.x | t->gid.y | t->gid.z | t->tindex) == 0;
#endif
}

// v of lane `from` of this SIMD-group: every lane of the SIMD-group calls it together (the
// layer's loops are uniform), as __shfl_sync with a full mask. On the CPU a rendezvous of the
// lanes at the user's call site.
// (A CUDA-dialect kernel on the CPU caches its thread's context for threadIdx: a rendezvous
// switched fibers, so it is pointed back at this thread's after each.)
KK_FN void rebind_thread() {
#if defined(KK_CUDA_CPU)
  ::kk_cuda_cpu::rebind();
#endif
}
template <class T>
KK_FN T lane_read(const T& v, unsigned from, const kk::site& s) {
#if defined(KK_TARGET_CUDA)
  (void)s;  // one SHFL: no active-lane mask to find, the whole SIMD-group is here
  return kk::detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(0xffffffffu, w, from & 31u); });
#else
  const T r = kk::simd_shuffle(v, from, s);
  rebind_thread();
  return r;
#endif
}
// An op over W SIMD-groups (W = 0: one thread) needs them whole in the threadgroup (Metal leaves a
// mismatch undefined). The CPU stops the launch with a clear error; the GPU does not check.
KK_FN void check_scope(int W, const kk::site& s) {
#if !defined(KK_TARGET_CUDA)
  const kk_thread_ctx* t = kk_rt_current;
  if (W <= 0 || !t) return;  // one thread's op (no fibers needed)
  const unsigned threads = t->tg_size.x * t->tg_size.y * t->tg_size.z;
  const unsigned need = W == 1 ? ((t->tindex >> 5) + 1) * 32 : 32u * unsigned(W);
  if (threads < need) {
    char msg[384];
    snprintf(msg, sizeof msg,
             "%s (%s:%u): its scope is %d SIMD-group(s) of 32 threads, and this threadgroup has %u threads "
             "(a threadgroup of 32 * N threads runs execution_simdgroups<N>; whole SIMD-groups run "
             "execution_simdgroup)", s.op, s.file ? s.file : "?", s.line, W, threads);
    kk_rt_fail(t, msg);
  }
#else
  (void)W, (void)s;
#endif
}

// Every thread of the threadgroup (all SIMD-groups of the scope) meets here.
KK_FN void threadgroup_barrier(const kk::site& s) {
  kk::threadgroup_barrier(s);
  rebind_thread();
}

}  // namespace tops
}  // namespace kk
