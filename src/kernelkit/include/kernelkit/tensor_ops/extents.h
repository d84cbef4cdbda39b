// kernelkit/tensor_ops/extents.h: metal::extents, dextents and dynamic_extent, as <metal_tensor>
// declares them (metal::array: metal/array.h). Extents are innermost first: a rows x cols matrix
// is dextents<int, 2>(cols, rows). Every extent is also held at run time (a static one too), so that
// a slice that runs past its tensor's edge can be clipped (tensor.h).
#pragma once

#include "../metal/array.h"  // metal::array, as tensors take their strides

namespace metal {

constexpr kk::tops::usize dynamic_extent = kk::tops::usize(-1);

template <class I, kk::tops::usize... E>
struct extents {
  using index_type = I;
  using size_type = kk::tops::usize;
  using rank_type = kk::tops::usize;
  static constexpr rank_type R = sizeof...(E);
  static_assert(R >= 1 && R <= 16, "extents: rank must be 1..16");
  static_assert(kk::tops::is_integer_v<I>, "extents: the index type must be an integer type");

  static constexpr KK_FN rank_type rank() { return R; }
  static constexpr KK_FN rank_type rank_dynamic() { return ((E == dynamic_extent) + ...); }
  static constexpr KK_FN size_type static_extent(rank_type r) {
    constexpr size_type s[R] = {E...};
    return s[r];
  }

  I e[R];

  // All static: no arguments. Otherwise one value per dynamic extent, or one per extent.
  constexpr KK_FN extents() : e{I(E == dynamic_extent ? 0 : E)...} {}
  template <class... Is, kk::tops::enable_if_t<sizeof...(Is) >= 1 && sizeof...(Is) == R && sizeof...(Is) != rank_dynamic(), int> = 0>
  constexpr KK_FN extents(Is... is) : e{I(is)...} {}
  template <class... Is, kk::tops::enable_if_t<sizeof...(Is) >= 1 && sizeof...(Is) == rank_dynamic(), int> = 0>
  constexpr KK_FN extents(Is... is) : e{} {
    const I given[] = {I(is)...};
    int n = 0;
    for (rank_type r = 0; r < R; ++r) e[r] = static_extent(r) == dynamic_extent ? given[n++] : I(static_extent(r));
  }

  constexpr KK_FN I extent(rank_type r) const { return e[r]; }
};

namespace kk_detail {
// extents<I, dynamic_extent (R times)>
template <class I, kk::tops::usize R, kk::tops::usize... E>
struct dextents_of : dextents_of<I, R - 1, dynamic_extent, E...> {};
template <class I, kk::tops::usize... E>
struct dextents_of<I, 0, E...> { using type = extents<I, E...>; };
}  // namespace kk_detail

template <class I, kk::tops::usize R>
using dextents = typename kk_detail::dextents_of<I, R>::type;

}  // namespace metal

namespace mpp {
namespace tensor_ops {
// A descriptor's K read from the operands at run time (Apple: numeric_limits<T>::max()).
template <class T> struct dynamic_length {
  static_assert(kk::tops::is_integer_v<T>, "dynamic_length: T must be an integer type");
  static constexpr T value = T(~(unsigned long long)0 >> (65 - 8 * sizeof(T)));
};
template <class T> inline constexpr T dynamic_length_v = dynamic_length<T>::value;
}  // namespace tensor_ops
}  // namespace mpp
