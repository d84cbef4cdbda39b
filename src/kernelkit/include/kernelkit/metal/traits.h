// kernelkit/metal/traits.h: MSL's scalar type names and the few type traits
// Metal's standard library offers (metal::is_same, enable_if_t...). Written
// without any standard header: NVRTC has none.
#pragma once

namespace metal {

// ---------------------------------------------------------------------------
// Scalar type names. Fixed-width types match <cstdint> on LP64 hosts (int64_t
// is `long`), so the same names mean the same types on every target.

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
#if defined(__INT64_TYPE__)
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
#else
typedef long int64_t;
typedef unsigned long uint64_t;
#endif
static_assert(sizeof(int64_t) == 8, "kernelkit assumes an LP64 target");
typedef decltype(sizeof(0)) size_t;
typedef decltype(static_cast<char*>(nullptr) - static_cast<char*>(nullptr)) ptrdiff_t;
typedef float float32_t;
typedef double float64_t;

// ---------------------------------------------------------------------------
// Type traits (the subset MSL code uses; all compile-time only).

template <class T, T v>
struct integral_constant {
  static constexpr T value = v;
  using value_type = T;
  using type = integral_constant;
  constexpr KK_FN operator value_type() const { return value; }
};
template <bool B>
using bool_constant = integral_constant<bool, B>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;

template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { using type = T; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;

template <bool B, class T, class F> struct conditional { using type = T; };
template <class T, class F> struct conditional<false, T, F> { using type = F; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;

template <class T, class U> struct is_same : false_type {};
template <class T> struct is_same<T, T> : true_type {};
template <class T, class U> constexpr bool is_same_v = is_same<T, U>::value;

template <class T> struct remove_const { using type = T; };
template <class T> struct remove_const<const T> { using type = T; };
template <class T> struct remove_volatile { using type = T; };
template <class T> struct remove_volatile<volatile T> { using type = T; };
template <class T> struct remove_cv { using type = typename remove_const<typename remove_volatile<T>::type>::type; };
template <class T> using remove_cv_t = typename remove_cv<T>::type;
template <class T> struct remove_reference { using type = T; };
template <class T> struct remove_reference<T&> { using type = T; };
template <class T> struct remove_reference<T&&> { using type = T; };
template <class T> using remove_reference_t = typename remove_reference<T>::type;

namespace kk_detail {
template <class T> struct is_integral : false_type {};
template <> struct is_integral<bool> : true_type {};
template <> struct is_integral<char> : true_type {};
template <> struct is_integral<signed char> : true_type {};
template <> struct is_integral<unsigned char> : true_type {};
template <> struct is_integral<short> : true_type {};
template <> struct is_integral<unsigned short> : true_type {};
template <> struct is_integral<int> : true_type {};
template <> struct is_integral<unsigned int> : true_type {};
template <> struct is_integral<long> : true_type {};
template <> struct is_integral<unsigned long> : true_type {};
template <> struct is_integral<long long> : true_type {};
template <> struct is_integral<unsigned long long> : true_type {};
// half and bfloat specialise this in half.h.
template <class T> struct is_floating_point : false_type {};
template <> struct is_floating_point<float> : true_type {};
template <> struct is_floating_point<double> : true_type {};
}  // namespace kk_detail

template <class T> struct is_integral : kk_detail::is_integral<remove_cv_t<T>> {};
template <class T> constexpr bool is_integral_v = is_integral<T>::value;
template <class T> struct is_floating_point : kk_detail::is_floating_point<remove_cv_t<T>> {};
template <class T> constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic : bool_constant<is_integral_v<T> || is_floating_point_v<T>> {};
template <class T> constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> struct is_signed : bool_constant<is_floating_point_v<T> || (is_integral_v<T> && T(-1) < T(0))> {};
template <class T> constexpr bool is_signed_v = is_signed<T>::value;
template <class T> struct is_unsigned : bool_constant<is_integral_v<T> && !(T(-1) < T(0))> {};
template <class T> constexpr bool is_unsigned_v = is_unsigned<T>::value;

template <class T> struct make_unsigned { using type = T; };
template <> struct make_unsigned<char> { using type = unsigned char; };
template <> struct make_unsigned<signed char> { using type = unsigned char; };
template <> struct make_unsigned<short> { using type = unsigned short; };
template <> struct make_unsigned<int> { using type = unsigned int; };
template <> struct make_unsigned<long> { using type = unsigned long; };
template <> struct make_unsigned<long long> { using type = unsigned long long; };
template <class T> using make_unsigned_t = typename make_unsigned<T>::type;

template <class T> KK_FN T&& declval();  // unevaluated contexts only

// is_convertible<From, To>: From converts implicitly to To (copy-initialisation `To t = from;`).
namespace kk_detail {
template <class To> KK_FN void accept(To);  // unevaluated contexts only
template <class From, class To, class = void> struct is_convertible : false_type {};
template <class From, class To>
struct is_convertible<From, To, decltype(accept<To>(declval<From>()))> : true_type {};
}  // namespace kk_detail
template <class From, class To> struct is_convertible : kk_detail::is_convertible<From, To> {};
template <class From, class To> constexpr bool is_convertible_v = is_convertible<From, To>::value;

namespace kk_detail {
// Builtin (non-class) integer and floating types: what C++'s own operators handle.
template <class T>
constexpr bool is_builtin_arith = is_integral<T>::value || is_same_v<T, float> || is_same_v<T, double>;
}  // namespace kk_detail

}  // namespace metal
