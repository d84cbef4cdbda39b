// half, bfloat, scalar type names, traits, numeric_limits, as_type.
#include "prelude_test.h"

namespace metal {

// Layout: 2 bytes, usable in buffers, threadgroup arrays and atomics.
static_assert(sizeof(half) == 2 && alignof(half) == 2 && sizeof(bfloat) == 2, "16-bit floats");
static_assert(__is_trivial(half) && __is_trivial(bfloat) && __is_trivially_copyable(half), "trivial");
static_assert(is_same_v<float16_t, half> && is_same_v<bfloat16_t, bfloat>, "MLX names");
static_assert(sizeof(int8_t) == 1 && sizeof(int16_t) == 2 && sizeof(int32_t) == 4 && sizeof(int64_t) == 8 &&
                  sizeof(uint64_t) == 8 && sizeof(size_t) == 8 && sizeof(ulong) == 8 && sizeof(uchar) == 1,
              "fixed-width names");
static_assert(is_integral_v<uint> && !is_integral_v<half> && is_floating_point_v<half> &&
                  is_floating_point_v<bfloat> && is_arithmetic_v<bfloat> && is_signed_v<int> && is_unsigned_v<uint>,
              "traits");

// Metal's promotion rules.
static_assert(is_same_v<decltype(half() + half()), half>, "half op half");
static_assert(is_same_v<decltype(half() * 2), half>, "half op int");
static_assert(is_same_v<decltype(3u - half()), half>, "uint op half");
static_assert(is_same_v<decltype(half() / 2.0f), float>, "half op float");
static_assert(is_same_v<decltype(2.0 * half()), double>, "double op half");
static_assert(is_same_v<decltype(half() + bfloat()), float>, "half op bfloat");
static_assert(is_same_v<decltype(bfloat() - 1), bfloat>, "bfloat op int");
static_assert(is_same_v<decltype(half() < 1), bool>, "comparison");

// MLX's Limits<T> pattern: static constexpr members from numeric_limits.
template <typename U> struct Limits;
template <> struct Limits<half> {
  static constexpr half max = numeric_limits<half>::infinity();
  static constexpr half min = -numeric_limits<half>::infinity();
  static constexpr half finite_max = numeric_limits<half>::max();
};
template <> struct Limits<float> {
  static constexpr float max = numeric_limits<float>::infinity();
  static constexpr float finite_min = -numeric_limits<float>::max();
};
static_assert(Limits<half>::min.bits == 0xfc00 && Limits<half>::finite_max.bits == 0x7bff, "constexpr half limits");
static_assert(numeric_limits<int>::max() == 2147483647 && numeric_limits<int>::min() == -2147483647 - 1, "int");
static_assert(numeric_limits<uint8_t>::max() == 255 && numeric_limits<int8_t>::min() == -128, "8-bit");
static_assert(numeric_limits<uint64_t>::max() == ~0ull && numeric_limits<int64_t>::max() == 0x7fffffffffffffffll,
              "64-bit");
static_assert(numeric_limits<short>::lowest() == -32768 && numeric_limits<bool>::max(), "short, bool");
static_assert(numeric_limits<float>::max() == 0x1.fffffep+127f && numeric_limits<float>::epsilon() == 0x1p-23f,
              "float");
static_assert(numeric_limits<double>::min() == 0x1p-1022 && numeric_limits<double>::lowest() == -0x1.fffffffffffffp+1023,
              "double");
static_assert(as_type<uint>(1.0f) == 0x3f800000u, "as_type is constexpr");

template <typename T>
KK_FN void mlx_grid_sample_expressions(kk_test_result& r) {
  // Lines of the MLX seeds, with T = half / bfloat: they must compile, unambiguously.
  int W = 7, H = 5;
  float ix = 2.25f, iy = 1.5f;
  int ix_nw = floor(ix);
  int iy_nw = floor(iy);
  int ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  T nw = (ix_se - ix) * (iy_se - iy);
  T I_nw = T(3.0f);
  bool inside = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1;
  I_nw = inside ? I_nw : 0;
  T I = !inside ? I_nw : 0;
  T out = nw * I_nw + nw * I;
  CHECK_NEAR(float(out), 0.375 * 3.0, 1e-2);
  CHECK(I == 0);
  T cot = T(2);
  T gix = T(0);
  gix -= I_nw * (iy_se - iy) * cot;
  gix += I_nw * (iy - iy_nw) * cot;
  CHECK(gix == 0);
  T gix_mult = W / 2;
  CHECK(gix_mult == 3);
  float f = gix_mult;
  double d = gix_mult;
  CHECK(f == 3.0f && d == 3.0);
  T e = metal::exp(T(1));
  static_assert(is_same_v<decltype(metal::exp(T(1))), T>, "exp(half) is half");
  CHECK_NEAR(float(e), 2.71828, 1e-2);
  static_assert(is_same_v<decltype(max(T(1), T(2))), T>, "max(half, half)");
  CHECK(max(T(1), T(2)) == 2 && min(T(1), T(2)) == 1);
  T t = (T(2) + 1) * W - 1;  // half op int op int
  CHECK(t == 20);
  float grid_term = ((T(0.5f) + 1) * W - 1) / 2;
  CHECK_NEAR(grid_term, 4.75, 1e-3);
}

KK_FN void test_types(kk_test_result& r, uint) {
  // Conversions, round to nearest even.
  CHECK(half(1.5f).bits == 0x3e00);
  CHECK(half(1.0f + 0x1p-11f).bits == 0x3c00);      // tie -> even
  CHECK(half(1.0f + 3 * 0x1p-11f).bits == 0x3c02);  // tie -> even (up)
  CHECK(half(1.0f + 0x1p-11f + 0x1p-20f).bits == 0x3c01);
  CHECK(half(65504.0f).bits == 0x7bff && half(65520.0f).bits == 0x7c00 && half(-1e9f).bits == 0xfc00);
  CHECK(half(0x1p-24f).bits == 0x0001 && half(0x1p-25f).bits == 0x0000 && half(0x1.8p-25f).bits == 0x0001);
  CHECK(half(0x1p-14f).bits == 0x0400 && half(-0.0f).bits == 0x8000);
  CHECK(float(half::from_bits(0x0001)) == 0x1p-24f && float(half::from_bits(0x7bff)) == 65504.0f);
  CHECK(isnan(float(half::from_bits(0x7e00))) && isinf(float(half::from_bits(0xfc00))));
  CHECK(bfloat(1.0f).bits == 0x3f80 && bfloat(1.0f + 0x1p-8f).bits == 0x3f80 && bfloat(1.0f + 3 * 0x1p-8f).bits == 0x3f82);
  CHECK(float(bfloat(3.0e38f)) > 2.9e38f && float(bfloat::from_bits(0x7f80)) > 1e38f);
  CHECK(half(3).bits == 0x4200 && half(true).bits == 0x3c00 && half(2.5).bits == 0x4100 && half(-7L) == -7);
  CHECK(half(bfloat(1.5f)) == 1.5f && bfloat(half(-2.0f)) == -2.0f);

  // Explicit conversions to integers and bool; implicit to float and double.
  half h = 2.75f;
  CHECK(int(h) == 2 && static_cast<uint>(h) == 2u && (long)h == 2 && static_cast<bool>(h));
  CHECK(!half(0.0f) && (h ? true : false));
  float f = h;
  double d = h;
  CHECK(f == 2.75f && d == 2.75);

  // Arithmetic, compound assignment, increments, unary minus.
  half a = 1.5f, b = 0.25f;
  CHECK(a + b == 1.75f && a - b == 1.25f && a * b == 0.375f && a / b == 6);
  CHECK(a * 2 == 3 && 2 * a == 3 && a + 1.0f == 2.5f && 1.0 + a == 2.5);
  CHECK(a > b && b < a && a >= 1.5f && a <= 2 && a != b && a == 1.5f && 1.5 == a);
  CHECK((-a).bits == 0xbe00 && (+a) == a);
  half c = 1;
  c += 2;
  c *= 1.5f;
  c -= half(0.5f);
  c /= 2.0;
  CHECK(c == 2);
  CHECK(++c == 3 && c++ == 3 && c == 4 && --c == 3 && c-- == 3 && c == 2);
  CHECK(half(1000.0f) + half(0.25f) == 1000.0f);  // rounded to half after each operation
  bfloat bf = 1.0f;
  bf += 0.5f;
  CHECK(bf == 1.5f && bf * 2 == 3 && bfloat(2.0f) + half(1.0f) == 3.0f);
  uint u = 5;
  CHECK(half(1) * u == 5 && u - half(1) == 4);

  mlx_grid_sample_expressions<half>(r);
  mlx_grid_sample_expressions<bfloat>(r);
  mlx_grid_sample_expressions<float>(r);

  // numeric_limits at run time, all scalar types.
  CHECK(numeric_limits<half>::max() == 65504.0f && numeric_limits<half>::lowest() == -65504.0f);
  CHECK(numeric_limits<half>::min() == 0x1p-14f && numeric_limits<half>::epsilon() == 0x1p-10f);
  CHECK(isinf(numeric_limits<half>::infinity()) && isnan(numeric_limits<half>::quiet_NaN()));
  CHECK(float(numeric_limits<half>::denorm_min()) == 0x1p-24f);
  CHECK(numeric_limits<bfloat>::epsilon() == 0x1p-7f && numeric_limits<bfloat>::min() == 0x1p-126f);
  CHECK(float(numeric_limits<bfloat>::max()) == 0x1.fep+127f && isinf(numeric_limits<bfloat>::infinity()));
  CHECK(isinf(numeric_limits<float>::infinity()) && isnan(numeric_limits<float>::quiet_NaN()));
  CHECK(isnan(numeric_limits<double>::quiet_NaN()) && numeric_limits<double>::epsilon() == 0x1p-52);
  CHECK(numeric_limits<uint>::max() == 0xffffffffu && numeric_limits<ushort>::max() == 65535);
  CHECK(Limits<float>::max > 1e38f && Limits<float>::finite_min < -1e38f && isinf(Limits<half>::max));
  CHECK(isinf(INFINITY) && isnan(NAN) && FLT_MAX == 0x1.fffffep+127f && MAXFLOAT > 3e38f);
  CHECK(M_PI_F == 3.14159274f && M_PI_H == 3.140625f);
  CHECK_NEAR(M_SQRT2_F * M_SQRT1_2_F, 1.0, 1e-7);
  CHECK(HALF_MAX == 65504.0f);

  // as_type: scalars and vectors of the same size.
  CHECK(as_type<float>(0x40490fdbu) == M_PI_F && as_type<ushort>(half(1.0f)) == 0x3c00);
  CHECK(as_type<half>(ushort(0xc000)) == -2.0f && as_type<ushort>(bfloat(1.0f)) == 0x3f80);
  uint2 halves = as_type<uint2>(0x0000000500000007ul);
  CHECK(halves.x == 7 && halves.y == 5);
  half2 hh = as_type<half2>(0x40003c00u);
  CHECK(hh.x == 1.0f && hh.y == 2.0f && as_type<uint>(hh) == 0x40003c00u);
  CHECK(as_type<ulong>(1.0) == 0x3ff0000000000000ul && as_type<int>(-1.0f) == int(0xbf800000u));
}

}  // namespace metal

KK_TEST_MAIN(test_types, 1)
