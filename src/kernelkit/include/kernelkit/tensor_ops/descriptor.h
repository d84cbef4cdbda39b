// kernelkit/tensor_ops/descriptor.h: matmul2d_descriptor and the execution scopes, as Apple
// declares them (MPPTensorOpsMatMul2d.h, <metal_tensor>'s __exec/units.h).
//
// The descriptor is a class-type template argument of matmul2d (C++20): tensor-op kernels are
// compiled as C++20 (codegen.py). Scopes: execution_thread (one thread does the whole op),
// execution_simdgroup = execution_simdgroups<1> (the 32 lanes of one SIMD-group),
// execution_simdgroups<N> (the first N SIMD-groups of the threadgroup, together). Every thread
// of the scope must call each op (Apple: "execution scope uniform").
#pragma once

namespace metal {

template <kk::tops::usize N>
struct execution_simdgroups {
  static_assert(N != 0, "execution_simdgroups<0> is not supported");
  static constexpr kk::tops::usize static_size = N;
  constexpr KK_FN unsigned size() const { return unsigned(N); }
};
template <kk::tops::usize N>
struct execution_threads {
  static_assert(N == 1, "Only execution_thread<1> is supported");
  static constexpr kk::tops::usize static_size = N;
  constexpr KK_FN unsigned size() const { return unsigned(N); }
};
using execution_simdgroup = execution_simdgroups<1>;
using execution_thread = execution_threads<1>;

template <class T> inline constexpr bool is_execution_simdgroups_v = false;
template <kk::tops::usize N> inline constexpr bool is_execution_simdgroups_v<execution_simdgroups<N>> = true;
template <class T> inline constexpr bool is_execution_thread_v = kk::tops::is_same_v<T, execution_thread>;

}  // namespace metal

namespace mpp {
namespace tensor_ops {

struct matmul2d_descriptor {
  enum class mode {
    multiply,             // destination = left * right
    multiply_accumulate,  // destination += left * right
  };

  int m, n, k;
  bool transpose_left, transpose_right;
  bool relaxed_precision;
  mode matmul_mode;

  constexpr KK_FN matmul2d_descriptor(int __m, int __n, int __k = static_cast<int>(metal::dynamic_extent),
                                      bool __transpose_left = false, bool __transpose_right = false,
                                      bool __relaxed_precision = false, mode __matmul_mode = mode::multiply)
      : m(__m), n(__n), k(__k), transpose_left(__transpose_left), transpose_right(__transpose_right),
        relaxed_precision(__relaxed_precision), matmul_mode(__matmul_mode) {}

  // K comes from the operands at run time: either spelling of the header, or 0, which the Metal
  // Shading Language specification's matmul2d examples pass (§7.2.1: matmul2d_descriptor(64, 32, 0)).
  constexpr KK_FN bool dynamic_k() const {
    return k == static_cast<int>(metal::dynamic_extent) || k == dynamic_length_v<int> || k == 0;
  }
};

enum class reduction_operation { sum, max, min };

}  // namespace tensor_ops
}  // namespace mpp
