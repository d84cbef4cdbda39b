// metal:: math (precise, fast, and the mode-selected plain names), common,
// relational, integer and geometric functions.
#include "prelude_test.h"

namespace metal {

// Overload results.
static_assert(is_same_v<decltype(floor(1.5f)), float> && is_same_v<decltype(floor(2)), float>, "floor");
static_assert(is_same_v<decltype(exp(half())), half> && is_same_v<decltype(exp(bfloat())), bfloat>, "16-bit");
static_assert(is_same_v<decltype(exp(1.0)), double> && is_same_v<decltype(sqrt(float4())), float4>, "double, vector");
static_assert(is_same_v<decltype(pow(2.0f, 3)), float> && is_same_v<decltype(pow(2, 3)), float>, "mixed -> float");
static_assert(is_same_v<decltype(max(1, 2)), int> && is_same_v<decltype(max(1u, 2u)), uint>, "integer max");
static_assert(is_same_v<decltype(max(1.0f, 0)), float> && is_same_v<decltype(min(half(), 1)), half>, "mixed max");
static_assert(is_same_v<decltype(clamp(float4(), 0.0f, 1.0f)), float4> && is_same_v<decltype(clamp(1, 0, 2)), int>,
              "clamp");
static_assert(is_same_v<decltype(mix(float3(), float3(), 0.5f)), float3>, "mix with a scalar weight");
static_assert(is_same_v<decltype(abs(-1)), int> && is_same_v<decltype(abs(int2())), int2> &&
                  is_same_v<decltype(abs(half())), half>,
              "abs");
static_assert(is_same_v<decltype(isnan(float2())), bool2> && is_same_v<decltype(dot(half3(), half3())), half>,
              "relational, geometric");
static_assert(is_same_v<decltype(clz(uchar())), uchar> && is_same_v<decltype(popcount(ulong())), ulong>, "integer");

KK_TEST_FN void test_float_math(kk_test_result& r) {
  const double e = 2.718281828459045, pi = 3.141592653589793;
  // Every mode's names exist and agree to their precision.
  CHECK_NEAR(exp(1.0f), e, 1e-6);
  CHECK_NEAR(precise::exp(1.0f), e, 1e-7);
  CHECK_NEAR(fast::exp(1.0f), e, 1e-5);
  CHECK_NEAR(metal::exp(1.0), e, 1e-15);
  CHECK_NEAR(exp2(10.0f), 1024, 1e-6);
  CHECK_NEAR(exp10(2.0f), 100, 1e-6);
  CHECK_NEAR(fast::exp10(2.0f), 100, 1e-4);
  CHECK_NEAR(log(float(e)), 1, 1e-6);
  CHECK_NEAR(fast::log(8.0f), 2.0794415, 1e-5);
  CHECK_NEAR(log2(1024.0f), 10, 1e-6);
  CHECK_NEAR(log10(1000.0f), 3, 1e-6);
  CHECK_NEAR(pow(2.0f, 10), 1024, 1e-6);
  CHECK_NEAR(fast::pow(2.0f, 0.5f), 1.41421356, 1e-5);
  CHECK_NEAR(powr(9.0f, 0.5f), 3, 1e-6);
  CHECK(sqrt(16.0f) == 4.0f && precise::sqrt(2.0) * precise::sqrt(2.0) > 1.9999999);
  CHECK_NEAR(rsqrt(4.0f), 0.5, 1e-6);
  CHECK(precise::rsqrt(4.0f) == 0.5f);
  CHECK_NEAR(fast::rsqrt(4.0f), 0.5, 1e-5);
  CHECK_NEAR(cbrt(27.0f), 3, 1e-6);
  CHECK_NEAR(divide(1.0f, 3.0f), 1.0 / 3, 1e-6);
  CHECK_NEAR(sin(float(pi / 6)), 0.5, 1e-6);
  CHECK_NEAR(fast::sin(0.5f), 0.47942554, 1e-5);
  CHECK_NEAR(cos(float(pi / 3)), 0.5, 1e-6);
  CHECK_NEAR(fast::cos(0.5f), 0.87758256, 1e-5);
  CHECK_NEAR(tan(float(pi / 4)), 1, 1e-6);
  CHECK(sinpi(1.0f) == 0.0f && sinpi(0.5f) == 1.0f && sinpi(-0.5f) == -1.0f && sinpi(2.5f) == 1.0f);
  CHECK(cospi(0.5f) == 0.0f && cospi(1.0f) == -1.0f && cospi(0.0f) == 1.0f && cospi(1e10f) == 1.0f);
  CHECK_NEAR(sinpi(1.0f / 6), 0.5, 1e-6);
  CHECK_NEAR(tanpi(0.25f), 1, 1e-6);
  CHECK(sinpi(1.0) == 0.0 && cospi(0.5) == 0.0);
  float c = 0;
  const float s = sincos(0.5f, c);
  CHECK_NEAR(s, 0.47942554, 1e-6);
  CHECK_NEAR(c, 0.87758256, 1e-6);
  CHECK_NEAR(asin(1.0f), pi / 2, 1e-6);
  CHECK_NEAR(acos(0.0f), pi / 2, 1e-6);
  CHECK_NEAR(atan(1.0f), pi / 4, 1e-6);
  CHECK_NEAR(atan2(1.0f, -1.0f), 3 * pi / 4, 1e-6);
  CHECK_NEAR(sinh(1.0f), 1.17520119, 1e-6);
  CHECK_NEAR(cosh(1.0f), 1.54308063, 1e-6);
  CHECK_NEAR(tanh(0.5f), 0.46211716, 1e-6);
  CHECK_NEAR(asinh(1.0f), 0.88137359, 1e-6);
  CHECK_NEAR(acosh(2.0f), 1.3169579, 1e-6);
  CHECK_NEAR(atanh(0.5f), 0.54930614, 1e-6);

  // Exact functions.
  CHECK(floor(-1.5f) == -2 && ceil(-1.5f) == -1 && trunc(-1.7f) == -1 && round(2.5f) == 3 && rint(2.5f) == 2);
  CHECK(round(-2.5f) == -3 && rint(3.5f) == 4 && fabs(-3.0f) == 3 && abs(-3.0f) == 3);
  CHECK(fract(1.25f) == 0.25f && fract(-1.25f) == 0.75f && fract(-0x1p-30f) < 1.0f);
  CHECK(fmod(7.5f, 2.0f) == 1.5f && copysign(2.0f, -0.0f) == -2 && fdim(5.0f, 3.0f) == 2 && fdim(3.0f, 5.0f) == 0);
  CHECK(fmax(1.0f, NAN) == 1.0f && fmin(NAN, 2.0f) == 2.0f && fma(2.0f, 3.0f, 1.0f) == 7);
  CHECK(nextafter(1.0f, 2.0f) == 1.0f + 0x1p-23f && logb(8.0f) == 3 && ilogb(8.0f) == 3 && ilogb(0.75) == -1);
  int ex = 0;
  CHECK(frexp(8.0f, ex) == 0.5f && ex == 4 && ldexp(0.5f, 4) == 8.0f);
  float ip = 0;
  CHECK(modf(3.25f, ip) == 0.25f && ip == 3);
  int ix_nw = floor(2.75f);  // the MLX seed's implicit float -> int
  CHECK(ix_nw == 2);
  CHECK(floor(7) == 7.0f && sqrt(4) == 2.0f);

  // Common functions.
  CHECK(max(1.0f, 2.0f) == 2 && min(1.0f, 2.0f) == 1 && max(1.5f, 0) == 1.5f && min(-1, 0.5f) == -1);
  CHECK(max(3, 7) == 7 && min(3u, 7u) == 3u && max(-1, 2u) == uint(-1) && min(size_t(4), 9u) == 4);
  CHECK(max(NAN, 1.0f) == 1.0f);
  CHECK(clamp(1.5f, 0.0f, 1.0f) == 1 && clamp(-3, 0, 10) == 0 && clamp(5u, 1u, 3u) == 3u && clamp(0.5, 0, 1) == 0.5);
  CHECK(saturate(1.5f) == 1 && saturate(-0.5f) == 0 && saturate(0.25f) == 0.25f);
  CHECK(mix(1.0f, 3.0f, 0.25f) == 1.5f && step(0.5f, 0.4f) == 0 && step(0.5f, 0.5f) == 1);
  CHECK(smoothstep(0.0f, 1.0f, 0.5f) == 0.5f && smoothstep(0.0f, 1.0f, 2.0f) == 1.0f);
  CHECK(sign(-2.0f) == -1 && sign(3.0f) == 1 && sign(0.0f) == 0 && sign(NAN) == 0);
  CHECK(max3(1, 5, 3) == 5 && min3(4.0f, 2.0f, 3.0f) == 2 && median3(1, 9, 5) == 5 && median3(9.0f, 1.0f, 5.0f) == 5);

  // half and bfloat: computed in float, rounded back.
  half h = 2.0f;
  CHECK(exp(h) == half(7.389056f) && sqrt(h * 8) == 4 && floor(half(-1.5f)) == -2 && abs(half(-3)) == 3);
  CHECK(max(h, half(3)) == 3 && clamp(h, half(0), half(1)) == 1 && mix(half(0), half(4), half(0.5f)) == 2);
  CHECK(fma(h, h, h) == 6 && pow(h, 3) == 8 && fast::exp(half(0)) == 1 && precise::log(half(1)) == 0);
  CHECK(exp(bfloat(0.0f)) == 1 && abs(bfloat(-2.0f)) == 2 && isnan(bfloat(NAN)));
  float hf = max(h, 2.5f);  // half and float: computed in float
  CHECK(hf == 2.5f);

  // Relational.
  CHECK(isnan(NAN) && !isnan(1.0f) && isinf(-INFINITY) && isfinite(1e38f) && !isfinite(INFINITY));
  CHECK(isnormal(1.0f) && !isnormal(0x1p-130f) && signbit(-0.0f) && !signbit(0.0f) && signbit(half(-1)));
  CHECK(isnan(half(NAN)) && isinf(half(1e6f)) && isordered(1.0f, 2.0f) && isunordered(NAN, 2.0f));
  CHECK(isnan(0.0 / 0.0 + numeric_limits<double>::quiet_NaN()) && signbit(-1.0));

  // Vectors: element-wise, scalars broadcast.
  float4 v = float4(-1.5f, 0.25f, 4.0f, 9.0f);
  CHECK(all(abs(v) == float4(1.5f, 0.25f, 4, 9)) && all(floor(v) == float4(-2, 0, 4, 9)));
  CHECK(all(sqrt(max(v, 0.0f)) == float4(0, 0.5f, 2, 3)) && all(clamp(v, 0.0f, 1.0f) == float4(0, 0.25f, 1, 1)));
  CHECK(all(max(v, float4(0)) == max(0.0f, v)) && all(min(int2(1, 5), 3) == int2(1, 3)));
  CHECK(all(mix(float2(0, 10), float2(10, 20), 0.5f) == float2(5, 15)) && all(step(1.0f, v) == float4(0, 0, 1, 1)));
  CHECK(all(pow(float2(2, 3), 2.0f) == float2(4, 9)) && all(fma(float2(1, 2), float2(3), float2(1)) == float2(4, 7)));
  CHECK(all(exp(float2(0)) == 1.0f) && all(precise::exp(half2(0)) == half2(1)) && all(fast::log(float2(1)) == 0.0f));
  CHECK(all(sign(v) == float4(-1, 1, 1, 1)) && all(select(v, -v, v < 0) == abs(v)) && all(fract(v) == float4(0.5f, 0.25f, 0, 0)));
  CHECK(all(ilogb(float2(8, 0.5f)) == int2(3, -1)) && all(smoothstep(0.0f, 2.0f, float2(0, 2)) == float2(0, 1)));
  int2 e2;
  CHECK(all(frexp(float2(8, 1), e2) == float2(0.5f)) && all(e2 == int2(4, 1)));
  CHECK(all(isinf(float3(1, INFINITY, -INFINITY)) == bool3(false, true, true)));

  // Geometric.
  float3 x = float3(1, 2, 2), y = float3(0, 1, 0);
  CHECK(dot(x, y) == 2 && length(x) == 3 && length_squared(x) == 9 && distance(x, float3(1, 2, 0)) == 2);
  CHECK_NEAR(length(normalize(float4(1, 1, 1, 1))), 1.0, 1e-6);
  CHECK(all(cross(float3(1, 0, 0), float3(0, 1, 0)) == float3(0, 0, 1)));
  CHECK(all(reflect(float2(1, -1), float2(0, 1)) == float2(1, 1)) && distance_squared(float2(0), float2(3, 4)) == 25);
  CHECK(all(faceforward(float2(0, 1), float2(0, -1), float2(0, 1)) == float2(0, 1)));
  CHECK(all(refract(float2(0, -1), float2(0, 1), 1.0f) == float2(0, -1)));
  CHECK(dot(double2(1, 2), double2(3, 4)) == 11.0);
}

KK_TEST_FN void test_integer_math(kk_test_result& r) {
  CHECK(abs(-5) == 5 && abs(7u) == 7u && abs(short(-3)) == 3 && abs(-5L) == 5 && abs(char(-1)) == 1);
  CHECK(absdiff(3, -5) == 8 && absdiff(2u, 9u) == 7u && absdiff(uchar(250), uchar(5)) == 245);
  CHECK(addsat(250, 10) == 260 && addsat(uchar(250), uchar(10)) == 255 && addsat(char(-100), char(-100)) == -128);
  CHECK(addsat(0x7fffffff, 1) == 0x7fffffff && addsat(uint(0xfffffff0u), 0x20u) == 0xffffffffu);
  CHECK(subsat(uchar(3), uchar(5)) == 0 && subsat(-0x7fffffff, 5) == -0x7fffffff - 1 && subsat(5, 3) == 2);
  CHECK(subsat(short(32000), short(-1000)) == 32767);
  CHECK(clz(1u) == 31 && clz(0u) == 32 && clz(uchar(1)) == 7 && clz(ushort(0)) == 16 && clz(-1) == 0);
  CHECK(clz(1ul) == 63 && clz(long(0)) == 64 && clz(char(0x10)) == 3);
  CHECK(ctz(8u) == 3 && ctz(0u) == 32 && ctz(uchar(0)) == 8 && ctz(0x100000000ul) == 32 && ctz(ulong(0)) == 64);
  CHECK(popcount(0xffu) == 8 && popcount(-1) == 32 && popcount(uchar(0x81)) == 2 && popcount(~0ul) == 64);
  CHECK(reverse_bits(1u) == 0x80000000u && reverse_bits(uchar(1)) == 0x80 && reverse_bits(ushort(0x00f0)) == 0x0f00);
  CHECK(reverse_bits(1ul) == 0x8000000000000000ul && reverse_bits(0x80000000u) == 1u);
  CHECK(rotate(0x80000001u, 1u) == 3u && rotate(uchar(0x81), uchar(4)) == 0x18 && rotate(1u, 33u) == 2u);
  CHECK(rotate(0x8000000000000000ul, 1ul) == 1ul && rotate(5, 0) == 5);
  CHECK(mulhi(0x80000000u, 4u) == 2u && mulhi(-2, 0x40000000) == -1 && mulhi(ushort(0x8000), ushort(4)) == 2);
  CHECK(mulhi(~0ul, ~0ul) == ~0ul - 1 && mulhi(long(-1), long(1)) == -1 && mulhi(long(1) << 62, long(4)) == 1);
  CHECK(mulhi(-3L, 5L) == -1 && mulhi(0x123456789abcdefL, 0x1000L) == 0x12);
  CHECK(hadd(7, 8) == 7 && rhadd(7, 8) == 8 && hadd(0xffffffffu, 0xffffffffu) == 0xffffffffu && hadd(-1, -2) == -2);
  CHECK(mul24(3, 4) == 12 && mad24(3, 4, 5) == 17 && madhi(0x80000000u, 4u, 1u) == 3u);
  CHECK(madsat(0x10000, 0x10000, 1) == 0x7fffffff && madsat(uchar(16), uchar(16), uchar(1)) == 255);
  CHECK(madsat(-0x10000, 0x10000, 0) == -0x7fffffff - 1 && madsat(3, 4, 5) == 17);
  CHECK(extract_bits(0xabcdu, 4u, 8u) == 0xbcu && extract_bits(int(0xf0), 4u, 4u) == -1 && extract_bits(7u, 0u, 0u) == 0u);
  CHECK(insert_bits(0xffffu, 0u, 4u, 8u) == 0xf00fu && insert_bits(0u, 0xfu, 28u, 4u) == 0xf0000000u);
  CHECK(insert_bits(0u, ~0u, 0u, 32u) == ~0u);
  CHECK(all(popcount(uint2(3, 7)) == uint2(2, 3)) && all(clz(int2(1, 0)) == int2(31, 32)));
  CHECK(all(abs(int3(-1, 2, -3)) == int3(1, 2, 3)) && all(absdiff(uint2(1, 9), uint2(4, 2)) == uint2(3, 7)));
  CHECK(all(max(uint3(1, 5, 3), uint3(2)) == uint3(2, 5, 3)) && all(clamp(int2(-5, 5), -1, 1) == int2(-1, 1)));
}

KK_FN void test_math(kk_test_result& r, uint) {
  test_float_math(r);
  test_integer_math(r);
}

}  // namespace metal

KK_TEST_MAIN(test_math, 1)
