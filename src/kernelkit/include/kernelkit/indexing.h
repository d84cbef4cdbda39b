// kernelkit/indexing.h: MLX's indexing helpers for every dialect: elem_to_loc (the
// location of a row-major element in a strided array), ceildiv, and kk::array, the
// fixed-size array the CUDA dialect passes `name_shape` / `name_strides` as (MLX's
// Shape / Strides: `.data()`, `[i]`, `.size()`).
#pragma once

namespace kk {

// Location of the elem-th element (row-major order) of an array with these shape
// and strides. IdxT follows elem: an unsigned elem gives an unsigned offset.
template <typename IdxT, typename Stride>
KK_FN IdxT elem_to_loc(IdxT elem, const int* shape, const Stride* strides, int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += (elem % shape[i]) * IdxT(strides[i]);
    elem /= shape[i];
  }
  return loc;
}

// ceil(N / M) for positive integers.
template <typename T, typename U>
KK_FN T ceildiv(T N, U M) {
  return (N + M - 1) / M;
}

template <typename T, int N>
struct array {
  T v[N];
  KK_FN T& operator[](int i) { return v[i]; }
  KK_FN const T& operator[](int i) const { return v[i]; }
  KK_FN T* data() { return v; }
  KK_FN const T* data() const { return v; }
  static constexpr KK_FN int size() { return N; }
};

// The argument block holds plain arrays; the CUDA dialect's kernel takes them as kk::array.
template <typename T, int N>
KK_FN const array<T, N>& as_array(const T (&a)[N]) {
  return *reinterpret_cast<const array<T, N>*>(&a);
}

}  // namespace kk
