// kernelkit/metal/matrix.h: MSL matrix types matrix<T, Cols, Rows> (Cols, Rows = 2, 3, 4),
// their names (float4x4, half3x2...), operators, transpose and determinant (MSL §2.3, §6.6).
//
// Column-major as Metal's: a matrix is an array of Cols column vectors vec<T, Rows>, so its size
// and alignment are the columns' (float3x3 is 48 bytes, float3 being 16) and a device buffer of
// floats read as `device float4x4*` gives columns of four consecutive floats. `m[i]` is column i.
//
// Everything is built through one constexpr constructor from a function of the column index,
// so that `constant float3x3 k = float3x3(...)` is a constant at program scope (a __constant__
// on CUDA) and the columns stay in registers.
#pragma once

namespace metal {

template <class T, int Cols, int Rows> struct matrix;

namespace kk_detail {
template <int... I> struct ints {};
template <int N, int... I> struct make_ints_t : make_ints_t<N - 1, N - 1, I...> {};
template <int... I> struct make_ints_t<0, I...> { using type = ints<I...>; };
template <int N> using make_ints = typename make_ints_t<N>::type;

// Component i of v for any i known or not; constexpr, unlike vec::operator[] (a cast).
template <class T, int N>
constexpr KK_FN T vget(const vec<T, N>& v, int i) {
  if constexpr (N == 2) return i == 0 ? v.x : v.y;
  else if constexpr (N == 3) return i == 0 ? v.x : i == 1 ? v.y : v.z;
  else return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// vec<T, N>(f(0), ..., f(N - 1)).
template <class T, class F, int... I>
constexpr KK_FN vec<T, sizeof...(I)> vgen(ints<I...>, F f) { return vec<T, sizeof...(I)>(T(f(I))...); }

// Cols * Rows scalars in column-major order, as the scalar constructor receives them.
template <class T, int N> struct elements { T e[N]; };

template <class V, class T, int N>
constexpr bool is_column = is_same_v<V, vec<T, N>> || is_same_v<V, packed_vec<T, N>>;
template <class T> constexpr bool is_matrix = false;
template <class T, int C, int R> constexpr bool is_matrix<matrix<T, C, R>> = true;
}  // namespace kk_detail

template <class T, int Cols, int Rows>
struct matrix {
  static_assert(Cols >= 2 && Cols <= 4 && Rows >= 2 && Rows <= 4, "a matrix has 2 to 4 columns and rows");
  static_assert(kk_detail::is_scalar<T>, "a matrix holds scalars (float, half)");
  using value_type = T;
  using column_type = vec<T, Rows>;
  column_type columns[Cols];

  matrix() = default;  // uninitialised, as in MSL; so arrays of matrices in threadgroup memory work

  // Column c is f(c): the constructor the others (and the operators) delegate to.
  template <class F, int... C>
  constexpr KK_FN matrix(kk_detail::ints<C...>, F f) : columns{column_type(f(C))...} {}

  // float4x4(s): s on the diagonal, 0 elsewhere (for non-square ones too).
  template <class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
  constexpr KK_FN explicit matrix(S s)
      : matrix(kk_detail::make_ints<Cols>(), [t = T(s)](int c) {
          return kk_detail::vgen<T>(kk_detail::make_ints<Rows>(), [&](int r) { return r == c ? t : T(0); });
        }) {}

  // float2x2(float2, float2): the Cols columns.
  template <class... V, enable_if_t<sizeof...(V) == Cols && (kk_detail::is_column<V, T, Rows> && ...), int> = 0>
  constexpr KK_FN matrix(const V&... v) : columns{column_type(v)...} {}

  // float2x2(a, b, c, d): Cols * Rows scalars, column by column. (MSL does not mix scalars
  // and vectors in a matrix constructor, nor take fewer.)
  template <class... S, enable_if_t<sizeof...(S) == Cols * Rows && (kk_detail::is_scalar<S> && ...), int> = 0>
  constexpr KK_FN matrix(S... s) : matrix(kk_detail::elements<T, Cols * Rows>{{T(s)...}}) {}
  constexpr KK_FN explicit matrix(const kk_detail::elements<T, Cols * Rows>& a)
      : matrix(kk_detail::make_ints<Cols>(), [&a](int c) {
          return kk_detail::vgen<T>(kk_detail::make_ints<Rows>(), [&](int r) { return a.e[c * Rows + r]; });
        }) {}

  // float4x4(half4x4): element by element, explicit as between vector types.
  template <class U, enable_if_t<!is_same_v<U, T>, int> = 0>
  constexpr KK_FN explicit matrix(const matrix<U, Cols, Rows>& m)
      : matrix(kk_detail::make_ints<Cols>(), [&m](int c) { return column_type(m.columns[c]); }) {}

  constexpr KK_FN column_type& operator[](int i) { return columns[i]; }
  constexpr KK_FN const column_type& operator[](int i) const { return columns[i]; }
};

// ---------------------------------------------------------------------------
// Operators (MSL's "Matrix Operators"): + and - element-wise on matrices of one size,
// * by a scalar either side, and the linear-algebra products matrix * vector (a column
// vector), vector * matrix (a row vector) and matrix * matrix. MSL has no matrix == or /.

template <class T, int C, int R>
constexpr KK_FN matrix<T, C, R> operator+(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  return matrix<T, C, R>(kk_detail::make_ints<C>(), [&](int c) {
    return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) {
      return kk_detail::vget(a.columns[c], r) + kk_detail::vget(b.columns[c], r);
    });
  });
}
template <class T, int C, int R>
constexpr KK_FN matrix<T, C, R> operator-(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  return matrix<T, C, R>(kk_detail::make_ints<C>(), [&](int c) {
    return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) {
      return kk_detail::vget(a.columns[c], r) - kk_detail::vget(b.columns[c], r);
    });
  });
}
template <class T, int C, int R>
constexpr KK_FN matrix<T, C, R> operator-(const matrix<T, C, R>& a) {
  return matrix<T, C, R>(kk_detail::make_ints<C>(), [&](int c) {
    return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) { return -kk_detail::vget(a.columns[c], r); });
  });
}
template <class T, int C, int R>
constexpr KK_FN matrix<T, C, R> operator+(const matrix<T, C, R>& a) { return a; }

// The scalar is converted to T first, as for vectors: half3x3 * 2.0f stays half.
template <class T, int C, int R, class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
constexpr KK_FN matrix<T, C, R> operator*(const matrix<T, C, R>& a, const S& s) {
  const T t = T(s);
  return matrix<T, C, R>(kk_detail::make_ints<C>(), [&](int c) {
    return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) { return kk_detail::vget(a.columns[c], r) * t; });
  });
}
template <class T, int C, int R, class S, enable_if_t<kk_detail::is_scalar<S>, int> = 0>
constexpr KK_FN matrix<T, C, R> operator*(const S& s, const matrix<T, C, R>& a) {
  const T t = T(s);
  return matrix<T, C, R>(kk_detail::make_ints<C>(), [&](int c) {
    return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) { return t * kk_detail::vget(a.columns[c], r); });
  });
}

// m * v = v.x * m[0] + v.y * m[1] + ...: a vector of m's rows. One template for every size,
// so that a mismatch is this static_assert rather than a list of candidates.
template <class T, int C, int R, int N>
constexpr KK_FN vec<T, R> operator*(const matrix<T, C, R>& m, const vec<T, N>& v) {
  static_assert(N == C, "matrix * vector: the vector has as many components as the matrix has columns");
  return kk_detail::vgen<T>(kk_detail::make_ints<R>(), [&](int r) {
    T s = kk_detail::vget(m.columns[0], r) * v.x;
    for (int c = 1; c < C; ++c) s = s + kk_detail::vget(m.columns[c], r) * kk_detail::vget(v, c);
    return s;
  });
}
// v * m: v taken as a row vector; component c is dot(v, m[c]).
template <class T, int C, int R, int N>
constexpr KK_FN vec<T, C> operator*(const vec<T, N>& v, const matrix<T, C, R>& m) {
  static_assert(N == R, "vector * matrix: the vector has as many components as the matrix has rows");
  return kk_detail::vgen<T>(kk_detail::make_ints<C>(), [&](int c) {
    T s = v.x * m.columns[c].x;
    for (int r = 1; r < R; ++r) s = s + kk_detail::vget(v, r) * kk_detail::vget(m.columns[c], r);
    return s;
  });
}
// a * b: column c of the product is a * b[c].
template <class T, int CA, int RA, int CB, int RB>
constexpr KK_FN matrix<T, CB, RA> operator*(const matrix<T, CA, RA>& a, const matrix<T, CB, RB>& b) {
  static_assert(CA == RB, "matrix * matrix: the left one has as many columns as the right one has rows");
  return matrix<T, CB, RA>(kk_detail::make_ints<CB>(), [&](int c) { return a * b.columns[c]; });
}

// m += n, m -= n, m *= s, and m *= n where m * n has m's type (n square).
template <class T, int C, int R, class U>
constexpr KK_FN matrix<T, C, R>& operator+=(matrix<T, C, R>& a, const U& b) { return a = a + b; }
template <class T, int C, int R, class U>
constexpr KK_FN matrix<T, C, R>& operator-=(matrix<T, C, R>& a, const U& b) { return a = a - b; }
template <class T, int C, int R, class U>
constexpr KK_FN matrix<T, C, R>& operator*=(matrix<T, C, R>& a, const U& b) {
  static_assert(!kk_detail::is_matrix<U> || is_same_v<decltype(a * b), matrix<T, C, R>>,
                "m *= n needs a square n of m's element type");
  return a = a * b;
}

// ---------------------------------------------------------------------------
// Matrix functions (MSL §6.6).

template <class T, int C, int R>
constexpr KK_FN matrix<T, R, C> transpose(const matrix<T, C, R>& m) {
  return matrix<T, R, C>(kk_detail::make_ints<R>(), [&](int r) {
    return kk_detail::vgen<T>(kk_detail::make_ints<C>(), [&](int c) { return kk_detail::vget(m.columns[c], r); });
  });
}

template <class T>
constexpr KK_FN T determinant(const matrix<T, 2, 2>& m) {
  return T(m.columns[0].x * m.columns[1].y - m.columns[1].x * m.columns[0].y);
}
// det = m[0] . (m[1] x m[2]).
template <class T>
constexpr KK_FN T determinant(const matrix<T, 3, 3>& m) {
  const vec<T, 3>& a = m.columns[0];
  const vec<T, 3>& b = m.columns[1];
  const vec<T, 3>& c = m.columns[2];
  return T(a.x * (b.y * c.z - b.z * c.y) + a.y * (b.z * c.x - b.x * c.z) + a.z * (b.x * c.y - b.y * c.x));
}
// Laplace expansion along the first two columns: the six 2x2 minors of columns 0, 1 times
// their complements in columns 2, 3 (40 multiplies, no division).
template <class T>
constexpr KK_FN T determinant(const matrix<T, 4, 4>& m) {
  const vec<T, 4>& a = m.columns[0];
  const vec<T, 4>& b = m.columns[1];
  const vec<T, 4>& c = m.columns[2];
  const vec<T, 4>& d = m.columns[3];
  const T s0 = a.x * b.y - b.x * a.y, s1 = a.x * b.z - b.x * a.z, s2 = a.x * b.w - b.x * a.w;
  const T s3 = a.y * b.z - b.y * a.z, s4 = a.y * b.w - b.y * a.w, s5 = a.z * b.w - b.z * a.w;
  const T c5 = c.z * d.w - d.z * c.w, c4 = c.y * d.w - d.y * c.w, c3 = c.y * d.z - d.y * c.z;
  const T c2 = c.x * d.w - d.x * c.w, c1 = c.x * d.z - d.x * c.z, c0 = c.x * d.y - d.x * c.y;
  return T(s0 * c5 - s1 * c4 + s2 * c3 + s3 * c2 - s4 * c1 + s5 * c0);
}

// ---------------------------------------------------------------------------
// Names (Apple's: float and half; matrix<bfloat, C, R> works but has no short name in MSL).

#define KK_MATRIX_NAMES(T, name)                                                            \
  typedef matrix<T, 2, 2> name##2x2;                                                        \
  typedef matrix<T, 2, 3> name##2x3;                                                        \
  typedef matrix<T, 2, 4> name##2x4;                                                        \
  typedef matrix<T, 3, 2> name##3x2;                                                        \
  typedef matrix<T, 3, 3> name##3x3;                                                        \
  typedef matrix<T, 3, 4> name##3x4;                                                        \
  typedef matrix<T, 4, 2> name##4x2;                                                        \
  typedef matrix<T, 4, 3> name##4x3;                                                        \
  typedef matrix<T, 4, 4> name##4x4;
KK_MATRIX_NAMES(float, float)
KK_MATRIX_NAMES(half, half)
#undef KK_MATRIX_NAMES

// MSL's Table 2.5 (size, alignment).
static_assert(sizeof(float2x2) == 16 && alignof(float2x2) == 8, "Metal layout");
static_assert(sizeof(float2x3) == 32 && alignof(float2x3) == 16, "Metal layout");
static_assert(sizeof(float3x2) == 24 && alignof(float3x2) == 8, "Metal layout");
static_assert(sizeof(float3x3) == 48 && sizeof(float3x4) == 48 && sizeof(float4x2) == 32, "Metal layout");
static_assert(sizeof(float4x3) == 64 && sizeof(float4x4) == 64 && alignof(float4x4) == 16, "Metal layout");
static_assert(sizeof(half2x2) == 8 && alignof(half2x2) == 4, "Metal layout");
static_assert(sizeof(half2x3) == 16 && alignof(half2x3) == 8 && sizeof(half3x2) == 12, "Metal layout");
static_assert(sizeof(half3x3) == 24 && sizeof(half4x3) == 32 && sizeof(half4x4) == 32, "Metal layout");

}  // namespace metal
