// kernelkit/tensor_ops/loops.h: matmul2d::run as plain loops, on the destination's layout.
// The CPU's path for every op; on the GPU the path of execution_thread, of cooperative inputs
// and of the types mma_sync.h does not take.
//
// Each thread computes the destination elements it holds (layout.h): for each k, in order, it
// reads the left values of its rows and the right values of its columns (from memory, or from the
// lanes that hold them), then adds their products to its accumulators (float; int32 for int8
// operands into an integer destination). Accumulation is in k order, in the accumulator's type.
#pragma once

namespace kk {
namespace tops {

template <class Acc, mpp::tensor_ops::matmul2d_descriptor D, class Layout, class Left, class Right>
struct loops_matmul {
  static constexpr bool tl = D.transpose_left, tr = D.transpose_right;
  static constexpr KK_FN const char* name() { return is_integer_v<Acc> ? "loops (int32)" : "loops (float)"; }

  // acc[i] += sum over k < K of left(row(i), k) * right(k, col(i)) for this thread's elements.
  static KK_FN void run(Acc (&acc)[Layout::capacity], const Left& left, const Right& right, int K, const kk::site& s) {
    Acc rows[Layout::row_slots], cols[Layout::col_slots];
    for (int k = 0; k < K; ++k) {
      for (int r = 0; r < Layout::row_slots; ++r) rows[r] = left_at(left, Layout::row_of_slot(r), k, s);
      for (int c = 0; c < Layout::col_slots; ++c) cols[c] = right_at(right, k, Layout::col_of_slot(c), s);
      for (int i = 0; i < Layout::capacity; ++i) acc[i] += rows[Layout::row_slot(i)] * cols[Layout::col_slot(i)];
    }
  }

  static KK_FN Acc left_at(const Left& l, int m, int k, const kk::site& s) {
    if constexpr (is_cooperative_v<Left>) return lane_value<Acc>(l, m, k, s);
    else return left_value<Acc, tl>(l, m, k);
  }
  static KK_FN Acc right_at(const Right& r, int k, int n, const kk::site& s) {
    if constexpr (is_cooperative_v<Right>) return lane_value<Acc>(r, n, k, s);
    else return right_value<Acc, tr>(r, k, n);
  }
};

}  // namespace tops
}  // namespace kk
