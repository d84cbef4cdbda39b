// Cholesky, one thread a matrix, no synchronisation (linalg.py's choice on the CPU for small
// matrices, where cholesky.metal's barriers cost more than its arithmetic): A's lower triangle
// (UPPER: its upper one) copied into L, then factored column by column in place; info as LAPACK's.
const uint b = thread_position_in_grid.x;
const uint n = A_shape[1];
const device T* a = A + ulong(b) * n * n;
device T* l = L + ulong(b) * n * n;
for (uint i = 0; i < n; ++i)
  for (uint j = 0; j < n; ++j) {
    const ulong at = kk_at<UPPER>(i, j, n);
    l[at] = j <= i ? a[at] : T(0);
  }
for (uint j = 0; j < n; ++j) {
  const T d = l[kk_at<UPPER>(j, j, n)];
  if (!(d > T(0))) {
    info[b] = int(j + 1);
    return;
  }
  const T r = metal::sqrt(d), inverse = T(1) / r;
  l[kk_at<UPPER>(j, j, n)] = r;
  for (uint i = j + 1; i < n; ++i) l[kk_at<UPPER>(i, j, n)] *= inverse;
  for (uint c = j + 1; c < n; ++c) {  // the trailing lower triangle, column c
    const T lcj = l[kk_at<UPPER>(c, j, n)];
    for (uint i = c; i < n; ++i) l[kk_at<UPPER>(i, c, n)] -= l[kk_at<UPPER>(i, j, n)] * lcj;
  }
}
info[b] = 0;
