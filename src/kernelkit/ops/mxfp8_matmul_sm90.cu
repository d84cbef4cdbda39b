// dequant(a) @ dequant(b)^T for MXFP8 operands on Hopper (sm_90a): the tensor-op layer's
// persistent GEMM, scaled (tensor_ops/sm90_persistent.h, run_scaled), one threadgroup an SM
// walking the 128 x 128 output tiles; mxfp8.py's matmul2d kernel is the same op on every other
// path. a (M, K) and b (N, K): e4m3 bytes, rows contiguous; their scales (M and N, blocks): ue8m0
// bytes, rows at a_scales_strides[0] / b_scales_strides[0]. Template value: TC, the output type.

  using G = kk::tops::sm90::persistent_gemm<__nv_fp8_e4m3, true, true, 16, false, TC>;
  const int M = a_shape[0], K = a_shape[1], N = b_shape[0];
  const G::operand A{a, 0, a_strides[0], 1}, B{b, 0, b_strides[0], 1};
  const G::operand SA{a_scales, 0, a_scales_strides[0], 1}, SB{b_scales, 0, b_scales_strides[0], 1};
  G::run_scaled(A, SA, B, SB, c, 1, M, N, K, [](float&, float&, float, float, int, int, int) {});
