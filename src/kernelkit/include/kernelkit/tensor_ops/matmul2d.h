// kernelkit/tensor_ops/matmul2d.h: mpp::tensor_ops::matmul2d, as MPPTensorOpsMatMul2d.h declares it.
//
//   matmul2d<descriptor, scope> op;
//   op.run(left, right, destination);   // destination (+)= left * right, over all of K
//
// Operands are tensors (device or threadgroup memory, any strides) or cooperative tensors from
// this op's getters. The tile is descriptor.m x descriptor.n; K is descriptor.k, or with a dynamic
// k the left tensor's K extent (the right's when the left is cooperative). Elements past an
// operand's extents read as zero; destination elements past its extents are not written.
// The path is chosen here (DESIGN.md "Tensor ops" has the table): run takes the warpgroup path
// (warpgroup.h, sm_90a) where it applies and is ready, else path_of below: the warp's tensor cores
// (mma_sync.h) where the target and the types allow, the loops (loops.h) elsewhere. Every path
// leaves a cooperative destination in layout.h's layout.
#pragma once

namespace kk {
namespace tops {

enum class path { loops, mma_sync };

// Accumulator of a destination element type for these operands: int32 for int8 into integers,
// double for doubles (the CPU's float64 references and gradchecks), float otherwise.
template <class LV, class RV, class DV>
using accumulator_t = conditional_t<is_int8_v<LV> && is_int8_v<RV> && is_integer_v<DV>, int,
                                    conditional_t<is_same_v<LV, double> && is_same_v<RV, double>, double, float>>;

template <class Layout, class Left, class Right, class Dest>
KK_FN constexpr path path_of() {
#if defined(KK_TARGET_CUDA) && defined(KK_TOPS_MMA_SYNC)
  if constexpr (!Layout::whole && !is_cooperative_v<Right> &&
                (!is_cooperative_v<Left> || mma_sync_left_input_v<Left, typename operand_traits<Right>::value_type>))
    return mma_sync_supported<typename operand_traits<Left>::value_type, typename operand_traits<Right>::value_type,
                              typename operand_traits<Dest>::value_type,
                              operand_traits<Left>::scaled || operand_traits<Right>::scaled>() ? path::mma_sync : path::loops;
#endif
  return path::loops;
}

}  // namespace tops
}  // namespace kk

namespace mpp {
namespace tensor_ops {

template <matmul2d_descriptor Descriptor, class Scope, class... Args>
class matmul2d {
  static_assert(metal::is_execution_simdgroups_v<Scope> || metal::is_execution_thread_v<Scope>,
                "Scope template argument should be of op_scope type");
  static_assert(Descriptor.m > 0 && Descriptor.n > 0, "matmul2d: the descriptor's m and n must be positive");
  static_assert(Descriptor.dynamic_k() || Descriptor.k > 0, "matmul2d: the descriptor's k must be positive or dynamic");
  static constexpr int W = metal::is_execution_thread_v<Scope> ? 0 : int(Scope::static_size);
  static constexpr int KS = Descriptor.dynamic_k() ? 0 : Descriptor.k;  // static K, 0 when dynamic
  template <kk::tops::role R> using layout = kk::tops::layout<R, Descriptor.m, Descriptor.n, W>;
  template <class T> static constexpr bool plain_v = !metal::is_tensor_v<T> && !kk::tops::is_cooperative_v<T>;

 public:
  static constexpr matmul2d_descriptor descriptor = Descriptor;
  using scope = Scope;

  template <class L, class R, class T, class CoordType = int>
  using cooperative_tensor_destination_t =
      metal::cooperative_tensor<T, metal::extents<CoordType, Descriptor.n, Descriptor.m>, layout<kk::tops::role::destination>>;
  template <class L, class R, class T, class CoordType = int>
  using cooperative_tensor_row_reduction_destination_t =
      metal::cooperative_tensor<T, metal::extents<CoordType, Descriptor.m>, layout<kk::tops::role::row_reduction>>;
  template <class L, class R, class T, class CoordType = int>
  using cooperative_tensor_column_reduction_destination_t =
      metal::cooperative_tensor<T, metal::extents<CoordType, Descriptor.n>, layout<kk::tops::role::column_reduction>>;
  template <class LE, class RE, class T, class CoordType = int>
  using cooperative_tensor_left_input_t =
      metal::cooperative_tensor<LE, metal::extents<CoordType, (KS > 0 ? KS : 1), Descriptor.m>,
                                kk::tops::layout<kk::tops::role::left, Descriptor.m, (KS > 0 ? KS : 1), W>>;
  template <class LE, class RE, class T, class CoordType = int>
  using cooperative_tensor_right_input_t =
      metal::cooperative_tensor<RE, metal::extents<CoordType, Descriptor.n, (KS > 0 ? KS : 1)>,
                                kk::tops::layout<kk::tops::role::right, Descriptor.n, (KS > 0 ? KS : 1), W>>;

  template <class L, class R, class T, class CoordType = int>
  KK_FN cooperative_tensor_destination_t<L, R, T, CoordType> get_destination_cooperative_tensor() const {
    static_assert(plain_v<T> && kk::tops::is_integer_v<CoordType>, "get_destination_cooperative_tensor<Left, Right, ElementType>: ElementType must be an element type");
    return {};
  }
  template <class L, class R, class T, class CoordType = int>
  KK_FN cooperative_tensor_row_reduction_destination_t<L, R, T, CoordType> get_row_reduction_destination_cooperative_tensor() const {
    static_assert(plain_v<T>, "get_row_reduction_destination_cooperative_tensor<Left, Right, ElementType>: ElementType must be an element type");
    return {};
  }
  template <class L, class R, class T, class CoordType = int>
  KK_FN cooperative_tensor_column_reduction_destination_t<L, R, T, CoordType> get_column_reduction_destination_cooperative_tensor() const {
    static_assert(plain_v<T>, "get_column_reduction_destination_cooperative_tensor<Left, Right, ElementType>: ElementType must be an element type");
    return {};
  }

  // Input cooperative tensors: element types <left, right, destination>; a single SIMD-group and
  // a static K, as Apple requires. From a source: the destination of an op whose m x n is this
  // op's m x k (left) or k x n (right).
  template <class LE, class RE, class T, class CoordType = int>
  KK_FN cooperative_tensor_left_input_t<LE, RE, T, CoordType> get_left_input_cooperative_tensor() const {
    check_inputs<LE, RE, T>();
    return {};
  }
  template <class LE, class RE, class T, class CoordType = int>
  KK_FN cooperative_tensor_right_input_t<LE, RE, T, CoordType> get_right_input_cooperative_tensor() const {
    check_inputs<LE, RE, T, false>();
    return {};
  }
  template <class LE, class RE, class T, class CoordType = int, class SE, class SX, class SL>
  KK_FN cooperative_tensor_left_input_t<LE, RE, T, CoordType> get_left_input_cooperative_tensor(
      const metal::cooperative_tensor<SE, SX, SL>& src, kk::site s = KK_TOPS_SITE("get_left_input_cooperative_tensor")) const {
    check_source<LE, RE, T, SL, Descriptor.m, KS>();
    cooperative_tensor_left_input_t<LE, RE, T, CoordType> r;
    kk::tops::relayout(r, src, s);
    return r;
  }
  template <class LE, class RE, class T, class CoordType = int, class SE, class SX, class SL>
  KK_FN cooperative_tensor_right_input_t<LE, RE, T, CoordType> get_right_input_cooperative_tensor(
      const metal::cooperative_tensor<SE, SX, SL>& src, kk::site s = KK_TOPS_SITE("get_right_input_cooperative_tensor")) const {
    check_source<LE, RE, T, SL, KS, Descriptor.n, false>();
    cooperative_tensor_right_input_t<LE, RE, T, CoordType> r;
    kk::tops::relayout(r, src, s);
    return r;
  }
  // Whether get_*_input_cooperative_tensor(src) is a copy in registers (no lane exchange).
  template <class LE, class RE, class T, class SE, class SX, class SL>
  KK_FN bool is_compatible_as_left_input(const metal::cooperative_tensor<SE, SX, SL>&) const {
    check_source<LE, RE, T, SL, Descriptor.m, KS>();
    return kk::tops::same_registers_v<typename cooperative_tensor_left_input_t<LE, RE, T>::layout, SL>;
  }
  template <class LE, class RE, class T, class SE, class SX, class SL>
  KK_FN bool is_compatible_as_right_input(const metal::cooperative_tensor<SE, SX, SL>&) const {
    check_source<LE, RE, T, SL, KS, Descriptor.n, false>();
    return kk::tops::same_registers_v<typename cooperative_tensor_right_input_t<LE, RE, T>::layout, SL>;
  }

  // (Apple's takes lvalues; kernelkit also takes a slice made in the call.)
  template <class Left, class Right, class Dest>
  KK_FN void run(Left&& left, Right&& right, Dest&& destination, kk::site s = KK_TOPS_SITE("matmul2d::run")) const {
    using kk::tops::remove_reference_t;
    run_on<remove_reference_t<Left>, remove_reference_t<Right>, remove_reference_t<Dest>>(left, right, destination, s);
  }

 private:
  template <class Left, class Right, class Dest>
  KK_FN void run_on(Left& left, Right& right, Dest& destination, const kk::site& s) const {
    using namespace kk::tops;
    static_assert(!plain_v<Left> && !plain_v<Right> && !plain_v<Dest>,
                  "matmul2d::run(left, right, destination): each operand must be a tensor or a cooperative tensor");
    static_assert(rank2<Left>() && rank2<Right>() && rank2<Dest>(),
                  "matmul2d::run(left, right, destination): tensor operands must be rank 2 (extents: columns, rows)");
    static_assert(!is_cooperative_v<Left> || !Descriptor.transpose_left, "Input cooperative tensor cannot be transposed");
    static_assert(!is_cooperative_v<Right> || !Descriptor.transpose_right, "Input cooperative tensor cannot be transposed");
    static_assert(!(is_cooperative_v<Left> || is_cooperative_v<Right>) || KS > 0,
                  "Inner dimension cannot be dynamic with input cooperative tensors");
    static_assert(!(operand_traits<Left>::scaled || operand_traits<Right>::scaled) ||
                  (!is_integer_v<typename operand_traits<Dest>::value_type>),
                  "matmul2d::run: a scaled (MXFP8) product needs a floating-point destination");
    check_scope(W, s);
    using DV = typename operand_traits<Dest>::value_type;
    using Acc = accumulator_t<typename operand_traits<Left>::value_type, typename operand_traits<Right>::value_type, DV>;
    using DL = layout<role::destination>;
    int K = KS;
    if constexpr (KS == 0) {
      if constexpr (metal::is_tensor_v<Left>) K = left_k<Descriptor.transpose_left>(left);
      else K = right_k<Descriptor.transpose_right>(right);
    }
#if defined(KK_TOPS_WGMMA)
    using wg = warpgroup_matmul<Descriptor, W, Left, Right, Dest, Acc>;
    if constexpr (wg::applies) {
      if (wg::ready(left, right)) {
        report(wg::name(), s);
        wg::run(left, right, destination, K);
        return;
      }
    }
#endif
    constexpr bool accumulate = Descriptor.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate;
    Acc acc[DL::capacity];
    if constexpr (is_cooperative_v<Dest>) {
      static_assert(is_same_v<typename Dest::layout, DL>, "matmul2d::run: the destination cooperative tensor is not this op's");
      KK_TOPS_UNROLL
      for (int i = 0; i < DL::capacity; ++i) acc[i] = accumulate ? convert<Acc>(destination.v[i]) : Acc(0);
    } else {
      KK_TOPS_UNROLL
      for (int i = 0; i < DL::capacity; ++i) {
        int row, col;
        DL::at(i, row, col);
        acc[i] = accumulate ? tensor_value<Acc>(destination, col, row) : Acc(0);
      }
    }
#if defined(KK_TOPS_MMA_SYNC)
    if constexpr (path_of<DL, Left, Right, Dest>() == path::mma_sync) {
      report(mma_sync_matmul<Acc, Descriptor, DL, Left, Right>::name(), s);
      mma_sync_matmul<Acc, Descriptor, DL, Left, Right>::run(acc, left, right, K);
    } else
#endif
    {
      report(loops_matmul<Acc, Descriptor, DL, Left, Right>::name(), s);
      loops_matmul<Acc, Descriptor, DL, Left, Right>::run(acc, left, right, K, s);
    }
    if constexpr (is_cooperative_v<Dest>) {
      KK_TOPS_UNROLL
      for (int i = 0; i < DL::capacity; ++i) destination.v[i] = convert<DV>(acc[i]);
    } else {
      KK_TOPS_UNROLL
      for (int i = 0; i < DL::capacity; ++i) {
        int row, col;
        DL::at(i, row, col);
        if (DL::is_valid(i) && col < int(destination.get_extent(0)) && row < int(destination.get_extent(1)))
          destination(col, row) = convert<DV>(acc[i]);
      }
    }
  }

  template <class T> static constexpr KK_FN bool rank2() {
    if constexpr (metal::is_tensor_v<T>) return kk::tops::remove_const_t<T>::R == 2;
    else return true;
  }

  // With KK_TOPS_REPORT (KERNELKIT_TENSOR_OPS_REPORT=1), the launch's first thread prints each run's path.
  static KK_FN void report(const char* path, const kk::site& s) {
#if defined(KK_TOPS_REPORT)
    if (kk::tops::first_thread())
      printf("kernelkit tensor ops: %s:%u: matmul2d<(%d, %d, %d%s), %s<%d>>: %s\n", s.file, s.line, Descriptor.m,
             Descriptor.n, KS, KS ? "" : ": dynamic", W ? "execution_simdgroups" : "execution_threads", W ? W : 1, path);
#else
    (void)path, (void)s;
#endif
  }

  // Apple's SDK takes input cooperative tensors on execution_simdgroup only. kernelkit also takes
  // a left input on execution_simdgroups<N> (on Hopper, a warpgroup's left input in registers is
  // wgmma's A operand; a body that uses it is kernelkit's, not Apple's); a right input's columns
  // would be spread over the SIMD-groups, so it stays single.
  template <class LE, class RE, class T, bool Left = true>
  static KK_FN void check_inputs() {
    static_assert(W == 1 || (Left && W > 1), "Input cooperative tensors require a single SIMD group "
                                             "(kernelkit: a left input also takes execution_simdgroups<N>)");
    static_assert(KS > 0, "Inner dimension cannot be dynamic with input cooperative tensors");
    static_assert(plain_v<LE> && plain_v<RE> && plain_v<T>, "input cooperative tensors take element types <left, right, destination>");
  }
  template <class LE, class RE, class T, class SL, int OUTER, int INNER, bool Left = true>
  static KK_FN void check_source() {
    check_inputs<LE, RE, T, Left>();
    static_assert(SL::which == kk::tops::role::destination, "Source must be matmul2d cooperative destination tensor");
    static_assert(SL::simdgroups == W, "Source must be a cooperative destination of an op of the same scope");
    static_assert(SL::outer == OUTER && SL::inner == INNER,
                  "Source extents must match the input's: (m x k) for a left input, (k x n) for a right input");
  }
};

}  // namespace tensor_ops
}  // namespace mpp
