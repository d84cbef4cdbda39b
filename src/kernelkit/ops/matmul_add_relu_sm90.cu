// relu(lhs @ rhs + bias) on Hopper (sm_90a), 16-bit types: the tensor-op layer's persistent GEMM
// (tensor_ops/sm90_persistent.h) with the bias and relu as its epilogue. One threadgroup an SM
// walks the 128 x 256 output tiles; matmul_add_relu.metal is the same op on every other path.
// Inputs are 3-D views (batch, rows, columns) with the output's batch count; an operand whose
// batch stride is 0 is one matrix for every batch. Template values: T, KA / KB (lhs / rhs
// K-major), BIAS (0: none; 1: the layer loads the bias a pair at a time under the main loop, its
// columns contiguous and aligned; 2: the epilogue loads each element through its strides; 3: the
// layer stages its tiles by TMA, which reads it), RELU.

  using G = kk::tops::sm90::persistent_gemm<T, KA != 0, KB != 0, 16, BIAS == 3>;
  const int batches = lhs_shape[0], M = lhs_shape[1], K = lhs_shape[2], N = rhs_shape[2];
  const G::operand a{lhs, lhs_strides[0], KA ? lhs_strides[1] : lhs_strides[2], lhs_strides[0] == 0 ? 1 : batches};
  const G::operand b{rhs, rhs_strides[0], KB ? rhs_strides[2] : rhs_strides[1], rhs_strides[0] == 0 ? 1 : batches};
  const int64_t bs = bias_strides[0], br = bias_strides[1], bc = bias_strides[2];
  const G::operand source{BIAS == 1 || BIAS == 3 ? bias : nullptr, bs, br, bs == 0 ? 1 : batches};
  G::run(a, b, source, out, batches, M, N, K, [&](float& v0, float& v1, float s0, float s1, int batch, int row, int col) {
    if (BIAS == 1 || BIAS == 3) {
      v0 += s0;
      v1 += s1;
    } else if (BIAS == 2 && row < M && col < N) {
      const T* p = bias + batch * bs + row * br + col * bc;
      v0 += float(p[0]);
      v1 += float(p[bc]);
    }
    if (RELU) {  // NaN stays NaN, as torch.relu
      v0 = v0 < 0.0f ? 0.0f : v0;
      v1 = v1 < 0.0f ? 0.0f : v1;
    }
  });
