// tests/prelude/single_lane_target.h: a target for testing the MSL layer on
// the CPU without the fiber runtime. It implements the contract of DESIGN.md
// for one thread that is lane 0 of its SIMD-group, alone: the active mask is
// 1, a shuffle returns the lane's own value, reductions and scans see one
// value, barriers do nothing, atomics are plain loads and stores.
// Only for tests: include it before kernelkit/metal.h.
#pragma once

#include <string.h>

#include "kernelkit/launch.h"

#define KK_TARGET_DEFINED 1
#define KK_FN inline
#define KK_THREADGROUP static
#define KK_PROGRAM_CONSTANT const

namespace kk {
namespace single_lane {
template <class To, class From> inline To bits(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "size");
  To t;
  memcpy(&t, &f, sizeof t);
  return t;
}
}  // namespace single_lane

// 16-bit floats in plain C++ (round to nearest even), independent of the
// targets' own versions so that the tests cross-check them.
inline float half_to_float(unsigned short h) {
  const unsigned sign = unsigned(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = float(m) * 0x1p-24f;  // zero or subnormal, exact
    return sign ? -v : v;
  }
  const unsigned b = e == 0x1f ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  return single_lane::bits<float>(b);
}
inline unsigned short float_to_half(float f) {
  const unsigned x = single_lane::bits<unsigned>(f);
  const unsigned sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<unsigned short>(sign | 0x7e00u);  // NaN
  if (a >= 0x47800000u) return static_cast<unsigned short>(sign | 0x7c00u);  // >= 2^16: inf
  if (a >= 0x38800000u) {                                                    // normal half
    unsigned r = a - 0x38000000u;                                            // exponent bias 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                                          // nearest even; may carry to inf
    return static_cast<unsigned short>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return static_cast<unsigned short>(sign);  // below 2^-25: zero
  // Subnormal half: the value in units of 2^-24 is m >> (126 - e).
  const unsigned e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
  unsigned q = m >> shift;
  const unsigned rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  q += (rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u;
  return static_cast<unsigned short>(sign | q);
}
inline float bfloat_to_float(unsigned short b) { return single_lane::bits<float>(unsigned(b) << 16); }
inline unsigned short float_to_bfloat(float f) {
  unsigned x = single_lane::bits<unsigned>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>(x >> 16);
}

// One lane, alone in its SIMD-group.
inline unsigned simd_lane() { return 0; }
inline unsigned simd_active_mask(site = site()) { return 1u; }
template <class T> inline T simd_shuffle(T v, unsigned, site = site()) { return v; }
inline unsigned simd_ballot(bool p, site = site()) { return p ? 1u : 0u; }
template <unsigned W, class T, class Op> inline T simd_reduce(T v, Op, site = site()) { return v; }
template <unsigned W, class T, class Op>
inline T simd_scan(T v, Op, T identity, bool inclusive, site = site()) {
  return inclusive ? v : identity;
}
inline void threadgroup_barrier(site = site()) {}
inline void simdgroup_barrier(site = site()) {}

// Atomics: one thread, plain memory operations.
template <class T> inline T atomic_load(T* p) { return *p; }
template <class T> inline void atomic_store(T* p, T v) { *p = v; }
template <class T> inline T atomic_exchange(T* p, T v) {
  T old = *p;
  *p = v;
  return old;
}
template <class T> inline bool atomic_compare_exchange(T* p, T* expected, T desired) {
  if (memcmp(p, expected, sizeof(T)) == 0) {
    *p = desired;
    return true;
  }
  *expected = *p;
  return false;
}
#define KK_SINGLE_LANE_RMW(name, EXPR) \
  template <class T> inline T name(T* p, T v) { \
    T old = *p;                                 \
    *p = EXPR;                                  \
    return old;                                 \
  }
KK_SINGLE_LANE_RMW(atomic_fetch_add, T(old + v))
KK_SINGLE_LANE_RMW(atomic_fetch_sub, T(old - v))
KK_SINGLE_LANE_RMW(atomic_fetch_and, T(old & v))
KK_SINGLE_LANE_RMW(atomic_fetch_or, T(old | v))
KK_SINGLE_LANE_RMW(atomic_fetch_xor, T(old ^ v))
KK_SINGLE_LANE_RMW(atomic_fetch_min, v < old ? v : old)
KK_SINGLE_LANE_RMW(atomic_fetch_max, old < v ? v : old)
#undef KK_SINGLE_LANE_RMW
}  // namespace kk
