// relu(lhs @ rhs + bias) for one tile of one batch, written with the tensor-op layer as the talk
// writes a matmul: the threadgroup slices its tile, runs matmul2d once over all of K into a
// destination cooperative tensor, applies the epilogue to it in registers and stores it once.
// Template values: T (element type), TILEM x TILEN on execution_simdgroups<SG>, BAND (tile rows
// a band: the threadgroups in flight share rows of lhs and columns of rhs in L2), RELU (0: a
// plain matmul plus bias, the backward's), RELAXED (float as tf32).
//
// Inputs are read through their strides (broadcast batch dims and bias have stride 0), so the
// caller's views need no copies; the output is contiguous.

  const int nd = lhs_ndim;
  const int M = lhs_shape[nd - 2], K = lhs_shape[nd - 1], N = rhs_shape[nd - 1];
  const int tiles_n = ceildiv(N, TILEN), tiles_m = ceildiv(M, TILEM);
  const uint g = threadgroup_position_in_grid.x;
  const uint batch = g / uint(tiles_n * tiles_m);
  const int id = int(g % uint(tiles_n * tiles_m)), first = id / (BAND * tiles_n) * BAND;
  const int band_rows = min(BAND, tiles_m - first), in_band = id - first * tiles_n;
  const int m0 = (first + in_band % band_rows) * TILEM, n0 = (in_band / band_rows) * TILEN;

  // Where this batch's matrices start: the batch dims may broadcast (stride 0).
  const device T* a = lhs + elem_to_loc(int64_t(batch), lhs_shape, lhs_strides, nd - 2);
  const device T* b = rhs + elem_to_loc(int64_t(batch), rhs_shape, rhs_strides, nd - 2);
  const device T* c = bias + elem_to_loc(int64_t(batch), bias_shape, bias_strides, nd - 2);
  const int64_t c_m = bias_strides[nd - 2], c_n = bias_strides[nd - 1];

  auto A = tensor(a, dextents<int, 2>(K, M), array<int, 2>({int(lhs_strides[nd - 1]), int(lhs_strides[nd - 2])}));
  auto B = tensor(b, dextents<int, 2>(N, K), array<int, 2>({int(rhs_strides[nd - 1]), int(rhs_strides[nd - 2])}));
  auto C = tensor(out + int64_t(batch) * M * N, dextents<int, 2>(N, M));
  auto tA = A.slice(0, m0);
  auto tB = B.slice(n0, 0);

  constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, false, false, RELAXED != 0);
  matmul2d<descriptor, execution_simdgroups<SG>> op;
  auto acc = op.template get_destination_cooperative_tensor<decltype(tA), decltype(tB), ACC>();
  op.run(tA, tB, acc);

  // The epilogue, on the accumulators: bias, then relu (NaN stays NaN, as torch.relu). In chunks
  // of 32 (unrolled: indexed by constants, the accumulators stay in registers): each chunk's bias
  // loads are issued together, so their latencies overlap instead of adding up.
  constexpr int CHUNK = 32;
#pragma unroll
  for (int c0 = 0; c0 < acc.get_capacity(); c0 += CHUNK) {
    ACC bv[CHUNK];
#pragma unroll
    for (int j = 0; j < CHUNK && c0 + j < acc.get_capacity(); ++j) {
      auto idx = acc.get_multidimensional_index(c0 + j);  // (n, m) in the tile
      const int m = m0 + idx[1], n = n0 + idx[0];
      bv[j] = acc.is_valid_element(c0 + j) && m < M && n < N ? ACC(c[m * c_m + n * c_n]) : ACC(0);
    }
#pragma unroll
    for (int j = 0; j < CHUNK && c0 + j < acc.get_capacity(); ++j) {
      ACC v = acc[c0 + j] + bv[j];
      acc[c0 + j] = RELU && v < ACC(0) ? ACC(0) : v;
    }
  }
  acc.store(C.slice(n0, m0));
