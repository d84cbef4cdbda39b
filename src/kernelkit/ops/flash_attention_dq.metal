// Flash attention backward, dQ (FlashAttention-2): a threadgroup takes a block of NW * 16 queries
// of one (batch, head), as the forward; each SIMD-group its 16. First delta = rowsum(dO * O) - dlse
// (written out for the dK / dV kernel), then over the keys, BK at a time through threadgroup
// memory: P = exp(S * scale - lse) recomputed, dP = dO V^T, dS = P (dP - delta), dQ += dS K,
// dS reused in registers as the left input. dq = dQ * scale.
constexpr int ROWS = FA_ROWS, BQ = NW * ROWS, THREADS = NW * 32;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
const int b = threadgroup_position_in_grid.z, h = threadgroup_position_in_grid.y, hk = h / (H / Hkv);
const int q0 = threadgroup_position_in_grid.x * BQ;
const uint sgid = simdgroup_index_in_threadgroup, tid = thread_index_in_threadgroup;
const int row0 = q0 + int(sgid) * ROWS;
const long bh = long(b) * H + h;
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e): exp2 below

auto tQ = tensor(q + b * q_strides[0] + h * q_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(q_strides[2])}));
auto tO = tensor(o + b * o_strides[0] + h * o_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_strides[2])}));
auto tdO = tensor(dout + b * dout_strides[0] + h * dout_strides[1], dextents<int, 2>(D, Sq),
                  array<int, 2>({1, int(dout_strides[2])}));
auto tQSlice = tQ.template slice<D, ROWS>(0, row0);
auto tdOSlice = tdO.template slice<D, ROWS>(0, row0);
const device T* kp = k + b * k_strides[0] + hk * k_strides[1];
const device T* vp = v + b * v_strides[0] + hk * v_strides[1];
threadgroup T Ks[BK * fa_pitch<D, T>()];
threadgroup T Vs[BK * fa_pitch<D, T>()];
auto tK = tensor(Ks, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));
auto tV = tensor(Vs, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));

// S = Q K^T and dP = dO V^T (16 x BK), one descriptor
constexpr auto mul_qk_op_desc = matmul2d_descriptor(ROWS, BK, D, false, true);
matmul2d<mul_qk_op_desc, execution_simdgroup> mul_qk_op;
// dQ += dS K (16 x D)
constexpr auto mul_sk_op_desc = matmul2d_descriptor(ROWS, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_sk_op_desc, execution_simdgroup> mul_sk_op;
using In = decltype(mul_sk_op.template get_left_input_cooperative_tensor<T, T, A>());
auto ctdQ = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();

// delta: dO and O loaded into cooperative tensors of dQ's layout, their product reduced by rows
auto ctDelta = mul_sk_op.template get_row_reduction_destination_cooperative_tensor<In, decltype(tK), A>();
{
  auto ctdO = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();
  auto ctOut = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();
  ctdO.load(tdOSlice);
  ctOut.load(tO.template slice<D, ROWS>(0, row0));
  for (ushort i = 0; i < ctdO.get_capacity(); ++i) ctdO[i] *= ctOut[i];
  reduce_rows(ctdO, ctDelta, reduction_operation::sum, A(0));
  auto ctdLse = mul_sk_op.template get_row_reduction_destination_cooperative_tensor<In, decltype(tK), A>();
  ctdLse.load(tensor(dlse + bh * Sq, dextents<int, 1>(Sq)).slice(row0));
  for (ushort i = 0; i < ctDelta.get_capacity(); ++i) ctDelta[i] -= ctdLse[i];
  if (thread_index_in_simdgroup % 4 == 0)
    for (ushort i = 0; i < ctDelta.get_capacity(); ++i) {
      const int query = row0 + ctDelta.get_multidimensional_index(i)[0];
      if (ctDelta.is_valid_element(i) && query < Sq) delta[bh * Sq + query] = ctDelta[i];
    }
}
// each row's lse in the log2 domain
auto ctLse = mul_qk_op.template get_row_reduction_destination_cooperative_tensor<decltype(tQSlice), decltype(tK), A>();
ctLse.load(tensor(lse + bh * Sq, dextents<int, 1>(Sq)).slice(row0));
for (ushort i = 0; i < ctLse.get_capacity(); ++i) ctLse[i] *= A(1.4426950408889634);

// This SIMD-group's queries and output gradients, read once as the left inputs of every tile's
// products (in registers: the tiles' fragments then all come from threadgroup memory).
auto ctQ = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctQ.load(tQSlice);
auto ctdOIn = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctdOIn.load(tdOSlice);
auto ctS = mul_qk_op.template get_destination_cooperative_tensor<decltype(ctQ), decltype(tK), A>();
auto ctdP = mul_qk_op.template get_destination_cooperative_tensor<decltype(ctdOIn), decltype(tV), A>();
const int kend = causal ? min(Sk, q0 + BQ) : Sk;  // causal: no key past the block's last query
for (int k0 = 0; k0 < kend; k0 += BK) {
  threadgroup_barrier(mem_flags::mem_threadgroup);
  fa_stage<BK, D, THREADS>(Ks, kp + k0 * k_strides[2], k_strides[2], Sk - k0, tid);
  fa_stage<BK, D, THREADS>(Vs, vp + k0 * v_strides[2], v_strides[2], Sk - k0, tid);
  threadgroup_barrier(mem_flags::mem_threadgroup);

  mul_qk_op.run(ctQ, tK, ctS);
  if (k0 + BK <= Sk && (!causal || k0 + BK - 1 <= row0)) {  // every key seen by every query: no mask
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++) *it = exp2(*it * scale2 - *ctLse.map_iterator(it));
  } else {
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++) {
      const auto idx = it.get_multidimensional_index();
      const int key = k0 + idx[0], query = row0 + idx[1];
      *it = key < Sk && (!causal || key <= query) ? exp2(*it * scale2 - *ctLse.map_iterator(it)) : A(0);
    }
  }
  mul_qk_op.run(ctdOIn, tV, ctdP);
  #pragma clang loop unroll(full)
  for (auto it = ctS.begin(); it != ctS.end(); it++)
    *it *= ctdP[it.get_index()] - *ctDelta.map_iterator(it);  // dS (ctdP: the same layout)
  auto ctdS = mul_sk_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
  mul_sk_op.run(ctdS, tK, ctdQ);
}

for (ushort i = 0; i < ctdQ.get_capacity(); ++i) ctdQ[i] *= A(scale);
const long o_row = BSHD ? long(H) * D : long(D);
auto tdQ = tensor(dq + fa_offset<BSHD>(b, h, 0, H, Sq, D), dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_row)}));
ctdQ.store(tdQ.slice(0, row0));
