// kernelkit/metal/half.h: MSL's 16-bit floats `half` and `bfloat`.
//
// Both are class types holding the bit pattern (2 bytes, trivially copyable,
// trivially default constructible, so they work in buffers and threadgroup
// arrays). Arithmetic is done in float and rounded back to nearest even, with
// Metal's promotion rules:
//   half op half -> half     half op integer -> half     half op bfloat -> float
//   half op float -> float   half op double -> double    (bfloat likewise)
// Conversions: implicit from any arithmetic type; implicit *to float, double and
// bool only* (`bool b = h;`, as for float), explicit to the other integers.
// Allowing half -> int implicitly would make `cond ? h : 0` ambiguous (int ->
// half works too); the conversion operator is a constrained template so that
// C++ deduces the target type exactly and rejects everything else (a bool
// target is not reached through int promotions).
#pragma once

namespace metal {
namespace kk_detail {

// Conversions: the target's (one instruction on the GPU) at run time; plain
// C++ in constant expressions, so that `constexpr half h = 0.5f;` and
// `constant half table[] = {...}` (program-scope constants) work.
struct half_format {
  static constexpr KK_FN float to_float(unsigned short b) {
    if (!__builtin_is_constant_evaluated()) return kk::half_to_float(b);
    const unsigned sign = unsigned(b & 0x8000u) << 16, e = (b >> 10) & 0x1fu, m = b & 0x3ffu;
    if (e == 0) return (sign ? -1.0f : 1.0f) * float(m) * 0x1p-24f;  // zero, subnormal: exact
    return __builtin_bit_cast(float, e == 0x1f ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13));
  }
  static constexpr KK_FN unsigned short from_float(float f) {
    if (!__builtin_is_constant_evaluated()) return kk::float_to_half(f);
    const unsigned x = __builtin_bit_cast(unsigned, f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    unsigned h = 0;  // stays 0 below 2^-25 (rounds to zero)
    if (a > 0x7f800000u) {
      h = 0x7e00u;  // NaN
    } else if (a >= 0x47800000u) {
      h = 0x7c00u;  // >= 2^16: infinity
    } else if (a >= 0x38800000u) {  // normal: rebias the exponent, round to nearest even (may carry to inf)
      const unsigned r = a - 0x38000000u;
      h = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    } else if (a >= 0x33000000u) {  // subnormal: the value in units of 2^-24 is m >> (126 - e), rounded to even
      const unsigned e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
      const unsigned rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
      h = (m >> shift) + ((rem > halfway || (rem == halfway && ((m >> shift) & 1u))) ? 1u : 0u);
    }
    return static_cast<unsigned short>(sign | h);
  }
};
struct bfloat_format {
  static constexpr KK_FN float to_float(unsigned short b) {
    if (!__builtin_is_constant_evaluated()) return kk::bfloat_to_float(b);
    return __builtin_bit_cast(float, unsigned(b) << 16);
  }
  static constexpr KK_FN unsigned short from_float(float f) {
    if (!__builtin_is_constant_evaluated()) return kk::float_to_bfloat(f);
    const unsigned x = __builtin_bit_cast(unsigned, f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);  // quiet NaN
    return static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
};
struct bits_tag {};

template <class Format>
struct alignas(2) float16 {
  unsigned short bits;  // the raw IEEE binary16 / bfloat16 pattern

  float16() = default;
  template <class T, enable_if_t<is_builtin_arith<T>, int> = 0>
  constexpr KK_FN float16(T v) : bits(Format::from_float(static_cast<float>(v))) {}
  template <class Other, enable_if_t<!is_same_v<Other, Format>, int> = 0>
  constexpr KK_FN float16(float16<Other> v) : bits(Format::from_float(static_cast<float>(v))) {}
  constexpr KK_FN float16(bits_tag, unsigned short b) : bits(b) {}

  // Build from a bit pattern; constexpr, so limits and constants can use it.
  static constexpr KK_FN float16 from_bits(unsigned short b) { return float16(bits_tag{}, b); }

  template <class T, enable_if_t<is_same_v<T, float> || is_same_v<T, double> || is_same_v<T, bool>, int> = 0>
  constexpr KK_FN operator T() const { return static_cast<T>(Format::to_float(bits)); }
  template <class T, enable_if_t<is_integral<T>::value && !is_same_v<T, bool>, int> = 0>
  constexpr KK_FN explicit operator T() const { return static_cast<T>(Format::to_float(bits)); }

  constexpr KK_FN float16 operator-() const { return from_bits(static_cast<unsigned short>(bits ^ 0x8000u)); }
  constexpr KK_FN float16 operator+() const { return *this; }

  // x op= y is x = x op y, converted back: `h += 1.5f` computes in float.
  template <class T> KK_FN float16& operator+=(const T& v) { return *this = float16(*this + v); }
  template <class T> KK_FN float16& operator-=(const T& v) { return *this = float16(*this - v); }
  template <class T> KK_FN float16& operator*=(const T& v) { return *this = float16(*this * v); }
  template <class T> KK_FN float16& operator/=(const T& v) { return *this = float16(*this / v); }
  KK_FN float16& operator++() { return *this += 1; }
  KK_FN float16& operator--() { return *this -= 1; }
  KK_FN float16 operator++(int) { float16 old = *this; *this += 1; return old; }
  KK_FN float16 operator--(int) { float16 old = *this; *this -= 1; return old; }
};

template <class T> struct is_float16 : false_type {};
template <class F> struct is_float16<float16<F>> : true_type {};
template <class T> constexpr bool is_float16_v = is_float16<T>::value;

// Result type of a binary operation with at least one 16-bit float operand;
// no `type` (SFINAE) when the other operand is not an arithmetic type.
template <class A, class B, class = void> struct f16_promote {};
template <class F> struct f16_promote<float16<F>, float16<F>> { using type = float16<F>; };
template <class F, class G> struct f16_promote<float16<F>, float16<G>> { using type = float; };
template <class F, class T>
struct f16_promote<float16<F>, T, enable_if_t<is_builtin_arith<T>>> {
  using type = conditional_t<is_integral<T>::value, float16<F>, T>;  // T: float or double
};
template <class T, class F>
struct f16_promote<T, float16<F>, enable_if_t<is_builtin_arith<T>>> : f16_promote<float16<F>, T> {};
template <class A, class B> using f16_promote_t = typename f16_promote<A, B>::type;

// Arithmetic is carried out in float, or double when a double is involved.
template <class R> using f16_compute_t = conditional_t<is_same_v<R, double>, double, float>;

// `c ? a : b`, which the front end (dialects/metal.py) writes with each operand cast to
// cond_operand_t<decltype((operand)), decltype((other))>. MSL brings a half or bfloat and another
// arithmetic operand to their usual arithmetic type (`c ? h : 0.0f` is a float), where C++ finds
// each convertible to the other and refuses; any other pair keeps its types and value categories.
template <class T> using plain_t = remove_cv_t<remove_reference_t<T>>;
template <class A, class B, class = void> struct cond_operand { using type = A; };
template <class A, class B>
struct cond_operand<A, B, enable_if_t<!is_same_v<plain_t<A>, plain_t<B>>,
                                      decltype(void(declval<f16_promote_t<plain_t<A>, plain_t<B>>>()))>> {
  using type = f16_promote_t<plain_t<A>, plain_t<B>>;
};
template <class A, class B> using cond_operand_t = typename cond_operand<A, B>::type;
}  // namespace kk_detail

typedef kk_detail::float16<kk_detail::half_format> half;
typedef kk_detail::float16<kk_detail::bfloat_format> bfloat;
typedef half float16_t;
typedef bfloat bfloat16_t;

namespace kk_detail {
template <> struct is_floating_point<half> : true_type {};
template <> struct is_floating_point<bfloat> : true_type {};
}  // namespace kk_detail

// Operators live beside float16 in metal::kk_detail; argument-dependent lookup
// finds them from any namespace.
namespace kk_detail {
#define KK_F16_ARITH(op)                                                           \
  template <class A, class B, class R = f16_promote_t<A, B>>                       \
  KK_FN R operator op(A a, B b) {                                                  \
    using C = f16_compute_t<R>;                                                    \
    return R(static_cast<C>(static_cast<R>(a)) op static_cast<C>(static_cast<R>(b))); \
  }
KK_F16_ARITH(+)
KK_F16_ARITH(-)
KK_F16_ARITH(*)
KK_F16_ARITH(/)
#undef KK_F16_ARITH

// A built-in left operand: `float s; s += h;` is s = s + h, converted back to s's type, as in
// Metal (C++'s built-in candidates can't take a half: it converts to float and double alike).
#define KK_F16_COMPOUND(op)                                                        \
  template <class A, class F, enable_if_t<is_builtin_arith<A>, int> = 0>           \
  KK_FN A& operator op##=(A& a, float16<F> b) { return a = static_cast<A>(a op b); }
KK_F16_COMPOUND(+)
KK_F16_COMPOUND(-)
KK_F16_COMPOUND(*)
KK_F16_COMPOUND(/)
#undef KK_F16_COMPOUND

#define KK_F16_COMPARE(op)                                                          \
  template <class A, class B, class R = f16_promote_t<A, B>>                        \
  KK_FN bool operator op(A a, B b) {                                                \
    using C = f16_compute_t<R>;                                                     \
    return static_cast<C>(static_cast<R>(a)) op static_cast<C>(static_cast<R>(b));  \
  }
KK_F16_COMPARE(==)
KK_F16_COMPARE(!=)
KK_F16_COMPARE(<)
KK_F16_COMPARE(>)
KK_F16_COMPARE(<=)
KK_F16_COMPARE(>=)
#undef KK_F16_COMPARE
}  // namespace kk_detail

}  // namespace metal
