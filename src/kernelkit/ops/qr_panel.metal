// Householder QR of large matrices, the panel of columns k0..k0 + NB (linalg.py's blocked QR, one
// threadgroup a matrix): the panel's reflectors made and applied within it as qr.metal does, in
// place in W (n x m, row c = column c of A), then the panel as a block reflector
// H_k0 ... H_k0+nb-1 = I - V T V^T for the GEMMs that apply it to the rest (torch.matmul):
// V explicit in VT (NB x m: row i is v_i, zero above its 1, rows past the panel zero), and T
// (NB x NB, upper triangular) by LAPACK's dlarft from V^T V and the taus.
const uint b = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup, nt = threads_per_threadgroup.x;
const uint lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
const uint groups = simdgroups_per_threadgroup;
const uint n = W_shape[1], m = W_shape[2], k0 = uint(first);
const uint k1 = metal::min(k0 + NB, metal::min(m, n)), nb = k1 - k0;
device T* w = const_cast<device T*>(W) + ulong(b) * n * m;
device T* vt = VT + ulong(b) * NB * m;
threadgroup T taus[NB];
threadgroup T S[NB * (NB + 1)];  // V^T V
for (uint j = k0; j < k1; ++j) {
  device T* v = w + ulong(j) * m;
  if (sg == 0) {
    const T h = kk_householder_lanes(v, j, m, lane);
    if (lane == 0) taus[j - k0] = h;
  }
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  const T h = taus[j - k0];
  if (h != T(0))
    for (uint c = j + 1 + sg; c < k1; c += groups) kk_reflect_lanes(v, h, w + ulong(c) * m, j, m, lane);
  threadgroup_barrier(mem_flags::mem_device);
}
for (uint i = 0; i < NB; ++i) {
  const uint row = k0 + i;
  for (uint r = tid; r < m; r += nt)
    vt[ulong(i) * m + r] = i >= nb || r < row ? T(0) : r == row ? T(1) : w[ulong(row) * m + r];
}
threadgroup_barrier(mem_flags::mem_device);
for (uint p = sg; p < NB * NB; p += groups) {  // S[i][j] = v_i . v_j, i < j (both zero above row k0 + j)
  const uint i = p / NB, j = p % NB;
  if (i >= j || j >= nb) continue;
  T d = T(0);
  for (uint r = k0 + j + lane; r < m; r += 32) d += vt[ulong(i) * m + r] * vt[ulong(j) * m + r];
  d = simd_sum(d);
  if (lane == 0) S[i * (NB + 1) + j] = d;
}
threadgroup_barrier(mem_flags::mem_threadgroup);
if (sg == 0) {  // T[0:j, j] = -tau_j T[0:j, 0:j] S[0:j, j], T[j][j] = tau_j; lane i makes row i
  T row[NB];
  for (uint j = 0; j < NB; ++j) {
    T x = T(0);
    for (uint l = lane; l < j && j < nb; ++l) x += row[l] * S[l * (NB + 1) + j];
    row[j] = j >= nb || lane > j ? T(0) : lane == j ? taus[j] : -taus[j] * x;
  }
  if (lane < NB)
    for (uint j = 0; j < NB; ++j) tfactor[ulong(b) * NB * NB + lane * NB + j] = row[j];
}
