// kernelkit/tensor_ops/simdgroup_matrix.h: MSL's simdgroup_matrix<T, 8, 8> (float, half, bfloat)
// with simdgroup_load / simdgroup_store / simdgroup_multiply / simdgroup_multiply_accumulate /
// make_filled_simdgroup_matrix, in namespace metal (the MSL dialect only).
//
// Each of the 32 lanes holds two elements, thread_elements() (a vec<T, 2>), at the place Apple's
// GPUs put them and MLX's steel kernels assume (BaseMMAFrag::get_coord): lane l, q = l / 4, holds
// row (q & 4) + (l / 2) % 4, columns (q & 2) * 2 + (l % 2) * 2 and the next one. Every lane calls
// a product together, as Metal requires; it is computed in float and rounded to T once. On the CPU
// each lane reads the row and columns it needs from the lanes that hold them; on NVIDIA (sm_80+)
// the operands are moved into an m16n8k8 mma.sync fragment (rows 8..15 zero) by five shuffles and
// the result back by one (half, bfloat: f16 / bf16 inputs; float: 3xTF32, fp32 accuracy), for a and
// b of one type and any accumulator (MLX steel: half fragments into float).
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

  // This lane's row, and the column of its first element.
  static KK_FN int row() {
    const int l = int(kk::tops::lane_id()), q = l >> 2;
    return (q & 4) + ((l >> 1) & 3);
  }
  static KK_FN int col() {
    const int l = int(kk::tops::lane_id()), q = l >> 2;
    return (q & 2) * 2 + (l & 1) * 2;
  }
  // The lane holding (r, c): the inverse of row() and col(); the element is c % 2.
  static constexpr KK_FN unsigned lane_of(int r, int c) {
    return unsigned(((r >> 2) & 1) << 4 | ((c >> 2) & 1) << 3 | ((r >> 1) & 1) << 2 | (r & 1) << 1 | ((c >> 1) & 1));
  }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows>
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
    const float x = float(kk::tops::lane_read(a.e[k & 1], M::lane_of(r, k), s));
    const float y0 = float(kk::tops::lane_read(b.e[0], M::lane_of(k, c), s));
    const float y1 = float(kk::tops::lane_read(b.e[1], M::lane_of(k, c), s));
    out[0] += x * y0;
    out[1] += x * y1;
  }
}
}  // namespace kk_detail

#if defined(KK_TARGET_CUDA) && defined(KK_TOPS_MMA_SYNC)
// d = a * b + c on one m16n8k8 mma.sync (a and b of one type I; c in float, this lane's pair);
// the PTX fragment's lane l: g = l / 4, t = l % 4.
template <class T, class I>
KK_FN void simdgroup_mma(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<I, 8, 8>& a,
                         const simdgroup_matrix<I, 8, 8>& b, const float (&c)[2], const kk::site& s) {
  using M = simdgroup_matrix<I, 8, 8>;
  kk::tops::check_scope(1, s);
  const int l = int(kk::tops::lane_id()), g = l >> 2, t = l & 3;
  const auto bits = [](const I& x) { return *reinterpret_cast<const unsigned short*>(&x); };
  // c(g, 2t), c(g, 2t + 1): the pair of lane (g, 2t)
  const float c0 = kk::tops::lane_read(c[0], M::lane_of(g, 2 * t), s);
  const float c1 = kk::tops::lane_read(c[1], M::lane_of(g, 2 * t), s);
  float acc[4] = {c0, c1, 0.0f, 0.0f};
  constexpr kk::tops::kind K = kk::tops::kind_of<I>;
  if constexpr (K == kk::tops::kind::f32) {
    // A: (g, t), (g, t + 4); B: (t, g), (t + 4, g); each the element c % 2 of its lane's pair
    const vec<I, 2> a0 = kk::tops::lane_read(a.e, M::lane_of(g, t), s), a2 = kk::tops::lane_read(a.e, M::lane_of(g, t + 4), s);
    const vec<I, 2> b0 = kk::tops::lane_read(b.e, M::lane_of(t, g), s), b1 = kk::tops::lane_read(b.e, M::lane_of(t + 4, g), s);
    const float x[2] = {a0[t & 1], a2[t & 1]}, y[2] = {b0[g & 1], b1[g & 1]};
    unsigned ah[4] = {0, 0, 0, 0}, al[4] = {0, 0, 0, 0}, bh[2], bl[2];
    for (int i = 0; i < 2; ++i) {
      const float xh = kk::tops::to_tf32(x[i]), yh = kk::tops::to_tf32(y[i]);
      ah[2 * i] = __float_as_uint(xh), al[2 * i] = __float_as_uint(kk::tops::to_tf32(x[i] - xh));
      bh[i] = __float_as_uint(yh), bl[i] = __float_as_uint(kk::tops::to_tf32(y[i] - yh));
    }
    kk::tops::mma<kk::tops::mma_shape::tf32>(acc, ah, bh);
    kk::tops::mma<kk::tops::mma_shape::tf32>(acc, al, bh);
    kk::tops::mma<kk::tops::mma_shape::tf32>(acc, ah, bl);
  } else {
    // A: the pair (g, 2t), (g, 2t + 1); B: (2t, g), (2t + 1, g)
    const vec<I, 2> a0 = kk::tops::lane_read(a.e, M::lane_of(g, 2 * t), s);
    const vec<I, 2> b0 = kk::tops::lane_read(b.e, M::lane_of(2 * t, g), s), b1 = kk::tops::lane_read(b.e, M::lane_of(2 * t + 1, g), s);
    const I bk0 = b0[g & 1], bk1 = b1[g & 1];
    const I ak0 = a0[0], ak1 = a0[1];
    const unsigned ar[2] = {kk::tops::pack16(bits(ak0), bits(ak1)), 0u}, br = kk::tops::pack16(bits(bk0), bits(bk1));
    if constexpr (K == kk::tops::kind::f16)
      asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                   : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(ar[0]), "r"(ar[1]), "r"(br));
    else
      asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                   : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(ar[0]), "r"(ar[1]), "r"(br));
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
