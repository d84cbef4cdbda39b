// kernelkit/cuda_cpu/fp16.h: __half, __nv_bfloat16 and their pairs (cuda_fp16.h, cuda_bf16.h).
// Part of kernelkit/cuda_cpu.h, which includes it; not to be included alone.
#pragma once

// ===========================================================================
// 16-bit floats: __half and __nv_bfloat16 are MSL's half and bfloat (2 bytes,
// trivially copyable; + - * / in float, rounded to nearest even, which is
// correctly rounded; half op float gives float).

typedef metal::half __half;
typedef metal::bfloat __nv_bfloat16;
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

namespace kk_cuda_cpu {
template <class H>
struct alignas(4) f16x2 {
  H x, y;
  f16x2() = default;
  constexpr f16x2(const H& a, const H& b) : x(a), y(b) {}
};
template <class H>
struct is_f16 : std::false_type {};
template <> struct is_f16<__half> : std::true_type {};
template <> struct is_f16<__nv_bfloat16> : std::true_type {};
}  // namespace kk_cuda_cpu

typedef kk_cuda_cpu::f16x2<__half> __half2;
typedef kk_cuda_cpu::f16x2<__nv_bfloat16> __nv_bfloat162;
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

// Bit-level views, as CUDA's __half_raw / __nv_bfloat16_raw.
struct __half_raw {
  unsigned short x;
  __half_raw() = default;
  constexpr __half_raw(unsigned short v) : x(v) {}
  constexpr __half_raw(const __half& h) : x(h.bits) {}
  constexpr operator __half() const { return __half::from_bits(x); }
};
struct __nv_bfloat16_raw {
  unsigned short x;
  __nv_bfloat16_raw() = default;
  constexpr __nv_bfloat16_raw(unsigned short v) : x(v) {}
  constexpr __nv_bfloat16_raw(const __nv_bfloat16& h) : x(h.bits) {}
  constexpr operator __nv_bfloat16() const { return __nv_bfloat16::from_bits(x); }
};
struct __half2_raw {
  unsigned short x, y;
  constexpr operator __half2() const { return __half2(__half::from_bits(x), __half::from_bits(y)); }
};
struct __nv_bfloat162_raw {
  unsigned short x, y;
  constexpr operator __nv_bfloat162() const {
    return __nv_bfloat162(__nv_bfloat16::from_bits(x), __nv_bfloat16::from_bits(y));
  }
};

namespace kk_cuda_cpu {
// float -> F with a rounding mode: 'n' nearest even, 'z' toward zero, 'd' down, 'u' up.
// Round to nearest, then step one unit where that went the wrong way.
template <class H>
inline unsigned short f16_step(unsigned short b, bool up) {  // next value up or down
  const bool neg = b & 0x8000u;
  const unsigned short mag = b & 0x7fffu;
  if (mag == 0) return up ? 0x0001u : 0x8001u;
  return static_cast<unsigned short>((up != neg) ? b + 1 : b - 1);
}
template <class H>
inline H f16_from_float(float f, char mode) {
  const H h = H(f);
  if (mode == 'n' || f != f) return h;
  const float back = float(h);
  bool step, up;
  if (mode == 'u') {
    step = back < f, up = true;
  } else if (mode == 'd') {
    step = back > f, up = false;
  } else {  // 'z'
    step = fabsf(back) > fabsf(f), up = back < 0;
  }
  return step ? H::from_bits(f16_step<H>(h.bits, up)) : h;
}

// double -> float rounded to odd (the last bit set when inexact): rounding that
// to a 16-bit float then is correct rounding of the double (float keeps more
// than two extra bits).
inline float float_round_odd(double d) {
  float f = float(d);
  if (double(f) == d || d != d || std::isinf(f)) return f;  // exact, NaN, overflow
  uint32_t u;
  memcpy(&u, &f, 4);
  if (fabs(double(f)) > fabs(d)) u -= 1;  // truncate toward zero...
  u |= 1u;                                 // ...and mark inexact
  memcpy(&f, &u, 4);
  return f;
}
// hi + lo (|lo| below half an ulp of hi) rounded to odd in double.
inline double double_round_odd(double hi, double lo) {
  if (lo == 0 || hi != hi || std::isinf(hi)) return hi;
  uint64_t u;
  memcpy(&u, &hi, 8);
  if ((u & 1u) == 0) hi = nextafter(hi, lo > 0 ? INFINITY : -INFINITY);
  return hi;
}
template <class H>
inline H f16_from_double(double d) { return H(float_round_odd(d)); }
// a * b + c, rounded once.
template <class H>
inline H f16_fma(H a, H b, H c) {
  const double p = double(float(a)) * double(float(b));  // exact (at most 22 bits)
  const double cc = double(float(c));
  const double s = p + cc;                                // TwoSum: s + e == p + c exactly
  const double bb = s - p;
  const double e = (p - (s - bb)) + (cc - bb);
  return f16_from_double<H>(double_round_odd(s, e));
}

template <class H>
inline H f16_sat(H a) {  // clamp to [0, 1], NaN -> 0
  const float f = float(a);
  return f > 0.0f ? (f < 1.0f ? a : H(1.0f)) : H(0.0f);
}
template <class I, class H>
inline I f16_to_int(H h, char mode) {  // saturating, NaN -> 0, as the GPU converts
  float f = float(h);
  if (f != f) return I(0);
  f = mode == 'n' ? nearbyintf(f) : mode == 'z' ? truncf(f) : mode == 'd' ? floorf(f) : ceilf(f);
  if (f <= float(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (f >= float(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(f);
}
template <class H, class I>
inline H int_to_f16(I v, char mode) {
  const double d = double(v);  // exact up to 2^53; the 16-bit range is far below
  return f16_from_float<H>(float(d), mode);
}
}  // namespace kk_cuda_cpu

// Conversions
#define KK_CUDA_F16_CONVERSIONS(H, F2H, H2F, SFX)                                                   \
  inline H F2H(float f) { return H(f); }                                                           \
  inline H F2H##_rn(float f) { return H(f); }                                                      \
  inline H F2H##_rz(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'z'); }                    \
  inline H F2H##_rd(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'd'); }                    \
  inline H F2H##_ru(float f) { return kk_cuda_cpu::f16_from_float<H>(f, 'u'); }                    \
  inline float H2F(H h) { return float(h); }                                                       \
  inline H __double2##SFX(double d) { return kk_cuda_cpu::f16_from_double<H>(d); }                 \
  inline unsigned short __##SFX##_as_ushort(H h) { return h.bits; }                                \
  inline short __##SFX##_as_short(H h) { return short(h.bits); }                                   \
  inline H __ushort_as_##SFX(unsigned short b) { return H::from_bits(b); }                         \
  inline H __short_as_##SFX(short b) { return H::from_bits(static_cast<unsigned short>(b)); }
KK_CUDA_F16_CONVERSIONS(__half, __float2half, __half2float, half)
KK_CUDA_F16_CONVERSIONS(__nv_bfloat16, __float2bfloat16, __bfloat162float, bfloat16)
#undef KK_CUDA_F16_CONVERSIONS

#define KK_CUDA_F16_INT(H, SFX, I, ISFX)                                                             \
  inline I __##SFX##2##ISFX##_rn(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'n'); }                 \
  inline I __##SFX##2##ISFX##_rz(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'z'); }                 \
  inline I __##SFX##2##ISFX##_rd(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'd'); }                 \
  inline I __##SFX##2##ISFX##_ru(H h) { return kk_cuda_cpu::f16_to_int<I>(h, 'u'); }                 \
  inline H __##ISFX##2##SFX##_rn(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'n'); }                 \
  inline H __##ISFX##2##SFX##_rz(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'z'); }                 \
  inline H __##ISFX##2##SFX##_rd(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'd'); }                 \
  inline H __##ISFX##2##SFX##_ru(I v) { return kk_cuda_cpu::int_to_f16<H>(v, 'u'); }
#define KK_CUDA_F16_INTS(H, SFX)                    \
  KK_CUDA_F16_INT(H, SFX, int, int)                 \
  KK_CUDA_F16_INT(H, SFX, unsigned, uint)           \
  KK_CUDA_F16_INT(H, SFX, short, short)             \
  KK_CUDA_F16_INT(H, SFX, unsigned short, ushort)   \
  KK_CUDA_F16_INT(H, SFX, long long, ll)            \
  KK_CUDA_F16_INT(H, SFX, unsigned long long, ull)
KK_CUDA_F16_INTS(__half, half)
KK_CUDA_F16_INTS(__nv_bfloat16, bfloat16)
#undef KK_CUDA_F16_INTS
#undef KK_CUDA_F16_INT
inline signed char __half2char_rz(__half h) { return kk_cuda_cpu::f16_to_int<signed char>(h, 'z'); }
inline unsigned char __half2uchar_rz(__half h) { return kk_cuda_cpu::f16_to_int<unsigned char>(h, 'z'); }

// Arithmetic and comparisons (the same names for both types, as CUDA).
#define KK_CUDA_F16_OPS(H)                                                                          \
  inline H __hadd(H a, H b) { return H(float(a) + float(b)); }                                     \
  inline H __hsub(H a, H b) { return H(float(a) - float(b)); }                                     \
  inline H __hmul(H a, H b) { return H(float(a) * float(b)); }                                     \
  inline H __hdiv(H a, H b) { return H(float(a) / float(b)); }                                     \
  inline H __hadd_rn(H a, H b) { return __hadd(a, b); }                                             \
  inline H __hsub_rn(H a, H b) { return __hsub(a, b); }                                             \
  inline H __hmul_rn(H a, H b) { return __hmul(a, b); }                                             \
  inline H __hfma(H a, H b, H c) { return kk_cuda_cpu::f16_fma(a, b, c); }                          \
  inline H __hneg(H a) { return H::from_bits(static_cast<unsigned short>(a.bits ^ 0x8000u)); }      \
  inline H __habs(H a) { return H::from_bits(static_cast<unsigned short>(a.bits & 0x7fffu)); }      \
  inline H __hadd_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hadd(a, b)); }                      \
  inline H __hsub_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hsub(a, b)); }                      \
  inline H __hmul_sat(H a, H b) { return kk_cuda_cpu::f16_sat(__hmul(a, b)); }                      \
  inline H __hfma_sat(H a, H b, H c) { return kk_cuda_cpu::f16_sat(__hfma(a, b, c)); }              \
  inline H __hfma_relu(H a, H b, H c) {                                                             \
    H r = __hfma(a, b, c);                                                                          \
    return float(r) < 0.0f ? H(0.0f) : r;                                                           \
  }                                                                                                 \
  inline H __hmax(H a, H b) { return H(fmaxf(float(a), float(b))); }                               \
  inline H __hmin(H a, H b) { return H(fminf(float(a), float(b))); }                               \
  inline H __hmax_nan(H a, H b) { return (a != a || b != b) ? H(NAN) : __hmax(a, b); }             \
  inline H __hmin_nan(H a, H b) { return (a != a || b != b) ? H(NAN) : __hmin(a, b); }             \
  inline bool __heq(H a, H b) { return float(a) == float(b); }                                      \
  inline bool __hne(H a, H b) { return float(a) < float(b) || float(a) > float(b); }                \
  inline bool __hlt(H a, H b) { return float(a) < float(b); }                                       \
  inline bool __hle(H a, H b) { return float(a) <= float(b); }                                      \
  inline bool __hgt(H a, H b) { return float(a) > float(b); }                                       \
  inline bool __hge(H a, H b) { return float(a) >= float(b); }                                      \
  inline bool __hequ(H a, H b) { return !(float(a) < float(b) || float(a) > float(b)); }            \
  inline bool __hneu(H a, H b) { return !(float(a) == float(b)); }                                  \
  inline bool __hltu(H a, H b) { return !(float(a) >= float(b)); }                                  \
  inline bool __hleu(H a, H b) { return !(float(a) > float(b)); }                                   \
  inline bool __hgtu(H a, H b) { return !(float(a) <= float(b)); }                                  \
  inline bool __hgeu(H a, H b) { return !(float(a) < float(b)); }                                   \
  inline bool __hisnan(H a) { return (a.bits & 0x7fffu) > H(INFINITY).bits; }                    \
  inline int __hisinf(H a) {                                                                        \
    return (a.bits & 0x7fffu) == H(INFINITY).bits ? ((a.bits & 0x8000u) ? -1 : 1) : 0;             \
  }                                                                                                 \
  inline H hexp(H a) { return H(expf(float(a))); }                                                  \
  inline H hexp2(H a) { return H(exp2f(float(a))); }                                                \
  inline H hexp10(H a) { return H(exp10f(float(a))); }                                              \
  inline H hlog(H a) { return H(logf(float(a))); }                                                  \
  inline H hlog2(H a) { return H(log2f(float(a))); }                                                \
  inline H hlog10(H a) { return H(log10f(float(a))); }                                              \
  inline H hsqrt(H a) { return H(sqrtf(float(a))); }                                                \
  inline H hrsqrt(H a) { return H(1.0f / sqrtf(float(a))); }                                        \
  inline H hrcp(H a) { return H(1.0f / float(a)); }                                                 \
  inline H hsin(H a) { return H(sinf(float(a))); }                                                  \
  inline H hcos(H a) { return H(cosf(float(a))); }                                                  \
  inline H htanh(H a) { return H(tanhf(float(a))); }                                                \
  inline H htanh_approx(H a) { return htanh(a); }                                                   \
  inline H hfloor(H a) { return H(floorf(float(a))); }                                              \
  inline H hceil(H a) { return H(ceilf(float(a))); }                                                \
  inline H htrunc(H a) { return H(truncf(float(a))); }                                              \
  inline H hrint(H a) { return H(nearbyintf(float(a))); }
KK_CUDA_F16_OPS(__half)
KK_CUDA_F16_OPS(__nv_bfloat16)
#undef KK_CUDA_F16_OPS

// Pairs: __half2 and __nv_bfloat162 (element-wise, same names for both).
#define KK_CUDA_F16X2_MAP1(NAME, F)                                                           \
  template <class H> inline kk_cuda_cpu::f16x2<H> NAME(kk_cuda_cpu::f16x2<H> a) {             \
    return kk_cuda_cpu::f16x2<H>(F(a.x), F(a.y));                                             \
  }
#define KK_CUDA_F16X2_MAP2(NAME, F)                                                                         \
  template <class H> inline kk_cuda_cpu::f16x2<H> NAME(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {  \
    return kk_cuda_cpu::f16x2<H>(F(a.x, b.x), F(a.y, b.y));                                                 \
  }
KK_CUDA_F16X2_MAP2(__hadd2, __hadd)
KK_CUDA_F16X2_MAP2(__hsub2, __hsub)
KK_CUDA_F16X2_MAP2(__hmul2, __hmul)
KK_CUDA_F16X2_MAP2(__h2div, __hdiv)
KK_CUDA_F16X2_MAP2(__hadd2_sat, __hadd_sat)
KK_CUDA_F16X2_MAP2(__hsub2_sat, __hsub_sat)
KK_CUDA_F16X2_MAP2(__hmul2_sat, __hmul_sat)
KK_CUDA_F16X2_MAP2(__hmax2, __hmax)
KK_CUDA_F16X2_MAP2(__hmin2, __hmin)
KK_CUDA_F16X2_MAP2(__hmax2_nan, __hmax_nan)
KK_CUDA_F16X2_MAP2(__hmin2_nan, __hmin_nan)
KK_CUDA_F16X2_MAP1(__hneg2, __hneg)
KK_CUDA_F16X2_MAP1(__habs2, __habs)
KK_CUDA_F16X2_MAP1(h2exp, hexp)
KK_CUDA_F16X2_MAP1(h2exp2, hexp2)
KK_CUDA_F16X2_MAP1(h2exp10, hexp10)
KK_CUDA_F16X2_MAP1(h2log, hlog)
KK_CUDA_F16X2_MAP1(h2log2, hlog2)
KK_CUDA_F16X2_MAP1(h2log10, hlog10)
KK_CUDA_F16X2_MAP1(h2sqrt, hsqrt)
KK_CUDA_F16X2_MAP1(h2rsqrt, hrsqrt)
KK_CUDA_F16X2_MAP1(h2rcp, hrcp)
KK_CUDA_F16X2_MAP1(h2sin, hsin)
KK_CUDA_F16X2_MAP1(h2cos, hcos)
KK_CUDA_F16X2_MAP1(h2tanh, htanh)
KK_CUDA_F16X2_MAP1(h2floor, hfloor)
KK_CUDA_F16X2_MAP1(h2ceil, hceil)
KK_CUDA_F16X2_MAP1(h2trunc, htrunc)
KK_CUDA_F16X2_MAP1(h2rint, hrint)
#undef KK_CUDA_F16X2_MAP1
#undef KK_CUDA_F16X2_MAP2
template <class H>
inline kk_cuda_cpu::f16x2<H> __hfma2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b, kk_cuda_cpu::f16x2<H> c) {
  return kk_cuda_cpu::f16x2<H>(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
// Comparisons: __hb*2 are true when both halves compare true; __h*2 give 1.0 or 0.0 per half.
#define KK_CUDA_F16X2_CMP(OP, CMP)                                                                  \
  template <class H> inline bool __hb##OP##2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {    \
    return CMP(a.x, b.x) && CMP(a.y, b.y);                                                          \
  }                                                                                                 \
  template <class H>                                                                                \
  inline kk_cuda_cpu::f16x2<H> __h##OP##2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {       \
    return kk_cuda_cpu::f16x2<H>(H(CMP(a.x, b.x) ? 1.0f : 0.0f), H(CMP(a.y, b.y) ? 1.0f : 0.0f));  \
  }
KK_CUDA_F16X2_CMP(eq, __heq)
KK_CUDA_F16X2_CMP(ne, __hne)
KK_CUDA_F16X2_CMP(lt, __hlt)
KK_CUDA_F16X2_CMP(le, __hle)
KK_CUDA_F16X2_CMP(gt, __hgt)
KK_CUDA_F16X2_CMP(ge, __hge)
#undef KK_CUDA_F16X2_CMP

namespace kk_cuda_cpu {
// Operators of the pairs (found by argument-dependent lookup).
#define KK_CUDA_F16X2_OP(OP, FN)                                                                  \
  template <class H> inline f16x2<H> operator OP(f16x2<H> a, f16x2<H> b) { return FN(a, b); }    \
  template <class H> inline f16x2<H>& operator OP##=(f16x2<H>& a, f16x2<H> b) { return a = FN(a, b); }
KK_CUDA_F16X2_OP(+, ::__hadd2)
KK_CUDA_F16X2_OP(-, ::__hsub2)
KK_CUDA_F16X2_OP(*, ::__hmul2)
KK_CUDA_F16X2_OP(/, ::__h2div)
#undef KK_CUDA_F16X2_OP
template <class H> inline f16x2<H> operator-(f16x2<H> a) { return ::__hneg2(a); }
template <class H> inline f16x2<H> operator+(f16x2<H> a) { return a; }
template <class H> inline bool operator==(f16x2<H> a, f16x2<H> b) { return ::__hbeq2(a, b); }
template <class H> inline bool operator!=(f16x2<H> a, f16x2<H> b) { return ::__hbne2(a, b); }
template <class H> inline bool operator<(f16x2<H> a, f16x2<H> b) { return ::__hblt2(a, b); }
template <class H> inline bool operator<=(f16x2<H> a, f16x2<H> b) { return ::__hble2(a, b); }
template <class H> inline bool operator>(f16x2<H> a, f16x2<H> b) { return ::__hbgt2(a, b); }
template <class H> inline bool operator>=(f16x2<H> a, f16x2<H> b) { return ::__hbge2(a, b); }
}  // namespace kk_cuda_cpu

// Building and taking apart pairs.
inline __half2 make_half2(__half x, __half y) { return __half2(x, y); }
inline __half2 __halves2half2(__half x, __half y) { return __half2(x, y); }
inline __half2 __half2half2(__half x) { return __half2(x, x); }
inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
inline __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 x) { return __nv_bfloat162(x, x); }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __nv_bfloat162(__nv_bfloat16(f), __nv_bfloat16(f)); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b)); }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162(__nv_bfloat16(f.x), __nv_bfloat16(f.y)); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
template <class H> inline float __low2float(kk_cuda_cpu::f16x2<H> h) { return float(h.x); }
template <class H> inline float __high2float(kk_cuda_cpu::f16x2<H> h) { return float(h.y); }
template <class H> inline kk_cuda_cpu::f16x2<H> __lows2half2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {
  return kk_cuda_cpu::f16x2<H>(a.x, b.x);
}
template <class H> inline kk_cuda_cpu::f16x2<H> __highs2half2(kk_cuda_cpu::f16x2<H> a, kk_cuda_cpu::f16x2<H> b) {
  return kk_cuda_cpu::f16x2<H>(a.y, b.y);
}
template <class H> inline kk_cuda_cpu::f16x2<H> __low2half2(kk_cuda_cpu::f16x2<H> a) { return kk_cuda_cpu::f16x2<H>(a.x, a.x); }
template <class H> inline kk_cuda_cpu::f16x2<H> __high2half2(kk_cuda_cpu::f16x2<H> a) { return kk_cuda_cpu::f16x2<H>(a.y, a.y); }
template <class H> inline kk_cuda_cpu::f16x2<H> __lowhigh2highlow(kk_cuda_cpu::f16x2<H> a) {
  return kk_cuda_cpu::f16x2<H>(a.y, a.x);
}
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __lows2half2(a, b); }
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __highs2half2(a, b); }
inline __nv_bfloat162 __low2bfloat162(__nv_bfloat162 a) { return __low2half2(a); }
inline __nv_bfloat162 __high2bfloat162(__nv_bfloat162 a) { return __high2half2(a); }

// Atomics on 16-bit floats: a CAS loop, arithmetic in float rounded back.
inline __half atomicAdd(__half* address, __half val) { return kk::atomic_fetch_add(address, val); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 val) { return kk::atomic_fetch_add(address, val); }
template <class H>
inline kk_cuda_cpu::f16x2<H> atomicAdd(kk_cuda_cpu::f16x2<H>* address, kk_cuda_cpu::f16x2<H> val) {
  return kk::cpu_detail::cas_update(address, [val](kk_cuda_cpu::f16x2<H> o) { return __hadd2(o, val); });
}

// Limits and constants of cuda_fp16.h / cuda_bf16.h.
#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_FP16 __ushort_as_half((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_NEG_ZERO_FP16 __ushort_as_half((unsigned short)0x8000U)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)
#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_BF16 __ushort_as_bfloat16((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_NEG_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x8000U)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)
