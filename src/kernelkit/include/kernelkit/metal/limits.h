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

enum float_round_style {
  round_indeterminate = -1,
  round_toward_zero = 0,
  round_to_nearest = 1,
  round_toward_infinity = 2,
  round_toward_neg_infinity = 3,
};
enum float_denorm_style { denorm_indeterminate = -1, denorm_absent = 0, denorm_present = 1 };

template <class T> struct numeric_limits {
  static constexpr bool is_specialized = false;
};

namespace kk_detail {
// The members C++'s std::numeric_limits has, with the values it gives the same types.
template <class T, bool Signed, int Digits>
struct common_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = Signed;
  static constexpr bool is_bounded = true;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr int radix = 2;
  static constexpr int digits = Digits;
};

template <class T, bool Signed = (T(-1) < T(0)), int Digits = int(sizeof(T) * 8) - (Signed ? 1 : 0)>
struct integer_limits : common_limits<T, Signed, Digits> {
  static constexpr bool is_integer = true;
  static constexpr bool is_exact = true;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_modulo = !Signed;
  static constexpr bool has_infinity = false;
  static constexpr bool has_quiet_NaN = false;
  static constexpr bool has_signaling_NaN = false;
  static constexpr float_denorm_style has_denorm = denorm_absent;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_toward_zero;
  static constexpr int digits10 = Digits * 30103 / 100000;  // floor(digits * log10(2))
  static constexpr int max_digits10 = 0;
  static constexpr int min_exponent = 0, min_exponent10 = 0, max_exponent = 0, max_exponent10 = 0;
  static constexpr KK_FN T max() { return Signed ? T(~(T(1) << (sizeof(T) * 8 - 1))) : T(~T(0)); }
  static constexpr KK_FN T min() { return Signed ? T(-max() - 1) : T(0); }
  static constexpr KK_FN T lowest() { return min(); }
  static constexpr KK_FN T epsilon() { return T(0); }
  static constexpr KK_FN T round_error() { return T(0); }
};

// A floating type given by its bit patterns (Bits: an unsigned integer of the same size).
// The exponent range follows from the widths (an IEEE-style format: 1 sign bit, then the
// exponent, then digits - 1 fraction bits); the decimal members are <float.h>'s formulas,
// log10(2) taken as 0.30103.
template <class T, class Bits, Bits Min, Bits Max, Bits Eps, Bits Inf, Bits NaN, int Digits>
struct float_limits : common_limits<T, true, Digits> {
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_modulo = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr int max_exponent = 1 << (int(sizeof(T) * 8) - Digits - 1);
  static constexpr int min_exponent = 3 - max_exponent;
  static constexpr int digits10 = (Digits - 1) * 30103 / 100000;            // floor
  static constexpr int max_digits10 = 2 + Digits * 30103 / 100000;          // ceil(1 + ...)
  static constexpr int max_exponent10 = max_exponent * 30103 / 100000;      // floor
  static constexpr int min_exponent10 = (min_exponent - 1) * 30103 / 100000;  // ceil: truncates
  static constexpr KK_FN T round_error() { return T(0.5f); }
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

template <> struct numeric_limits<bool> : kk_detail::integer_limits<bool, false, 1> {
  static constexpr bool is_modulo = false;
  static constexpr KK_FN bool min() { return false; }
  static constexpr KK_FN bool max() { return true; }
  static constexpr KK_FN bool lowest() { return false; }
  static constexpr KK_FN bool epsilon() { return false; }
  static constexpr KK_FN bool round_error() { return false; }
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

// The C library's integer limits, which Metal's SDK headers define too (Metal's long is 64 bits).
// Guarded: a body's header may include <climits> as well.
#ifndef CHAR_BIT
#define CHAR_BIT 8
#endif
#ifndef SCHAR_MAX
#define SCHAR_MAX 127
#endif
#ifndef SCHAR_MIN
#define SCHAR_MIN (-127 - 1)
#endif
#ifndef UCHAR_MAX
#define UCHAR_MAX 255
#endif
#ifndef CHAR_MAX
#define CHAR_MAX SCHAR_MAX
#endif
#ifndef CHAR_MIN
#define CHAR_MIN SCHAR_MIN
#endif
#ifndef SHRT_MAX
#define SHRT_MAX 32767
#endif
#ifndef SHRT_MIN
#define SHRT_MIN (-32767 - 1)
#endif
#ifndef USHRT_MAX
#define USHRT_MAX 65535
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef INT_MIN
#define INT_MIN (-2147483647 - 1)
#endif
#ifndef UINT_MAX
#define UINT_MAX 4294967295U
#endif
#ifndef LONG_MAX
#define LONG_MAX 9223372036854775807L
#endif
#ifndef LONG_MIN
#define LONG_MIN (-9223372036854775807L - 1)
#endif
#ifndef ULONG_MAX
#define ULONG_MAX 18446744073709551615UL
#endif
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
// MSL's implementation limits for float and half (<float.h>'s names; HALF_* as OpenCL C's).
#ifndef FLT_DIG
#define FLT_DIG 6
#endif
#ifndef FLT_MANT_DIG
#define FLT_MANT_DIG 24
#endif
#ifndef FLT_MAX_10_EXP
#define FLT_MAX_10_EXP +38
#endif
#ifndef FLT_MAX_EXP
#define FLT_MAX_EXP +128
#endif
#ifndef FLT_MIN_10_EXP
#define FLT_MIN_10_EXP -37
#endif
#ifndef FLT_MIN_EXP
#define FLT_MIN_EXP -125
#endif
#ifndef FLT_RADIX
#define FLT_RADIX 2
#endif
#ifndef HALF_DIG
#define HALF_DIG 3
#endif
#ifndef HALF_MANT_DIG
#define HALF_MANT_DIG 11
#endif
#ifndef HALF_MAX_10_EXP
#define HALF_MAX_10_EXP +4
#endif
#ifndef HALF_MAX_EXP
#define HALF_MAX_EXP +16
#endif
#ifndef HALF_MIN_10_EXP
#define HALF_MIN_10_EXP -4
#endif
#ifndef HALF_MIN_EXP
#define HALF_MIN_EXP -13
#endif
#ifndef HALF_RADIX
#define HALF_RADIX 2
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

// bfloat's, as MSL's Table 6.7 lists them (MSL defines no MINBFLOAT, nor MINHALF).
#define MAXBFLOAT (::metal::numeric_limits<::metal::bfloat>::max())
#define HUGE_VALBF (::metal::numeric_limits<::metal::bfloat>::infinity())
#define KK_BFLOAT_CONST(bits) (::metal::bfloat::from_bits(bits))
#define M_E_BF KK_BFLOAT_CONST(0x402e)
#define M_LOG2E_BF KK_BFLOAT_CONST(0x3fb9)
#define M_LOG10E_BF KK_BFLOAT_CONST(0x3ede)
#define M_LN2_BF KK_BFLOAT_CONST(0x3f31)
#define M_LN10_BF KK_BFLOAT_CONST(0x4013)
#define M_PI_BF KK_BFLOAT_CONST(0x4049)
#define M_PI_2_BF KK_BFLOAT_CONST(0x3fc9)
#define M_PI_4_BF KK_BFLOAT_CONST(0x3f49)
#define M_1_PI_BF KK_BFLOAT_CONST(0x3ea3)
#define M_2_PI_BF KK_BFLOAT_CONST(0x3f23)
#define M_2_SQRTPI_BF KK_BFLOAT_CONST(0x3f90)
#define M_SQRT2_BF KK_BFLOAT_CONST(0x3fb5)
#define M_SQRT1_2_BF KK_BFLOAT_CONST(0x3f35)
