// kernelkit/complex.h: MLX's complex numbers for kernel bodies (the names of
// mlx/backend/metal/kernels/complex.h, which MLX prepends to every custom kernel):
// complex_t<T> with members `real` and `imag`, complex64_t (float lanes), complex32_t
// (half lanes), is_complex_v, is_lane_convertible_v, and MLX's set of operators.
//
// As in MLX: a default-constructed complex is 0; a real scalar converts to (x, 0) and a
// complex converts to a real scalar (its real part) implicitly; float2 <-> complex64_t;
// comparisons order by the real part, then the imaginary part; `%` is a floored remainder
// per lane. MLX defines +=, but no -=, *= or /=, and no complex-by-scalar * (a scalar
// operand of + - / is taken as (x, 0)). Metal's address-space variants of each constructor
// and operator are one function here (address spaces vanish).
//
// At global scope, as MLX's (utils.h explains why); the operators are found by
// argument-dependent lookup from the user's code in namespace metal.
#pragma once

template <typename T>
struct complex_t;

template <typename T>
constexpr bool is_complex_v = false;
template <typename T>
constexpr bool is_complex_v<complex_t<T>> = true;

// The lanes of a complex convert from From to To (explicit bfloat casts count, as in Metal).
template <typename From, typename To>
constexpr bool is_lane_convertible_v =
    metal::is_convertible_v<From, To> ||
    (metal::is_same_v<To, metal::bfloat16_t> && metal::is_convertible_v<From, float>) ||
    (metal::is_same_v<From, metal::bfloat16_t> && metal::is_convertible_v<float, To>);

namespace metal {
namespace kk_detail {
template <typename U, typename T>
constexpr bool real_to_lane = !is_complex_v<U> && is_lane_convertible_v<U, T>;
}  // namespace kk_detail
}  // namespace metal

template <typename T>
struct complex_t {
  using value_type = T;

  T real;
  T imag;

  constexpr KK_FN complex_t(T real_, T imag_) : real(real_), imag(imag_) {}
  constexpr KK_FN complex_t() : real(0), imag(0) {}

  // A real scalar is (x, 0).
  template <typename U, typename = metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>>>
  constexpr KK_FN complex_t(U x) : real(static_cast<T>(x)), imag(static_cast<T>(0)) {}

  // Between lane types: complex32_t <-> complex64_t.
  template <typename U,
            typename = metal::enable_if_t<!metal::is_same_v<U, T> && is_lane_convertible_v<U, T>>>
  constexpr KK_FN complex_t(complex_t<U> x) : real(static_cast<T>(x.real)), imag(static_cast<T>(x.imag)) {}

  // Two-lane vectors (x = real, y = imag), as MLX's FFT kernels store complex values.
  constexpr KK_FN complex_t(metal::vec<T, 2> v) : real(v.x), imag(v.y) {}
  constexpr KK_FN operator metal::vec<T, 2>() const { return metal::vec<T, 2>(real, imag); }

  // To a real scalar: the real part.
  template <typename U, typename = metal::enable_if_t<!is_complex_v<U> && is_lane_convertible_v<T, U>>>
  constexpr KK_FN operator U() const {
    return static_cast<U>(real);
  }
};

using complex32_t = complex_t<metal::half>;
using complex64_t = complex_t<float>;

static_assert(sizeof(complex32_t) == 2 * sizeof(metal::half), "complex32_t is two halves");
static_assert(sizeof(complex64_t) == 2 * sizeof(float), "complex64_t is two floats");
static_assert(sizeof(complex_t<metal::bfloat16_t>) == 2 * sizeof(metal::bfloat16_t), "two bfloats");

// ---------------------------------------------------------------------------
// Operators.

template <typename T>
constexpr KK_FN complex_t<T> operator-(complex_t<T> x) {
  return {-x.real, -x.imag};
}

// Ordered by the real part, then the imaginary part.
template <typename T>
constexpr KK_FN bool operator>(complex_t<T> a, complex_t<T> b) {
  return a.real > b.real || (a.real == b.real && a.imag > b.imag);
}
template <typename T>
constexpr KK_FN bool operator>=(complex_t<T> a, complex_t<T> b) {
  return a.real > b.real || (a.real == b.real && a.imag >= b.imag);
}
template <typename T>
constexpr KK_FN bool operator<(complex_t<T> a, complex_t<T> b) {
  return b > a;
}
template <typename T>
constexpr KK_FN bool operator<=(complex_t<T> a, complex_t<T> b) {
  return b >= a;
}
template <typename T>
constexpr KK_FN bool operator==(complex_t<T> a, complex_t<T> b) {
  return a.real == b.real && a.imag == b.imag;
}

template <typename T>
constexpr KK_FN complex_t<T> operator+(complex_t<T> a, complex_t<T> b) {
  return {a.real + b.real, a.imag + b.imag};
}
template <typename T>
constexpr KK_FN complex_t<T>& operator+=(complex_t<T>& a, complex_t<T> b) {
  a.real += b.real;
  a.imag += b.imag;
  return a;
}
template <typename T, typename U, metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>, bool> = true>
constexpr KK_FN complex_t<T> operator+(U a, complex_t<T> b) {
  return {static_cast<T>(a) + b.real, b.imag};
}
template <typename T, typename U, metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>, bool> = true>
constexpr KK_FN complex_t<T> operator+(complex_t<T> a, U b) {
  return {a.real + static_cast<T>(b), a.imag};
}

template <typename T>
constexpr KK_FN complex_t<T> operator-(complex_t<T> a, complex_t<T> b) {
  return {a.real - b.real, a.imag - b.imag};
}
template <typename T, typename U, metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>, bool> = true>
constexpr KK_FN complex_t<T> operator-(U a, complex_t<T> b) {
  return {static_cast<T>(a) - b.real, -b.imag};
}
template <typename T, typename U, metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>, bool> = true>
constexpr KK_FN complex_t<T> operator-(complex_t<T> a, U b) {
  return {a.real - static_cast<T>(b), a.imag};
}

template <typename T>
constexpr KK_FN complex_t<T> operator*(complex_t<T> a, complex_t<T> b) {
  return {a.real * b.real - a.imag * b.imag, a.real * b.imag + a.imag * b.real};
}

// Textbook division, as MLX's (no scaling against overflow).
template <typename T>
constexpr KK_FN complex_t<T> operator/(complex_t<T> a, complex_t<T> b) {
  const auto denom = b.real * b.real + b.imag * b.imag;
  const auto x = a.real * b.real + a.imag * b.imag;
  const auto y = a.imag * b.real - a.real * b.imag;
  return {T(x / denom), T(y / denom)};
}
template <typename T, typename U, metal::enable_if_t<metal::kk_detail::real_to_lane<U, T>, bool> = true>
constexpr KK_FN complex_t<T> operator/(U a, complex_t<T> b) {
  const T s = static_cast<T>(a);
  const auto denom = b.real * b.real + b.imag * b.imag;
  return {T(s * b.real / denom), T(-s * b.imag / denom)};
}

// Per lane, the remainder of a floored division (its sign follows the divisor's).
template <typename T>
constexpr KK_FN complex_t<T> operator%(complex_t<T> a, complex_t<T> b) {
  T r = T(a.real - b.real * static_cast<metal::int64_t>(a.real / b.real));
  T i = T(a.imag - b.imag * static_cast<metal::int64_t>(a.imag / b.imag));
  if (r != 0 && ((r < 0) != (b.real < 0))) r = T(r + b.real);
  if (i != 0 && ((i < 0) != (b.imag < 0))) i = T(i + b.imag);
  return {r, i};
}

static_assert((complex64_t{1.0f, 2.0f} * complex64_t{3.0f, 4.0f}).real == -5.0f, "complex64_t product");
