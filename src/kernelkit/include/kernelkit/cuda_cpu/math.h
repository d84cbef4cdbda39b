// kernelkit/cuda_cpu/math.h: CUDA's math library and intrinsics on the CPU.
// Part of kernelkit/cuda_cpu.h, which includes it; not to be included alone.
#pragma once

// ===========================================================================
// Math. The C functions (expf, sinf, fmaxf...) and C++ overloads come from
// <math.h>; below are CUDA's additions.

// C++ math on a 16-bit float: CUDA converts it to float (one conversion); here
// half converts to float and double, so these overloads pick float.
#define KK_CUDA_F16_MATH1(NAME, RET)                                                             \
  inline RET NAME(__half x) { return std::NAME(float(x)); }                                    \
  inline RET NAME(__nv_bfloat16 x) { return std::NAME(float(x)); }
KK_CUDA_F16_MATH1(exp, float)
KK_CUDA_F16_MATH1(exp2, float)
KK_CUDA_F16_MATH1(expm1, float)
KK_CUDA_F16_MATH1(log, float)
KK_CUDA_F16_MATH1(log2, float)
KK_CUDA_F16_MATH1(log10, float)
KK_CUDA_F16_MATH1(log1p, float)
KK_CUDA_F16_MATH1(sqrt, float)
KK_CUDA_F16_MATH1(cbrt, float)
KK_CUDA_F16_MATH1(sin, float)
KK_CUDA_F16_MATH1(cos, float)
KK_CUDA_F16_MATH1(tan, float)
KK_CUDA_F16_MATH1(asin, float)
KK_CUDA_F16_MATH1(acos, float)
KK_CUDA_F16_MATH1(atan, float)
KK_CUDA_F16_MATH1(sinh, float)
KK_CUDA_F16_MATH1(cosh, float)
KK_CUDA_F16_MATH1(tanh, float)
KK_CUDA_F16_MATH1(asinh, float)
KK_CUDA_F16_MATH1(acosh, float)
KK_CUDA_F16_MATH1(atanh, float)
KK_CUDA_F16_MATH1(erf, float)
KK_CUDA_F16_MATH1(erfc, float)
KK_CUDA_F16_MATH1(tgamma, float)
KK_CUDA_F16_MATH1(lgamma, float)
KK_CUDA_F16_MATH1(fabs, float)
KK_CUDA_F16_MATH1(floor, float)
KK_CUDA_F16_MATH1(ceil, float)
KK_CUDA_F16_MATH1(round, float)
KK_CUDA_F16_MATH1(trunc, float)
KK_CUDA_F16_MATH1(rint, float)
KK_CUDA_F16_MATH1(isnan, bool)
KK_CUDA_F16_MATH1(isinf, bool)
KK_CUDA_F16_MATH1(isfinite, bool)
KK_CUDA_F16_MATH1(signbit, bool)
#undef KK_CUDA_F16_MATH1
namespace kk_cuda_cpu {
template <class... A>
constexpr bool f16_args = (... || is_f16<std::decay_t<A>>::value) &&
                          (... && (is_f16<std::decay_t<A>>::value || std::is_arithmetic<std::decay_t<A>>::value));
}  // namespace kk_cuda_cpu
#define KK_CUDA_F16_MATH2(NAME)                                                                       \
  template <class A, class B, std::enable_if_t<kk_cuda_cpu::f16_args<A, B>, int> = 0>                 \
  inline float NAME(A a, B b) { return std::NAME(static_cast<float>(a), static_cast<float>(b)); }
KK_CUDA_F16_MATH2(pow)
KK_CUDA_F16_MATH2(atan2)
KK_CUDA_F16_MATH2(fmod)
KK_CUDA_F16_MATH2(fmin)
KK_CUDA_F16_MATH2(fmax)
KK_CUDA_F16_MATH2(hypot)
KK_CUDA_F16_MATH2(copysign)
KK_CUDA_F16_MATH2(fdim)
#undef KK_CUDA_F16_MATH2

namespace kk_cuda_cpu {
constexpr double pi = 3.14159265358979323846;

// sin(pi x) and cos(pi x) with exact argument reduction: x = n/2 + f, |f| <= 1/4.
inline void sincospi(double x, double* s, double* c) {
  if (std::isinf(x) || x != x) {
    *s = *c = NAN;
    return;
  }
  const double n = nearbyint(2.0 * x);
  const double f = x - 0.5 * n;  // exact
  const double sf = sin(pi * f), cf = cos(pi * f);
  const long q = long(fmod(n, 4.0)) & 3;  // fmod is exact
  switch (q) {
    case 0: *s = sf; *c = cf; break;
    case 1: *s = cf; *c = -sf; break;
    case 2: *s = -sf; *c = -cf; break;
    default: *s = -cf; *c = sf; break;
  }
  if (*s == 0) *s = copysign(0.0, x);  // sinpi(-n) is -0 (and +0 for +n)
  if (*c == 0) *c = 0.0;               // cospi(n + 1/2) is +0
}

// erfinv and erfcinv: a first guess (Giles, "Approximating the erfinv
// function"), then Newton steps on erf(x) = y near 0 and on log(erfc(x)) =
// log(1 - y) in the tails, in double.
inline double erfinv_guess(double a) {  // 0 <= a < 1
  double w = -log((1.0 - a) * (1.0 + a)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  return p * a;
}
// x >= 0 with erfc(x) = t, 0 < t <= 1, from the guess x.
inline double erfc_solve(double x, double t) {
  const double k = 2.0 / sqrt(pi), lt = log(t);
  for (int i = 0; i < 8; ++i) {
    const double ec = erfc(x);
    if (!(ec > 0)) break;
    const double step = (log(ec) - lt) / (-k * exp(-x * x) / ec);
    x -= step;
    if (fabs(step) <= 1e-17 * x) break;
  }
  return x;
}
inline double erfinv(double y) {
  if (y != y || y < -1 || y > 1) return NAN;
  if (y == 1 || y == -1) return copysign(INFINITY, y);
  if (y == 0) return y;
  const double a = fabs(y);
  double x = erfinv_guess(a);
  if (a < 0.5) {
    const double k = 2.0 / sqrt(pi);
    for (int i = 0; i < 3; ++i) x -= (erf(x) - a) / (k * exp(-x * x));
  } else {
    x = erfc_solve(x, 1.0 - a);  // 1 - a is exact (Sterbenz)
  }
  return copysign(x, y);
}
inline double erfcinv(double z) {  // z in [0, 2]
  if (z != z || z < 0 || z > 2) return NAN;
  if (z == 0) return INFINITY;
  if (z == 2) return -INFINITY;
  if (z > 1) return -erfcinv(2.0 - z);  // 2 - z is exact
  if (z > 0.5) return erfinv(1.0 - z);  // exact
  double x;
  if (z > 1e-15) {
    x = erfinv_guess(1.0 - z);
  } else {  // erfc(x) ~ exp(-x^2) / (x sqrt(pi))
    x = sqrt(-log(z));
    x = sqrt(fmax(-log(z) - log(x * sqrt(pi)), 0.25));
  }
  return erfc_solve(x, z);
}

// exp(x^2) erfc(x): x^2 split exactly in two (hi + lo) so that exp does not
// magnify its rounding; the asymptotic series where erfc(x) underflows.
inline double erfcx(double x) {
  if (x < 26.0) {
    const double hi = x * x, lo = fma(x, x, -hi);
    return exp(hi) * exp(lo) * erfc(x);
  }
  const double r = 1.0 / (2.0 * x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 12; ++k) {
    term *= -(2.0 * k - 1.0) * r;
    sum += term;
  }
  return sum / (x * sqrt(pi));
}

// A float result of the exact value hi + lo (|lo| below half an ulp of hi, or
// hi exact), rounded with mode 'n', 'z', 'u' or 'd'.
inline float round_float(double hi, double lo, char mode) {
  float f = float(hi);
  if (hi != hi || std::isinf(hi)) return f;
  const double d = double(f) - hi;
  // sign of f - (hi + lo): d when nonzero (|d| >= one ulp of hi > |lo|), else -lo
  const int above = d > 0 ? 1 : d < 0 ? -1 : (lo < 0 ? 1 : lo > 0 ? -1 : 0);
  if (above == 0) return f;  // exact
  if (mode == 'n') {
    // hi a midpoint of two floats and lo breaking the tie the other way
    if (lo != 0) {
      const float g = nextafterf(f, above > 0 ? -INFINITY : INFINITY);
      if (!std::isinf(g) && double(f) - hi == hi - double(g) && d != 0) return (lo > 0) == (g > f) ? g : f;
    }
    return f;
  }
  const double exact_sign = hi != 0 ? hi : lo;
  bool toward_up;
  if (mode == 'u') {
    if (above > 0) return f;
    toward_up = true;
  } else if (mode == 'd') {
    if (above < 0) return f;
    toward_up = false;
  } else {  // 'z': the result must not be larger in magnitude
    if ((exact_sign > 0 && above < 0) || (exact_sign < 0 && above > 0)) return f;
    toward_up = exact_sign < 0;
  }
  return nextafterf(f, toward_up ? INFINITY : -INFINITY);
}
inline void two_sum(double a, double b, double* s, double* e) {
  *s = a + b;
  const double bb = *s - a;
  *e = (a - (*s - bb)) + (b - bb);
}
inline float fadd(float a, float b, char m) {
  double s, e;
  two_sum(a, b, &s, &e);
  return round_float(s, e, m);
}
inline float fmul(float a, float b, char m) { return round_float(double(a) * double(b), 0.0, m); }
inline float ffma(float a, float b, float c, char m) {
  double s, e;
  two_sum(double(a) * double(b), c, &s, &e);
  return round_float(s, e, m);
}
inline float fdiv(float a, float b, char m) {
  const double q = double(a) / double(b);
  if (q != q || std::isinf(q) || q == 0) return round_float(q, 0.0, m);
  const double r = fma(-q, double(b), double(a));  // exact remainder
  return round_float(q, r / double(b), m);
}
inline float fsqrt(float x, char m) {
  const double s = sqrt(double(x));
  if (s != s || std::isinf(s) || s == 0) return float(s);
  return round_float(s, fma(-s, s, double(x)) / (2.0 * s), m);
}
// An opaque copy: keeps a *_rn result from being fused into a neighbouring fma.
template <class T>
inline T opaque(T v) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  __asm__ volatile("" : "+m"(v));
#endif
  return v;
}

template <class I, class F>
inline I float_to_int(F f, char mode) {  // saturating, NaN -> 0, as the GPU converts
  if (f != f) return I(0);
  f = mode == 'n' ? std::nearbyint(f) : mode == 'z' ? std::trunc(f) : mode == 'd' ? std::floor(f) : std::ceil(f);
  if (f <= F(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (f >= F(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(f);
}
}  // namespace kk_cuda_cpu

// Functions CUDA adds to the C library, float and double (and C++ overloads).
inline float rsqrtf(float x) { return float(1.0 / sqrt(double(x))); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rsqrt(float x) { return rsqrtf(x); }
inline float rcbrtf(float x) { return float(1.0 / cbrt(double(x))); }
inline double rcbrt(double x) { return 1.0 / cbrt(x); }
inline float rcbrt(float x) { return rcbrtf(x); }
inline float exp10(float x) { return exp10f(x); }
inline void sincos(float x, float* s, float* c) { sincosf(x, s, c); }
inline void sincospi(double x, double* s, double* c) { kk_cuda_cpu::sincospi(x, s, c); }
inline void sincospif(float x, float* s, float* c) {
  double ds, dc;
  kk_cuda_cpu::sincospi(x, &ds, &dc);
  *s = float(ds);
  *c = float(dc);
}
inline void sincospi(float x, float* s, float* c) { sincospif(x, s, c); }
inline double sinpi(double x) { double s, c; kk_cuda_cpu::sincospi(x, &s, &c); return s; }
inline double cospi(double x) { double s, c; kk_cuda_cpu::sincospi(x, &s, &c); return c; }
inline float sinpif(float x) { return float(sinpi(double(x))); }
inline float cospif(float x) { return float(cospi(double(x))); }
inline float sinpi(float x) { return sinpif(x); }
inline float cospi(float x) { return cospif(x); }
inline double erfinv(double y) { return kk_cuda_cpu::erfinv(y); }
inline float erfinvf(float y) { return float(kk_cuda_cpu::erfinv(y)); }
inline float erfinv(float y) { return erfinvf(y); }
inline double erfcinv(double z) { return kk_cuda_cpu::erfcinv(z); }
inline float erfcinvf(float z) { return float(kk_cuda_cpu::erfcinv(z)); }
inline float erfcinv(float z) { return erfcinvf(z); }
inline double erfcx(double x) { return kk_cuda_cpu::erfcx(x); }
inline float erfcxf(float x) { return float(kk_cuda_cpu::erfcx(x)); }
inline float erfcx(float x) { return erfcxf(x); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }
inline float normcdff(float x) { return float(normcdf(double(x))); }
inline float normcdf(float x) { return normcdff(x); }
inline double normcdfinv(double p) { return -1.41421356237309504880 * kk_cuda_cpu::erfcinv(2.0 * p); }
inline float normcdfinvf(float p) { return float(normcdfinv(double(p))); }
inline float normcdfinv(float p) { return normcdfinvf(p); }
inline float fdividef(float x, float y) { return x / y; }
inline double rhypot(double x, double y) { return 1.0 / hypot(x, y); }
inline float rhypotf(float x, float y) { return float(rhypot(x, y)); }
inline float rhypot(float x, float y) { return rhypotf(x, y); }
inline double norm3d(double a, double b, double c) { return sqrt(a * a + b * b + c * c); }
inline float norm3df(float a, float b, float c) { return float(norm3d(a, b, c)); }
inline double rnorm3d(double a, double b, double c) { return 1.0 / norm3d(a, b, c); }
inline float rnorm3df(float a, float b, float c) { return float(rnorm3d(a, b, c)); }
inline double norm4d(double a, double b, double c, double d) { return sqrt(a * a + b * b + c * c + d * d); }
inline float norm4df(float a, float b, float c, float d) { return float(norm4d(a, b, c, d)); }
inline double rnorm4d(double a, double b, double c, double d) { return 1.0 / norm4d(a, b, c, d); }
inline float rnorm4df(float a, float b, float c, float d) { return float(rnorm4d(a, b, c, d)); }
inline double norm(int dim, const double* p) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += p[i] * p[i];
  return sqrt(s);
}
inline float normf(int dim, const float* p) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += double(p[i]) * p[i];
  return float(sqrt(s));
}
inline double rnorm(int dim, const double* p) { return 1.0 / norm(dim, p); }
inline float rnormf(int dim, const float* p) { return 1.0f / normf(dim, p); }

// Intrinsics. The fast approximations (__expf...) are the precise functions here.
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline float __tanhf(float x) { return tanhf(x); }

// Arithmetic with an explicit rounding mode (never fused with other operations).
#define KK_CUDA_ROUNDED(SFX, M)                                                                        \
  inline float __fadd_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fadd(a, b, M)); }  \
  inline float __fsub_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fadd(a, -b, M)); } \
  inline float __fmul_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fmul(a, b, M)); }  \
  inline float __fdiv_##SFX(float a, float b) { return kk_cuda_cpu::opaque(kk_cuda_cpu::fdiv(a, b, M)); }  \
  inline float __fmaf_##SFX(float a, float b, float c) { return kk_cuda_cpu::ffma(a, b, c, M); }          \
  inline float __frcp_##SFX(float a) { return kk_cuda_cpu::fdiv(1.0f, a, M); }                            \
  inline float __fsqrt_##SFX(float a) { return kk_cuda_cpu::fsqrt(a, M); }                                \
  inline float __int2float_##SFX(int i) { return kk_cuda_cpu::round_float(double(i), 0.0, M); }          \
  inline float __uint2float_##SFX(unsigned i) { return kk_cuda_cpu::round_float(double(i), 0.0, M); }    \
  inline float __double2float_##SFX(double d) { return kk_cuda_cpu::round_float(d, 0.0, M); }            \
  inline int __float2int_##SFX(float f) { return kk_cuda_cpu::float_to_int<int>(f, M); }                 \
  inline unsigned __float2uint_##SFX(float f) { return kk_cuda_cpu::float_to_int<unsigned>(f, M); }      \
  inline long long __float2ll_##SFX(float f) { return kk_cuda_cpu::float_to_int<long long>(f, M); }      \
  inline unsigned long long __float2ull_##SFX(float f) {                                                 \
    return kk_cuda_cpu::float_to_int<unsigned long long>(f, M);                                          \
  }                                                                                                      \
  inline int __double2int_##SFX(double f) { return kk_cuda_cpu::float_to_int<int>(f, M); }               \
  inline unsigned __double2uint_##SFX(double f) { return kk_cuda_cpu::float_to_int<unsigned>(f, M); }    \
  inline long long __double2ll_##SFX(double f) { return kk_cuda_cpu::float_to_int<long long>(f, M); }    \
  inline unsigned long long __double2ull_##SFX(double f) {                                               \
    return kk_cuda_cpu::float_to_int<unsigned long long>(f, M);                                          \
  }
KK_CUDA_ROUNDED(rn, 'n')
KK_CUDA_ROUNDED(rz, 'z')
KK_CUDA_ROUNDED(rd, 'd')
KK_CUDA_ROUNDED(ru, 'u')
#undef KK_CUDA_ROUNDED
inline float __fmaf_ieee_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frsqrt_rn(float x) { return float(1.0 / sqrt(double(x))); }
inline float __ll2float_rn(long long i) { return float(i); }
inline float __ull2float_rn(unsigned long long i) { return float(i); }
inline double __int2double_rn(int i) { return double(i); }
inline double __uint2double_rn(unsigned i) { return double(i); }
inline double __ll2double_rn(long long i) { return double(i); }
inline double __ull2double_rn(unsigned long long i) { return double(i); }
inline double __dadd_rn(double a, double b) { return kk_cuda_cpu::opaque(a + b); }
inline double __dsub_rn(double a, double b) { return kk_cuda_cpu::opaque(a - b); }
inline double __dmul_rn(double a, double b) { return kk_cuda_cpu::opaque(a * b); }
inline double __ddiv_rn(double a, double b) { return kk_cuda_cpu::opaque(a / b); }
inline double __drcp_rn(double a) { return kk_cuda_cpu::opaque(1.0 / a); }
inline double __dsqrt_rn(double a) { return sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

// Bit casts.
inline int __float_as_int(float f) { return kk::cpu_detail::bit_cast<int>(f); }
inline unsigned __float_as_uint(float f) { return kk::cpu_detail::bit_cast<unsigned>(f); }
inline float __int_as_float(int i) { return kk::cpu_detail::bit_cast<float>(i); }
inline float __uint_as_float(unsigned i) { return kk::cpu_detail::bit_cast<float>(i); }
inline long long __double_as_longlong(double d) { return kk::cpu_detail::bit_cast<long long>(d); }
inline double __longlong_as_double(long long i) { return kk::cpu_detail::bit_cast<double>(i); }
inline int __double2hiint(double d) { return int(kk::cpu_detail::bit_cast<unsigned long long>(d) >> 32); }
inline int __double2loint(double d) { return int(kk::cpu_detail::bit_cast<unsigned long long>(d) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
  return kk::cpu_detail::bit_cast<double>((static_cast<unsigned long long>(unsigned(hi)) << 32) | unsigned(lo));
}

// Integer intrinsics.
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll(static_cast<unsigned long long>(x)) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(unsigned(x))) << 32) | __brev(unsigned(x >> 32));
}
inline int __mulhi(int a, int b) { return int((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((static_cast<unsigned long long>(a) * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) { return (long long)((__int128)a * b >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}
inline int __mul24(int a, int b) {
  const int x = int(unsigned(a) << 8) >> 8, y = int(unsigned(b) << 8) >> 8;  // low 24 bits, signed
  return int(unsigned(x) * unsigned(y));
}
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __sad(int x, int y, unsigned z) {
  return z + (x > y ? unsigned(x) - unsigned(y) : unsigned(y) - unsigned(x));
}
inline unsigned __usad(unsigned x, unsigned y, unsigned z) { return z + (x > y ? x - y : y - x); }
inline int __hadd(int a, int b) { return int((static_cast<long long>(a) + b) >> 1); }
inline int __rhadd(int a, int b) { return int((static_cast<long long>(a) + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return unsigned((static_cast<unsigned long long>(a) + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) {
  return unsigned((static_cast<unsigned long long>(a) + b + 1) >> 1);
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y, x} (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift < 32u ? shift : 32u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift & 31u));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift < 32u ? shift : 32u));
}
// Dot products of the four bytes (two halves) of a and b, plus c.
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int(static_cast<signed char>(a >> (8 * i))) * int(static_cast<signed char>(b >> (8 * i)));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
  return c;
}

// CUDA's global min and max overloads (math_functions.hpp), and umin & co.
#define KK_CUDA_MINMAX(R, A, B)                                       \
  inline R min(A a, B b) {                                            \
    const R x = static_cast<R>(a), y = static_cast<R>(b);             \
    return y < x ? y : x;                                             \
  }                                                                   \
  inline R max(A a, B b) {                                            \
    const R x = static_cast<R>(a), y = static_cast<R>(b);             \
    return x < y ? y : x;                                             \
  }
KK_CUDA_MINMAX(int, int, int)
KK_CUDA_MINMAX(unsigned, unsigned, unsigned)
KK_CUDA_MINMAX(unsigned, int, unsigned)
KK_CUDA_MINMAX(unsigned, unsigned, int)
KK_CUDA_MINMAX(long, long, long)
KK_CUDA_MINMAX(unsigned long, unsigned long, unsigned long)
KK_CUDA_MINMAX(unsigned long, long, unsigned long)
KK_CUDA_MINMAX(unsigned long, unsigned long, long)
KK_CUDA_MINMAX(long long, long long, long long)
KK_CUDA_MINMAX(unsigned long long, unsigned long long, unsigned long long)
KK_CUDA_MINMAX(unsigned long long, long long, unsigned long long)
KK_CUDA_MINMAX(unsigned long long, unsigned long long, long long)
#undef KK_CUDA_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(double(a), b); }
inline double max(float a, double b) { return fmax(double(a), b); }
inline double min(double a, float b) { return fmin(a, double(b)); }
inline double max(double a, float b) { return fmax(a, double(b)); }
inline unsigned umin(unsigned a, unsigned b) { return min(a, b); }
inline unsigned umax(unsigned a, unsigned b) { return max(a, b); }
inline long long llmin(long long a, long long b) { return min(a, b); }
inline long long llmax(long long a, long long b) { return max(a, b); }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return min(a, b); }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return max(a, b); }
