// kernelkit/tensor_ops/simdgroup_matrix.h: MSL's simdgroup_matrix<T, 8, 8> (float, half, bfloat)
// with simdgroup_load / simdgroup_store / simdgroup_multiply / simdgroup_multiply_accumulate /
// make_filled_simdgroup_matrix, in namespace metal (the MSL dialect only).
//
// Each of the 32 lanes holds two elements, thread_elements() (a vec<T, 2>), at the place Apple's
// GPUs put them and MLX's steel kernels assume (BaseMMAFrag::get_coord): lane l, q = l / 4, holds
// row (q & 4) + (l / 2) % 4, columns (q & 2) * 2 + (l % 2) * 2 and the next one. Every lane calls
// a product together, as Metal requires; it is computed in float and rounded to T once. On the CPU
// each lane reads the row and columns it needs from the lanes that hold them. On NVIDIA (sm_80+)
// a product is one m16n8k8 mma.sync (rows 8..15 zero; half, bfloat: f16 / bf16 inputs; float: one
// f16 / bf16 product where the values are half or bfloat numbers, else 3xTF32: fp32 accuracy), for
// a and b of one type and any accumulator. Such a kernel, launched in whole warps, numbers its
// lanes so that Metal lane l runs on the PTX fragment's lane 4 * row + col / 2 (target_cuda.h,
// KK_MMA_LANE_ORDER): then a, c and d are already in mma.sync's layout and b is one movmatrix
// away. In a threadgroup that is not whole warps the lanes keep the hardware's order and the
// operands move by shuffles. bench/notes/simdgroup_matrix.md has the measurements.
#pragma once

namespace metal {

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "simdgroup_matrix: kernelkit has 8x8 matrices");
  static_assert(kk::tops::is_same_v<T, float> || kk::tops::kind_of<T> == kk::tops::kind::f16 ||
                    kk::tops::kind_of<T> == kk::tops::kind::bf16,
                "simdgroup_matrix: T must be float, half or bfloat");
  using value_type = T;
  vec<T, 2> e;

  simdgroup_matrix() = default;
  // A diagonal matrix of dval (MSL).
  KK_FN explicit simdgroup_matrix(T dval) {
    const int r = row(), c = col();
    e[0] = r == c ? dval : T(0);
    e[1] = r == c + 1 ? dval : T(0);
  }
  KK_FN vec<T, 2>& thread_elements() { return e; }
  KK_FN const vec<T, 2>& thread_elements() const { return e; }

  // This lane's row, and the column of its first element (by Metal lane: thread_index_in_simdgroup).
  static KK_FN int row() {
    const int l = int(kk::simd_lane()), q = l >> 2;
    return (q & 4) + ((l >> 1) & 3);
  }
  static KK_FN int col() {
    const int l = int(kk::simd_lane()), q = l >> 2;
    return (q & 2) * 2 + (l & 1) * 2;
  }
  // The element v (of the lane holding it, Metal lane `lane`) for every lane.
  template <class V> static KK_FN V read(const V& v, unsigned lane, const kk::site& s) {
    return kk::tops::lane_read(v, kk::hw_of(lane), s);
  }
  // The lane holding (r, c): the inverse of row() and col(); the element is c % 2.
  static constexpr KK_FN unsigned lane_of(int r, int c) {
    return unsigned(((r >> 2) & 1) << 4 | ((c >> 2) & 1) << 3 | ((r >> 1) & 1) << 2 | (r & 1) << 1 | ((c >> 1) & 1));
  }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

// Rows defaults to Cols, as <metal_simdgroup_matrix> declares it: llama.cpp writes
// make_filled_simdgroup_matrix<float, 8>(0.f).
template <class T, int Cols, int Rows = Cols>
KK_FN simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.e[0] = value;
  m.e[1] = value;
  return m;
}

// d(r, c) = src[(origin.y + r) * elements_per_row + origin.x + c]; transposed, d(r, c) is read at
// (origin.y + c, origin.x + r).
template <class T, int Cols, int Rows, class U>
KK_FN void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const U* src, ulong elements_per_row = Cols,
                          ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
  const long r = simdgroup_matrix<T, Cols, Rows>::row(), c = simdgroup_matrix<T, Cols, Rows>::col();
  const long ld = long(elements_per_row);
  const U* base = src + long(matrix_origin.y) * ld + long(matrix_origin.x);
  for (int j = 0; j < 2; ++j) d.e[j] = T(transpose_matrix ? base[(c + j) * ld + r] : base[r * ld + c + j]);
}
template <class T, int Cols, int Rows, class U>
KK_FN void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& a, U* dst, ulong elements_per_row = Cols,
                           ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
  const long r = simdgroup_matrix<T, Cols, Rows>::row(), c = simdgroup_matrix<T, Cols, Rows>::col();
  const long ld = long(elements_per_row);
  U* base = dst + long(matrix_origin.y) * ld + long(matrix_origin.x);
  for (int j = 0; j < 2; ++j) (transpose_matrix ? base[(c + j) * ld + r] : base[r * ld + c + j]) = U(a.e[j]);
}

namespace kk_detail {
// a * b (+ c) for this lane's two elements, in float.
template <class T, class TA, class TB>
KK_FN void simdgroup_product(float (&out)[2], const simdgroup_matrix<TA, 8, 8>& a, const simdgroup_matrix<TB, 8, 8>& b,
                             const kk::site& s) {
  using M = simdgroup_matrix<T, 8, 8>;
  kk::tops::check_scope(1, s);
  const int r = M::row(), c = M::col();
  for (int k = 0; k < 8; ++k) {
    const float x = float(M::read(a.e[k & 1], M::lane_of(r, k), s));
    const float y0 = float(M::read(b.e[0], M::lane_of(k, c), s));
    const float y1 = float(M::read(b.e[1], M::lane_of(k, c), s));
    out[0] += x * y0;
    out[1] += x * y1;
  }
}
}  // namespace kk_detail

#if defined(KK_TARGET_CUDA) && defined(KK_TOPS_MMA_SYNC)
namespace kk_detail {
template <class I> KK_FN unsigned pack_pair(const vec<I, 2>& v) {
  return kk::tops::pack16(*reinterpret_cast<const unsigned short*>(&v[0]), *reinterpret_cast<const unsigned short*>(&v[1]));
}
// acc += a * b in fp32 accuracy from three TF32 m16n8k8 products (hi*hi, lo*hi, hi*lo), rows 8..15
// of A zero: this lane's A elements in k slots t and t + 4, B elements in k slots t and t + 4 of
// column g. Where every element is a TF32 number (half's, bfloat's) the lo products are zero, and
// skipped: MLX's steel kernels multiply float fragments loaded from half or bfloat data.
KK_FN void mma_3xtf32(float (&acc)[4], float a0, float a2, float b0, float b1) {
  const float x[2] = {a0, a2}, y[2] = {b0, b1};
  unsigned ah[4] = {0, 0, 0, 0}, al[4] = {0, 0, 0, 0}, bh[2], bl[2];
  for (int i = 0; i < 2; ++i) {
    const float xh = kk::tops::to_tf32(x[i]), yh = kk::tops::to_tf32(y[i]);
    ah[2 * i] = __float_as_uint(xh), al[2 * i] = __float_as_uint(kk::tops::to_tf32(x[i] - xh));
    bh[i] = __float_as_uint(yh), bl[i] = __float_as_uint(kk::tops::to_tf32(y[i] - yh));
  }
  kk::tops::mma<kk::tops::mma_shape::tf32>(acc, ah, bh);
  if (__ballot_sync(__activemask(), ((al[0] | al[2] | bl[0] | bl[1]) << 1) != 0u) == 0u) return;  // (-0 is 0)
  kk::tops::mma<kk::tops::mma_shape::tf32>(acc, al, bh);
  kk::tops::mma<kk::tops::mma_shape::tf32>(acc, ah, bl);
}
// An 8 x 8 matrix of 16-bit pairs, one 32-bit word a lane in mma.sync's layout, transposed.
KK_FN unsigned transposed(unsigned pair) {
  unsigned r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(pair));
  return r;
}
// acc += a * b on one m16n8k8 of 16-bit inputs I (half or bfloat), rows 8..15 of A zero.
template <class I> KK_FN void mma_m16n8k8(float (&acc)[4], unsigned a, unsigned b) {
  if constexpr (kk::tops::kind_of<I> == kk::tops::kind::f16)
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(a), "r"(0u), "r"(b));
  else
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(a), "r"(0u), "r"(b));
}
// Float fragments with lanes in mma.sync's order (lanes_permuted): a pair of halves of a word, and
// whether they are the floats exactly. libdevice's conversions, not inline PTX, so that the
// compiler shares them between the products that reuse a fragment.
extern "C" __device__ unsigned short __nv_float2half_rn(float);
extern "C" __device__ float __nv_half2float(unsigned short);
KK_FN unsigned pack_halves(float lo, float hi) {
  return unsigned(__nv_float2half_rn(lo)) | (unsigned(__nv_float2half_rn(hi)) << 16);
}
KK_FN bool halves_are(unsigned pair, float lo, float hi) {
  return (__nv_half2float(static_cast<unsigned short>(pair)) == lo) &
         (__nv_half2float(static_cast<unsigned short>(pair >> 16)) == hi);
}
// acc (this lane's pair) += a * b for float fragments that are neither all bfloat nor all half
// numbers, in fp32 accuracy by TF32 products. A's k slots t and t + 4 take its columns 2t and
// 2t + 1, this lane's pair (a product's k order is free when B's rows follow); B's take its rows 2t
// and 2t + 1 of column g: B transposed, by movmatrix on the high and on the low halves of its
// words. Out of line: the straight path of a steel kernel's unrolled loop (hundreds of products)
// stays small enough for the instruction cache.
__device__ __noinline__ ::float2 mma_float_rare(float c0, float c1, float a0, float a1, float b0, float b1) {
  const unsigned y0 = __float_as_uint(b0), y1 = __float_as_uint(b1);
  const unsigned hi = transposed(__byte_perm(y0, y1, 0x7632)), lo = transposed(__byte_perm(y0, y1, 0x5410));
  float acc[4] = {c0, c1, 0.0f, 0.0f};
  mma_3xtf32(acc, a0, a1, __uint_as_float(__byte_perm(lo, hi, 0x5410)), __uint_as_float(__byte_perm(lo, hi, 0x7632)));
  return ::make_float2(acc[0], acc[1]);
}
// acc += a * b for float fragments in mma.sync's order. MLX's steel kernels fill float fragments
// from half or bfloat data: where every element is a bfloat number one bf16 product is exact (the
// test known at compile time for fragments filled from bfloat), where every one is a half number
// one f16 product; else mma_float_rare.
KK_FN void mma_float_in_place(float (&acc)[4], const vec<float, 2>& a, const vec<float, 2>& b) {
  const unsigned a0 = __float_as_uint(a[0]), a1 = __float_as_uint(a[1]);
  const unsigned b0 = __float_as_uint(b[0]), b1 = __float_as_uint(b[1]);
  // (each fragment's conversions ahead of the branches: products that share it share them)
  const unsigned ah = pack_halves(a[0], a[1]), bh = pack_halves(b[0], b[1]);
  const bool halves = halves_are(ah, a[0], a[1]) & halves_are(bh, b[0], b[1]);
  const unsigned active = __activemask();
  if (__builtin_expect(__ballot_sync(active, ((a0 | a1 | b0 | b1) & 0xffffu) != 0u) == 0u, 1))
    return mma_m16n8k8<bfloat>(acc, __byte_perm(a0, a1, 0x7632), transposed(__byte_perm(b0, b1, 0x7632)));
  if (__builtin_expect(__ballot_sync(active, !halves) == 0u, 1)) return mma_m16n8k8<half>(acc, ah, transposed(bh));
  const ::float2 d = mma_float_rare(acc[0], acc[1], a[0], a[1], b[0], b[1]);
  acc[0] = d.x, acc[1] = d.y;
}
}  // namespace kk_detail

// d = a * b + c on one m16n8k8 mma.sync (a and b of one type I; c in float, this lane's pair);
// the PTX fragment's lane h: g = h / 4, t = h % 4.
template <class T, class I>
KK_FN void simdgroup_mma(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<I, 8, 8>& a,
                         const simdgroup_matrix<I, 8, 8>& b, const float (&c)[2], const kk::site& s) {
  using M = simdgroup_matrix<I, 8, 8>;
  kk::tops::check_scope(1, s);
  constexpr kk::tops::kind K = kk::tops::kind_of<I>;
  if constexpr (kk::lanes_permuted()) {  // this lane is (g, t) = (row, col / 2): C, D and A in place
    float acc[4] = {c[0], c[1], 0.0f, 0.0f};
    if constexpr (K == kk::tops::kind::f32) {
      kk_detail::mma_float_in_place(acc, a.e, b.e);
    } else {
      kk_detail::mma_m16n8k8<I>(acc, kk_detail::pack_pair(a.e), kk_detail::transposed(kk_detail::pack_pair(b.e)));
    }
    d.e[0] = T(acc[0]);
    d.e[1] = T(acc[1]);
    return;
  }
  const int l = int(kk::hw_lane()), g = l >> 2, t = l & 3;
  // c(g, 2t), c(g, 2t + 1): the pair of lane (g, 2t)
  const float c0 = kk::tops::lane_read(c[0], M::lane_of(g, 2 * t), s);
  const float c1 = kk::tops::lane_read(c[1], M::lane_of(g, 2 * t), s);
  float acc[4] = {c0, c1, 0.0f, 0.0f};
  if constexpr (K == kk::tops::kind::f32) {
    // A: (g, t), (g, t + 4); B: (t, g), (t + 4, g); each the element c % 2 of its lane's pair
    const vec<I, 2> a0 = kk::tops::lane_read(a.e, M::lane_of(g, t), s), a2 = kk::tops::lane_read(a.e, M::lane_of(g, t + 4), s);
    const vec<I, 2> b0 = kk::tops::lane_read(b.e, M::lane_of(t, g), s), b1 = kk::tops::lane_read(b.e, M::lane_of(t + 4, g), s);
    const auto pick = [](const vec<I, 2>& v, int i) { return i ? v[1] : v[0]; };  // (no indexed vector)
    kk_detail::mma_3xtf32(acc, pick(a0, t & 1), pick(a2, t & 1), pick(b0, g & 1), pick(b1, g & 1));
  } else {
    // A: the pair (g, 2t), (g, 2t + 1); B: (2t, g), (2t + 1, g)
    const vec<I, 2> a0 = kk::tops::lane_read(a.e, M::lane_of(g, 2 * t), s);
    const vec<I, 2> b0 = kk::tops::lane_read(b.e, M::lane_of(2 * t, g), s), b1 = kk::tops::lane_read(b.e, M::lane_of(2 * t + 1, g), s);
    const vec<I, 2> bk((g & 1) ? b0[1] : b0[0], (g & 1) ? b1[1] : b1[0]);
    kk_detail::mma_m16n8k8<I>(acc, kk_detail::pack_pair(a0), kk_detail::pack_pair(bk));
  }
  // back: this lane's (row, col), (row, col + 1) are acc[0..1] of PTX lane 4 * row + col / 2
  const int from = M::row() * 4 + M::col() / 2;
  const float d0 = kk::tops::lane_read(acc[0], unsigned(from), s), d1 = kk::tops::lane_read(acc[1], unsigned(from), s);
  d.e[0] = T(d0);
  d.e[1] = T(d1);
}
#endif

template <class T, class TA, class TB, class TC>
KK_FN void simdgroup_multiply_accumulate(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                         const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                         kk::site s = KK_TOPS_SITE("simdgroup_multiply_accumulate")) {
  float out[2] = {float(c.e[0]), float(c.e[1])};
#if defined(KK_TARGET_CUDA) && defined(KK_TOPS_MMA_SYNC)
  if constexpr (kk::tops::is_same_v<TA, TB>) return simdgroup_mma(d, a, b, out, s);
#endif
  kk_detail::simdgroup_product<T>(out, a, b, s);
  d.e[0] = T(out[0]);
  d.e[1] = T(out[1]);
}
template <class T, class TA, class TB>
KK_FN void simdgroup_multiply(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                              const simdgroup_matrix<TB, 8, 8>& b, kk::site s = KK_TOPS_SITE("simdgroup_multiply")) {
  float out[2] = {0.0f, 0.0f};
#if defined(KK_TARGET_CUDA) && defined(KK_TOPS_MMA_SYNC)
  if constexpr (kk::tops::is_same_v<TA, TB>) return simdgroup_mma(d, a, b, out, s);
#endif
  kk_detail::simdgroup_product<T>(out, a, b, s);
  d.e[0] = T(out[0]);
  d.e[1] = T(out[1]);
}

}  // namespace metal
