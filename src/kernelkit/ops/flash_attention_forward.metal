// Flash attention forward, one op over the whole threadgroup: o = softmax(q k^T * scale) v and the
// log-sum-exp of each row. q, k, v: (B, H, S, D) views (any strides, the last dim packed); k and v
// have H / group heads. A threadgroup of NW SIMD-groups takes a block of NW * 16 queries of one
// (batch, head) and runs the talk's loop with ops of scope execution_simdgroups<NW>: the queries
// are the left input of QK^T in registers, K and V are read as device tensors BK keys at a time
// (on Hopper the ops stage them into shared memory themselves and run wgmma, A in registers),
// reduce_rows and map_iterator do the softmax, and the probabilities are the left input of the
// PV product in registers.
constexpr int BQ = NW * FA_ROWS;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
const int b = threadgroup_position_in_grid.z, h = threadgroup_position_in_grid.y, hk = h / (H / Hkv);
const int q0 = threadgroup_position_in_grid.x * BQ;
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e)

auto tQ = tensor(q + b * q_strides[0] + h * q_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(q_strides[2])}));
auto tK = tensor(k + b * k_strides[0] + hk * k_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(k_strides[2])}));
auto tV = tensor(v + b * v_strides[0] + hk * v_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(v_strides[2])}));

// S = Q K^T (BQ x BK; K is held row-major, so the right operand is transposed)
constexpr auto mul_qk_op_desc = matmul2d_descriptor(BQ, BK, D, false, true);
matmul2d<mul_qk_op_desc, execution_simdgroups<NW>> mul_qk_op;
// O += P V (BQ x D)
constexpr auto mul_sv_op_desc = matmul2d_descriptor(BQ, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_sv_op_desc, execution_simdgroups<NW>> mul_sv_op;

auto ctQ = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctQ.load(tQ.slice(0, q0));
auto ctQK = mul_qk_op.template get_destination_cooperative_tensor<decltype(ctQ), decltype(tK), A>();
using Rows = decltype(mul_qk_op.template get_row_reduction_destination_cooperative_tensor<decltype(ctQ), decltype(tK), A>());
Rows ctRowMax, ctRowSum, ctTile;  // running max and sum of each row (log2 domain); per-tile scratch
for (ushort i = 0; i < ctRowMax.get_capacity(); ++i) ctRowMax[i] = -INFINITY;
auto ctO = mul_sv_op.template get_destination_cooperative_tensor<
    decltype(mul_sv_op.template get_left_input_cooperative_tensor<T, T, A>()), decltype(tV), A>();

// Causal (top-left aligned, as torch's is_causal): query i sees keys j <= i, so keys past the
// block's last query are never needed. Every row sees key 0, so each row's max is finite after
// the first tile and no exp2 below meets -inf - -inf (Sk == 0 never gets here).
const int kend = causal ? min(Sk, q0 + BQ) : Sk;
for (int k0 = 0; k0 < kend; k0 += BK) {
  mul_qk_op.run(ctQ, tK.slice(0, k0), ctQK);
  // ctTile: each row's max of the tile's scaled scores. A tile that every query sees whole keeps
  // its raw scores (the scale goes into the exponent below: one FMA an element); the others are
  // masked and scaled here.
  A mul = scale2;
  if (k0 + BK <= Sk && (!causal || k0 + BK - 1 <= q0)) {
    if (scale2 >= A(0)) reduce_rows(ctQK, ctTile, reduction_operation::max, A(-INFINITY));
    else reduce_rows(ctQK, ctTile, reduction_operation::min, A(INFINITY));
    for (ushort i = 0; i < ctTile.get_capacity(); ++i) ctTile[i] *= scale2;
  } else {
    #pragma clang loop unroll(full)
    for (auto it = ctQK.begin(); it != ctQK.end(); it++) {
      const auto idx = it.get_multidimensional_index();  // (key, query) within the tile
      const int key = k0 + idx[0], query = q0 + idx[1];
      *it = key < Sk && (!causal || key <= query) ? *it * scale2 : A(-INFINITY);
    }
    mul = A(1);
    reduce_rows(ctQK, ctTile, reduction_operation::max, A(-INFINITY));
  }
  // A row's max moves only when the tile's exceeds it by more than 8 (log2 domain): below that its
  // exponentials stay under 2^8, exact enough in float and bfloat, and the output and sums keep
  // their scale. After the first tiles most SIMD-groups skip the rescaling (FlashAttention-4's).
  bool grew = false;
  for (ushort i = 0; i < ctRowMax.get_capacity(); ++i) grew |= ctTile[i] > ctRowMax[i] + A(8);
  if (simd_any(grew)) {
    for (ushort i = 0; i < ctRowMax.get_capacity(); ++i) {  // new max; ctTile becomes the rescale factor
      const A m = max(ctRowMax[i], ctTile[i]);
      ctTile[i] = exp2(ctRowMax[i] - m);
      ctRowMax[i] = m;
    }
    #pragma clang loop unroll(full)
    for (auto it = ctO.begin(); it != ctO.end(); it++) *it *= *ctTile.map_iterator(it);
    for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) ctRowSum[i] *= ctTile[i];
  }
  #pragma clang loop unroll(full)
  for (auto it = ctQK.begin(); it != ctQK.end(); it++) {
    auto row_it = ctRowMax.map_iterator(it);
    *it = exp2(*it * mul - *row_it);
  }
  reduce_rows(ctQK, ctTile, reduction_operation::sum, A(0));
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) ctRowSum[i] += ctTile[i];

  // The probabilities as the left input of P V: the destination's registers as they are.
  auto ctP = mul_sv_op.template get_left_input_cooperative_tensor<T, T, A>(ctQK);
  mul_sv_op.run(ctP, tV.slice(0, k0), ctO);
}

#pragma clang loop unroll(full)
for (auto it = ctO.begin(); it != ctO.end(); it++) *it /= *ctRowSum.map_iterator(it);
const long o_row = BSHD ? long(H) * D : long(D);
auto tO = tensor(o + fa_offset<BSHD>(b, h, 0, H, Sq, D), dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_row)}));
ctO.store(tO.slice(0, q0));
// The four lanes of a quad hold the same rows: the first writes them.
if (thread_index_in_simdgroup % 4 == 0)
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) {
    const int query = q0 + ctRowSum.get_multidimensional_index(i)[0];
    if (ctRowSum.is_valid_element(i) && query < Sq)
      lse[(long(b) * H + h) * Sq + query] = (ctRowMax[i] + log2(ctRowSum[i])) * A(0.6931471805599453);  // ln(2): natural log
  }
