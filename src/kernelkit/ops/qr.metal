// Householder QR, one threadgroup a matrix (linalg.py's qr): LAPACK's geqr2 then org2r, on
// column-major copies so that a column is contiguous (lanes of a SIMD-group read consecutive
// rows). W (n x m, row c = column c of A) becomes R above its diagonal and the reflectors' v
// below it (v_j = 1 implied), tau their scalars; QT (q x m) becomes Q^T and RT (n x rr) R^T, Q
// having q columns and R rr rows. The reflectors are LAPACK's dlarfg's (beta = -sign(alpha)
// ||x||), so Q and R are the ones LAPACK and cuSOLVER give.
const uint b = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup, nt = threads_per_threadgroup.x;
const uint lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
const uint groups = simdgroups_per_threadgroup;
const uint m = A_shape[1], n = A_shape[2], k = metal::min(m, n);
const device T* a = A + ulong(b) * m * n;
device T* w = W + ulong(b) * m * n;
device T* t = tau + ulong(b) * k;
for (uint i = 0; i < m; ++i)  // (threads along A's rows: coalesced reads)
  for (uint c = tid; c < n; c += nt) w[ulong(c) * m + i] = a[ulong(i) * n + c];
threadgroup T shared_tau;
threadgroup_barrier(mem_flags::mem_device);
for (uint j = 0; j < k; ++j) {
  device T* v = w + ulong(j) * m;
  if (sg == 0) {
    const T h = kk_householder_lanes(v, j, m, lane);
    if (lane == 0) {
      t[j] = h;
      shared_tau = h;
    }
  }
  threadgroup_barrier(mem_flags::mem_device);
  const T h = shared_tau;
  if (h != T(0))  // H = I - h v v^T on the columns right of j, a SIMD-group a column
    for (uint c = j + 1 + sg; c < n; c += groups) kk_reflect_lanes(v, h, w + ulong(c) * m, j, m, lane);
  threadgroup_barrier(mem_flags::mem_device);
}
device T* r = RT + ulong(b) * n * rr;  // R^T: row c holds R's column c
for (uint c = 0; c < n; ++c)
  for (uint i = tid; i < rr; i += nt) r[ulong(c) * rr + i] = i <= c ? w[ulong(c) * m + i] : T(0);
if (WANT_Q) {  // Q = H_0 ... H_{k-1} I, the reflectors applied last first (org2r)
  device T* qt = QT + ulong(b) * q * m;
  for (uint c = 0; c < q; ++c)
    for (uint i = tid; i < m; i += nt) qt[ulong(c) * m + i] = i == c ? T(1) : T(0);
  threadgroup_barrier(mem_flags::mem_device);
  for (uint j = k; j-- > 0;) {
    const T h = t[j];
    if (h != T(0))
      for (uint c = j + sg; c < q; c += groups) kk_reflect_lanes(w + ulong(j) * m, h, qt + ulong(c) * m, j, m, lane);
    threadgroup_barrier(mem_flags::mem_device);
  }
}
