// kernelkit/tensor_ops/reduction.h: reduce_rows, reduce_columns (MPPTensorOpsMatMul2d.h).
//
//   reduce_rows(source, destination, reduction_operation::max, reduction_operation_identity<float>::max_identity);
//
// source: a destination cooperative tensor; destination: the same op's row (column) reduction
// cooperative tensor, overwritten with op folded over each row (column) from `identity` (Apple's
// default is sum_identity whatever the op: pass the identity). Invalid elements take no part.
// Each thread folds its own elements of each row, then the lanes that share the row combine theirs
// (the four lanes of a quad for rows; the eight lanes with the same t for columns). A column of an
// execution_simdgroups<N> op spans the N SIMD-groups: they combine their partials, in SIMD-group
// order, through threadgroup memory between two threadgroup barriers (every thread of the
// threadgroup calls reduce_columns, as the scope requires).
#pragma once

namespace mpp {
namespace tensor_ops {

template <class T>
struct reduction_operation_identity {
  static constexpr T sum_identity = T(0);
  static constexpr T max_identity = kk::tops::lowest<T>();
  static constexpr T min_identity = kk::tops::highest<T>();
};

}  // namespace tensor_ops
}  // namespace mpp

namespace kk {
namespace tops {

// max / min of float and double as fmax / fmin (one instruction on the GPU; a NaN operand yields
// the other one), of other types by comparison.
template <class T>
KK_FN T reduce_op(mpp::tensor_ops::reduction_operation op, T a, T b) {
  constexpr bool ieee = is_same_v<T, float> || is_same_v<T, double>;
  switch (op) {
    case mpp::tensor_ops::reduction_operation::max:
      if constexpr (ieee) return fmax(a, b);
      else return b > a ? b : a;
    case mpp::tensor_ops::reduction_operation::min:
      if constexpr (ieee) return fmin(a, b);
      else return b < a ? b : a;
    default: return T(a + b);
  }
}

// Column partials of each SIMD-group (dst, the same in every lane with the same t) folded over the
// scope's SIMD-groups.
template <class SL, class E, class DX, class DL>
KK_FN void across_simdgroups(metal::cooperative_tensor<E, DX, DL>& dst, mpp::tensor_ops::reduction_operation op,
                             const kk::site& s) {
  constexpr int W = SL::simdgroups, C = SL::col_slots, stride = SL::IB * 8;
  KK_THREADGROUP E partials[W * stride];  // [SIMD-group][column]
  const unsigned lane = lane_id(), w = SL::group();
  if (lane < 4)
    for (int c = 0; c < C; ++c) partials[int(w) * stride + SL::col_of_slot(c)] = dst.v[c];
  threadgroup_barrier(s);
  for (int c = 0; c < C; ++c) {
    E part = partials[SL::col_of_slot(c)];
    for (int g = 1; g < W; ++g) part = reduce_op(op, part, partials[g * stride + SL::col_of_slot(c)]);
    dst.v[c] = part;
  }
  threadgroup_barrier(s);  // every SIMD-group has read the partials before they are written again
}

template <bool Rows, class E, class SX, class DX, class SL, class DL>
KK_FN void reduce(const metal::cooperative_tensor<E, SX, SL>& src, metal::cooperative_tensor<E, DX, DL>& dst,
                  mpp::tensor_ops::reduction_operation op, E identity, const kk::site& s) {
  static_assert(SL::which == role::destination, "reduce_rows / reduce_columns: the source must be a matmul2d destination cooperative tensor");
  static_assert(DL::which == (Rows ? role::row_reduction : role::column_reduction),
                "reduce_rows / reduce_columns: the destination must be the op's row / column reduction cooperative tensor");
  static_assert(SL::simdgroups == DL::simdgroups && (Rows ? SL::outer == DL::outer : SL::inner == DL::inner),
                "reduce_rows / reduce_columns: source and destination come from different ops");
  check_scope(SL::simdgroups, s);
  constexpr int slots = Rows ? SL::row_slots : SL::col_slots;
  KK_TOPS_UNROLL
  for (int r = 0; r < slots; ++r) {
    E part = identity;
    KK_TOPS_UNROLL
    for (int i = 0; i < SL::capacity; ++i)
      if ((Rows ? SL::row_slot(i) : SL::col_slot(i)) == r && SL::is_valid(i)) part = reduce_op(op, part, src.v[i]);
    if constexpr (!SL::whole) {
      const unsigned lane = lane_id();
      for (unsigned d = Rows ? 1u : 4u; d < (Rows ? 4u : 32u); d <<= 1)
        part = reduce_op(op, part, lane_read(part, lane ^ d, s));
    }
    dst.v[r] = part;
  }
  if constexpr (!Rows && SL::simdgroups > 1) across_simdgroups<SL>(dst, op, s);
}

}  // namespace tops
}  // namespace kk

namespace mpp {
namespace tensor_ops {

template <class E, class SX, class DX, class SL, class DL>
KK_FN void reduce_rows(metal::cooperative_tensor<E, SX, SL>& source, metal::cooperative_tensor<E, DX, DL>& destination,
                       reduction_operation op = reduction_operation::sum,
                       kk::tops::type_identity_t<E> identity = reduction_operation_identity<E>::sum_identity,
                       kk::site s = KK_TOPS_SITE("reduce_rows")) {
  kk::tops::reduce<true>(source, destination, op, identity, s);
}
template <class E, class SX, class DX, class SL, class DL>
KK_FN void reduce_columns(metal::cooperative_tensor<E, SX, SL>& source, metal::cooperative_tensor<E, DX, DL>& destination,
                          reduction_operation op = reduction_operation::sum,
                          kk::tops::type_identity_t<E> identity = reduction_operation_identity<E>::sum_identity,
                          kk::site s = KK_TOPS_SITE("reduce_columns")) {
  kk::tops::reduce<false>(source, destination, op, identity, s);
}

}  // namespace tensor_ops
}  // namespace mpp
