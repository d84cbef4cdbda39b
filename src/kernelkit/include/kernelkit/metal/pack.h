// kernelkit/metal/pack.h: MSL's pack and unpack functions (<metal_pack>, MSL §6.15): vectors of
// normalized values to and from 8-, 10- and 16-bit integer fields of one word, the first
// component in the lowest bits. Conversions as MSL's normalized-integer rules (§7.7): unorm
// n = rint(clamp(f, 0, 1) * (2^N - 1)), snorm n = rint(clamp(f, -1, 1) * (2^(N-1) - 1)), NaN to
// 0; back, unorm f = n / (2^N - 1), snorm f = max(n / (2^(N-1) - 1), -1); sRGB forms put the
// colour channels (not alpha) through the sRGB transfer function. The half forms round the
// float ones.
#pragma once

namespace metal {

namespace kk_detail {
template <int Bits> KK_FN uint to_unorm(float f) {
  constexpr float top = float((1u << Bits) - 1);
  return f == f ? uint(::rintf(::fminf(::fmaxf(f, 0.0f), 1.0f) * top)) : 0u;
}
template <int Bits> KK_FN uint to_snorm(float f) {
  constexpr float top = float((1u << (Bits - 1)) - 1);
  const int n = f == f ? int(::rintf(::fminf(::fmaxf(f, -1.0f), 1.0f) * top)) : 0;
  return uint(n) & ((1u << Bits) - 1);
}
template <int Bits> KK_FN float from_unorm(uint n) { return float(n & ((1u << Bits) - 1)) / float((1u << Bits) - 1); }
template <int Bits> KK_FN float from_snorm(uint n) {
  const int v = int(n << (32 - Bits)) >> (32 - Bits);  // sign-extended field
  return ::fmaxf(float(v) / float((1u << (Bits - 1)) - 1), -1.0f);
}
KK_FN float linear_to_srgb(float c) {
  c = ::fminf(::fmaxf(c, 0.0f), 1.0f);
  return c <= 0.0031308f ? c * 12.92f : 1.055f * ::powf(c, 1.0f / 2.4f) - 0.055f;
}
KK_FN float srgb_to_linear(float c) { return c <= 0.04045f ? c / 12.92f : ::powf((c + 0.055f) / 1.055f, 2.4f); }
}  // namespace kk_detail

KK_FN uint pack_float_to_unorm4x8(float4 v) {
  using namespace kk_detail;
  return to_unorm<8>(v.x) | to_unorm<8>(v.y) << 8 | to_unorm<8>(v.z) << 16 | to_unorm<8>(v.w) << 24;
}
KK_FN uint pack_float_to_snorm4x8(float4 v) {
  using namespace kk_detail;
  return to_snorm<8>(v.x) | to_snorm<8>(v.y) << 8 | to_snorm<8>(v.z) << 16 | to_snorm<8>(v.w) << 24;
}
KK_FN uint pack_float_to_srgb_unorm4x8(float4 v) {
  using namespace kk_detail;
  return pack_float_to_unorm4x8(float4(linear_to_srgb(v.x), linear_to_srgb(v.y), linear_to_srgb(v.z), v.w));
}
KK_FN uint pack_float_to_unorm2x16(float2 v) {
  return kk_detail::to_unorm<16>(v.x) | kk_detail::to_unorm<16>(v.y) << 16;
}
KK_FN uint pack_float_to_snorm2x16(float2 v) {
  return kk_detail::to_snorm<16>(v.x) | kk_detail::to_snorm<16>(v.y) << 16;
}
KK_FN uint pack_float_to_unorm10a2(float4 v) {
  using namespace kk_detail;
  return to_unorm<10>(v.x) | to_unorm<10>(v.y) << 10 | to_unorm<10>(v.z) << 20 | to_unorm<2>(v.w) << 30;
}
KK_FN ushort pack_float_to_unorm565(float3 v) {
  using namespace kk_detail;
  return ushort(to_unorm<5>(v.x) | to_unorm<6>(v.y) << 5 | to_unorm<5>(v.z) << 11);
}

KK_FN float4 unpack_unorm4x8_to_float(uint n) {
  using namespace kk_detail;
  return float4(from_unorm<8>(n), from_unorm<8>(n >> 8), from_unorm<8>(n >> 16), from_unorm<8>(n >> 24));
}
KK_FN float4 unpack_snorm4x8_to_float(uint n) {
  using namespace kk_detail;
  return float4(from_snorm<8>(n), from_snorm<8>(n >> 8), from_snorm<8>(n >> 16), from_snorm<8>(n >> 24));
}
KK_FN float4 unpack_unorm4x8_srgb_to_float(uint n) {
  using namespace kk_detail;
  const float4 c = unpack_unorm4x8_to_float(n);
  return float4(srgb_to_linear(c.x), srgb_to_linear(c.y), srgb_to_linear(c.z), c.w);
}
KK_FN float2 unpack_unorm2x16_to_float(uint n) {
  return float2(kk_detail::from_unorm<16>(n), kk_detail::from_unorm<16>(n >> 16));
}
KK_FN float2 unpack_snorm2x16_to_float(uint n) {
  return float2(kk_detail::from_snorm<16>(n), kk_detail::from_snorm<16>(n >> 16));
}
KK_FN float4 unpack_unorm10a2_to_float(uint n) {
  using namespace kk_detail;
  return float4(from_unorm<10>(n), from_unorm<10>(n >> 10), from_unorm<10>(n >> 20), from_unorm<2>(n >> 30));
}
KK_FN float3 unpack_unorm565_to_float(ushort n) {
  using namespace kk_detail;
  return float3(from_unorm<5>(n), from_unorm<6>(uint(n) >> 5), from_unorm<5>(uint(n) >> 11));
}

// the half forms
KK_FN uint pack_half_to_unorm4x8(half4 v) { return pack_float_to_unorm4x8(float4(v)); }
KK_FN uint pack_half_to_snorm4x8(half4 v) { return pack_float_to_snorm4x8(float4(v)); }
KK_FN uint pack_half_to_srgb_unorm4x8(half4 v) { return pack_float_to_srgb_unorm4x8(float4(v)); }
KK_FN uint pack_half_to_unorm2x16(half2 v) { return pack_float_to_unorm2x16(float2(v)); }
KK_FN uint pack_half_to_snorm2x16(half2 v) { return pack_float_to_snorm2x16(float2(v)); }
KK_FN uint pack_half_to_unorm10a2(half4 v) { return pack_float_to_unorm10a2(float4(v)); }
KK_FN ushort pack_half_to_unorm565(half3 v) { return pack_float_to_unorm565(float3(v)); }
KK_FN half4 unpack_unorm4x8_to_half(uint n) { return half4(unpack_unorm4x8_to_float(n)); }
KK_FN half4 unpack_snorm4x8_to_half(uint n) { return half4(unpack_snorm4x8_to_float(n)); }
KK_FN half4 unpack_unorm4x8_srgb_to_half(uint n) { return half4(unpack_unorm4x8_srgb_to_float(n)); }
KK_FN half2 unpack_unorm2x16_to_half(uint n) { return half2(unpack_unorm2x16_to_float(n)); }
KK_FN half2 unpack_snorm2x16_to_half(uint n) { return half2(unpack_snorm2x16_to_float(n)); }
KK_FN half4 unpack_unorm10a2_to_half(uint n) { return half4(unpack_unorm10a2_to_float(n)); }
KK_FN half3 unpack_unorm565_to_half(ushort n) { return half3(unpack_unorm565_to_float(n)); }

}  // namespace metal
