// kernelkit/metal/integer.h: MSL's integer functions (abs, absdiff, addsat,
// subsat, clz, ctz, popcount, reverse_bits, rotate, mulhi, hadd, rhadd,
// mad24, mul24, madhi, madsat, extract_bits, insert_bits) for every integer
// type and vectors of them. min, max and clamp (shared with floats) are in math.h.
#pragma once

// ---------------------------------------------------------------------------
// kk bit primitives: a target may provide single-instruction versions
// (KK_HAS_BIT_INTRINSICS); otherwise the compiler's builtins, or plain C++
// (forced with KK_PORTABLE_BITS, for tests).
#ifndef KK_HAS_BIT_INTRINSICS
#if defined(__has_builtin) && !defined(KK_PORTABLE_BITS)
#if __has_builtin(__builtin_clz) && __has_builtin(__builtin_ctzll) && __has_builtin(__builtin_popcountll)
#define KK_GNU_BIT_BUILTINS 1
#endif
#endif
namespace kk {
#ifdef KK_GNU_BIT_BUILTINS
KK_FN int clz32(unsigned x) { return x ? __builtin_clz(x) : 32; }
KK_FN int clz64(unsigned long long x) { return x ? __builtin_clzll(x) : 64; }
KK_FN int ctz32(unsigned x) { return x ? __builtin_ctz(x) : 32; }
KK_FN int ctz64(unsigned long long x) { return x ? __builtin_ctzll(x) : 64; }
KK_FN int popcount32(unsigned x) { return __builtin_popcount(x); }
KK_FN int popcount64(unsigned long long x) { return __builtin_popcountll(x); }
#else
KK_FN int popcount64(unsigned long long x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<int>((x * 0x0101010101010101ull) >> 56);
}
KK_FN int popcount32(unsigned x) { return popcount64(x); }
KK_FN int clz64(unsigned long long x) {
  // Smear the top bit right, then count the zeros left of it.
  x |= x >> 1; x |= x >> 2; x |= x >> 4; x |= x >> 8; x |= x >> 16; x |= x >> 32;
  return 64 - popcount64(x);
}
KK_FN int clz32(unsigned x) { return clz64(x) - 32; }
KK_FN int ctz64(unsigned long long x) { return x ? popcount64((x & (0 - x)) - 1) : 64; }
KK_FN int ctz32(unsigned x) { return x ? ctz64(x) : 32; }
#endif
KK_FN unsigned long long reverse_bits64(unsigned long long x) {
  x = ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
  x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
  x = ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
  x = ((x >> 8) & 0x00ff00ff00ff00ffull) | ((x & 0x00ff00ff00ff00ffull) << 8);
  x = ((x >> 16) & 0x0000ffff0000ffffull) | ((x & 0x0000ffff0000ffffull) << 16);
  return (x >> 32) | (x << 32);
}
KK_FN unsigned reverse_bits32(unsigned x) { return static_cast<unsigned>(reverse_bits64(x) >> 32); }
KK_FN unsigned mulhi32(unsigned x, unsigned y) {
  return static_cast<unsigned>((static_cast<unsigned long long>(x) * y) >> 32);
}
KK_FN int mulhi32(int x, int y) { return static_cast<int>((static_cast<long long>(x) * y) >> 32); }
KK_FN unsigned long long mulhi64(unsigned long long x, unsigned long long y) {
  const unsigned long long xl = x & 0xffffffffu, xh = x >> 32, yl = y & 0xffffffffu, yh = y >> 32;
  const unsigned long long mid = (xl * yl >> 32) + (xh * yl & 0xffffffffu) + xl * yh;
  return xh * yh + (xh * yl >> 32) + (mid >> 32);
}
KK_FN long long mulhi64(long long x, long long y) {
  // Signed high half from the unsigned one: subtract y if x < 0 and x if y < 0.
  unsigned long long h = mulhi64(static_cast<unsigned long long>(x), static_cast<unsigned long long>(y));
  if (x < 0) h -= static_cast<unsigned long long>(y);
  if (y < 0) h -= static_cast<unsigned long long>(x);
  return static_cast<long long>(h);
}
}  // namespace kk
#endif

namespace metal {
namespace kk_detail {
template <class T> constexpr bool is_int = is_integral<T>::value && !is_same_v<T, bool>;
template <class T> using if_int = enable_if_t<is_int<T>, int>;
template <class T> constexpr int bit_width = int(sizeof(T) * 8);
template <class T> using unsigned_t = typename make_unsigned<T>::type;
}  // namespace kk_detail

// Negated in the unsigned type: abs(INT_MIN) wraps to INT_MIN (two's complement), where -x would
// overflow (undefined in C++).
template <class T, kk_detail::if_int<T> = 0>
KK_FN T abs(T x) {
  if constexpr (is_signed_v<T>) return x < 0 ? T(kk_detail::unsigned_t<T>(0) - kk_detail::unsigned_t<T>(x)) : x;
  else return x;
}
// |x - y| in the unsigned type of the same width (MSL's Tu), where it always fits.
template <class T, kk_detail::if_int<T> = 0>
KK_FN kk_detail::unsigned_t<T> absdiff(T x, T y) {
  using U = kk_detail::unsigned_t<T>;
  return x > y ? U(U(x) - U(y)) : U(U(y) - U(x));
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T addsat(T x, T y) {
  const T r = T(kk_detail::unsigned_t<T>(x) + kk_detail::unsigned_t<T>(y));
  if constexpr (is_signed_v<T>) {
    if (x > 0 && y > 0 && r < 0) return numeric_limits<T>::max();
    if (x < 0 && y < 0 && r >= 0) return numeric_limits<T>::min();
    return r;
  } else {
    return r < x ? numeric_limits<T>::max() : r;
  }
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T subsat(T x, T y) {
  const T r = T(kk_detail::unsigned_t<T>(x) - kk_detail::unsigned_t<T>(y));
  if constexpr (is_signed_v<T>) {
    if (x >= 0 && y < 0 && r < 0) return numeric_limits<T>::max();
    if (x < 0 && y > 0 && r >= 0) return numeric_limits<T>::min();
    return r;
  } else {
    return y > x ? T(0) : r;
  }
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T clz(T x) {
  using U = kk_detail::unsigned_t<T>;
  if constexpr (sizeof(T) == 8) return T(kk::clz64(U(x)));
  else return T(kk::clz32(U(x)) - (32 - kk_detail::bit_width<T>));
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T ctz(T x) {
  using U = kk_detail::unsigned_t<T>;
  if constexpr (sizeof(T) == 8) return T(kk::ctz64(U(x)));
  else return x == 0 ? T(kk_detail::bit_width<T>) : T(kk::ctz32(U(x)));
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T popcount(T x) {
  using U = kk_detail::unsigned_t<T>;
  if constexpr (sizeof(T) == 8) return T(kk::popcount64(U(x)));
  else return T(kk::popcount32(U(x)));
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T reverse_bits(T x) {
  using U = kk_detail::unsigned_t<T>;
  if constexpr (sizeof(T) == 8) return T(kk::reverse_bits64(U(x)));
  else return T(kk::reverse_bits32(U(x)) >> (32 - kk_detail::bit_width<T>));
}
// Rotate left by y bits (modulo the width).
template <class T, kk_detail::if_int<T> = 0>
KK_FN T rotate(T x, T y) {
  using U = kk_detail::unsigned_t<T>;
  constexpr int w = kk_detail::bit_width<T>;
  const int s = int(U(y) % U(w));
  return s == 0 ? x : T(U(U(x) << s) | U(U(x) >> (w - s)));
}
// High half of the full product.
template <class T, kk_detail::if_int<T> = 0>
KK_FN T mulhi(T x, T y) {
  if constexpr (sizeof(T) == 8) {
    if constexpr (is_signed_v<T>) return T(kk::mulhi64(static_cast<long long>(x), static_cast<long long>(y)));
    else return T(kk::mulhi64(static_cast<unsigned long long>(x), static_cast<unsigned long long>(y)));
  } else if constexpr (sizeof(T) == 4) {
    if constexpr (is_signed_v<T>) return T(kk::mulhi32(int(x), int(y)));
    else return T(kk::mulhi32(unsigned(x), unsigned(y)));
  } else {
    return T((static_cast<long long>(x) * y) >> kk_detail::bit_width<T>);  // 8/16-bit: exact
  }
}
// (x + y) >> 1 and (x + y + 1) >> 1 without overflow.
template <class T, kk_detail::if_int<T> = 0>
KK_FN T hadd(T x, T y) { return T((x >> 1) + (y >> 1) + (x & y & 1)); }
template <class T, kk_detail::if_int<T> = 0>
KK_FN T rhadd(T x, T y) { return T((x >> 1) + (y >> 1) + ((x | y) & 1)); }
// x * y + z wrapping around, as the GPU's: computed unsigned, at least 32 bits wide (a signed
// overflow is undefined in C++, and ushort * ushort overflows the int it promotes to).
namespace kk_detail {
template <class T> using wide_unsigned_t = conditional_t<(sizeof(T) < 4), unsigned, unsigned_t<T>>;
template <class T> KK_FN T wrap_mad(T x, T y, T z) {
  using W = wide_unsigned_t<T>;
  return T(W(W(x) * W(y)) + W(z));
}
}  // namespace kk_detail
template <class T, kk_detail::if_int<T> = 0>
KK_FN T mul24(T x, T y) { return kk_detail::wrap_mad(x, y, T(0)); }
template <class T, kk_detail::if_int<T> = 0>
KK_FN T mad24(T x, T y, T z) { return kk_detail::wrap_mad(x, y, z); }
template <class T, kk_detail::if_int<T> = 0>
KK_FN T madhi(T x, T y, T z) { return kk_detail::wrap_mad(mulhi(x, y), T(1), z); }
// a*b+c saturated once, from its exact value: in 64 bits for types up to 32 bits, else in
// 128 bits as (high, low) words, the high word from mulhi.
template <class T, kk_detail::if_int<T> = 0>
KK_FN T madsat(T x, T y, T z) {
  constexpr T lo_lim = numeric_limits<T>::min(), hi_lim = numeric_limits<T>::max();
  if constexpr (sizeof(T) <= 4) {
    using W = conditional_t<is_signed_v<T>, long long, unsigned long long>;
    const W r = W(x) * W(y) + W(z);
    if (r > W(hi_lim)) return hi_lim;
    if constexpr (is_signed_v<T>) {
      if (r < W(lo_lim)) return lo_lim;
    }
    return T(r);
  } else {
    using U = kk_detail::unsigned_t<T>;
    const U lo = U(U(x) * U(y)), sum = U(lo + U(z));
    U hi = U(U(mulhi(x, y)) + U(sum < lo));  // carry out of the low word
    if constexpr (is_signed_v<T>) {
      if (z < 0) hi = U(hi - 1);  // z sign-extended: its high word is all ones
      // The sum fits in T when its high word is the sign extension of its low word.
      if (hi == (T(sum) < 0 ? U(~U(0)) : U(0))) return T(sum);
      return T(hi) < 0 ? lo_lim : hi_lim;
    } else {
      return hi != 0 ? hi_lim : sum;
    }
  }
}
// bits [offset, offset + bits) of x, sign-extended for signed T.
template <class T, kk_detail::if_int<T> = 0>
KK_FN T extract_bits(T x, uint offset, uint bits) {
  constexpr int w = kk_detail::bit_width<T>;
  if (bits == 0) return T(0);
  using U = kk_detail::unsigned_t<T>;
  const U shifted = U(U(x) << (w - int(offset) - int(bits)));
  if constexpr (is_signed_v<T>) return T(T(shifted) >> (w - int(bits)));
  else return T(shifted >> (w - int(bits)));
}
template <class T, kk_detail::if_int<T> = 0>
KK_FN T insert_bits(T base, T insert, uint offset, uint bits) {
  using U = kk_detail::unsigned_t<T>;
  if (bits == 0) return base;
  const U ones = bits >= uint(kk_detail::bit_width<T>) ? U(~U(0)) : U((U(1) << bits) - 1);
  const U mask = U(ones << offset);
  return T((U(base) & U(~mask)) | (U(U(insert) << offset) & mask));
}

// Vectors, element-wise.
#define KK_INT_VEC1(name)                                                                  \
  template <class T, int N, kk_detail::if_int<T> = 0>                                      \
  KK_FN vec<T, N> name(const vec<T, N>& x) {                                               \
    return kk_detail::vmap<T, N>([](const T& a) { return name(a); }, x);                   \
  }
#define KK_INT_VEC2(name)                                                                  \
  template <class T, int N, kk_detail::if_int<T> = 0>                                      \
  KK_FN vec<T, N> name(const vec<T, N>& x, const vec<T, N>& y) {                           \
    return kk_detail::vmap<T, N>([](const T& a, const T& b) { return name(a, b); }, x, y); \
  }
#define KK_INT_VEC3(name)                                                                  \
  template <class T, int N, kk_detail::if_int<T> = 0>                                      \
  KK_FN vec<T, N> name(const vec<T, N>& x, const vec<T, N>& y, const vec<T, N>& z) {       \
    return kk_detail::vmap<T, N>([](const T& a, const T& b, const T& c) { return name(a, b, c); }, x, y, z); \
  }
KK_INT_VEC1(clz)
KK_INT_VEC1(ctz)
KK_INT_VEC1(popcount)
KK_INT_VEC1(reverse_bits)
KK_INT_VEC2(addsat)
KK_INT_VEC2(subsat)
KK_INT_VEC2(rotate)
KK_INT_VEC2(mulhi)
KK_INT_VEC2(hadd)
KK_INT_VEC2(rhadd)
KK_INT_VEC2(mul24)
KK_INT_VEC3(mad24)
KK_INT_VEC3(madhi)
KK_INT_VEC3(madsat)
#undef KK_INT_VEC1
#undef KK_INT_VEC2
#undef KK_INT_VEC3
template <class T, int N, kk_detail::if_int<T> = 0>
KK_FN vec<kk_detail::unsigned_t<T>, N> absdiff(const vec<T, N>& x, const vec<T, N>& y) {
  return kk_detail::vmap<kk_detail::unsigned_t<T>, N>([](const T& a, const T& b) { return absdiff(a, b); }, x, y);
}
template <class T, int N, kk_detail::if_int<T> = 0>
KK_FN vec<T, N> extract_bits(const vec<T, N>& x, uint offset, uint bits) {
  return kk_detail::vmap<T, N>([=](const T& a) { return extract_bits(a, offset, bits); }, x);
}
template <class T, int N, kk_detail::if_int<T> = 0>
KK_FN vec<T, N> insert_bits(const vec<T, N>& base, const vec<T, N>& insert, uint offset, uint bits) {
  return kk_detail::vmap<T, N>([=](const T& b, const T& i) { return insert_bits(b, i, offset, bits); }, base, insert);
}

}  // namespace metal
