// kernelkit/metal/limits.h: metal::numeric_limits, as_type<T>, and the
// constants MSL predefines (M_PI_F, MAXFLOAT, INFINITY, M_PI_H...).
// Everything here is constexpr: MLX's Limits<T> initialises static constexpr
// members from numeric_limits<T>::infinity().
#pragma once

namespace metal {

// Reinterpret the bits of x as T (Metal's as_type); sizes must match. Works for
// scalars and vectors (float3 is 16 bytes, like uint4 or float4).
template <class T, class U>
constexpr KK_FN T as_type(const U& x) {
  static_assert(sizeof(T) == sizeof(U), "as_type: source and destination sizes differ");
  return __builtin_bit_cast(T, x);
}

template <class T> struct numeric_limits {
  static constexpr bool is_specialized = false;
};

namespace kk_detail {
template <class T, bool Signed = (T(-1) < T(0))>
struct integer_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = Signed;
  static constexpr bool is_integer = true;
  static constexpr bool has_infinity = false;
  static constexpr bool has_quiet_NaN = false;
  static constexpr int digits = int(sizeof(T) * 8) - (Signed ? 1 : 0);
  static constexpr KK_FN T max() { return Signed ? T(~(T(1) << (sizeof(T) * 8 - 1))) : T(~T(0)); }
  static constexpr KK_FN T min() { return Signed ? T(-max() - 1) : T(0); }
  static constexpr KK_FN T lowest() { return min(); }
  static constexpr KK_FN T epsilon() { return T(0); }
};

// A floating type given by its bit patterns (Bits: an unsigned integer of the same size).
template <class T, class Bits, Bits Min, Bits Max, Bits Eps, Bits Inf, Bits NaN, int Digits>
struct float_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = Digits;
  static constexpr KK_FN T min() { return __builtin_bit_cast(T, Min); }
  static constexpr KK_FN T max() { return __builtin_bit_cast(T, Max); }
  static constexpr KK_FN T lowest() { return __builtin_bit_cast(T, Bits(Max | (Bits(1) << (sizeof(T) * 8 - 1)))); }
  static constexpr KK_FN T epsilon() { return __builtin_bit_cast(T, Eps); }
  static constexpr KK_FN T infinity() { return __builtin_bit_cast(T, Inf); }
  static constexpr KK_FN T quiet_NaN() { return __builtin_bit_cast(T, NaN); }
  static constexpr KK_FN T signaling_NaN() { return __builtin_bit_cast(T, Bits(NaN | 1)); }
  static constexpr KK_FN T denorm_min() { return __builtin_bit_cast(T, Bits(1)); }
};
}  // namespace kk_detail

template <> struct numeric_limits<bool> {
  static constexpr bool is_specialized = true, is_signed = false, is_integer = true;
  static constexpr bool has_infinity = false, has_quiet_NaN = false;
  static constexpr int digits = 1;
  static constexpr KK_FN bool min() { return false; }
  static constexpr KK_FN bool max() { return true; }
  static constexpr KK_FN bool lowest() { return false; }
  static constexpr KK_FN bool epsilon() { return false; }
};
template <> struct numeric_limits<char> : kk_detail::integer_limits<char> {};
template <> struct numeric_limits<signed char> : kk_detail::integer_limits<signed char> {};
template <> struct numeric_limits<unsigned char> : kk_detail::integer_limits<unsigned char> {};
template <> struct numeric_limits<short> : kk_detail::integer_limits<short> {};
template <> struct numeric_limits<unsigned short> : kk_detail::integer_limits<unsigned short> {};
template <> struct numeric_limits<int> : kk_detail::integer_limits<int> {};
template <> struct numeric_limits<unsigned int> : kk_detail::integer_limits<unsigned int> {};
template <> struct numeric_limits<long> : kk_detail::integer_limits<long> {};
template <> struct numeric_limits<unsigned long> : kk_detail::integer_limits<unsigned long> {};
template <> struct numeric_limits<long long> : kk_detail::integer_limits<long long> {};
template <> struct numeric_limits<unsigned long long> : kk_detail::integer_limits<unsigned long long> {};
template <> struct numeric_limits<float>
    : kk_detail::float_limits<float, uint, 0x00800000u, 0x7f7fffffu, 0x34000000u, 0x7f800000u, 0x7fc00000u, 24> {};
template <> struct numeric_limits<double>
    : kk_detail::float_limits<double, ulong, 0x0010000000000000ul, 0x7fefffffffffffffull, 0x3cb0000000000000ul,
                              0x7ff0000000000000ul, 0x7ff8000000000000ul, 53> {};
template <> struct numeric_limits<half>
    : kk_detail::float_limits<half, ushort, 0x0400, 0x7bff, 0x1400, 0x7c00, 0x7e00, 11> {};
template <> struct numeric_limits<bfloat>
    : kk_detail::float_limits<bfloat, ushort, 0x0080, 0x7f7f, 0x3c00, 0x7f80, 0x7fc0, 8> {};
template <class T> struct numeric_limits<const T> : numeric_limits<T> {};

}  // namespace metal

// ---------------------------------------------------------------------------
// MSL's predefined constants (macros, as in Metal). Guarded: a hosted target's
// <math.h> may define some of them already, with the same values.

#ifndef INFINITY
#define INFINITY (::metal::numeric_limits<float>::infinity())
#endif
#ifndef NAN
#define NAN (::metal::numeric_limits<float>::quiet_NaN())
#endif
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep+127f
#endif
#ifndef FLT_MAX
#define FLT_MAX 0x1.fffffep+127f
#endif
#ifndef FLT_MIN
#define FLT_MIN 0x1p-126f
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 0x1p-23f
#endif
#ifndef HALF_MAX
#define HALF_MAX (::metal::numeric_limits<::metal::half>::max())
#endif
#ifndef HALF_MIN
#define HALF_MIN (::metal::numeric_limits<::metal::half>::min())
#endif
#ifndef HALF_EPSILON
#define HALF_EPSILON (::metal::numeric_limits<::metal::half>::epsilon())
#endif
#ifndef MAXHALF
#define MAXHALF HALF_MAX
#endif
#ifndef HUGE_VALH
#define HUGE_VALH (::metal::numeric_limits<::metal::half>::infinity())
#endif

#define M_E_F 2.71828175f
#define M_LOG2E_F 1.44269502f
#define M_LOG10E_F 0.434294492f
#define M_LN2_F 0.693147182f
#define M_LN10_F 2.30258512f
#define M_PI_F 3.14159274f
#define M_PI_2_F 1.57079637f
#define M_PI_4_F 0.785398185f
#define M_1_PI_F 0.318309873f
#define M_2_PI_F 0.636619747f
#define M_2_SQRTPI_F 1.12837923f
#define M_SQRT2_F 1.41421354f
#define M_SQRT1_2_F 0.707106769f

#define KK_HALF_CONST(bits) (::metal::half::from_bits(bits))
#define M_E_H KK_HALF_CONST(0x4170)
#define M_LOG2E_H KK_HALF_CONST(0x3dc5)
#define M_LOG10E_H KK_HALF_CONST(0x36f3)
#define M_LN2_H KK_HALF_CONST(0x398c)
#define M_LN10_H KK_HALF_CONST(0x409b)
#define M_PI_H KK_HALF_CONST(0x4248)
#define M_PI_2_H KK_HALF_CONST(0x3e48)
#define M_PI_4_H KK_HALF_CONST(0x3a48)
#define M_1_PI_H KK_HALF_CONST(0x3518)
#define M_2_PI_H KK_HALF_CONST(0x3918)
#define M_2_SQRTPI_H KK_HALF_CONST(0x3c83)
#define M_SQRT2_H KK_HALF_CONST(0x3da8)
#define M_SQRT1_2_H KK_HALF_CONST(0x39a8)
