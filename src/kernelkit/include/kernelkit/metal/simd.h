// kernelkit/metal/simd.h: barriers and SIMD-group / quad-group functions.
//
// Built on the target's primitives (kk::simd_lane, simd_shuffle, simd_ballot,
// simd_reduce<W>, simd_scan<W>), with Metal's rules:
//  - only active lanes take part in reductions, scans and votes;
//  - shuffle_up by d gives lane i the value of lane i-d, or its own value when
//    i-d < 0; shuffle_down likewise past the top; rotate wraps around;
//    xor reads lane i^mask; quad_* do the same within aligned groups of 4.
// They take any scalar (half and bfloat included) and vectors.
#pragma once

// The call site of a synchronising function, as launch.h's KK_SITE (the CPU
// runtime meets threads by site and names the user's line in its errors).
// Each function below has a defaulted `site` parameter, so the default is
// evaluated at the user's call, and hands it on to every target call it makes.
// (The cast keeps NVRTC quiet about narrowing int to unsigned.)
#define KK_SYNC_SITE(op) {(op), __builtin_FILE(), static_cast<unsigned>(__builtin_LINE())}

namespace metal {

// ---------------------------------------------------------------------------
// Barriers. Both targets make device and threadgroup memory visible to the
// group at a barrier, whatever the flags.

enum class mem_flags : uint {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr KK_FN mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }
constexpr KK_FN mem_flags operator&(mem_flags a, mem_flags b) { return mem_flags(uint(a) & uint(b)); }

KK_FN void threadgroup_barrier(mem_flags = mem_flags::mem_none, kk::site s = KK_SYNC_SITE("threadgroup_barrier")) {
  kk::threadgroup_barrier(s);
}
KK_FN void simdgroup_barrier(mem_flags = mem_flags::mem_none, kk::site s = KK_SYNC_SITE("simdgroup_barrier")) {
  kk::simdgroup_barrier(s);
}

// atomic_thread_fence(flags, order, scope): orders this thread's memory accesses without an atomic
// object. Relaxed has no effect (as in C++); any other order is a sequentially consistent fence at
// the scope: the group's (CUDA's fence.sc.cta) up to threadgroup scope, the GPU's (fence.sc.gpu) at
// device scope. On the CPU a group's threads share one OS thread, groups do not: one full fence.
KK_FN void atomic_thread_fence(mem_flags, memory_order order, thread_scope scope = thread_scope_device) {
  if (order == memory_order_relaxed) return;
#if defined(KK_TARGET_CUDA)
  if (scope == thread_scope_device) __threadfence();
  else __threadfence_block();
#else
  (void)scope;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// ---------------------------------------------------------------------------
// Votes: bit i for lane i. simd_vote holds 32 lanes' bits, quad_vote 4.

template <class Vote, Vote AllLanes>
struct kk_vote {
  using vote_t = Vote;
  vote_t bits;
  vote_t active;  // lanes that voted

  constexpr KK_FN explicit kk_vote(vote_t v = 0, vote_t act = AllLanes) : bits(v), active(act) {}
  template <class I, enable_if_t<is_integral<I>::value, int> = 0>
  constexpr KK_FN explicit operator I() const { return I(bits); }
  constexpr KK_FN bool all() const { return (bits & active) == active; }  // every active lane voted true
  constexpr KK_FN bool any() const { return bits != 0; }
};
typedef kk_vote<uint64_t, 0xffffffffu> simd_vote;
typedef kk_vote<ushort, 0xfu> quad_vote;

namespace kk_detail {
struct op_sum { template <class T> KK_FN T operator()(const T& a, const T& b) const { return T(a + b); } };
struct op_product { template <class T> KK_FN T operator()(const T& a, const T& b) const { return T(a * b); } };
struct op_min { template <class T> KK_FN T operator()(const T& a, const T& b) const { return min(a, b); } };
struct op_max { template <class T> KK_FN T operator()(const T& a, const T& b) const { return max(a, b); } };
struct op_and { template <class T> KK_FN T operator()(const T& a, const T& b) const { return T(a & b); } };
struct op_or { template <class T> KK_FN T operator()(const T& a, const T& b) const { return T(a | b); } };
struct op_xor { template <class T> KK_FN T operator()(const T& a, const T& b) const { return T(a ^ b); } };

KK_FN uint quad_base() { return kk::simd_lane() & ~3u; }
KK_FN uint quad_active(kk::site s) { return (kk::simd_active_mask(s) >> quad_base()) & 0xfu; }
}  // namespace kk_detail

// ---------------------------------------------------------------------------
// Reductions and scans. simd_*: the 32 lanes; quad_*: aligned groups of 4.

#define KK_GROUP_FN(prefix, name, EXPR)                                                      \
  template <class T> KK_FN T prefix##_##name(T v, kk::site s = KK_SYNC_SITE(#prefix "_" #name)) { \
    return EXPR;                                                                                  \
  }
#define KK_GROUP_FUNCTIONS(prefix, W)                                                                          \
  KK_GROUP_FN(prefix, sum, kk::simd_reduce<W>(v, kk_detail::op_sum{}, s))                                      \
  KK_GROUP_FN(prefix, product, kk::simd_reduce<W>(v, kk_detail::op_product{}, s))                              \
  KK_GROUP_FN(prefix, min, kk::simd_reduce<W>(v, kk_detail::op_min{}, s))                                      \
  KK_GROUP_FN(prefix, max, kk::simd_reduce<W>(v, kk_detail::op_max{}, s))                                      \
  KK_GROUP_FN(prefix, and, kk::simd_reduce<W>(v, kk_detail::op_and{}, s))                                      \
  KK_GROUP_FN(prefix, or, kk::simd_reduce<W>(v, kk_detail::op_or{}, s))                                        \
  KK_GROUP_FN(prefix, xor, kk::simd_reduce<W>(v, kk_detail::op_xor{}, s))                                      \
  KK_GROUP_FN(prefix, prefix_inclusive_sum, kk::simd_scan<W>(v, kk_detail::op_sum{}, T(0), true, s))          \
  KK_GROUP_FN(prefix, prefix_exclusive_sum, kk::simd_scan<W>(v, kk_detail::op_sum{}, T(0), false, s))         \
  KK_GROUP_FN(prefix, prefix_inclusive_product, kk::simd_scan<W>(v, kk_detail::op_product{}, T(1), true, s))  \
  KK_GROUP_FN(prefix, prefix_exclusive_product, kk::simd_scan<W>(v, kk_detail::op_product{}, T(1), false, s))
KK_GROUP_FUNCTIONS(simd, 32)
KK_GROUP_FUNCTIONS(quad, 4)
#undef KK_GROUP_FUNCTIONS
#undef KK_GROUP_FN

// ---------------------------------------------------------------------------
// Shuffles and broadcasts: each is one target shuffle from a source lane.

namespace kk_detail {
// Source lane for lane i, in groups of W lanes (W = 32 or 4).
template <uint W> KK_FN uint src_up(uint i, uint d) { return (i & (W - 1)) >= d ? i - d : i; }
template <uint W> KK_FN uint src_down(uint i, uint d) { return (i & (W - 1)) + d < W ? i + d : i; }
template <uint W> KK_FN uint src_rotate(uint i, uint d_up) { return (i & ~(W - 1)) | ((i - d_up) & (W - 1)); }
}  // namespace kk_detail

#define KK_SHUFFLE(name, arg, SRC)                                                        \
  template <class T> KK_FN T name(T v, uint arg, kk::site s = KK_SYNC_SITE(#name)) {      \
    return kk::simd_shuffle(v, SRC, s);                                                   \
  }
KK_SHUFFLE(simd_shuffle, lane, lane & 31u)
KK_SHUFFLE(simd_broadcast, lane, lane & 31u)
KK_SHUFFLE(simd_shuffle_up, delta, kk_detail::src_up<32>(kk::simd_lane(), delta))
KK_SHUFFLE(simd_shuffle_down, delta, kk_detail::src_down<32>(kk::simd_lane(), delta))
KK_SHUFFLE(simd_shuffle_xor, mask, kk::simd_lane() ^ (mask & 31u))
KK_SHUFFLE(simd_shuffle_rotate_up, delta, kk_detail::src_rotate<32>(kk::simd_lane(), delta))
KK_SHUFFLE(simd_shuffle_rotate_down, delta, kk_detail::src_rotate<32>(kk::simd_lane(), 0u - delta))
KK_SHUFFLE(quad_shuffle, quad_lane, (kk::simd_lane() & ~3u) | (quad_lane & 3u))
KK_SHUFFLE(quad_broadcast, quad_lane, (kk::simd_lane() & ~3u) | (quad_lane & 3u))
KK_SHUFFLE(quad_shuffle_up, delta, kk_detail::src_up<4>(kk::simd_lane(), delta))
KK_SHUFFLE(quad_shuffle_down, delta, kk_detail::src_down<4>(kk::simd_lane(), delta))
KK_SHUFFLE(quad_shuffle_xor, mask, kk::simd_lane() ^ (mask & 3u))
KK_SHUFFLE(quad_shuffle_rotate_up, delta, kk_detail::src_rotate<4>(kk::simd_lane(), delta))
KK_SHUFFLE(quad_shuffle_rotate_down, delta, kk_detail::src_rotate<4>(kk::simd_lane(), 0u - delta))
#undef KK_SHUFFLE

// Within windows of `modulo` lanes (the whole SIMD-group or quad by default): lanes shifted
// in from outside the window take `fill` from its other end instead.
namespace kk_detail {
template <class T> KK_FN T shuffle_and_fill(T v, T fill, uint src, bool from_v, kk::site s) {
  const T a = kk::simd_shuffle(v, src, s);
  const T b = kk::simd_shuffle(fill, src, s);
  return from_v ? a : b;
}
// W: the group's width (32 or 4); the windows lie within it.
template <uint W, class T> KK_FN T shuffle_and_fill_up(T v, T fill, uint delta, uint modulo, kk::site s) {
  const uint lane = kk::simd_lane(), li = (lane & (W - 1)) % modulo;
  return shuffle_and_fill(v, fill, lane - li + (li + modulo - delta % modulo) % modulo, li >= delta, s);
}
template <uint W, class T> KK_FN T shuffle_and_fill_down(T v, T fill, uint delta, uint modulo, kk::site s) {
  const uint lane = kk::simd_lane(), li = (lane & (W - 1)) % modulo;
  return shuffle_and_fill(v, fill, lane - li + (li + delta) % modulo, li + delta < modulo, s);
}
}  // namespace kk_detail
template <class T>
KK_FN T simd_shuffle_and_fill_up(T v, T fill, uint delta, uint modulo = 32,
                                 kk::site s = KK_SYNC_SITE("simd_shuffle_and_fill_up")) {
  return kk_detail::shuffle_and_fill_up<32>(v, fill, delta, modulo, s);
}
template <class T>
KK_FN T simd_shuffle_and_fill_down(T v, T fill, uint delta, uint modulo = 32,
                                   kk::site s = KK_SYNC_SITE("simd_shuffle_and_fill_down")) {
  return kk_detail::shuffle_and_fill_down<32>(v, fill, delta, modulo, s);
}
template <class T>
KK_FN T quad_shuffle_and_fill_up(T v, T fill, uint delta, uint modulo = 4,
                                 kk::site s = KK_SYNC_SITE("quad_shuffle_and_fill_up")) {
  return kk_detail::shuffle_and_fill_up<4>(v, fill, delta, modulo, s);
}
template <class T>
KK_FN T quad_shuffle_and_fill_down(T v, T fill, uint delta, uint modulo = 4,
                                   kk::site s = KK_SYNC_SITE("quad_shuffle_and_fill_down")) {
  return kk_detail::shuffle_and_fill_down<4>(v, fill, delta, modulo, s);
}
template <class T> KK_FN T simd_broadcast_first(T v, kk::site s = KK_SYNC_SITE("simd_broadcast_first")) {
  return kk::simd_shuffle(v, uint(kk::ctz32(kk::simd_active_mask(s))), s);
}
template <class T> KK_FN T quad_broadcast_first(T v, kk::site s = KK_SYNC_SITE("quad_broadcast_first")) {
  return kk::simd_shuffle(v, kk_detail::quad_base() + uint(kk::ctz32(kk_detail::quad_active(s))), s);
}

// ---------------------------------------------------------------------------
// Votes and lane predicates.

KK_FN simd_vote simd_active_threads_mask(kk::site s = KK_SYNC_SITE("simd_active_threads_mask")) {
  const uint active = kk::simd_active_mask(s);
  return simd_vote(active, active);
}
KK_FN simd_vote simd_ballot(bool p, kk::site s = KK_SYNC_SITE("simd_ballot")) {
  const uint bits = kk::simd_ballot(p, s);
  return simd_vote(bits, kk::simd_active_mask(s));
}
KK_FN bool simd_any(bool p, kk::site s = KK_SYNC_SITE("simd_any")) { return kk::simd_ballot(p, s) != 0u; }
KK_FN bool simd_all(bool p, kk::site s = KK_SYNC_SITE("simd_all")) { return kk::simd_ballot(!p, s) == 0u; }
KK_FN bool simd_is_first(kk::site s = KK_SYNC_SITE("simd_is_first")) {
  return (kk::simd_active_mask(s) & ((1u << kk::simd_lane()) - 1u)) == 0u;  // no active lane below
}
KK_FN bool simd_is_helper_thread() { return false; }

KK_FN quad_vote quad_active_threads_mask(kk::site s = KK_SYNC_SITE("quad_active_threads_mask")) {
  const ushort active = ushort(kk_detail::quad_active(s));
  return quad_vote(active, active);
}
KK_FN quad_vote quad_ballot(bool p, kk::site s = KK_SYNC_SITE("quad_ballot")) {
  const ushort bits = ushort((kk::simd_ballot(p, s) >> kk_detail::quad_base()) & 0xfu);
  return quad_vote(bits, ushort(kk_detail::quad_active(s)));
}
KK_FN bool quad_any(bool p, kk::site s = KK_SYNC_SITE("quad_any")) {
  return ((kk::simd_ballot(p, s) >> kk_detail::quad_base()) & 0xfu) != 0u;
}
KK_FN bool quad_all(bool p, kk::site s = KK_SYNC_SITE("quad_all")) {
  return ((kk::simd_ballot(!p, s) >> kk_detail::quad_base()) & 0xfu) == 0u;
}
KK_FN bool quad_is_first(kk::site s = KK_SYNC_SITE("quad_is_first")) {
  return (kk_detail::quad_active(s) & ((1u << (kk::simd_lane() & 3u)) - 1u)) == 0u;
}
KK_FN bool quad_is_helper_thread() { return false; }

}  // namespace metal
