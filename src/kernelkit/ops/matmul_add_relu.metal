// relu(lhs @ rhs + bias) for one tile of one batch, written with the tensor-op layer as the talk
// writes a matmul: the threadgroup slices its tile, loads the bias into a destination
// cooperative tensor, runs matmul2d once over all of K onto it, applies the relu in registers
// and stores it once.
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

  auto A = tensor(a, dextents<int, 2>(K, M), array<int, 2>({int(lhs_strides[nd - 1]), int(lhs_strides[nd - 2])}));
  auto B = tensor(b, dextents<int, 2>(N, K), array<int, 2>({int(rhs_strides[nd - 1]), int(rhs_strides[nd - 2])}));
  auto Bias = tensor(c, dextents<int, 2>(N, M), array<int, 2>({int(bias_strides[nd - 1]), int(bias_strides[nd - 2])}));
  auto C = tensor(out + int64_t(batch) * M * N, dextents<int, 2>(N, M));
  auto tA = A.slice(0, m0);
  auto tB = B.slice(n0, 0);

  // The bias is the accumulators' starting value (multiply_accumulate): its loads are issued
  // together before the K loop, their latency under its first stages, and the epilogue is
  // only the relu.
  constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, false, false, RELAXED != 0,
                                                  matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<descriptor, execution_simdgroups<SG>> op;
  auto acc = op.template get_destination_cooperative_tensor<decltype(tA), decltype(tB), ACC>();
  acc.load(Bias.slice(n0, m0));
  op.run(tA, tB, acc);
  if (RELU) {
    // (unrolled: indexed by constants, the accumulators stay in registers; NaN stays NaN, as torch.relu)
#pragma unroll
    for (int i = 0; i < acc.get_capacity(); ++i) acc[i] = acc[i] < ACC(0) ? ACC(0) : acc[i];
  }
  acc.store(C.slice(n0, m0));
