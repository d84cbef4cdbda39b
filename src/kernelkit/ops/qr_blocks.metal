// The Householder QR's steps by the 32 lanes of a SIMD-group (qr.metal, qr_panel.metal), after
// linalg.metal: a column is contiguous (m rows), lanes take every 32nd row.

// The reflector of column v at row j (kk_reflector from the lanes' sums), made in place: v[j] =
// beta, the rows below scaled into v (v_j = 1 implied). Returns tau, to every lane.
template <typename T>
inline T kk_householder_lanes(device T* v, uint j, uint m, uint lane) {
  const T alpha = v[j];
  T amax = T(0);
  for (uint i = j + 1 + lane; i < m; i += 32) amax = metal::max(amax, metal::abs(v[i]));
  amax = simd_max(amax);
  T squares = T(0);
  if (amax > T(0))
    for (uint i = j + 1 + lane; i < m; i += 32) squares += (v[i] / amax) * (v[i] / amax);
  squares = simd_sum(squares);
  T beta, scale;
  const T tau = kk_reflector(alpha, amax, squares, beta, scale);
  simdgroup_barrier(mem_flags::mem_device);  // alpha read by every lane before lane 0 writes beta
  for (uint i = j + 1 + lane; i < m; i += 32) v[i] *= scale;
  if (lane == 0) v[j] = beta;
  return tau;
}

// x[j..m) = (I - tau v v^T) x[j..m), v as kk_householder_lanes left it.
template <typename T>
inline void kk_reflect_lanes(const device T* v, T tau, device T* x, uint j, uint m, uint lane) {
  T d = T(0);
  for (uint i = j + lane; i < m; i += 32) d += i == j ? x[i] : v[i] * x[i];
  d = simd_sum(d) * tau;
  for (uint i = j + lane; i < m; i += 32) x[i] -= i == j ? d : v[i] * d;
}
