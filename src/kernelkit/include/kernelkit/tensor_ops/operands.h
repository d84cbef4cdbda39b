// kernelkit/tensor_ops/operands.h: a matmul2d operand seen as the logical matrix it stands for
// (left: M x K, right: K x N, after the descriptor's transposes), for the paths to read.
//
// A tensor operand reads element (row, col) from memory, zero past the tensor's extents, times its
// block's scale when it has a scales plane (MXFP8 is dequantised here). A cooperative operand
// (an input of an execution_simdgroup op) lives in the lanes' registers: lane_value reads the
// element this lane needs from the lane that holds it, all lanes together (layout.h).
#pragma once

namespace kk {
namespace tops {

template <class T> inline constexpr bool is_cooperative_v = false;
template <class E, class X, class L> inline constexpr bool is_cooperative_v<metal::cooperative_tensor<E, X, L>> = true;
template <class T> inline constexpr bool is_cooperative_v<const T> = is_cooperative_v<T>;

template <class Op> struct operand_traits;
template <class Op> struct operand_traits<const Op> : operand_traits<Op> {};
template <class T, class E, class D, class... Tags>
struct operand_traits<metal::tensor<T, E, D, Tags...>> {
  using value_type = remove_const_t<T>;
  static constexpr bool scaled = !is_same_v<typename metal::tensor<T, E, D, Tags...>::plane_type, metal::kk_detail::no_plane>;
};
template <class E, class X, class L>
struct operand_traits<metal::cooperative_tensor<E, X, L>> {
  using value_type = E;
  static constexpr bool scaled = false;
};

// Element (x, y) of a rank-2 tensor as Acc, zero outside it.
template <class Acc, class Tn>
KK_FN Acc tensor_value(const Tn& t, int x, int y) {
  if (x < 0 || y < 0 || x >= int(t.get_extent(0)) || y >= int(t.get_extent(1))) return Acc(0);
  const auto& e = t(x, y);
  if constexpr (operand_traits<remove_const_t<Tn>>::scaled) return Acc(to_float(e) * t.plane.scale(x, y));
  else if constexpr (is_integer_v<Acc> && is_integer_v<remove_const_t<remove_cvref_t<decltype(e)>>>) return Acc(e);
  else return convert<Acc>(e);
}

// Left operand element (m, k): a left tensor is K x M (extents (K, M)), or M x K transposed.
template <class Acc, bool Transposed, class Tn>
KK_FN Acc left_value(const Tn& t, int m, int k) {
  return Transposed ? tensor_value<Acc>(t, m, k) : tensor_value<Acc>(t, k, m);
}
// Right operand element (k, n): a right tensor has extents (N, K), or (K, N) transposed.
template <class Acc, bool Transposed, class Tn>
KK_FN Acc right_value(const Tn& t, int k, int n) {
  return Transposed ? tensor_value<Acc>(t, k, n) : tensor_value<Acc>(t, n, k);
}

// The K extent a tensor operand offers.
template <bool Transposed, class Tn> KK_FN int left_k(const Tn& t) { return int(t.get_extent(Transposed ? 1 : 0)); }
template <bool Transposed, class Tn> KK_FN int right_k(const Tn& t) { return int(t.get_extent(Transposed ? 0 : 1)); }

// Element (outer, inner) of a cooperative operand in the fragment layout, for the lane that asks:
// every lane of the SIMD-group calls this with the same (block, half, k) arguments, each asking for
// the outer index `o` its own slot needs (in the same 16-block and half, one of this SIMD-group's
// blocks). The element lives in lane 4 * (o % 8) + (inner % 8) / 2 at an index that depends only
// on the arguments (layout.h: the block's slot among the SIMD-group's, then the column).
template <class Acc, class CT>
KK_FN Acc lane_value(const CT& ct, int o, int inner, const kk::site& s) {
  using L = typename CT::layout;
  const int slot = ((o / 16) % (L::OBW * L::P)) / L::P;  // this SIMD-group's slot of block o / 16
  const int idx = (slot * L::IB + inner / 8) * 4 + ((o & 15) >> 3) * 2 + (inner & 1);
  const unsigned from = unsigned((o & 7) << 2) | unsigned((inner & 7) >> 1);
  const auto v = lane_read(ct.v[idx], from, s);
  return convert<Acc>(v);
}

// Do an input layout and a destination layout put each element in the same register of the same
// lane? A left input over (m, k) and a destination over (m, n = k) do; a right input is held
// transposed (n, k) and never does.
template <class In, class Src>
inline constexpr bool same_registers_v = In::which == role::left && In::simdgroups == Src::simdgroups &&
                                         In::outer == Src::outer && In::inner == Src::inner;

// dst (an input cooperative tensor) from src (a destination of another op): a copy in registers
// when the layouts agree, else each element read from the lane that holds it.
template <class DCT, class SCT>
KK_FN void relayout(DCT& dst, const SCT& src, const kk::site& s) {
  using D = typename DCT::layout;
  using S = typename SCT::layout;
  using E = typename DCT::element_type;
  if constexpr (same_registers_v<D, S>) {
    convert_all(dst.v, src.v);
  } else {
    static_assert(S::simdgroups == 1 && D::simdgroups == 1,
                  "An input cooperative tensor in another layout than its source's needs a single SIMD group");
    check_scope(1, s);
    for (int i = 0; i < D::capacity; ++i) {
      int o, n;
      D::at(i, o, n);
      const int row = D::which == role::right ? n : o, col = D::which == role::right ? o : n;  // in src
      const int want = ((row / 16) * S::IB + col / 8) * 4 + ((row & 15) >> 3) * 2 + (col & 1);
      const unsigned from = unsigned((row & 7) << 2) | unsigned((col & 7) >> 1);
      E x = E();
      for (int j = 0; j < S::capacity; ++j) {  // the same j on every lane: each keeps the one it wants
        const auto v = lane_read(src.v[j], from, s);
        if (j == want) x = convert<E>(v);
      }
      dst.v[i] = x;
    }
  }
}

}  // namespace tops
}  // namespace kk
