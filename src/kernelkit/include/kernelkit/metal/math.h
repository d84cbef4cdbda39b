// kernelkit/metal/math.h: MSL's floating-point math (metal::, metal::precise::,
// metal::fast::), common functions (min, max, clamp, mix...), relational
// functions (isnan, select...) and geometric functions (dot, normalize...).
//
// Every function takes float, double, half, bfloat and vectors of them
// (element-wise); half and bfloat are computed in float and rounded back.
// Calls mixing scalar types are computed in the common type (pow(x, 2),
// max(x, 0), clamp(h, 0.0f, 1.0f)); integer arguments of float-only functions
// become float (floor(3)); a vector mixed with scalars broadcasts them
// (clamp(v, 0.0f, 1.0f), mix(a, b, 0.5f)).
//
// Modes: metal::precise:: is IEEE-accurate C math; metal::fast:: uses the
// target's approximations (kk::fast, e.g. __expf on CUDA) where it has them.
// Plain metal::exp is the fast one under KK_MATH_FAST, the precise one otherwise.
// Functions that are exact either way (floor, fma, max...) exist once, in
// metal::, and are also visible as metal::precise::floor and metal::fast::floor.
#pragma once

// ---------------------------------------------------------------------------
// kk::fast: the target's fast approximations. A target without its own gets
// the precise C functions (on the CPU, fast and precise are the same).
#ifndef KK_HAS_FAST_MATH
namespace kk {
namespace fast {
KK_FN float exp(float x) { return ::expf(x); }
KK_FN float exp2(float x) { return ::exp2f(x); }
KK_FN float exp10(float x) { return ::powf(10.0f, x); }
KK_FN float log(float x) { return ::logf(x); }
KK_FN float log2(float x) { return ::log2f(x); }
KK_FN float log10(float x) { return ::log10f(x); }
KK_FN float sin(float x) { return ::sinf(x); }
KK_FN float cos(float x) { return ::cosf(x); }
KK_FN float tan(float x) { return ::tanf(x); }
KK_FN float pow(float x, float y) { return ::powf(x, y); }
KK_FN float rsqrt(float x) { return 1.0f / ::sqrtf(x); }
KK_FN float divide(float x, float y) { return x / y; }
}  // namespace fast
}  // namespace kk
#endif

namespace metal {
namespace kk_detail {

// ---------------------------------------------------------------------------
// Argument conversion for calls that match no overload exactly.

template <class A, class B> using arith_t = decltype(declval<A>() + declval<B>());
template <class... A> struct common_scalar;
template <class A> struct common_scalar<A> { using type = A; };
template <class A, class B, class... C> struct common_scalar<A, B, C...> : common_scalar<arith_t<A, B>, C...> {};
template <class A, class... B> constexpr bool all_same = (is_same_v<A, B> && ...);
template <class A, class... B> struct first { using type = A; };

// The first vector type among A..., or void.
template <class... A> struct first_vec { using type = void; };
template <class A, class... B> struct first_vec<A, B...> {
  using type = conditional_t<is_vec<A>::value, A, typename first_vec<B...>::type>;
};

// Mode: IntOk = the function takes integers as they are (min, max, clamp);
// otherwise integers are converted to float (exp, floor, pow...).
template <bool IntOk, class Enable, class... A> struct forward_impl {};
// Scalars only, not all of one type the function takes as is: the common type.
template <bool IntOk, class... A>
struct forward_impl<IntOk, enable_if_t<(is_scalar<A> && ...)>, A...> {
  using C = typename common_scalar<A...>::type;
  using R = conditional_t<!IntOk && is_integral<C>::value, float, C>;
  static constexpr bool exact = all_same<A...> && (IntOk || is_floating_point_v<typename first<A...>::type>);
};
// Vectors of one type mixed with scalars: broadcast to the vector type.
template <class V, class... A> constexpr bool vec_compatible = ((is_same_v<A, V> || is_scalar<A>) && ...);
template <bool IntOk, class... A>
struct forward_impl<IntOk,
                    enable_if_t<!(is_scalar<A> && ...) && vec_compatible<typename first_vec<A...>::type, A...>>, A...> {
  using R = typename first_vec<A...>::type;
  static constexpr bool exact = all_same<A...>;
};
template <bool IntOk, class... A>
using forward_t = enable_if_t<!forward_impl<IntOk, void, A...>::exact, typename forward_impl<IntOk, void, A...>::R>;

// Arithmetic type of a scalar's computation: float for half/bfloat.
template <class T> using compute_t = conditional_t<is_float16_v<T>, float, T>;

// Implementations the C library lacks, for float and double.
template <class T> KK_FN T pi() { return T(3.14159265358979323846); }
KK_FN float fract(float x) { return ::fminf(x - ::floorf(x), 0x1.fffffep-1f); }
KK_FN double fract(double x) { return ::fmin(x - ::floor(x), 0x1.fffffffffffffp-1); }
// sin(pi x) and cos(pi x) with exact zeros and ones: x = n + r, |r| <= 1/2, n integer.
KK_FN float sinpi(float x) {
  const float n = ::rintf(x), r = x - n;
  const float s = ::sinf(pi<float>() * r);
  return ::fmodf(n, 2.0f) != 0.0f ? -s : s;
}
KK_FN double sinpi(double x) {
  const double n = ::rint(x), r = x - n;
  const double s = ::sin(pi<double>() * r);
  return ::fmod(n, 2.0) != 0.0 ? -s : s;
}
KK_FN float cospi(float x) {
  const float n = ::rintf(x), r = x - n;
  const float c = ::sinf(pi<float>() * (0.5f - ::fabsf(r)));
  return ::fmodf(n, 2.0f) != 0.0f ? -c : c;
}
KK_FN double cospi(double x) {
  const double n = ::rint(x), r = x - n;
  const double c = ::sin(pi<double>() * (0.5 - ::fabs(r)));
  return ::fmod(n, 2.0) != 0.0 ? -c : c;
}
KK_FN float tanpi(float x) { return sinpi(x) / cospi(x); }
KK_FN double tanpi(double x) { return sinpi(x) / cospi(x); }
#if defined(KK_TARGET_CUDA)
// CUDA's: rsqrtf within 2 ulp (Metal's bound for precise::rsqrt), rsqrt within 1; a square root
// and a division cost several times more (float64 most)
KK_FN float rsqrt(float x) { return ::rsqrtf(x); }
KK_FN double rsqrt(double x) { return ::rsqrt(x); }
#else
KK_FN float rsqrt(float x) { return 1.0f / ::sqrtf(x); }
KK_FN double rsqrt(double x) { return 1.0 / ::sqrt(x); }
#endif
KK_FN float exp10(float x) { return ::powf(10.0f, x); }
KK_FN double exp10(double x) { return ::pow(10.0, x); }
KK_FN float divide(float x, float y) { return x / y; }
KK_FN double divide(double x, double y) { return x / y; }
}  // namespace kk_detail

// ---------------------------------------------------------------------------
// Overload sets. FFN/DFN: the float and double implementations.

// Calls whose arguments need converting first (see forward_t). The call is qualified with the
// enclosing namespace (kk_this_ns: metal, precise or fast): unqualified, argument-dependent
// lookup would also find metal::pow (the other mode's) for a vector, an ambiguity.
#define KK_MATH_FORWARD(name, int_ok)                                                     \
  template <class... A, class R = kk_detail::forward_t<int_ok, A...>>                     \
  KK_FN auto name(const A&... a)->decltype(kk_this_ns::name(R(a)...)) {                   \
    return kk_this_ns::name(R(a)...);                                                     \
  }
namespace kk_this_ns = ::metal;

#define KK_MATH1(name, FFN, DFN)                                                          \
  KK_FN float name(float x) { return FFN(x); }                                            \
  KK_FN double name(double x) { return DFN(x); }                                          \
  template <class F>                                                                      \
  KK_FN kk_detail::float16<F> name(kk_detail::float16<F> x) {                             \
    return kk_detail::float16<F>(FFN(static_cast<float>(x)));                             \
  }                                                                                       \
  template <class T, int N>                                                               \
  KK_FN vec<T, N> name(const vec<T, N>& x) {                                              \
    return kk_detail::vmap<T, N>([](const T& e) { return T(name(e)); }, x);               \
  }                                                                                       \
  KK_MATH_FORWARD(name, false)

#define KK_MATH2(name, FFN, DFN)                                                          \
  KK_FN float name(float x, float y) { return FFN(x, y); }                                \
  KK_FN double name(double x, double y) { return DFN(x, y); }                             \
  template <class F>                                                                      \
  KK_FN kk_detail::float16<F> name(kk_detail::float16<F> x, kk_detail::float16<F> y) {    \
    return kk_detail::float16<F>(FFN(static_cast<float>(x), static_cast<float>(y)));      \
  }                                                                                       \
  template <class T, int N>                                                               \
  KK_FN vec<T, N> name(const vec<T, N>& x, const vec<T, N>& y) {                          \
    return kk_detail::vmap<T, N>([](const T& a, const T& b) { return T(name(a, b)); }, x, y); \
  }                                                                                       \
  KK_MATH_FORWARD(name, false)

// Functions that are the same in both modes.
KK_MATH1(fabs, ::fabsf, ::fabs)
KK_MATH1(floor, ::floorf, ::floor)
KK_MATH1(ceil, ::ceilf, ::ceil)
KK_MATH1(trunc, ::truncf, ::trunc)
KK_MATH1(round, ::roundf, ::round)  // halfway cases away from zero
KK_MATH1(rint, ::rintf, ::rint)     // halfway cases to even
KK_MATH1(fract, kk_detail::fract, kk_detail::fract)
KK_MATH1(logb, ::logbf, ::logb)
KK_MATH2(fmod, ::fmodf, ::fmod)
KK_MATH2(copysign, ::copysignf, ::copysign)
KK_MATH2(fdim, ::fdimf, ::fdim)
KK_MATH2(fmax, ::fmaxf, ::fmax)
KK_MATH2(fmin, ::fminf, ::fmin)

KK_FN float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
KK_FN double fma(double a, double b, double c) { return ::fma(a, b, c); }
template <class F>
KK_FN kk_detail::float16<F> fma(kk_detail::float16<F> a, kk_detail::float16<F> b, kk_detail::float16<F> c) {
  return kk_detail::float16<F>(::fmaf(float(a), float(b), float(c)));
}
template <class T, int N>
KK_FN vec<T, N> fma(const vec<T, N>& a, const vec<T, N>& b, const vec<T, N>& c) {
  return kk_detail::vmap<T, N>([](const T& x, const T& y, const T& z) { return T(fma(x, y, z)); }, a, b, c);
}
KK_MATH_FORWARD(fma, false)

// nextafter: one step in the argument's own type (for half and bfloat, on its bits, not in float).
KK_FN float nextafter(float x, float y) { return ::nextafterf(x, y); }
KK_FN double nextafter(double x, double y) { return ::nextafter(x, y); }
template <class F>
KK_FN kk_detail::float16<F> nextafter(kk_detail::float16<F> x, kk_detail::float16<F> y) {
  // The bits as an integer in the values' order (+0 and -0 both 0), stepped by one.
  const auto order = [](unsigned short b) { return b & 0x8000u ? -int(b & 0x7fffu) : int(b); };
  const unsigned short nan_bits = numeric_limits<kk_detail::float16<F>>::infinity().bits;
  if ((x.bits & 0x7fffu) > nan_bits) return x;  // NaN
  if ((y.bits & 0x7fffu) > nan_bits) return y;
  const int kx = order(x.bits), ky = order(y.bits);
  if (kx == ky) return y;  // equal (zeros of either sign too): y
  const int k = kx < ky ? kx + 1 : kx - 1;
  // k == 0: stepping to zero from a subnormal keeps x's sign, as C's nextafter.
  return kk_detail::float16<F>::from_bits(
      static_cast<unsigned short>(k > 0 ? k : k < 0 ? 0x8000 | -k : x.bits & 0x8000u));
}
template <class T, int N>
KK_FN vec<T, N> nextafter(const vec<T, N>& x, const vec<T, N>& y) {
  return kk_detail::vmap<T, N>([](const T& a, const T& b) { return T(nextafter(a, b)); }, x, y);
}
KK_MATH_FORWARD(nextafter, false)

// Functions with an out-parameter or an int.
KK_FN float frexp(float x, int& e) { return ::frexpf(x, &e); }
KK_FN double frexp(double x, int& e) { return ::frexp(x, &e); }
template <class F>
KK_FN kk_detail::float16<F> frexp(kk_detail::float16<F> x, int& e) { return kk_detail::float16<F>(::frexpf(float(x), &e)); }
template <class T, int N>
KK_FN vec<T, N> frexp(const vec<T, N>& x, vec<int, N>& e) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = frexp(x[i], e[i]);
  return r;
}
KK_FN float ldexp(float x, int e) { return ::ldexpf(x, e); }
KK_FN double ldexp(double x, int e) { return ::ldexp(x, e); }
template <class F>
KK_FN kk_detail::float16<F> ldexp(kk_detail::float16<F> x, int e) { return kk_detail::float16<F>(::ldexpf(float(x), e)); }
template <class T, int N>
KK_FN vec<T, N> ldexp(const vec<T, N>& x, const vec<int, N>& e) {
  return kk_detail::vmap<T, N>([](const T& a, int b) { return T(ldexp(a, b)); }, x, e);
}
KK_FN float modf(float x, float& ip) { return ::modff(x, &ip); }
KK_FN double modf(double x, double& ip) { return ::modf(x, &ip); }
template <class F>
KK_FN kk_detail::float16<F> modf(kk_detail::float16<F> x, kk_detail::float16<F>& ip) {
  float i;
  const float r = ::modff(float(x), &i);
  ip = kk_detail::float16<F>(i);
  return kk_detail::float16<F>(r);
}
template <class T, int N>
KK_FN vec<T, N> modf(const vec<T, N>& x, vec<T, N>& ip) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = modf(x[i], ip[i]);
  return r;
}
KK_FN int ilogb(float x) { return ::ilogbf(x); }
KK_FN int ilogb(double x) { return ::ilogb(x); }
template <class F> KK_FN int ilogb(kk_detail::float16<F> x) { return ::ilogbf(float(x)); }
template <class T, int N> KK_FN vec<int, N> ilogb(const vec<T, N>& x) {
  return kk_detail::vmap<int, N>([](const T& e) { return ilogb(e); }, x);
}

// ---------------------------------------------------------------------------
// Common functions: any scalar (integers included for min, max, clamp, abs)
// and vectors.

template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T abs(T x) { return fabs(x); }  // integer abs: integer.h

template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T max(T a, T b) {
  if constexpr (is_floating_point_v<T>) return fmax(a, b);  // a NaN loses, as in Metal
  else return a < b ? b : a;
}
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T min(T a, T b) {
  if constexpr (is_floating_point_v<T>) return fmin(a, b);
  else return b < a ? b : a;
}
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T max3(T a, T b, T c) { return max(max(a, b), c); }
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T min3(T a, T b, T c) { return min(min(a, b), c); }
// With NaNs (floats), as MSL's fmedian3 asks: one NaN gives one of the two other values, two
// NaNs the third value, three NaNs NaN.
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN T median3(T a, T b, T c) { return max(min(a, b), min(max(a, b), c)); }
// MSL's names for max3, min3 and median3 of floating types.
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T fmax3(T a, T b, T c) { return max3(a, b, c); }
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T fmin3(T a, T b, T c) { return min3(a, b, c); }
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T fmedian3(T a, T b, T c) { return median3(a, b, c); }

template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T mix(T x, T y, T a) {
  using C = kk_detail::compute_t<T>;
  return T(C(x) + (C(y) - C(x)) * C(a));
}
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T step(T edge, T x) { return x < edge ? T(0) : T(1); }
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T smoothstep(T e0, T e1, T x) {
  using C = kk_detail::compute_t<T>;
  const C t = fmin(fmax((C(x) - C(e0)) / (C(e1) - C(e0)), C(0)), C(1));
  return T(t * t * (C(3) - C(2) * t));
}
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T saturate(T x) { return clamp(x, T(0), T(1)); }
template <class T, enable_if_t<is_floating_point_v<T>, int> = 0>
KK_FN T sign(T x) {  // +-1, +-0 for +-0, 0 for NaN
  return x > T(0) ? T(1) : x < T(0) ? T(-1) : x == T(0) ? x : T(0);
}

// Vectors: element-wise over the scalar versions above (and integer.h's abs).
#define KK_COMMON_VEC1(name)                                                              \
  template <class T, int N> KK_FN vec<T, N> name(const vec<T, N>& x) {                    \
    return kk_detail::vmap<T, N>([](const T& a) { return T(name(a)); }, x);               \
  }
#define KK_COMMON_VEC2(name)                                                              \
  template <class T, int N> KK_FN vec<T, N> name(const vec<T, N>& x, const vec<T, N>& y) { \
    return kk_detail::vmap<T, N>([](const T& a, const T& b) { return T(name(a, b)); }, x, y); \
  }
#define KK_COMMON_VEC3(name)                                                              \
  template <class T, int N>                                                               \
  KK_FN vec<T, N> name(const vec<T, N>& x, const vec<T, N>& y, const vec<T, N>& z) {      \
    return kk_detail::vmap<T, N>([](const T& a, const T& b, const T& c) { return T(name(a, b, c)); }, x, y, z); \
  }
KK_COMMON_VEC1(abs)
KK_COMMON_VEC1(saturate)
KK_COMMON_VEC1(sign)
KK_COMMON_VEC2(max)
KK_COMMON_VEC2(min)
KK_COMMON_VEC2(step)
KK_COMMON_VEC3(clamp)
KK_COMMON_VEC3(max3)
KK_COMMON_VEC3(min3)
KK_COMMON_VEC3(median3)
KK_COMMON_VEC3(fmax3)
KK_COMMON_VEC3(fmin3)
KK_COMMON_VEC3(fmedian3)
KK_COMMON_VEC3(mix)
KK_COMMON_VEC3(smoothstep)
KK_MATH_FORWARD(max, true)
KK_MATH_FORWARD(min, true)
KK_MATH_FORWARD(clamp, true)
KK_MATH_FORWARD(max3, true)
KK_MATH_FORWARD(min3, true)
KK_MATH_FORWARD(median3, true)
KK_MATH_FORWARD(fmax3, false)
KK_MATH_FORWARD(fmin3, false)
KK_MATH_FORWARD(fmedian3, false)
KK_MATH_FORWARD(mix, false)
KK_MATH_FORWARD(step, false)
KK_MATH_FORWARD(smoothstep, false)
KK_MATH_FORWARD(saturate, false)
KK_MATH_FORWARD(sign, false)
#undef KK_COMMON_VEC1
#undef KK_COMMON_VEC2
#undef KK_COMMON_VEC3

// ---------------------------------------------------------------------------
// Relational functions. On vectors they return bool vectors.

KK_FN bool isnan(float x) { return __builtin_isnan(x); }
KK_FN bool isnan(double x) { return __builtin_isnan(x); }
KK_FN bool isinf(float x) { return __builtin_isinf(x); }
KK_FN bool isinf(double x) { return __builtin_isinf(x); }
KK_FN bool isfinite(float x) { return __builtin_isfinite(x); }
KK_FN bool isfinite(double x) { return __builtin_isfinite(x); }
KK_FN bool isnormal(float x) { return isfinite(x) && ::fabsf(x) >= numeric_limits<float>::min(); }
KK_FN bool isnormal(double x) { return isfinite(x) && ::fabs(x) >= numeric_limits<double>::min(); }
KK_FN bool signbit(float x) { return (as_type<uint>(x) >> 31) != 0; }
KK_FN bool signbit(double x) { return (as_type<ulong>(x) >> 63) != 0; }
template <class F> KK_FN bool isnan(kk_detail::float16<F> x) { return isnan(float(x)); }
template <class F> KK_FN bool isinf(kk_detail::float16<F> x) { return isinf(float(x)); }
template <class F> KK_FN bool isfinite(kk_detail::float16<F> x) { return isfinite(float(x)); }
template <class F> KK_FN bool isnormal(kk_detail::float16<F> x) {
  return isfinite(x) && !(fabs(x) < numeric_limits<kk_detail::float16<F>>::min());
}
template <class F> KK_FN bool signbit(kk_detail::float16<F> x) { return (x.bits & 0x8000u) != 0; }
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN bool isordered(T x, T y) { return !isnan(x) && !isnan(y); }
template <class T, enable_if_t<kk_detail::is_scalar<T>, int> = 0>
KK_FN bool isunordered(T x, T y) { return isnan(x) || isnan(y); }
// On vectors, element-wise: a bool vector.
template <class T, int N> KK_FN vec<bool, N> isordered(const vec<T, N>& x, const vec<T, N>& y) {
  return kk_detail::vmap<bool, N>([](const T& a, const T& b) { return isordered(a, b); }, x, y);
}
template <class T, int N> KK_FN vec<bool, N> isunordered(const vec<T, N>& x, const vec<T, N>& y) {
  return kk_detail::vmap<bool, N>([](const T& a, const T& b) { return isunordered(a, b); }, x, y);
}
#define KK_RELATIONAL_VEC(name)                                                           \
  template <class T, int N> KK_FN vec<bool, N> name(const vec<T, N>& x) {                 \
    return kk_detail::vmap<bool, N>([](const T& a) { return bool(name(a)); }, x);         \
  }
KK_RELATIONAL_VEC(isnan)
KK_RELATIONAL_VEC(isinf)
KK_RELATIONAL_VEC(isfinite)
KK_RELATIONAL_VEC(isnormal)
KK_RELATIONAL_VEC(signbit)
#undef KK_RELATIONAL_VEC

// select(a, b, c): c ? b : a, element-wise for vectors.
template <class T> KK_FN T select(const T& a, const T& b, bool c) { return c ? b : a; }
template <class T, int N>
KK_FN vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
  return kk_detail::vmap<T, N>([](const T& x, const T& y, bool p) { return p ? y : x; }, a, b, c);
}

// ---------------------------------------------------------------------------
// Modal functions: one precise and one fast version each.

namespace precise {
namespace kk_this_ns = ::metal::precise;
KK_MATH1(exp, ::expf, ::exp)
KK_MATH1(exp2, ::exp2f, ::exp2)
KK_MATH1(exp10, kk_detail::exp10, kk_detail::exp10)
KK_MATH1(log, ::logf, ::log)
KK_MATH1(log2, ::log2f, ::log2)
KK_MATH1(log10, ::log10f, ::log10)
KK_MATH1(sqrt, ::sqrtf, ::sqrt)
KK_MATH1(rsqrt, kk_detail::rsqrt, kk_detail::rsqrt)
KK_MATH1(cbrt, ::cbrtf, ::cbrt)
KK_MATH1(sin, ::sinf, ::sin)
KK_MATH1(cos, ::cosf, ::cos)
KK_MATH1(tan, ::tanf, ::tan)
KK_MATH1(sinpi, kk_detail::sinpi, kk_detail::sinpi)
KK_MATH1(cospi, kk_detail::cospi, kk_detail::cospi)
KK_MATH1(tanpi, kk_detail::tanpi, kk_detail::tanpi)
KK_MATH1(asin, ::asinf, ::asin)
KK_MATH1(acos, ::acosf, ::acos)
KK_MATH1(atan, ::atanf, ::atan)
KK_MATH1(sinh, ::sinhf, ::sinh)
KK_MATH1(cosh, ::coshf, ::cosh)
KK_MATH1(tanh, ::tanhf, ::tanh)
KK_MATH1(asinh, ::asinhf, ::asinh)
KK_MATH1(acosh, ::acoshf, ::acosh)
KK_MATH1(atanh, ::atanhf, ::atanh)
KK_MATH2(atan2, ::atan2f, ::atan2)
KK_MATH2(pow, ::powf, ::pow)
KK_MATH2(powr, ::powf, ::pow)  // Metal: x >= 0 (NaN otherwise); pow gives that for x > 0
KK_MATH2(divide, kk_detail::divide, kk_detail::divide)
}  // namespace precise

namespace fast {
namespace kk_this_ns = ::metal::fast;
KK_MATH1(exp, kk::fast::exp, ::exp)
KK_MATH1(exp2, kk::fast::exp2, ::exp2)
KK_MATH1(exp10, kk::fast::exp10, kk_detail::exp10)
KK_MATH1(log, kk::fast::log, ::log)
KK_MATH1(log2, kk::fast::log2, ::log2)
KK_MATH1(log10, kk::fast::log10, ::log10)
KK_MATH1(rsqrt, kk::fast::rsqrt, kk_detail::rsqrt)
KK_MATH1(sin, kk::fast::sin, ::sin)
KK_MATH1(cos, kk::fast::cos, ::cos)
KK_MATH1(tan, kk::fast::tan, ::tan)
KK_MATH2(pow, kk::fast::pow, ::pow)
KK_MATH2(powr, kk::fast::pow, ::pow)
KK_MATH2(divide, kk::fast::divide, kk_detail::divide)
using precise::sqrt;
using precise::cbrt;
using precise::sinpi;
using precise::cospi;
using precise::tanpi;
using precise::asin;
using precise::acos;
using precise::atan;
using precise::atan2;
using precise::sinh;
using precise::cosh;
using precise::tanh;
using precise::asinh;
using precise::acosh;
using precise::atanh;
}  // namespace fast

// sincos(x, cosval): returns sin(x), stores cos(x). (Qualified calls, as in KK_MATH_FORWARD.)
#define KK_SINCOS(ns)                                                                     \
  namespace ns {                                                                          \
  template <class T> KK_FN T sincos(const T& x, T& c) {                                   \
    c = ns::cos(x);                                                                       \
    return ns::sin(x);                                                                    \
  }                                                                                       \
  }
KK_SINCOS(precise)
KK_SINCOS(fast)
#undef KK_SINCOS

#undef KK_MATH1
#undef KK_MATH2
#undef KK_MATH_FORWARD

// The names every mode shares, visible as metal::precise::floor and metal::fast::floor too.
#define KK_MATH_SHARED(X)                                                                 \
  X(fabs) X(abs) X(floor) X(ceil) X(trunc) X(round) X(rint) X(fract) X(logb) X(fmod)      \
  X(copysign) X(fdim) X(fmax) X(fmin) X(nextafter) X(fma) X(frexp) X(ldexp) X(modf)       \
  X(ilogb) X(max) X(min) X(clamp) X(max3) X(min3) X(median3) X(fmax3) X(fmin3)          \
  X(fmedian3) X(mix) X(step) X(smoothstep) X(saturate) X(sign) X(isnan) X(isinf)          \
  X(isfinite) X(isnormal) X(signbit) X(isordered) X(isunordered) X(select)
#define KK_USING_SHARED(name) using metal::name;
namespace precise { KK_MATH_SHARED(KK_USING_SHARED) }
namespace fast { KK_MATH_SHARED(KK_USING_SHARED) }
#undef KK_USING_SHARED
#undef KK_MATH_SHARED

// Plain metal::name follows the math mode.
#if defined(KK_MATH_FAST)
namespace kk_math_mode = fast;
#else
namespace kk_math_mode = precise;
#endif
using kk_math_mode::exp;
using kk_math_mode::exp2;
using kk_math_mode::exp10;
using kk_math_mode::log;
using kk_math_mode::log2;
using kk_math_mode::log10;
using kk_math_mode::sqrt;
using kk_math_mode::rsqrt;
using kk_math_mode::cbrt;
using kk_math_mode::sin;
using kk_math_mode::cos;
using kk_math_mode::tan;
using kk_math_mode::sincos;
using kk_math_mode::sinpi;
using kk_math_mode::cospi;
using kk_math_mode::tanpi;
using kk_math_mode::asin;
using kk_math_mode::acos;
using kk_math_mode::atan;
using kk_math_mode::atan2;
using kk_math_mode::sinh;
using kk_math_mode::cosh;
using kk_math_mode::tanh;
using kk_math_mode::asinh;
using kk_math_mode::acosh;
using kk_math_mode::atanh;
using kk_math_mode::pow;
using kk_math_mode::powr;
using kk_math_mode::divide;

// ---------------------------------------------------------------------------
// Geometric functions (vectors of float, double, half, bfloat).

template <class T, int N>
KK_FN T dot(const vec<T, N>& a, const vec<T, N>& b) {
  using C = kk_detail::compute_t<T>;
  C r = C(a.x) * C(b.x) + C(a.y) * C(b.y);
  if constexpr (N > 2) r += C(a.z) * C(b.z);
  if constexpr (N > 3) r += C(a.w) * C(b.w);
  return T(r);
}
template <class T, int N> KK_FN T length_squared(const vec<T, N>& v) { return dot(v, v); }
template <class T, int N> KK_FN T distance_squared(const vec<T, N>& a, const vec<T, N>& b) { return length_squared(a - b); }
// length, distance, normalize: precise:: and fast:: variants, each on its namespace's sqrt
// and rsqrt; plain metal:: ones follow the math mode, as exp does. (Calls are qualified:
// argument-dependent lookup would also find metal::length, the other mode's.)
#define KK_GEOMETRIC(ns)                                                                  \
  namespace ns {                                                                          \
  template <class T, int N> KK_FN T length(const vec<T, N>& v) {                          \
    return ns::sqrt(dot(v, v));                                                           \
  }                                                                                       \
  template <class T, int N> KK_FN T distance(const vec<T, N>& a, const vec<T, N>& b) {    \
    return ns::length(a - b);                                                             \
  }                                                                                       \
  }
KK_GEOMETRIC(precise)
KK_GEOMETRIC(fast)
#undef KK_GEOMETRIC
namespace precise {
template <class T, int N> KK_FN vec<T, N> normalize(const vec<T, N>& v) { return v / precise::length(v); }
}  // namespace precise
namespace fast {
template <class T, int N> KK_FN vec<T, N> normalize(const vec<T, N>& v) { return v * fast::rsqrt(dot(v, v)); }
}  // namespace fast
using kk_math_mode::length;
using kk_math_mode::distance;
using kk_math_mode::normalize;
template <class T>
KK_FN vec<T, 3> cross(const vec<T, 3>& a, const vec<T, 3>& b) {
  return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
template <class T, int N> KK_FN vec<T, N> reflect(const vec<T, N>& i, const vec<T, N>& n) {
  return i - T(2) * dot(n, i) * n;
}
template <class T, int N> KK_FN vec<T, N> faceforward(const vec<T, N>& n, const vec<T, N>& i, const vec<T, N>& nref) {
  return dot(nref, i) < T(0) ? n : -n;
}
template <class T, int N, class E> KK_FN vec<T, N> refract(const vec<T, N>& i, const vec<T, N>& n, E eta) {
  const T d = dot(n, i);
  const T k = T(1) - T(eta) * T(eta) * (T(1) - d * d);
  if (k < T(0)) return vec<T, N>(T(0));
  return T(eta) * i - (T(eta) * d + precise::sqrt(k)) * n;
}

}  // namespace metal
