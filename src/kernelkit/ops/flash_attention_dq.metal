// Flash attention backward, dQ (FlashAttention-2): a threadgroup takes a block of NW * 16 queries
// of one (batch, head), as the forward, and runs its ops over the whole threadgroup (on Hopper a
// warpgroup's wgmma, the queries, output gradients and dS its register operands). First delta =
// rowsum(dO * O) - dlse (written out for the dK / dV kernel), then over the keys, BK at a time,
// K and V read as device tensors: P = exp(S * scale - lse) recomputed, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K, dS reused in registers as the left input. dq = dQ * scale.
constexpr int BQ = NW * FA_ROWS;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2];
const int b = threadgroup_position_in_grid.z, h = threadgroup_position_in_grid.y, hk = h / (H / Hkv);
const int q0 = threadgroup_position_in_grid.x * BQ;
const long bh = long(b) * H + h;
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e): exp2 below

auto tQ = tensor(q + b * q_strides[0] + h * q_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(q_strides[2])}));
auto tO = tensor(o + b * o_strides[0] + h * o_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_strides[2])}));
auto tdO = tensor(dout + b * dout_strides[0] + h * dout_strides[1], dextents<int, 2>(D, Sq),
                  array<int, 2>({1, int(dout_strides[2])}));
auto tK = tensor(k + b * k_strides[0] + hk * k_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(k_strides[2])}));
auto tV = tensor(v + b * v_strides[0] + hk * v_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(v_strides[2])}));

// S = Q K^T and dP = dO V^T (BQ x BK), one descriptor
constexpr auto mul_qk_op_desc = matmul2d_descriptor(BQ, BK, D, false, true);
matmul2d<mul_qk_op_desc, execution_simdgroups<NW>> mul_qk_op;
// dQ += dS K (BQ x D)
constexpr auto mul_sk_op_desc = matmul2d_descriptor(BQ, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_sk_op_desc, execution_simdgroups<NW>> mul_sk_op;
using In = decltype(mul_sk_op.template get_left_input_cooperative_tensor<T, T, A>());
auto ctdQ = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();

// delta: dO and O loaded into cooperative tensors of dQ's layout, their product reduced by rows
auto ctDelta = mul_sk_op.template get_row_reduction_destination_cooperative_tensor<In, decltype(tK), A>();
{
  auto ctdO = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();
  auto ctOut = mul_sk_op.template get_destination_cooperative_tensor<In, decltype(tK), A>();
  ctdO.load(tdO.slice(0, q0));
  ctOut.load(tO.slice(0, q0));
  for (ushort i = 0; i < ctdO.get_capacity(); ++i) ctdO[i] *= ctOut[i];
  reduce_rows(ctdO, ctDelta, reduction_operation::sum, A(0));
  auto ctdLse = mul_sk_op.template get_row_reduction_destination_cooperative_tensor<In, decltype(tK), A>();
  ctdLse.load(tensor(dlse + bh * Sq, dextents<int, 1>(Sq)).slice(q0));
  for (ushort i = 0; i < ctDelta.get_capacity(); ++i) ctDelta[i] -= ctdLse[i];
  if (thread_index_in_simdgroup % 4 == 0)
    for (ushort i = 0; i < ctDelta.get_capacity(); ++i) {
      const int query = q0 + ctDelta.get_multidimensional_index(i)[0];
      if (ctDelta.is_valid_element(i) && query < Sq) delta[bh * Sq + query] = ctDelta[i];
    }
}
// The block's queries and output gradients, read once as the left inputs of every tile's
// products (in registers).
auto ctQ = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctQ.load(tQ.slice(0, q0));
auto ctdOIn = mul_qk_op.template get_left_input_cooperative_tensor<T, T, A>();
ctdOIn.load(tdO.slice(0, q0));
// each row's lse in the log2 domain
auto ctLse = mul_qk_op.template get_row_reduction_destination_cooperative_tensor<decltype(ctQ), decltype(tK), A>();
ctLse.load(tensor(lse + bh * Sq, dextents<int, 1>(Sq)).slice(q0));
for (ushort i = 0; i < ctLse.get_capacity(); ++i) ctLse[i] *= A(1.4426950408889634);
auto ctS = mul_qk_op.template get_destination_cooperative_tensor<decltype(ctQ), decltype(tK), A>();
auto ctdP = mul_qk_op.template get_destination_cooperative_tensor<decltype(ctdOIn), decltype(tV), A>();
const int kend = causal ? min(Sk, q0 + BQ) : Sk;  // causal: no key past the block's last query
for (int k0 = 0; k0 < kend; k0 += BK) {
  mul_qk_op.run(ctQ, tK.slice(0, k0), ctS);
  if (k0 + BK <= Sk && (!causal || k0 + BK - 1 <= q0)) {  // every key seen by every query: no mask
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++) *it = exp2(*it * scale2 - *ctLse.map_iterator(it));
  } else {
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++) {
      const auto idx = it.get_multidimensional_index();
      const int key = k0 + idx[0], query = q0 + idx[1];
      *it = key < Sk && (!causal || key <= query) ? exp2(*it * scale2 - *ctLse.map_iterator(it)) : A(0);
    }
  }
  mul_qk_op.run(ctdOIn, tV.slice(0, k0), ctdP);
  #pragma clang loop unroll(full)
  for (auto it = ctS.begin(); it != ctS.end(); it++)
    *it *= ctdP[it.get_index()] - *ctDelta.map_iterator(it);  // dS (ctdP: the same layout)
  auto ctdS = mul_sk_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
  mul_sk_op.run(ctdS, tK.slice(0, k0), ctdQ);
}

for (ushort i = 0; i < ctdQ.get_capacity(); ++i) ctdQ[i] *= A(scale);
const long o_row = BSHD ? long(H) * D : long(D);
auto tdQ = tensor(dq + fa_offset<BSHD>(b, h, 0, H, Sq, D), dextents<int, 2>(D, Sq), array<int, 2>({1, int(o_row)}));
ctdQ.store(tdQ.slice(0, q0));
