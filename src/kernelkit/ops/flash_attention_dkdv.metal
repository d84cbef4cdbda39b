// Flash attention backward, dK and dV (FlashAttention-2): a threadgroup takes a block of NW * 16
// keys of one (batch, key/value head) and walks every query head that reads them (grouped-query
// attention sums there, without atomics) and their queries, BK at a time, with ops over the whole
// threadgroup (on Hopper a warpgroup's wgmma): Q, dO and the block's K and V read as device
// tensors, lse and delta (from the dQ kernel) as column cooperative tensors read with
// map_iterator. In the keys' rows: S^T = K Q^T, P^T = exp(S^T * scale - lse), dV += P^T dO,
// dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q, P^T and dS^T reused in registers as
// left inputs (K and V stay in device memory: the two sums and two tiles fill the registers).
// dk = dK * scale.
constexpr int BKV = NW * FA_ROWS;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2], group = H / Hkv;
const int b = threadgroup_position_in_grid.z, hk = threadgroup_position_in_grid.y;
const int k0 = threadgroup_position_in_grid.x * BKV;
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e): exp2 below

auto tK = tensor(k + b * k_strides[0] + hk * k_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(k_strides[2])}));
auto tV = tensor(v + b * v_strides[0] + hk * v_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(v_strides[2])}));
auto tKSlice = tK.slice(0, k0);
auto tVSlice = tV.slice(0, k0);

// S^T = K Q^T and dP^T = V dO^T (BKV x BK), one descriptor
constexpr auto mul_kq_op_desc = matmul2d_descriptor(BKV, BK, D, false, true);
matmul2d<mul_kq_op_desc, execution_simdgroups<NW>> mul_kq_op;
// dV += P^T dO and dK += dS^T Q (BKV x D), one descriptor
constexpr auto mul_pd_op_desc = matmul2d_descriptor(BKV, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_pd_op_desc, execution_simdgroups<NW>> mul_pd_op;
using In = decltype(mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>());
using Dev = decltype(tK);  // a device tensor: the type the ops size their cooperative tensors for
auto ctdK = mul_pd_op.template get_destination_cooperative_tensor<In, Dev, A>();
auto ctdV = mul_pd_op.template get_destination_cooperative_tensor<In, Dev, A>();
auto ctS = mul_kq_op.template get_destination_cooperative_tensor<Dev, Dev, A>();
auto ctdP = mul_kq_op.template get_destination_cooperative_tensor<Dev, Dev, A>();
using Cols = decltype(mul_kq_op.template get_column_reduction_destination_cooperative_tensor<Dev, Dev, A>());
Cols ctLse, ctDelta;

// Causal: query i sees keys j <= i, so queries before the block's first key see none of it.
const int qbegin = causal ? k0 / BK * BK : 0;
for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
  const long bh = long(b) * H + hq;
  auto tQ = tensor(q + b * q_strides[0] + hq * q_strides[1], dextents<int, 2>(D, Sq), array<int, 2>({1, int(q_strides[2])}));
  auto tdO = tensor(dout + b * dout_strides[0] + hq * dout_strides[1], dextents<int, 2>(D, Sq),
                    array<int, 2>({1, int(dout_strides[2])}));
  auto tLse = tensor(lse + bh * Sq, dextents<int, 1>(Sq));
  auto tDelta = tensor(delta + bh * Sq, dextents<int, 1>(Sq));
  for (int q0 = qbegin; q0 < Sq; q0 += BK) {
    ctLse.load(tLse.slice(q0));  // (queries past Sq load as zero: their scores are masked)
    ctDelta.load(tDelta.slice(q0));
    mul_kq_op.run(tKSlice, tQ.slice(0, q0), ctS);
    // (scaled after the run, whose time hides the loads' latency)
    for (ushort i = 0; i < ctLse.get_capacity(); ++i) ctLse[i] *= A(1.4426950408889634);
    // every query of the tile sees every key of the block: no mask
    if (q0 + BK <= Sq && k0 + BKV <= Sk && (!causal || k0 + BKV - 1 <= q0)) {
      #pragma clang loop unroll(full)
      for (auto it = ctS.begin(); it != ctS.end(); it++) *it = exp2(*it * scale2 - *ctLse.map_iterator(it));
    } else {
      #pragma clang loop unroll(full)
      for (auto it = ctS.begin(); it != ctS.end(); it++) {
        const auto idx = it.get_multidimensional_index();  // (query, key) within the tiles
        const int query = q0 + idx[0], key = k0 + idx[1];
        *it = query < Sq && key < Sk && (!causal || key <= query) ? exp2(*it * scale2 - *ctLse.map_iterator(it)) : A(0);
      }
    }
    auto ctP = mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
    mul_pd_op.run(ctP, tdO.slice(0, q0), ctdV);
    mul_kq_op.run(tVSlice, tdO.slice(0, q0), ctdP);
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++)
      *it *= ctdP[it.get_index()] - *ctDelta.map_iterator(it);  // dS^T
    auto ctdS = mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
    mul_pd_op.run(ctdS, tQ.slice(0, q0), ctdK);
  }
}

for (ushort i = 0; i < ctdK.get_capacity(); ++i) ctdK[i] *= A(scale);
const long o_row = BSHD ? long(Hkv) * D : long(D);
auto tdK = tensor(dk + fa_offset<BSHD>(b, hk, 0, Hkv, Sk, D), dextents<int, 2>(D, Sk), array<int, 2>({1, int(o_row)}));
auto tdV = tensor(dv + fa_offset<BSHD>(b, hk, 0, Hkv, Sk, D), dextents<int, 2>(D, Sk), array<int, 2>({1, int(o_row)}));
ctdK.store(tdK.slice(0, k0));
ctdV.store(tdV.slice(0, k0));
