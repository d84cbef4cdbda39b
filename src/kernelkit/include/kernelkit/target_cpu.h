// kernelkit/target_cpu.h: the target layer contract (DESIGN.md) on the CPU.
// Included by metal.h when KK_TARGET_CPU is defined. The synchronising parts
// call the fiber runtime (cpu_runtime.h, in libkkrt).
//
// Every synchronising function takes a trailing `kk::site` defaulted to
// KK_SITE("name"): the user's file and line when metal.h forwards its own
// defaulted site (see launch.h). Threads meet only at the same site.
#pragma once

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cpu_runtime.h"
#include "launch.h"

#if defined(__F16C__) && !defined(KK_CPU_PORTABLE_HALF)
#include <immintrin.h>
#define KK_CPU_HALF_F16C 1
#elif defined(__aarch64__) && !defined(KK_CPU_PORTABLE_HALF)
#define KK_CPU_HALF_FP16 1
#endif

#define KK_TARGET_DEFINED 1

#define KK_FN inline
// A group runs on one OS thread at a time, all of its fibers on that thread:
// a function-local static thread_local is per-group memory.
#define KK_THREADGROUP static thread_local
#define KK_PROGRAM_CONSTANT  // storage of program-scope `constant` data (the front end adds const)
// MSL's `#pragma clang loop unroll(...)` (the front end writes these): GCC's unroll pragma
#define KK_PRAGMA(x) _Pragma(#x)
#define KK_UNROLL_FULL KK_PRAGMA(GCC unroll 65534)
#define KK_UNROLL_COUNT(n) KK_PRAGMA(GCC unroll n)

namespace kk {

namespace cpu_detail {
template <class To, class From>
KK_FN To bit_cast(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: sizes differ");
  To t;
  memcpy(&t, &f, sizeof t);
  return t;
}
}  // namespace cpu_detail

// ---------------------------------------------------------------------------
// 16-bit floats, round to nearest even.

KK_FN float half_to_float(unsigned short h) {
#if defined(KK_CPU_HALF_F16C)
  return _cvtsh_ss(h);
#elif defined(KK_CPU_HALF_FP16)
  __fp16 x;
  memcpy(&x, &h, 2);
  return float(x);
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact
    float f = float(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  uint32_t bits = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13))   // inf, nan
                              : (sign | ((exp + 112u) << 23) | (mant << 13));
  return cpu_detail::bit_cast<float>(bits);
#endif
}

KK_FN unsigned short float_to_half(float f) {
#if defined(KK_CPU_HALF_F16C)
  return static_cast<unsigned short>(_cvtss_sh(f, 0));
#elif defined(KK_CPU_HALF_FP16)
  __fp16 x = static_cast<__fp16>(f);
  unsigned short h;
  memcpy(&h, &x, 2);
  return h;
#else
  uint32_t x = cpu_detail::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t o;
  if (x >= 0x47800000u) {  // >= 65536, inf or nan
    o = x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal half or zero
    // Adding 0.5 puts the half's ulp (2^-24) at the float's last bit, and the
    // FPU rounds to nearest even.
    float v = cpu_detail::bit_cast<float>(x) + 0.5f;
    o = cpu_detail::bit_cast<uint32_t>(v) - 0x3f000000u;
  } else {
    const uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;  // rebias the exponent (-112 << 23), round half to even
    o = x >> 13;             // may carry into the exponent: up to inf
  }
  return static_cast<unsigned short>(o | sign);
#endif
}

KK_FN float bfloat_to_float(unsigned short b) {
  return cpu_detail::bit_cast<float>(uint32_t(b) << 16);
}

KK_FN unsigned short float_to_bfloat(float f) {
  uint32_t x = cpu_detail::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>(x >> 16);
}

// Storage types for 16-bit float atomics (the bit pattern, tagged by format),
// as on CUDA.
struct half_t { unsigned short bits; };
struct bfloat_t { unsigned short bits; };

// ---------------------------------------------------------------------------
// SIMD-group (32 lanes). Each function is one rendezvous (kk_rt_simd_exchange):
// its active lanes are the lanes that reach its call site, whatever the other
// lanes of the SIMD-group wait at (another site, a barrier) or whether they
// returned, as on a GPU.

KK_FN unsigned simd_lane() {
  const kk_thread_ctx* t = kk_rt_current;
  if (__builtin_expect(!t, 0)) kk_rt_fail(nullptr, "simd_lane needs the fiber runtime (loop mode)");
  return t->tindex & 31u;
}
// Lanes are numbered as the hardware's here (target_cuda.h's lane order is the GPU's).
KK_FN unsigned hw_lane() { return simd_lane(); }
KK_FN unsigned hw_of(unsigned lane) { return lane & 31u; }
KK_FN constexpr bool lanes_permuted() { return false; }

// Gathers v of every active lane: all[lane] (other slots unspecified). Returns the mask.
template <class T>
KK_FN unsigned simd_exchange(const T& v, T* all, site s = KK_SITE("SIMD-group function")) {
  static_assert(std::is_trivially_copyable<T>::value, "SIMD-group values must be trivially copyable");
  return kk_rt_simd_exchange(kk_rt_current, &s, &v, all, sizeof(T));
}

KK_FN unsigned simd_active_mask(site s = KK_SITE("simd_active_mask")) {
  return kk_rt_simd_exchange(kk_rt_current, &s, nullptr, nullptr, 0);
}

namespace cpu_detail {
// Storage for 32 values of T without constructing them.
template <class T>
struct lanes {
  alignas(T) unsigned char raw[32 * sizeof(T)];
  T* data() { return reinterpret_cast<T*>(raw); }
  T get(unsigned lane) const {
    T v;
    memcpy(&v, raw + lane * sizeof(T), sizeof(T));
    return v;
  }
};
}  // namespace cpu_detail

// v of src_lane (taken modulo 32, as on CUDA); a lane reading an inactive lane gets its own v.
template <class T>
KK_FN T simd_shuffle(T v, unsigned src_lane, site s = KK_SITE("simd_shuffle")) {
  cpu_detail::lanes<T> all;
  unsigned mask = simd_exchange(v, all.data(), s);
  src_lane &= 31u;
  if ((mask >> src_lane) & 1u) return all.get(src_lane);
  return v;
}

namespace cpu_detail {
// One rendezvous: the lanes where p holds; *active receives the active lanes.
inline unsigned ballot(bool p, unsigned* active, const site& s) {
  lanes<bool> all;
  unsigned mask = simd_exchange(p, all.data(), s), r = 0;
  for (unsigned m = mask; m; m &= m - 1) {
    unsigned lane = unsigned(__builtin_ctz(m));
    if (all.get(lane)) r |= 1u << lane;
  }
  *active = mask;
  return r;
}
}  // namespace cpu_detail

KK_FN unsigned simd_ballot(bool p, site s = KK_SITE("simd_ballot")) {
  unsigned active;
  return cpu_detail::ballot(p, &active, s);
}

// Lanes of the aligned group of W lanes (W = 32: simd_*, W = 4: quad_*) of `lane`.
template <unsigned W>
KK_FN unsigned simd_window(unsigned lane) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W must be a power of two <= 32");
  return W == 32 ? 0xffffffffu : (((1u << W) - 1u) << (lane & ~(W - 1u)));
}

// op folded over the active lanes of the W-lane window, in lane order.
template <unsigned W, class T, class Op>
KK_FN T simd_reduce(T v, Op op, site s = KK_SITE(W == 4 ? "quad_reduce" : "simd_reduce")) {
  cpu_detail::lanes<T> all;
  unsigned m = simd_exchange(v, all.data(), s) & simd_window<W>(simd_lane());
  T r = all.get(unsigned(__builtin_ctz(m)));
  for (m &= m - 1; m; m &= m - 1) r = op(r, all.get(unsigned(__builtin_ctz(m))));
  return r;
}

// Prefix of op over the active lanes of the W-lane window up to this lane
// (inclusive) or before it (exclusive, starting from identity).
template <unsigned W, class T, class Op>
KK_FN T simd_scan(T v, Op op, T identity, bool inclusive,
                  site s = KK_SITE(W == 4 ? "quad_scan" : "simd_scan")) {
  cpu_detail::lanes<T> all;
  const unsigned lane = simd_lane();
  const unsigned below = lane ? (0xffffffffu >> (32u - lane)) : 0u;
  unsigned m = simd_exchange(v, all.data(), s) & simd_window<W>(lane) & below;
  T r = identity;
  bool first = true;
  for (; m; m &= m - 1) {
    T x = all.get(unsigned(__builtin_ctz(m)));
    r = first ? x : op(r, x);
    first = false;
  }
  if (inclusive) return first ? v : op(r, v);
  return first ? identity : r;
}

// ---------------------------------------------------------------------------
// Barriers.

KK_FN void threadgroup_barrier(site s = KK_SITE("threadgroup_barrier")) {
  kk_rt_threadgroup_barrier(kk_rt_current, &s);
}

KK_FN void simdgroup_barrier(site s = KK_SITE("simdgroup_barrier")) {
  kk_rt_simdgroup_barrier(kk_rt_current, &s);
}

// ---------------------------------------------------------------------------
// Atomics on plain memory, relaxed (Metal has only memory_order_relaxed).
// Integers use the native read-modify-write instructions; other types of 2, 4
// or 8 bytes use a CAS loop on their bits: float, double, kk::half_t and
// kk::bfloat_t (arithmetic in float, rounded back), and any type with + - <.

namespace cpu_detail {
template <class T>
struct native_int
    : std::integral_constant<bool, std::is_integral<T>::value && !std::is_same<T, bool>::value> {};

template <class T> KK_FN T add(T a, T b) { return T(a + b); }
template <class T> KK_FN T sub(T a, T b) { return T(a - b); }
template <class T> KK_FN bool less(T a, T b) { return a < b; }
KK_FN half_t add(half_t a, half_t b) {
  return half_t{float_to_half(half_to_float(a.bits) + half_to_float(b.bits))};
}
KK_FN half_t sub(half_t a, half_t b) {
  return half_t{float_to_half(half_to_float(a.bits) - half_to_float(b.bits))};
}
KK_FN bool less(half_t a, half_t b) { return half_to_float(a.bits) < half_to_float(b.bits); }
KK_FN bfloat_t add(bfloat_t a, bfloat_t b) {
  return bfloat_t{float_to_bfloat(bfloat_to_float(a.bits) + bfloat_to_float(b.bits))};
}
KK_FN bfloat_t sub(bfloat_t a, bfloat_t b) {
  return bfloat_t{float_to_bfloat(bfloat_to_float(a.bits) - bfloat_to_float(b.bits))};
}
KK_FN bool less(bfloat_t a, bfloat_t b) { return bfloat_to_float(a.bits) < bfloat_to_float(b.bits); }

template <class T>
KK_FN void check_atomic() {
  static_assert(std::is_trivially_copyable<T>::value &&
                    (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8),
                "atomics need a trivially copyable type of 1, 2, 4 or 8 bytes");
}

// Atomically replaces *p by f(*p); returns the old value. Stops when f leaves it unchanged.
template <class T, class F>
KK_FN T cas_update(T* p, F f) {
  check_atomic<T>();
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  for (;;) {
    T desired = f(old);
    if (memcmp(&desired, &old, sizeof(T)) == 0) return old;
    if (__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return old;
  }
}
}  // namespace cpu_detail

template <class T>
KK_FN T atomic_load(const T* p) {
  cpu_detail::check_atomic<T>();
  T r;
  __atomic_load(const_cast<T*>(p), &r, __ATOMIC_RELAXED);
  return r;
}

template <class T>
KK_FN void atomic_store(T* p, T v) {
  cpu_detail::check_atomic<T>();
  __atomic_store(p, &v, __ATOMIC_RELAXED);
}

template <class T>
KK_FN T atomic_exchange(T* p, T v) {
  cpu_detail::check_atomic<T>();
  T r;
  __atomic_exchange(p, &v, &r, __ATOMIC_RELAXED);
  return r;
}

// Strong compare-and-swap of the bits; on failure *expected gets the current value.
template <class T>
KK_FN bool atomic_compare_exchange(T* p, T* expected, T desired) {
  cpu_detail::check_atomic<T>();
  return __atomic_compare_exchange(p, expected, &desired, false, __ATOMIC_RELAXED,
                                   __ATOMIC_RELAXED);
}

#define KK_CPU_ATOMIC_RMW(NAME, BUILTIN, EXPR)                                     \
  template <class T>                                                              \
  KK_FN T NAME(T* p, T v) {                                                       \
    if constexpr (cpu_detail::native_int<T>::value) {                             \
      return BUILTIN(p, v, __ATOMIC_RELAXED);                                     \
    } else {                                                                      \
      return cpu_detail::cas_update(p, [v](T o) -> T { return EXPR; });           \
    }                                                                             \
  }

KK_CPU_ATOMIC_RMW(atomic_fetch_add, __atomic_fetch_add, cpu_detail::add(o, v))
KK_CPU_ATOMIC_RMW(atomic_fetch_sub, __atomic_fetch_sub, cpu_detail::sub(o, v))
KK_CPU_ATOMIC_RMW(atomic_fetch_and, __atomic_fetch_and, T(o & v))
KK_CPU_ATOMIC_RMW(atomic_fetch_or, __atomic_fetch_or, T(o | v))
KK_CPU_ATOMIC_RMW(atomic_fetch_xor, __atomic_fetch_xor, T(o ^ v))
#undef KK_CPU_ATOMIC_RMW

// NaN operands leave the value unchanged (as CUDA's CAS loop does).
template <class T>
KK_FN T atomic_fetch_min(T* p, T v) {
  return cpu_detail::cas_update(p, [v](T o) -> T { return cpu_detail::less(v, o) ? v : o; });
}

template <class T>
KK_FN T atomic_fetch_max(T* p, T v) {
  return cpu_detail::cas_update(p, [v](T o) -> T { return cpu_detail::less(o, v) ? v : o; });
}

#define KK_HAS_ATOMIC_ADD_F16 1  // atomic_fetch_add (and sub, min, max) on half_t / bfloat_t

}  // namespace kk
