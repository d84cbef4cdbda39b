// Flash attention forward: o = softmax(q k^T * scale) v and the log-sum-exp of each row.
// q, k, v: (B, H, S, D) views (any strides, the last dim packed); k and v have H / group heads.
// A threadgroup of NW SIMD-groups takes a block of NW * 16 queries of one (batch, head); K and V
// go through threadgroup memory BK keys at a time, shared by the SIMD-groups; each SIMD-group
// runs the talk's loop on its 16 queries: QK^T into a cooperative tensor, reduce_rows for the
// tile's max, map_iterator for the exponentials and the rescaling of the running output, and the
// probabilities reused as the left input of the PV product, in registers.
constexpr int ROWS = FA_ROWS, BQ = NW * ROWS, THREADS = NW * 32;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
const int b = threadgroup_position_in_grid.z, h = threadgroup_position_in_grid.y, hk = h / (H / Hkv);
const int q0 = threadgroup_position_in_grid.x * BQ;
const uint sgid = simdgroup_index_in_threadgroup, tid = thread_index_in_threadgroup;
const int row0 = q0 + int(sgid) * ROWS;  // this SIMD-group's first query
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e)

auto tQ = tensor(q + b * q_strides[0] + h * q_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(q_strides[2])}));
auto tQSlice = tQ.template slice<D, ROWS>(0, row0);
const device T* kp = k + b * k_strides[0] + hk * k_strides[1];
const device T* vp = v + b * v_strides[0] + hk * v_strides[1];
threadgroup T Ks[BK * fa_pitch<D, T>()];
threadgroup T Vs[BK * fa_pitch<D, T>()];
auto tK = tensor(Ks, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));  // key j's row at Ks + j * pitch
auto tV = tensor(Vs, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));

// S = Q K^T (16 x BK; K is held row-major, so the right operand is transposed)
constexpr auto mul_qk_op_desc = matmul2d_descriptor(ROWS, BK, D, false, true);
matmul2d<mul_qk_op_desc, execution_simdgroup> mul_qk_op;
// O += P V (16 x D)
constexpr auto mul_sv_op_desc = matmul2d_descriptor(ROWS, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_sv_op_desc, execution_simdgroup> mul_sv_op;

// This SIMD-group's queries, read once as the left input of every tile's QK^T (in registers).
auto ctQ = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctQ.load(tQSlice);
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
  threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD-group is done with the last tile
  fa_stage<BK, D, THREADS>(Ks, kp + k0 * k_strides[2], k_strides[2], Sk - k0, tid);
  fa_stage<BK, D, THREADS>(Vs, vp + k0 * v_strides[2], v_strides[2], Sk - k0, tid);
  threadgroup_barrier(mem_flags::mem_threadgroup);

  mul_qk_op.run(ctQ, tK, ctQK);
  if (k0 + BK <= Sk && (!causal || k0 + BK - 1 <= row0)) {  // every key seen by every query: no mask
    #pragma clang loop unroll(full)
    for (auto it = ctQK.begin(); it != ctQK.end(); it++) *it *= scale2;
  } else {
    #pragma clang loop unroll(full)
    for (auto it = ctQK.begin(); it != ctQK.end(); it++) {
      const auto idx = it.get_multidimensional_index();  // (key, query) within the tile
      const int key = k0 + idx[0], query = row0 + idx[1];
      *it = key < Sk && (!causal || key <= query) ? *it * scale2 : A(-INFINITY);
    }
  }
  reduce_rows(ctQK, ctTile, reduction_operation::max, A(-INFINITY));
  for (ushort i = 0; i < ctRowMax.get_capacity(); ++i) {  // new max; ctTile becomes the rescale factor
    const A m = max(ctRowMax[i], ctTile[i]);
    ctTile[i] = exp2(ctRowMax[i] - m);
    ctRowMax[i] = m;
  }
  #pragma clang loop unroll(full)
  for (auto it = ctQK.begin(); it != ctQK.end(); it++) {
    auto row_it = ctRowMax.map_iterator(it);
    *it = exp2(*it - *row_it);
  }
  #pragma clang loop unroll(full)
  for (auto it = ctO.begin(); it != ctO.end(); it++) *it *= *ctTile.map_iterator(it);
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) ctRowSum[i] *= ctTile[i];
  reduce_rows(ctQK, ctTile, reduction_operation::sum, A(0));
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) ctRowSum[i] += ctTile[i];

  // The probabilities as the left input of P V: the destination's registers as they are.
  auto ctP = mul_sv_op.template get_left_input_cooperative_tensor<T, T, A>(ctQK);
  mul_sv_op.run(ctP, tV, ctO);
}

#pragma clang loop unroll(full)
for (auto it = ctO.begin(); it != ctO.end(); it++) *it /= *ctRowSum.map_iterator(it);
const long o_row = BSHD ? long(H) * D : long(D);
auto tO = tensor(o + fa_offset<BSHD>(b, h, 0, H, Sq, D), dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_row)}));
ctO.store(tO.slice(0, row0));
// The four lanes of a quad hold the same rows: the first writes them.
if (thread_index_in_simdgroup % 4 == 0)
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i) {
    const int query = row0 + ctRowSum.get_multidimensional_index(i)[0];
    if (ctRowSum.is_valid_element(i) && query < Sq)
      lse[(long(b) * H + h) * Sq + query] = (ctRowMax[i] + log2(ctRowSum[i])) * A(0.6931471805599453);  // ln(2): natural log
  }
