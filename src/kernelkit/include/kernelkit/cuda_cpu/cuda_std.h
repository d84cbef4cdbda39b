// kernelkit/cuda_cpu/cuda_std.h: cuda::std (libcu++) on the CPU backend.
// Part of kernelkit/cuda_cpu.h, which includes it; not to be included alone.
#pragma once

// ===========================================================================
// cuda::std (libcu++): the C++ standard library, with numeric_limits of the
// 16-bit floats.

namespace cuda {
namespace std {
using namespace ::std;
template <class T>
struct numeric_limits : ::std::numeric_limits<T> {};
namespace kk_detail {
template <class H, unsigned short Min, unsigned short Max, unsigned short Lowest, unsigned short Eps,
          unsigned short Denorm, int Digits>
struct f16_limits {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true;
  static constexpr bool is_iec559 = true, is_bounded = true, is_modulo = false;
  static constexpr int digits = Digits, radix = 2;
  static constexpr H min() noexcept { return H::from_bits(Min); }
  static constexpr H max() noexcept { return H::from_bits(Max); }
  static constexpr H lowest() noexcept { return H::from_bits(Lowest); }
  static constexpr H epsilon() noexcept { return H::from_bits(Eps); }
  static constexpr H round_error() noexcept { return H(0.5f); }
  static constexpr H denorm_min() noexcept { return H::from_bits(Denorm); }
};
}  // namespace kk_detail
template <>
struct numeric_limits<__half> : kk_detail::f16_limits<__half, 0x0400, 0x7bff, 0xfbff, 0x1400, 0x0001, 11> {
  static constexpr int digits10 = 3, max_digits10 = 5, min_exponent = -13, max_exponent = 16;
  static constexpr __half infinity() noexcept { return __half::from_bits(0x7c00); }
  static constexpr __half quiet_NaN() noexcept { return __half::from_bits(0x7e00); }
  static constexpr __half signaling_NaN() noexcept { return __half::from_bits(0x7d00); }
};
template <>
struct numeric_limits<__nv_bfloat16>
    : kk_detail::f16_limits<__nv_bfloat16, 0x0080, 0x7f7f, 0xff7f, 0x3c00, 0x0001, 8> {
  static constexpr int digits10 = 2, max_digits10 = 4, min_exponent = -125, max_exponent = 128;
  static constexpr __nv_bfloat16 infinity() noexcept { return __nv_bfloat16::from_bits(0x7f80); }
  static constexpr __nv_bfloat16 quiet_NaN() noexcept { return __nv_bfloat16::from_bits(0x7fc0); }
  static constexpr __nv_bfloat16 signaling_NaN() noexcept { return __nv_bfloat16::from_bits(0x7fa0); }
};
}  // namespace std
}  // namespace cuda
