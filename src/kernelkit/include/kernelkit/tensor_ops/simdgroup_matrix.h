// kernelkit/tensor_ops/simdgroup_matrix.h: MSL's simdgroup_matrix<T, 8, 8> (float, half, bfloat)
// with simdgroup_load / simdgroup_store / simdgroup_multiply / simdgroup_multiply_accumulate /
// make_filled_simdgroup_matrix, in namespace metal (the MSL dialect only).
//
// Each of the 32 lanes holds two elements, thread_elements() (a vec<T, 2>), at the place Apple's
// GPUs put them and MLX's steel kernels assume (BaseMMAFrag::get_coord): lane l, q = l / 4, holds
// row (q & 4) + (l / 2) % 4, columns (q & 2) * 2 + (l % 2) * 2 and the next one. A product reads
// the rows and columns it needs from the lanes that hold them (every lane calls it together, as
// Metal requires); it is computed in float and rounded to T once.
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

template <class T, class TA, class TB, class TC>
KK_FN void simdgroup_multiply_accumulate(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                         const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                         kk::site s = KK_TOPS_SITE("simdgroup_multiply_accumulate")) {
  float out[2] = {float(c.e[0]), float(c.e[1])};
  kk_detail::simdgroup_product<T>(out, a, b, s);
  d.e[0] = T(out[0]);
  d.e[1] = T(out[1]);
}
template <class T, class TA, class TB>
KK_FN void simdgroup_multiply(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                              const simdgroup_matrix<TB, 8, 8>& b, kk::site s = KK_TOPS_SITE("simdgroup_multiply")) {
  float out[2] = {0.0f, 0.0f};
  kk_detail::simdgroup_product<T>(out, a, b, s);
  d.e[0] = T(out[0]);
  d.e[1] = T(out[1]);
}

}  // namespace metal
