// kernelkit/metal/array.h: MSL's array<T, N> and array_ref<T> (<metal_array>, MSL §2.12): a
// fixed-size array with value semantics (copied, assigned, passed and returned whole, which C
// arrays are not) and a read-only view of one (or of a C array, or of a pointer and a count).
//
// array is an aggregate, as std::array, so that `array<float, 3> a = {1, 2, 3};` and
// `array<int, 4> z = {};` initialise it; its layout is its elements' (a device buffer of floats
// may be read as `device array<float, 4>*`). The tensor-op layer's tensors take their strides as
// one: tensor_ops/extents.h includes this file, since CUDA bodies reach that layer without
// metal.h (hence decltype(sizeof(0)), metal.h's size_t, spelt out).
#pragma once

namespace metal {

namespace kk_detail {
using usize = decltype(sizeof(0));
}

template <class T, kk_detail::usize N>
struct array {
  T elems[N > 0 ? N : 1];  // (public: aggregate initialisation)

  constexpr KK_FN kk_detail::usize size() const { return N; }
  constexpr KK_FN kk_detail::usize max_size() const { return N; }
  constexpr KK_FN bool empty() const { return N == 0; }
  constexpr KK_FN T& operator[](kk_detail::usize i) { return elems[i]; }
  constexpr KK_FN const T& operator[](kk_detail::usize i) const { return elems[i]; }
  constexpr KK_FN T& front() { return elems[0]; }
  constexpr KK_FN const T& front() const { return elems[0]; }
  constexpr KK_FN T& back() { return elems[N - 1]; }
  constexpr KK_FN const T& back() const { return elems[N - 1]; }
  constexpr KK_FN T* data() { return elems; }
  constexpr KK_FN const T* data() const { return elems; }
  constexpr KK_FN T* begin() { return elems; }
  constexpr KK_FN const T* begin() const { return elems; }
  constexpr KK_FN T* end() { return elems + N; }
  constexpr KK_FN const T* end() const { return elems + N; }
};

template <class T>
struct array_ref {
  constexpr KK_FN array_ref() : p_(nullptr), n_(0) {}
  constexpr KK_FN array_ref(const T& one) : p_(&one), n_(1) {}
  constexpr KK_FN array_ref(const T* p, kk_detail::usize n) : p_(p), n_(n) {}
  constexpr KK_FN array_ref(const T* first, const T* last) : p_(first), n_(kk_detail::usize(last - first)) {}
  template <kk_detail::usize N> constexpr KK_FN array_ref(const T (&a)[N]) : p_(a), n_(N) {}
  template <kk_detail::usize N> constexpr KK_FN array_ref(const array<T, N>& a) : p_(a.data()), n_(N) {}

  constexpr KK_FN kk_detail::usize size() const { return n_; }
  constexpr KK_FN bool empty() const { return n_ == 0; }
  constexpr KK_FN const T& operator[](kk_detail::usize i) const { return p_[i]; }
  constexpr KK_FN const T& front() const { return p_[0]; }
  constexpr KK_FN const T& back() const { return p_[n_ - 1]; }
  constexpr KK_FN const T* data() const { return p_; }
  constexpr KK_FN const T* begin() const { return p_; }
  constexpr KK_FN const T* end() const { return p_ + n_; }

 private:
  const T* p_;
  kk_detail::usize n_;
};

template <class T> constexpr KK_FN array_ref<T> make_array_ref(const T& one) { return array_ref<T>(one); }
template <class T> constexpr KK_FN array_ref<T> make_array_ref(const T* p, kk_detail::usize n) {
  return array_ref<T>(p, n);
}
template <class T> constexpr KK_FN array_ref<T> make_array_ref(const T* first, const T* last) {
  return array_ref<T>(first, last);
}
template <class T, kk_detail::usize N> constexpr KK_FN array_ref<T> make_array_ref(const T (&a)[N]) {
  return array_ref<T>(a);
}
template <class T, kk_detail::usize N> constexpr KK_FN array_ref<T> make_array_ref(const array<T, N>& a) {
  return array_ref<T>(a);
}

}  // namespace metal
