// kernelkit/tensor_ops/formats.h: the element types a tensor op takes, and how each is read.
//
// half, bfloat (MSL's, or CUDA's __half / __nv_bfloat16), float, double, int8_t / uint8_t, int32_t, and
// Apple's 8-bit float formats metal_fp8_e4m3_format (OCP E4M3FN: bias 7, no infinities, S.1111.111
// is NaN), metal_fp8_e5m2_format (IEEE-like, bias 15) and metal_fp8_ue8m0_format (a power of two,
// 2^(bits - 127); 0xff is NaN: the MX scale format). A tensor's fourth template argument
// tensor_blockwise<tensor_plane_scales, metal_fp8_ue8m0_format, B0, B1> is its scales plane: one
// scale per B0 x B1 block of elements (innermost extent first, as the tensor's), stored packed,
// ceil(E0 / B0) scales per row of blocks; matmul2d::run multiplies each element by its block's scale.
#pragma once

namespace metal {
namespace kk_detail {
template <class F> struct float16;  // kernelkit/metal/half.h (absent from a CUDA-dialect kernel on the GPU)
struct half_format;
struct bfloat_format;
}  // namespace kk_detail

struct metal_fp8_e4m3_format { unsigned char bits; };
struct metal_fp8_e5m2_format { unsigned char bits; };
struct metal_fp8_ue8m0_format { unsigned char bits; };

struct tensor_plane_scales {};

// The scales plane of a multi-plane tensor (see above). Built from the plane's buffer.
template <class Plane, class Scale, kk::tops::usize B0, kk::tops::usize B1 = 1>
struct tensor_blockwise {
  static_assert(kk::tops::is_same_v<Plane, tensor_plane_scales>,
                "tensor_blockwise: the plane must be tensor_plane_scales");
  static_assert(kk::tops::is_same_v<kk::tops::remove_const_t<Scale>, metal_fp8_ue8m0_format>,
                "tensor_blockwise: kernelkit takes metal_fp8_ue8m0_format scales");
  static_assert(B0 > 0 && B1 > 0, "tensor_blockwise: block sizes must be positive");
  static constexpr kk::tops::usize block0 = B0, block1 = B1;
  const unsigned char* scales = nullptr;
  int row_blocks = 0;      // scales per row of blocks: ceil(extent 0 / B0), set by the tensor
  int origin0 = 0, origin1 = 0;  // a slice's origin in the whole tensor, in elements
  tensor_blockwise() = default;
  template <class P>
  KK_FN explicit tensor_blockwise(P* p) : scales(reinterpret_cast<const unsigned char*>(p)) {}
  // The scale of element (x, y) of the (sliced) tensor.
  KK_FN float scale(int x, int y) const;
};
}  // namespace metal

namespace kk {
namespace tops {

KK_FN float exp2i(int e) {  // 2^e for e in [-190, 127], exactly (subnormal results included)
  const float below = e < -126 ? 5.42101086242752217e-20f : 1.0f;  // 2^-64
  return __builtin_bit_cast(float, unsigned(e < -126 ? e + 64 + 127 : e + 127) << 23) * below;
}

constexpr unsigned kNaN = 0x7fc00000u, kInf = 0x7f800000u;  // float bit patterns

KK_FN float fp8_e4m3_to_float(unsigned char b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return __builtin_bit_cast(float, kNaN);
  return sign * (e == 0 ? float(m) * exp2i(-9) : float(8 + m) * exp2i(e - 10));
}
KK_FN float fp8_e5m2_to_float(unsigned char b) {
  const int e = (b >> 2) & 31, m = b & 3;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (e == 31) return m ? __builtin_bit_cast(float, kNaN) : sign * __builtin_bit_cast(float, kInf);
  return sign * (e == 0 ? float(m) * exp2i(-16) : float(4 + m) * exp2i(e - 17));
}
KK_FN float ue8m0_to_float(unsigned char b) {
  return b == 0xff ? __builtin_bit_cast(float, kNaN) : exp2i(int(b) - 127);
}

// How an element type is read and written in compute. kind drives the choice of the hardware
// path (matmul2d.h); to_float / from_float convert.
enum class kind { f32, f16, bf16, s8, u8, s32, e4m3, e5m2, other };

template <class T, class = void> struct number {
  static constexpr kind k = is_integer_v<T> ? (sizeof(T) == 4 ? kind::s32 : kind::other) : kind::f32;
  static_assert(is_integer_v<T> || is_same_v<T, float>,
                "tensor ops: unsupported element type (expected half, bfloat, float, int8_t, uint8_t, "
                "int32_t or a metal_fp8_*_format)");
  KK_FN static float to_float(T v) { return float(v); }
  KK_FN static T from_float(float f) { return T(f); }
};
// double: no tensor-core path takes it (kind other); products of two doubles sum in double.
template <> struct number<double> {
  static constexpr kind k = kind::other;
  KK_FN static float to_float(double v) { return float(v); }
  KK_FN static double from_float(float f) { return double(f); }
};
template <> struct number<signed char> {
  static constexpr kind k = kind::s8;
  KK_FN static float to_float(signed char v) { return float(v); }
  KK_FN static signed char from_float(float f) { return (signed char)(f); }
};
template <> struct number<char> : number<signed char> {};
template <> struct number<unsigned char> {
  static constexpr kind k = kind::u8;
  KK_FN static float to_float(unsigned char v) { return float(v); }
  KK_FN static unsigned char from_float(float f) { return (unsigned char)(f); }
};
template <class F> struct number<metal::kk_detail::float16<F>> {
  static constexpr kind k = is_same_v<F, metal::kk_detail::half_format> ? kind::f16 : kind::bf16;
  using T = metal::kk_detail::float16<F>;
  KK_FN static float to_float(T v) { return float(v); }
  KK_FN static T from_float(float f) { return T(f); }
};
#if defined(__CUDA_FP16_H__) && defined(KK_TARGET_CUDA)
template <> struct number<__half> {
  static constexpr kind k = kind::f16;
  KK_FN static float to_float(__half v) { return __half2float(v); }
  KK_FN static __half from_float(float f) { return __float2half_rn(f); }
};
#endif
#if defined(__CUDA_BF16_H__) && defined(KK_TARGET_CUDA)
template <> struct number<__nv_bfloat16> {
  static constexpr kind k = kind::bf16;
  KK_FN static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  KK_FN static __nv_bfloat16 from_float(float f) { return __float2bfloat16_rn(f); }
};
#endif
template <> struct number<metal::metal_fp8_e4m3_format> {
  static constexpr kind k = kind::e4m3;
  KK_FN static float to_float(metal::metal_fp8_e4m3_format v) { return fp8_e4m3_to_float(v.bits); }
};
template <> struct number<metal::metal_fp8_e5m2_format> {
  static constexpr kind k = kind::e5m2;
  KK_FN static float to_float(metal::metal_fp8_e5m2_format v) { return fp8_e5m2_to_float(v.bits); }
};
template <> struct number<metal::metal_fp8_ue8m0_format> {
  static constexpr kind k = kind::other;
  KK_FN static float to_float(metal::metal_fp8_ue8m0_format v) { return ue8m0_to_float(v.bits); }
};

template <class T> KK_FN float to_float(const T& v) { return number<remove_const_t<T>>::to_float(v); }
template <class T> KK_FN T from_float(float f) { return number<T>::from_float(f); }
template <class T> inline constexpr kind kind_of = number<remove_const_t<T>>::k;
template <class T> inline constexpr bool is_int8_v = kind_of<T> == kind::s8 || kind_of<T> == kind::u8;

}  // namespace tops
}  // namespace kk

template <class Plane, class Scale, kk::tops::usize B0, kk::tops::usize B1>
KK_FN float metal::tensor_blockwise<Plane, Scale, B0, B1>::scale(int x, int y) const {
  const int bx = (origin0 + x) / int(B0), by = (origin1 + y) / int(B1);
  return kk::tops::ue8m0_to_float(scales[by * row_blocks + bx]);
}

namespace kk {
namespace tops {
// The lowest and highest finite values of an element type (reduction identities).
template <class T> constexpr KK_FN T lowest() {
  if constexpr (is_integer_v<T>) return T(T(0) < T(-1) ? T(0) : T(T(1) << (8 * sizeof(T) - 1)));
  else if constexpr (is_same_v<T, double>) return -1.7976931348623157e308;
  else if constexpr (kind_of<T> == kind::f16) return T(-65504.0f);
  else if constexpr (kind_of<T> == kind::bf16) return T(-3.38953139e38f);
  else return T(-3.40282347e38f);
}
template <class T> constexpr KK_FN T highest() {
  if constexpr (is_integer_v<T>) return T(~lowest<T>());
  else if constexpr (is_same_v<T, double>) return 1.7976931348623157e308;
  else if constexpr (kind_of<T> == kind::f16) return T(65504.0f);
  else if constexpr (kind_of<T> == kind::bf16) return T(3.38953139e38f);
  else return T(3.40282347e38f);
}

// x as a To: exactly between equal types, between integers and into double, through float otherwise.
template <class To, class From>
KK_FN To convert(const From& x) {
  if constexpr (is_same_v<To, remove_const_t<From>>) return x;
  else if constexpr (is_integer_v<To> && is_integer_v<remove_const_t<From>>) return To(x);
  else if constexpr (is_same_v<To, double> && (is_same_v<remove_const_t<From>, float> || is_integer_v<remove_const_t<From>>))
    return double(x);
  else return from_float<To>(to_float(x));
}

// dst[i] = convert<To>(src[i]) for every i; floats into half or bfloat two at a time on the GPU
// (one instruction a pair, where one a value would need a second to pack them).
template <class To, class From, int N>
KK_FN void convert_all(To (&dst)[N], const From (&src)[N]) {
#if defined(KK_TARGET_CUDA)
  if constexpr (N % 2 == 0 && is_same_v<From, float> && sizeof(To) == 2 &&
                (kind_of<To> == kind::bf16 || kind_of<To> == kind::f16)) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      unsigned w;  // (cvt's first source is the upper half)
      if constexpr (kind_of<To> == kind::bf16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(src[i + 1]), "f"(src[i]));
      else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(src[i + 1]), "f"(src[i]));
      dst[i] = __builtin_bit_cast(To, static_cast<unsigned short>(w & 0xffffu));
      dst[i + 1] = __builtin_bit_cast(To, static_cast<unsigned short>(w >> 16));
    }
    return;
  }
#endif
  for (int i = 0; i < N; ++i) dst[i] = convert<To>(src[i]);
}
}  // namespace tops
}  // namespace kk
