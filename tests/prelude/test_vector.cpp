// Vector types: layout, constructors, access, swizzles, operators, packed types.
#include "prelude_test.h"

namespace metal {

// Metal's layout: 3-vectors are padded to 4.
static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "float2");
static_assert(sizeof(float3) == 16 && alignof(float3) == 16 && sizeof(float4) == 16, "float3");
static_assert(sizeof(half3) == 8 && alignof(half3) == 8 && sizeof(half2) == 4, "half3");
static_assert(sizeof(char3) == 4 && sizeof(uchar2) == 2 && sizeof(bool4) == 4 && sizeof(bool3) == 4, "8-bit");
static_assert(sizeof(double3) == 32 && alignof(double4) == 32 && sizeof(long2) == 16 && sizeof(ulong3) == 32, "64-bit");
static_assert(sizeof(packed_float3) == 12 && alignof(packed_float3) == 4 && sizeof(packed_half3) == 6, "packed");
static_assert(__is_trivial(float4) && __is_trivial(half3) && __is_trivial(packed_float3), "trivial");

// Result types.
static_assert(is_same_v<decltype(float4() < float4()), bool4>, "comparisons give bool vectors");
static_assert(is_same_v<decltype(int3() == 1), bool3>, "vector == scalar");
static_assert(is_same_v<decltype(half4() * 2.0f), half4>, "scalar converted to the element type");
static_assert(is_same_v<decltype(float4().template swizzle<0, 1>()), const float2>, "swizzle reads");
static_assert(is_same_v<decltype(uint3().template swizzle<2, 1, 0, 0>()), const uint4>, "4-wide swizzle");

KK_FN void test_vector(kk_test_result& r, uint) {
  // Constructors: broadcast, components, Metal's mixed forms, conversions.
  float4 z = 0;
  CHECK(z.x == 0 && z.y == 0 && z.z == 0 && z.w == 0);
  float4 b = float4(2);
  CHECK(all(b == 2.0f));
  float2 xy = float2(1.0f, 2.0f);
  float4 v = float4(xy, 3.0f, 4.0f);
  CHECK(v.x == 1 && v.y == 2 && v.z == 3 && v.w == 4);
  CHECK(all(float4(0.0f, xy, 5.0f) == float4(0, 1, 2, 5)));
  CHECK(all(float4(7.0f, 8.0f, xy) == float4(7, 8, 1, 2)));
  CHECK(all(float4(xy, xy) == float4(1, 2, 1, 2)));
  float3 v3 = float3(xy, 9.0f);
  CHECK(all(float4(v3, 1.0f) == float4(1, 2, 9, 1)) && all(float4(0.5f, v3) == float4(0.5f, 1, 2, 9)));
  CHECK(all(float3(4.0f, xy) == float3(4, 1, 2)));
  int4 iv = int4(float4(1.7f, -1.7f, 2.0f, 0.2f));
  CHECK(iv.x == 1 && iv.y == -1 && iv.z == 2 && iv.w == 0);
  float4 fv = float4(int4(1, 2, 3, 4));
  CHECK(fv.w == 4.0f);
  half4 hv = half4(fv);
  CHECK(hv.z == 3 && float4(hv).y == 2.0f);
  half2 h2 = half2(1.5f, 2);
  CHECK(h2.x == 1.5f && h2.y == 2);
  uint3 pos = uint3(5, 6, 7);
  CHECK(pos.x == 5u && pos[2] == 7u);
  vec<int, 2> loc = {3, 4};  // copy-list-initialisation, as MLX's elem_to_loc_2_nd does
  CHECK(loc.y == 4);
  bool3 bv = bool3(true, false, true);
  CHECK(any(bv) && !all(bv) && all(!bool2(false)));

  // Element access, dynamic index, writes.
  float4 w = float4(1, 2, 3, 4);
  w[1] = 20;
  w.z += 10;
  for (int i = 0; i < 4; ++i) w[i] += 1;
  CHECK(w.x == 2 && w.y == 21 && w.z == 14 && w.w == 5);

  // Swizzles, as the front end rewrites them (v.xy, c.rgb, p.zyx, v.xxyy).
  float2 s2 = w.template swizzle<0, 1>();
  float3 s3 = w.template swizzle<2, 1, 0>();
  float4 s4 = s2.template swizzle<0, 0, 1, 1>();
  CHECK(s2.x == 2 && s2.y == 21 && s3.x == 14 && s3.z == 2 && s4.y == 2 && s4.z == 21);
  uint2 gxy = pos.template swizzle<0, 1>();
  CHECK(gxy.x == 5u && gxy.y == 6u);
  CHECK(length(w.template swizzle<0, 1>() - float2(2, 21)) == 0.0f);

  // Arithmetic: vector op vector, vector op scalar and scalar op vector.
  float4 a = float4(1, 2, 3, 4), c = float4(4, 3, 2, 1);
  CHECK(all(a + c == 5.0f) && all(a - c == float4(-3, -1, 1, 3)) && all(a * c == float4(4, 6, 6, 4)));
  CHECK(all(a / 2 == float4(0.5f, 1, 1.5f, 2)) && all(2 * a == a + a) && all(1.0f - a == -(a - 1.0)));
  CHECK(all((a < c) == bool4(true, true, false, false)) && all((a >= 3) == bool4(false, false, true, true)));
  CHECK(any(a != c) && !any(a > 10));
  CHECK(all(((a < 2) || (a > 3)) == bool4(true, false, false, true)) && !any((a < 2) && (a > 3)));
  int4 i4 = int4(7, 8, 9, -10);
  CHECK(all(i4 % 4 == int4(3, 0, 1, -2)) && all((i4 & 1) == int4(1, 0, 1, 0)) && all((i4 | 1) == int4(7, 9, 9, -9)));
  CHECK(all((i4 ^ i4) == 0) && all((i4 << 1) == int4(14, 16, 18, -20)) && all((i4 >> 1) == int4(3, 4, 4, -5)));
  CHECK(all(~int2(0, -1) == int2(-1, 0)) && all(-i4 == int4(-7, -8, -9, 10)));
  uint4 u4 = uint4(1, 2, 3, 4) * 3u + 1;
  CHECK(all(u4 == uint4(4, 7, 10, 13)));

  // Compound assignment, increments.
  float3 acc = 0.0f;
  acc += float3(1, 2, 3);
  acc *= 2;
  acc -= 1.0f;
  acc /= float3(1, 3, 5);
  CHECK(all(acc == float3(1, 1, 1)));
  int2 cnt = int2(1, 2);
  cnt <<= 2;
  cnt |= 1;
  ++cnt;
  cnt++;
  CHECK(all(cnt == int2(7, 11)));

  // half vectors: every operation in half.
  half4 hx = half4(1.0f, 2.0f, 3.0f, 4.0f);
  half4 hy = hx * half(0.5f) + 1;
  CHECK(all(hy == half4(1.5f, 2.0f, 2.5f, 3.0f)) && hy.y == 2);
  CHECK(dot(hx, half4(1)) == 10);
  bfloat2 bx = bfloat2(1.0f, 2.0f) * 2.0f;
  CHECK(bx.y == 4);

  // select, relational.
  float4 sel = select(float4(0), float4(1), bool4(true, false, true, false));
  CHECK(all(sel == float4(1, 0, 1, 0)) && all(select(a, c, true) == c));
  CHECK(all(isnan(float2(NAN, 1.0f)) == bool2(true, false)));

  // packed_* types: no padding, convert to vectors, index, swizzle, arithmetic.
  float data[6] = {1, 2, 3, 4, 5, 6};
  packed_float3* p = reinterpret_cast<packed_float3*>(data);
  float3 second = p[1];
  CHECK(second.x == 4 && second.z == 6 && p[1][1] == 5);
  p[0] = float3(7, 8, 9);
  CHECK(data[0] == 7 && data[2] == 9 && data[3] == 4);
  float3 sum = p[0] + p[1];
  CHECK(all(sum == float3(11, 13, 15)) && all(p[1] * 2.0f == float3(8, 10, 12)));
  p[1] += 1.0f;
  CHECK(data[3] == 5 && p[1].template swizzle<2, 0>().x == 7);
}

}  // namespace metal

KK_TEST_MAIN(test_vector, 1)
