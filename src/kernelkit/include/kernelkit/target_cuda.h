// kernelkit/target_cuda.h: the target layer for NVIDIA GPUs (NVRTC or nvcc, sm_70+).
//
// Implements the contract of DESIGN.md ("The target layer contract") with CUDA
// intrinsics, plus the optional extras metal.h uses when a target offers them:
//   KK_HAS_FAST_MATH       kk::fast::exp(float)...  hardware approximations (metal::fast)
//   KK_HAS_BIT_INTRINSICS  kk::clz32, popcount64...  single-instruction bit ops
//   KK_HAS_ATOMIC_ADD_F16  kk::atomic_fetch_add on kk::half_t / kk::bfloat_t, native
// Synchronising functions take a trailing kk::site (launch.h) like the CPU
// target's, so metal.h can pass the user's call site; CUDA has no use for it.
// No CUDA header is needed: NVRTC declares the intrinsics used here, and the
// 16-bit conversions are one PTX instruction each (cheaper to compile than cuda_fp16.h).
#pragma once

#include "launch.h"

#define KK_TARGET_DEFINED 1

#define KK_FN __device__ __forceinline__
#define KK_THREADGROUP __shared__
#define KK_PROGRAM_CONSTANT __constant__  // program-scope `constant` data (the front end adds const)
// MSL's `#pragma clang loop unroll(...)` (the front end writes these): NVRTC's unroll pragmas
#define KK_PRAGMA(x) _Pragma(#x)
#define KK_UNROLL_FULL KK_PRAGMA(unroll)
#define KK_UNROLL_COUNT(n) KK_PRAGMA(unroll n)

namespace kk {

// ---------------------------------------------------------------------------
// 16-bit floats: bit patterns <-> float, round to nearest even.

KK_FN float half_to_float(unsigned short bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}
KK_FN unsigned short float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
KK_FN float bfloat_to_float(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}
KK_FN unsigned short float_to_bfloat(float f) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
#endif
}

// Storage types for 16-bit float atomics (the bit pattern, tagged by format).
struct half_t { unsigned short bits; };
struct bfloat_t { unsigned short bits; };

// ---------------------------------------------------------------------------
// SIMD-group primitives. A Metal SIMD-group is a warp; "active" lanes are the
// lanes of __activemask(): lanes that returned early or sit in the other side
// of a branch do not take part.

namespace detail {
constexpr unsigned full_mask = 0xffffffffu;

// Any trivially copyable T moves through the shuffle network as 32-bit words (copied bytewise,
// so that a T with constructors, such as complex64_t, moves too).
template <class T>
struct words {
  static constexpr int n = (sizeof(T) + 3) / 4;
};

template <class T, class Shfl>
KK_FN T shuffle_words(T v, Shfl shfl) {
  unsigned in[words<T>::n], out[words<T>::n];
#pragma unroll
  for (int i = 0; i < words<T>::n; ++i) in[i] = 0;  // defined padding bytes
  memcpy(in, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < words<T>::n; ++i) out[i] = shfl(in[i]);
  T r = v;
  memcpy(&r, out, sizeof(T));
  return r;
}
}  // namespace detail

// Lane order. A Metal kernel that uses simdgroup_matrix, launched in threadgroups of whole warps, is
// generated with KK_MMA_LANE_ORDER: its SIMD-group's lanes are numbered so that Apple's 8x8
// fragment layout (tensor_ops/simdgroup_matrix.h) is mma.sync's, with no shuffles. Metal lane
// l4 l3 l2 l1 l0 (bits) runs on hardware lane l4 l2 l1 l3 l0: a permutation of the index bits, so
// an XOR mask maps to an XOR mask. (In a partial warp the hardware's lanes would be Metal lanes
// other than its first ones: such launches keep the identity.) Every function below speaks Metal
// lanes; the tensor-op layer's PTX fragments speak hardware lanes (hw_lane).
KK_FN unsigned hw_lane() {
  unsigned r;
  asm("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}
KK_FN constexpr bool lanes_permuted() {
#if defined(KK_MMA_LANE_ORDER)
  return true;  // (a variant of its own, for threadgroups of whole warps: codegen.MMA_LANES)
#else
  return false;
#endif
}
namespace detail {
constexpr KK_FN unsigned mma_lane_of(unsigned l) { return (l & 0x11u) | ((l & 0x6u) << 1) | ((l & 0x8u) >> 2); }
constexpr KK_FN unsigned metal_lane_of(unsigned h) { return (h & 0x11u) | ((h & 0xcu) >> 1) | ((h & 0x2u) << 2); }
// Swaps the bits of x at positions p and p + d for each p in m.
constexpr KK_FN unsigned delta_swap(unsigned x, unsigned m, unsigned d) {
  const unsigned t = ((x >> d) ^ x) & m;
  return x ^ t ^ (t << d);
}
// A mask of hardware lanes as the mask of their Metal lanes: bit l of the result is bit
// mma_lane_of(l) of m. Index bits 3, 2, 1 of a hardware lane hold Metal's 2, 1, 3: swapping
// index bits 3 and 1, then 2 and 1, puts each bit at its Metal lane.
constexpr KK_FN unsigned metal_mask_of(unsigned m) {
  return delta_swap(delta_swap(m, 0x00cc00ccu, 6), 0x0c0c0c0cu, 2);
}
}  // namespace detail
// The Metal lane running on hardware lane h, and back; masks of lanes likewise.
KK_FN unsigned hw_of(unsigned lane) { return lanes_permuted() ? detail::mma_lane_of(lane & 31u) : lane & 31u; }
KK_FN unsigned simd_lane() { return lanes_permuted() ? detail::metal_lane_of(hw_lane()) : hw_lane(); }
KK_FN unsigned metal_mask(unsigned hw_mask) { return lanes_permuted() ? detail::metal_mask_of(hw_mask) : hw_mask; }
// The threads of this block's threadgroup: Metal's threads_per_threadgroup, smaller than the block
// in the grid's edge groups. Each threadgroup starts inside the grid, so the threads left from
// there fit 32 bits (even with grid.x close to 2^32).
KK_FN kk_dim3 group_size(const kk_dim3 grid) {
  return {min(blockDim.x, grid.x - blockIdx.x * blockDim.x), min(blockDim.y, grid.y - blockIdx.y * blockDim.y),
          min(blockDim.z, grid.z - blockIdx.z * blockDim.z)};
}
// This thread's position in a threadgroup of `size` threads and its thread_index_in_threadgroup,
// as Metal numbers them: thread L of the block (in the lane order above) runs Metal's thread L,
// x fastest over `size`, so that a SIMD-group is a warp in an edge group too (there Metal
// linearises over the smaller group). False: this thread runs none of the group's threads.
KK_FN bool thread_position(const kk_dim3 size, kk_dim3& pos, unsigned& index) {
  const bool whole = size.x == blockDim.x && size.y == blockDim.y && size.z == blockDim.z;
  unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  if (whole && !lanes_permuted()) {
    pos = {threadIdx.x, threadIdx.y, threadIdx.z};
    index = linear;
    return true;
  }
  if (lanes_permuted()) linear = (linear & ~31u) | simd_lane();
  if (linear >= size.x * size.y * size.z) return false;
  pos = {linear % size.x, linear / size.x % size.y, linear / (size.x * size.y)};
  index = linear;
  return true;
}

KK_FN unsigned simd_active_mask(site = site()) { return metal_mask(__activemask()); }
KK_FN unsigned simd_ballot(bool p, site = site()) { return metal_mask(__ballot_sync(__activemask(), p)); }

// v of src_lane; a lane reading an inactive lane gets its own v.
template <class T>
KK_FN T simd_shuffle(T v, unsigned src_lane, site = site()) {
  const unsigned mask = __activemask();
  unsigned from = hw_of(src_lane);
  if (!((mask >> from) & 1u)) from = hw_lane();
  return detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(mask, w, from); });
}

// Reduction over the active lanes of each aligned group of W lanes; every
// active lane gets the result. Fast path: a full warp, butterfly in log2(W)
// steps. General path: each lane reads the W lanes of its group (the same
// number of shuffles on every lane, as __shfl_sync requires) and folds the
// active ones in lane order.
template <unsigned W, class T, class Op>
KK_FN T simd_reduce(T v, Op op, site = site()) {
  static_assert(W == 32 || W == 16 || W == 8 || W == 4 || W == 2, "group width");
  const unsigned mask = __activemask();
  if (mask == detail::full_mask) {
#pragma unroll
    for (unsigned off = W / 2; off > 0; off >>= 1) {
      const unsigned x = hw_of(off);
      v = op(v, detail::shuffle_words(v, [&](unsigned w) { return __shfl_xor_sync(mask, w, x); }));
    }
    return v;
  }
  const unsigned base = simd_lane() & ~(W - 1);
  T acc = v;
  bool have = false;
#pragma unroll 1
  for (unsigned k = 0; k < W; ++k) {
    const unsigned src = hw_of(base + k);
    T x = detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(mask, w, src); });
    if ((mask >> src) & 1u) {
      acc = have ? op(acc, x) : x;
      have = true;
    }
  }
  return acc;
}

// Prefix (scan) over the active lanes of each aligned group of W lanes, in
// lane order; an exclusive scan gives `identity` to the group's first active lane.
template <unsigned W, class T, class Op>
KK_FN T simd_scan(T v, Op op, T identity, bool inclusive, site = site()) {
  static_assert(W == 32 || W == 16 || W == 8 || W == 4 || W == 2, "group width");
  const unsigned mask = __activemask();
  const unsigned lane = simd_lane();
  if (mask == detail::full_mask) {
    const unsigned pos = lane & (W - 1);
#pragma unroll
    for (unsigned off = 1; off < W; off <<= 1) {
      const unsigned src = hw_of(pos >= off ? lane - off : lane);
      T y = detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(mask, w, src); });
      if (pos >= off) v = op(y, v);
    }
    if (inclusive) return v;
    const unsigned src = hw_of(pos >= 1 ? lane - 1 : lane);
    T y = detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(mask, w, src); });
    return pos == 0 ? identity : y;
  }
  const unsigned base = lane & ~(W - 1);
  T acc = identity;
#pragma unroll 1
  for (unsigned k = 0; k < W; ++k) {
    const unsigned src = base + k, from = hw_of(src);
    T x = detail::shuffle_words(v, [&](unsigned w) { return __shfl_sync(mask, w, from); });
    if (((mask >> from) & 1u) && (inclusive ? src <= lane : src < lane)) acc = op(acc, x);
  }
  return acc;
}

// ---------------------------------------------------------------------------
// Barriers. Threads that returned early (outside the grid) count as arrived.

KK_FN void threadgroup_barrier(site = site()) { __syncthreads(); }
KK_FN void simdgroup_barrier(site = site()) { __syncwarp(__activemask()); }

// ---------------------------------------------------------------------------
// Atomics on plain memory, relaxed order, device scope (threadgroup memory
// works through the same generic addresses). T: any trivially copyable type
// of 1, 2, 4 or 8 bytes. int, unsigned, (unsigned) long long, float, double
// use CUDA's instructions; other types (half, bfloat, short, char, bool...) a
// compare-and-swap loop computing with T's own operators, on T's bits (a byte
// goes through the aligned 32-bit word that holds it: little-endian).

namespace detail {
template <int Size> struct word_of;  // what atomicCAS takes for a T of this size
template <> struct word_of<2> { using type = unsigned short; };
template <> struct word_of<4> { using type = unsigned; };
template <> struct word_of<8> { using type = unsigned long long; };
template <class T> using word_t = typename word_of<sizeof(T)>::type;

template <class T> KK_FN bool same_bits(const T& a, const T& b) {
  if constexpr (sizeof(T) == 1) return __builtin_bit_cast(unsigned char, a) == __builtin_bit_cast(unsigned char, b);
  else return __builtin_bit_cast(word_t<T>, a) == __builtin_bit_cast(word_t<T>, b);
}

// A byte and the 32-bit word around it.
struct byte_in_word {
  unsigned* word;
  unsigned shift;
  template <class T> KK_FN explicit byte_in_word(T* p)
      : word(reinterpret_cast<unsigned*>(reinterpret_cast<unsigned long long>(p) & ~3ull)),
        shift(static_cast<unsigned>(reinterpret_cast<unsigned long long>(p) & 3u) * 8u) {}
  KK_FN unsigned char get(unsigned w) const { return static_cast<unsigned char>(w >> shift); }
  KK_FN unsigned put(unsigned w, unsigned char b) const { return (w & ~(0xffu << shift)) | (unsigned(b) << shift); }
};

template <class T> KK_FN T load(T* p) {
  if constexpr (sizeof(T) == 1) {
    return __builtin_bit_cast(T, *reinterpret_cast<volatile unsigned char*>(p));
  } else {
    return __builtin_bit_cast(T, *reinterpret_cast<volatile word_t<T>*>(p));
  }
}

// Strong compare-and-swap of T's bits; on failure `expected` gets the current value.
template <class T> KK_FN bool cas(T* p, T& expected, T desired) {
  if constexpr (sizeof(T) == 1) {
    const byte_in_word b(p);
    const unsigned char want = __builtin_bit_cast(unsigned char, expected);
    unsigned w = *reinterpret_cast<volatile unsigned*>(b.word);
    for (;;) {
      if (b.get(w) != want) {
        expected = __builtin_bit_cast(T, b.get(w));
        return false;
      }
      const unsigned prev = atomicCAS(b.word, w, b.put(w, __builtin_bit_cast(unsigned char, desired)));
      if (prev == w) return true;
      w = prev;  // the word changed, maybe only in the other bytes: look again
    }
  } else {
    using W = word_t<T>;
    const W want = __builtin_bit_cast(W, expected);
    const W old = atomicCAS(reinterpret_cast<W*>(p), want, __builtin_bit_cast(W, desired));
    if (old == want) return true;
    expected = __builtin_bit_cast(T, old);
    return false;
  }
}

// *p = f(*p) atomically; returns the old value. No write when f keeps the value.
template <class T, class F> KK_FN T cas_loop(T* p, F f) {
  T old = load(p);
  for (;;) {
    const T next = f(old);
    if (same_bits(next, old)) return old;
    T expected = old;
    if (cas(p, expected, next)) return old;
    old = expected;
  }
}
}  // namespace detail

template <class T> KK_FN T atomic_load(T* p) { return detail::load(p); }
template <class T> KK_FN void atomic_store(T* p, T v) {
  if constexpr (sizeof(T) == 1) {
    detail::cas_loop(p, [&](T) { return v; });  // never a plain byte store beside other atomics
  } else {
    *reinterpret_cast<volatile detail::word_t<T>*>(p) = __builtin_bit_cast(detail::word_t<T>, v);
  }
}
template <class T> KK_FN T atomic_exchange(T* p, T v) {
  if constexpr (sizeof(T) >= 4) {
    using W = detail::word_t<T>;
    return __builtin_bit_cast(T, atomicExch(reinterpret_cast<W*>(p), __builtin_bit_cast(W, v)));
  } else {
    return detail::cas_loop(p, [&](T) { return v; });
  }
}
template <class T> KK_FN bool atomic_compare_exchange(T* p, T* expected, T desired) {
  return detail::cas(p, *expected, desired);
}

namespace detail {
// The instructions CUDA has, by type; everything else falls to the templates
// at the end, which run cas_loop with T's operators.
using ull = unsigned long long;
KK_FN int fetch_add(int* p, int v) { return atomicAdd(p, v); }
KK_FN unsigned fetch_add(unsigned* p, unsigned v) { return atomicAdd(p, v); }
KK_FN ull fetch_add(ull* p, ull v) { return atomicAdd(p, v); }
KK_FN long long fetch_add(long long* p, long long v) {
  return static_cast<long long>(atomicAdd(reinterpret_cast<ull*>(p), static_cast<ull>(v)));
}
KK_FN float fetch_add(float* p, float v) { return atomicAdd(p, v); }
KK_FN double fetch_add(double* p, double v) { return atomicAdd(p, v); }
KK_FN half_t fetch_add(half_t* p, half_t v) {
  unsigned short old;
  asm volatile("atom.add.noftz.f16 %0, [%1], %2;" : "=h"(old) : "l"(p), "h"(v.bits) : "memory");
  return half_t{old};
}
KK_FN bfloat_t fetch_add(bfloat_t* p, bfloat_t v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  unsigned short old;
  asm volatile("atom.add.noftz.bf16 %0, [%1], %2;" : "=h"(old) : "l"(p), "h"(v.bits) : "memory");
  return bfloat_t{old};
#else
  return cas_loop(p, [&](bfloat_t x) {
    return bfloat_t{float_to_bfloat(bfloat_to_float(x.bits) + bfloat_to_float(v.bits))};
  });
#endif
}
KK_FN int fetch_sub(int* p, int v) { return atomicSub(p, v); }
KK_FN unsigned fetch_sub(unsigned* p, unsigned v) { return atomicSub(p, v); }
KK_FN ull fetch_sub(ull* p, ull v) { return atomicAdd(p, 0ull - v); }
KK_FN long long fetch_sub(long long* p, long long v) { return fetch_add(p, static_cast<long long>(0ull - ull(v))); }
KK_FN float fetch_sub(float* p, float v) { return atomicAdd(p, -v); }
KK_FN double fetch_sub(double* p, double v) { return atomicAdd(p, -v); }

#define KK_CUDA_INT_ATOMIC(name, intrinsic)                                                    \
  KK_FN int name(int* p, int v) { return intrinsic(p, v); }                                    \
  KK_FN unsigned name(unsigned* p, unsigned v) { return intrinsic(p, v); }                     \
  KK_FN ull name(ull* p, ull v) { return intrinsic(p, v); }
KK_CUDA_INT_ATOMIC(fetch_min, atomicMin)
KK_CUDA_INT_ATOMIC(fetch_max, atomicMax)
KK_CUDA_INT_ATOMIC(fetch_and, atomicAnd)
KK_CUDA_INT_ATOMIC(fetch_or, atomicOr)
KK_CUDA_INT_ATOMIC(fetch_xor, atomicXor)
#undef KK_CUDA_INT_ATOMIC
KK_FN long long fetch_min(long long* p, long long v) { return atomicMin(p, v); }
KK_FN long long fetch_max(long long* p, long long v) { return atomicMax(p, v); }
#define KK_CUDA_BITS_AS_ULL(name)                                                              \
  KK_FN long long name(long long* p, long long v) {                                            \
    return static_cast<long long>(name(reinterpret_cast<ull*>(p), static_cast<ull>(v)));       \
  }
KK_CUDA_BITS_AS_ULL(fetch_and)
KK_CUDA_BITS_AS_ULL(fetch_or)
KK_CUDA_BITS_AS_ULL(fetch_xor)
#undef KK_CUDA_BITS_AS_ULL

// Everything else: a CAS loop (float/double min and max included).
template <class T> KK_FN T fetch_add(T* p, T v) { return cas_loop(p, [&](T o) { return T(o + v); }); }
template <class T> KK_FN T fetch_sub(T* p, T v) { return cas_loop(p, [&](T o) { return T(o - v); }); }
template <class T> KK_FN T fetch_min(T* p, T v) { return cas_loop(p, [&](T o) { return v < o ? v : o; }); }
template <class T> KK_FN T fetch_max(T* p, T v) { return cas_loop(p, [&](T o) { return o < v ? v : o; }); }
template <class T> KK_FN T fetch_and(T* p, T v) { return cas_loop(p, [&](T o) { return T(o & v); }); }
template <class T> KK_FN T fetch_or(T* p, T v) { return cas_loop(p, [&](T o) { return T(o | v); }); }
template <class T> KK_FN T fetch_xor(T* p, T v) { return cas_loop(p, [&](T o) { return T(o ^ v); }); }
}  // namespace detail

namespace detail {
// long is 64-bit here: CUDA's intrinsics take it as long long.
template <class T> struct native { using type = T; };
template <> struct native<long> { using type = long long; };
template <> struct native<unsigned long> { using type = unsigned long long; };
}  // namespace detail
#define KK_CUDA_FETCH(op)                                                             \
  template <class T> KK_FN T atomic_fetch_##op(T* p, T v) {                           \
    using N = typename detail::native<T>::type;                                       \
    return T(detail::fetch_##op(reinterpret_cast<N*>(p), N(v)));                      \
  }
KK_CUDA_FETCH(add)
KK_CUDA_FETCH(sub)
KK_CUDA_FETCH(min)
KK_CUDA_FETCH(max)
KK_CUDA_FETCH(and)
KK_CUDA_FETCH(or)
KK_CUDA_FETCH(xor)
#undef KK_CUDA_FETCH
#define KK_HAS_ATOMIC_ADD_F16 1  // atomic_fetch_add on half_t / bfloat_t is one instruction

// ---------------------------------------------------------------------------
// Optional extras (see the top of this file).

#define KK_HAS_FAST_MATH 1
namespace fast {
KK_FN float exp(float x) { return __expf(x); }
KK_FN float exp2(float x) { return exp2f(x); }  // ex2.approx.ftz: already the fast path
KK_FN float exp10(float x) { return __exp10f(x); }
KK_FN float log(float x) { return __logf(x); }
KK_FN float log2(float x) { return __log2f(x); }
KK_FN float log10(float x) { return __log10f(x); }
KK_FN float sin(float x) { return __sinf(x); }
KK_FN float cos(float x) { return __cosf(x); }
KK_FN float tan(float x) { return __tanf(x); }
KK_FN float pow(float x, float y) { return __powf(x, y); }
KK_FN float rsqrt(float x) { return rsqrtf(x); }
KK_FN float divide(float x, float y) { return __fdividef(x, y); }
}  // namespace fast

#define KK_HAS_BIT_INTRINSICS 1
KK_FN int clz32(unsigned x) { return __clz(static_cast<int>(x)); }
KK_FN int clz64(unsigned long long x) { return __clzll(static_cast<long long>(x)); }
KK_FN int ctz32(unsigned x) { return x ? __ffs(static_cast<int>(x)) - 1 : 32; }
KK_FN int ctz64(unsigned long long x) { return x ? __ffsll(static_cast<long long>(x)) - 1 : 64; }
KK_FN int popcount32(unsigned x) { return __popc(x); }
KK_FN int popcount64(unsigned long long x) { return __popcll(x); }
KK_FN unsigned reverse_bits32(unsigned x) { return __brev(x); }
KK_FN unsigned long long reverse_bits64(unsigned long long x) { return __brevll(x); }
KK_FN unsigned mulhi32(unsigned x, unsigned y) { return __umulhi(x, y); }
KK_FN int mulhi32(int x, int y) { return __mulhi(x, y); }
KK_FN unsigned long long mulhi64(unsigned long long x, unsigned long long y) { return __umul64hi(x, y); }
KK_FN long long mulhi64(long long x, long long y) { return __mul64hi(x, y); }

}  // namespace kk
