// Flash attention backward, dK and dV (FlashAttention-2): a threadgroup takes a block of NW * 16
// keys of one (batch, key/value head), each SIMD-group its 16, and walks every query head that
// reads them (grouped-query attention sums there, without atomics) and their queries, BK at a
// time: Q and dO through threadgroup memory, lse and delta (from the dQ kernel) as column
// cooperative tensors read with map_iterator. In the keys' rows: S^T = K Q^T, P^T =
// exp(S^T * scale - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q,
// P^T and dS^T reused in registers as left inputs. dk = dK * scale.
constexpr int ROWS = FA_ROWS, BKV = NW * ROWS, THREADS = NW * 32;
const int H = q_shape[1], Sq = q_shape[2], Hkv = k_shape[1], Sk = k_shape[2], group = H / Hkv;
const int b = threadgroup_position_in_grid.z, hk = threadgroup_position_in_grid.y;
const int k0 = threadgroup_position_in_grid.x * BKV;
const uint sgid = simdgroup_index_in_threadgroup, tid = thread_index_in_threadgroup;
const int key0 = k0 + int(sgid) * ROWS;  // this SIMD-group's first key
const A scale2 = A(scale) * A(1.4426950408889634);  // log2(e): exp2 below

auto tK = tensor(k + b * k_strides[0] + hk * k_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(k_strides[2])}));
auto tV = tensor(v + b * v_strides[0] + hk * v_strides[1], dextents<int, 2>(D, Sk), array<int, 2>({1, int(v_strides[2])}));
auto tKSlice = tK.template slice<D, ROWS>(0, key0);
auto tVSlice = tV.template slice<D, ROWS>(0, key0);
threadgroup T Qs[BK * fa_pitch<D, T>()];
threadgroup T dOs[BK * fa_pitch<D, T>()];
threadgroup A lses[BK];    // lse * log2(e) of the tile's queries
threadgroup A deltas[BK];
auto tQ = tensor(Qs, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));
auto tdO = tensor(dOs, dextents<int, 2>(D, BK), array<int, 2>({1, fa_pitch<D, T>()}));

// S^T = K Q^T and dP^T = V dO^T (16 x BK), one descriptor
constexpr auto mul_kq_op_desc = matmul2d_descriptor(ROWS, BK, D, false, true);
matmul2d<mul_kq_op_desc, execution_simdgroup> mul_kq_op;
// dV += P^T dO and dK += dS^T Q (16 x D), one descriptor
constexpr auto mul_pd_op_desc = matmul2d_descriptor(ROWS, D, BK, false, false, false,
                                                    matmul2d_descriptor::mode::multiply_accumulate);
matmul2d<mul_pd_op_desc, execution_simdgroup> mul_pd_op;
using In = decltype(mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>());
auto ctdK = mul_pd_op.template get_destination_cooperative_tensor<In, decltype(tQ), A>();
auto ctdV = mul_pd_op.template get_destination_cooperative_tensor<In, decltype(tdO), A>();
auto ctS = mul_kq_op.template get_destination_cooperative_tensor<decltype(tKSlice), decltype(tQ), A>();
auto ctdP = mul_kq_op.template get_destination_cooperative_tensor<decltype(tVSlice), decltype(tdO), A>();
using Cols = decltype(mul_kq_op.template get_column_reduction_destination_cooperative_tensor<decltype(tKSlice), decltype(tQ), A>());
Cols ctLse, ctDelta;

// Causal: query i sees keys j <= i, so queries before the block's first key see none of it.
const int qbegin = causal ? k0 / BK * BK : 0;
for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
  const long bh = long(b) * H + hq;
  const device T* qp = q + b * q_strides[0] + hq * q_strides[1];
  const device T* dop = dout + b * dout_strides[0] + hq * dout_strides[1];
  for (int q0 = qbegin; q0 < Sq; q0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    fa_stage<BK, D, THREADS>(Qs, qp + q0 * q_strides[2], q_strides[2], Sq - q0, tid);
    fa_stage<BK, D, THREADS>(dOs, dop + q0 * dout_strides[2], dout_strides[2], Sq - q0, tid);
    for (uint i = tid; i < uint(BK); i += THREADS) {
      const bool in = q0 + int(i) < Sq;
      lses[i] = in ? lse[bh * Sq + q0 + i] * A(1.4426950408889634) : A(0);
      deltas[i] = in ? delta[bh * Sq + q0 + i] : A(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    ctLse.load(tensor(lses, dextents<int, 1>(BK)));
    ctDelta.load(tensor(deltas, dextents<int, 1>(BK)));

    mul_kq_op.run(tKSlice, tQ, ctS);
    // every query of the tile sees every key of this SIMD-group: no mask
    if (q0 + BK <= Sq && key0 + ROWS <= Sk && (!causal || key0 + ROWS - 1 <= q0)) {
      #pragma clang loop unroll(full)
      for (auto it = ctS.begin(); it != ctS.end(); it++) *it = exp2(*it * scale2 - *ctLse.map_iterator(it));
    } else {
      #pragma clang loop unroll(full)
      for (auto it = ctS.begin(); it != ctS.end(); it++) {
        const auto idx = it.get_multidimensional_index();  // (query, key) within the tiles
        const int query = q0 + idx[0], key = key0 + idx[1];
        *it = query < Sq && key < Sk && (!causal || key <= query) ? exp2(*it * scale2 - *ctLse.map_iterator(it)) : A(0);
      }
    }
    auto ctP = mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
    mul_pd_op.run(ctP, tdO, ctdV);
    mul_kq_op.run(tVSlice, tdO, ctdP);
    #pragma clang loop unroll(full)
    for (auto it = ctS.begin(); it != ctS.end(); it++)
      *it *= ctdP[it.get_index()] - *ctDelta.map_iterator(it);  // dS^T
    auto ctdS = mul_pd_op.template get_left_input_cooperative_tensor<T, T, A>(ctS);
    mul_pd_op.run(ctdS, tQ, ctdK);
  }
}

for (ushort i = 0; i < ctdK.get_capacity(); ++i) ctdK[i] *= A(scale);
const long o_row = BSHD ? long(Hkv) * D : long(D);
auto tdK = tensor(dk + fa_offset<BSHD>(b, hk, 0, Hkv, Sk, D), dextents<int, 2>(D, Sk), array<int, 2>({1, int(o_row)}));
auto tdV = tensor(dv + fa_offset<BSHD>(b, hk, 0, Hkv, Sk, D), dextents<int, 2>(D, Sk), array<int, 2>({1, int(o_row)}));
ctdK.store(tdK.slice(0, key0));
ctdV.store(tdV.slice(0, key0));
