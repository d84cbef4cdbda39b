// kernelkit/metal/half.h: MSL's 16-bit floats `half` and `bfloat`.
//
// Both are class types holding the bit pattern (2 bytes, trivially copyable,
// trivially default constructible, so they work in buffers and threadgroup
// arrays). Arithmetic is done in float and rounded back to nearest even, with
// Metal's promotion rules:
//   half op half -> half     half op integer -> half     half op bfloat -> float
//   half op float -> float   half op double -> double    (bfloat likewise)
// Conversions: implicit from any arithmetic type; implicit *to float and double
// only*, explicit to integers and bool. Allowing half -> int implicitly would
// make `cond ? h : 0` ambiguous (int -> half works too); the conversion
// operator is a constrained template so that C++ deduces the target type and
// rejects everything but float/double.
#pragma once

namespace metal {
namespace kk_detail {

struct half_format {
  static KK_FN float to_float(unsigned short b) { return kk::half_to_float(b); }
  static KK_FN unsigned short from_float(float f) { return kk::float_to_half(f); }
};
struct bfloat_format {
  static KK_FN float to_float(unsigned short b) { return kk::bfloat_to_float(b); }
  static KK_FN unsigned short from_float(float f) { return kk::float_to_bfloat(f); }
};
struct bits_tag {};

template <class Format>
struct alignas(2) float16 {
  unsigned short bits;  // the raw IEEE binary16 / bfloat16 pattern

  float16() = default;
  template <class T, enable_if_t<is_builtin_arith<T>, int> = 0>
  KK_FN float16(T v) : bits(Format::from_float(static_cast<float>(v))) {}
  template <class Other, enable_if_t<!is_same_v<Other, Format>, int> = 0>
  KK_FN float16(float16<Other> v) : bits(Format::from_float(static_cast<float>(v))) {}
  constexpr KK_FN float16(bits_tag, unsigned short b) : bits(b) {}

  // Build from a bit pattern; constexpr, so limits and constants can use it.
  static constexpr KK_FN float16 from_bits(unsigned short b) { return float16(bits_tag{}, b); }

  template <class T, enable_if_t<is_same_v<T, float> || is_same_v<T, double>, int> = 0>
  KK_FN operator T() const { return static_cast<T>(Format::to_float(bits)); }
  template <class T, enable_if_t<is_integral<T>::value, int> = 0>
  KK_FN explicit operator T() const { return static_cast<T>(Format::to_float(bits)); }

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
