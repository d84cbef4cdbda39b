// kernelkit/tensor_ops/layout.h: which thread holds which element of a cooperative tensor.
//
// Apple leaves this implementation-defined; kernelkit's is the same on every target, the layout of
// the mma.sync accumulator fragment (PTX m16n8), so that a destination is the tensor cores' own
// registers and reads the same on the CPU:
//
//   An OUTER x INNER matrix (a destination: M rows x N columns; a left input: M x K; a right
//   input: N x K, i.e. transposed) is cut into blocks of 16 outer x 8 inner. Lane l of a
//   SIMD-group (g = l / 4, t = l % 4) holds, in each block it owns, the elements
//   (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): element i of the thread is
//     e = i % 4, j = i / 4, inner block = j % IB, s = j / IB (the thread's s-th outer block),
//     outer block = (w / P) * OBW * P + s * P + w % P,
//     outer = 16 * outer block + g + 8 * (e / 2), inner = 8 * inner block + 2t + e % 2,
//   with IB = ceil(INNER / 8), OBW = ceil(ceil(OUTER / 16) / W) the outer blocks of a SIMD-group,
//   w the SIMD-group's index in the scope (simdgroup % W), W the scope's SIMD-groups and P = 4
//   when W is a multiple of 4 (else P = W): the scope's SIMD-groups, in fours (a Hopper
//   warpgroup), take consecutive bands of rows, and the four of a band share its 16-row blocks
//   round robin. This is the wgmma accumulator's own layout (one warpgroup a band of rows), so
//   a destination of execution_simdgroups<4> or <8> is the warpgroup path's registers too.
//   Elements past OUTER or INNER exist but are not valid (is_valid_element is false).
//   A row reduction holds, per outer block it owns, rows g and g + 8 (capacity 2 per block; the
//   four lanes of a quad hold the same rows); a column reduction, per inner block, columns 2t and
//   2t + 1 (every SIMD-group and every g holds them).
//   execution_thread: the thread holds everything, row-major (element i = (i / INNER, i % INNER)).
//
// get_multidimensional_index gives the coordinates innermost first, as the operand's tensor:
// destination (n, m), left input (k, m), right input (n, k), reductions (m) and (n).
#pragma once

namespace kk {
namespace tops {

enum class role { destination, left, right, row_reduction, column_reduction };

// W >= 1: the fragment layout over W SIMD-groups; W == 0: one thread holds everything.
template <role Role, int OUTER, int INNER, int W>
struct layout {
  static constexpr role which = Role;
  static constexpr int outer = OUTER, inner = INNER, simdgroups = W;
  static constexpr bool whole = W == 0;
  static constexpr int OB = ceil_div(OUTER, 16), IB = ceil_div(INNER, 8);
  static constexpr int OBW = whole ? 0 : ceil_div(OB, W == 0 ? 1 : W);  // outer blocks per SIMD-group
  static constexpr bool reduction = Role == role::row_reduction || Role == role::column_reduction;
  static constexpr int rank = reduction ? 1 : 2;
  static constexpr int capacity =
      whole ? (Role == role::row_reduction ? OUTER : Role == role::column_reduction ? INNER : OUTER * INNER)
            : (Role == role::row_reduction ? OBW * 2 : Role == role::column_reduction ? IB * 2 : OBW * IB * 4);
  static_assert(OUTER > 0 && INNER > 0, "cooperative tensor: the op's extents must be positive and static");

  // This thread's position in the scope.
  KK_FN static unsigned lane() { return whole ? 0u : lane_id(); }
  KK_FN static unsigned group() { return W > 1 ? simdgroup_id() % unsigned(W) : 0u; }

  static constexpr int P = W % 4 == 0 ? 4 : (W == 0 ? 1 : W);  // SIMD-groups sharing a band of rows
  // The outer block of this thread's s-th outer block.
  KK_FN static int outer_block(int s) {
    const int w = int(group());
    return (w / P) * OBW * P + s * P + w % P;
  }
  // Slot s of this thread's rows (row reductions, and the rows of a destination) and columns.
  KK_FN static int row_of_slot(int s) {
    if constexpr (whole) return s;
    else return outer_block(s >> 1) * 16 + int(lane() >> 2) + 8 * (s & 1);
  }
  KK_FN static int col_of_slot(int s) {
    if constexpr (whole) return s;
    else return (s >> 1) * 8 + 2 * int(lane() & 3) + (s & 1);
  }
  static constexpr int row_slots = whole ? OUTER : OBW * 2;
  static constexpr int col_slots = whole ? INNER : IB * 2;
  // The row and column slot of element i of a rank-2 layout.
  KK_FN static int row_slot(int i) {
    if constexpr (whole) return i / INNER;
    else return ((i >> 2) / IB) * 2 + ((i & 3) >> 1);
  }
  KK_FN static int col_slot(int i) {
    if constexpr (whole) return i % INNER;
    else return ((i >> 2) % IB) * 2 + (i & 1);
  }

  // Element i as (outer, inner); reductions: (row, -1) or (-1, column).
  KK_FN static void at(int i, int& o, int& n) {
    if constexpr (Role == role::row_reduction) {
      o = row_of_slot(i), n = -1;
    } else if constexpr (Role == role::column_reduction) {
      o = -1, n = col_of_slot(i);
    } else {
      o = row_of_slot(row_slot(i)), n = col_of_slot(col_slot(i));
    }
  }
  // Whole 16 x 8 blocks shared evenly by the scope's SIMD-groups: every element is valid, and an
  // unrolled loop's tests fold away (they would otherwise depend on the lane and SIMD-group).
  static constexpr bool all_valid = whole || (OUTER % 16 == 0 && INNER % 8 == 0 && OB == OBW * W);
  KK_FN static bool is_valid(int i) {
    if (i < 0 || i >= capacity) return false;
    if constexpr (all_valid) return true;
    int o, n;
    at(i, o, n);
    return o < OUTER && n < INNER;
  }
  // The index of the element at (outer, inner) (-1: ignored for a reduction), or -1 when this
  // thread does not hold it.
  KK_FN static int index_of(int o, int n) {
    int rs = -1, cs = -1;
    if constexpr (whole) {
      rs = o, cs = n;
    } else {
      if (o >= 0 && Role != role::column_reduction) {  // a reduction looks at its own coordinate only
        const int ob = o / 16, band = ob / (OBW * P), in_band = ob % (OBW * P);
        if ((o & 7) != int(lane() >> 2) || band * P + in_band % P != int(group())) return -1;
        rs = (in_band / P) * 2 + ((o & 15) >> 3);
      }
      if (n >= 0 && Role != role::row_reduction) {
        if (((n & 7) >> 1) != int(lane() & 3)) return -1;
        cs = (n / 8) * 2 + (n & 1);
      }
    }
    if constexpr (Role == role::row_reduction) return rs >= 0 && rs < row_slots ? rs : -1;
    else if constexpr (Role == role::column_reduction) return cs >= 0 && cs < col_slots ? cs : -1;
    else {
      if (rs < 0 || cs < 0 || rs >= row_slots || cs >= col_slots) return -1;
      if constexpr (whole) return rs * INNER + cs;
      else return ((rs >> 1) * IB + (cs >> 1)) * 4 + (rs & 1) * 2 + (cs & 1);
    }
  }
  // Coordinates innermost first, as the operand's tensor (see the top of this file): coords_size
  // of them (a reduction's second is 0; a convolution's destination has four, convolution2d.h).
  static constexpr int coords_size = 2;
  KK_FN static void coords(int i, int (&c)[coords_size]) {
    int o, n;
    at(i, o, n);
    if constexpr (Role == role::row_reduction) c[0] = o, c[1] = 0;
    else if constexpr (Role == role::column_reduction) c[0] = n, c[1] = 0;
    else if constexpr (Role == role::right) c[0] = o, c[1] = n;
    else c[0] = n, c[1] = o;
  }
  KK_FN static int index_of_coords(const int (&c)[2]) {
    if constexpr (Role == role::row_reduction) return index_of(c[0], -1);
    else if constexpr (Role == role::column_reduction) return index_of(-1, c[0]);
    else if constexpr (Role == role::right) return index_of(c[0], c[1]);
    else return index_of(c[1], c[0]);
  }
};

template <class T> inline constexpr bool is_layout_v = false;
template <role R, int O, int I, int W> inline constexpr bool is_layout_v<layout<R, O, I, W>> = true;

// Can b's elements be found from a's iterators (map_iterator): the same rows over the same lanes.
template <class A, class B>
inline constexpr bool iterator_compatible_v =
    A::simdgroups == B::simdgroups && (A::which == role::destination || A::which == B::which) &&
    (B::which == role::column_reduction || A::outer == B::outer) &&
    (B::which == role::row_reduction || A::inner == B::inner);

}  // namespace tops
}  // namespace kk
