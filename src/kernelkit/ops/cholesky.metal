// Cholesky, one threadgroup a matrix (linalg.py's cholesky_ex on batches and small matrices): A's
// lower triangle (UPPER: its upper one) copied into L, then the blocked right-looking algorithm
// in place, NB columns a step: the diagonal block factored in threadgroup memory by one
// SIMD-group, the panel below it solved a row a thread, the trailing lower triangle updated
// tile by tile (linalg.metal). A pivot that is not positive stops the matrix there: info is its
// order, as LAPACK's, L's columns before it are the factorization's and the rest as far as it got.
const uint b = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup, nt = threads_per_threadgroup.x;
const uint n = A_shape[1];
const device T* a = A + ulong(b) * n * n;
device T* l = L + ulong(b) * n * n;
for (uint i = 0; i < n; ++i)  // (threads along rows of the storage: coalesced)
  for (uint j = tid; j < n; j += nt) {
    const ulong at = ulong(i) * n + j;
    l[at] = (UPPER ? j >= i : j <= i) ? a[at] : T(0);
  }
threadgroup T D[NB * (NB + 1)];
threadgroup T P[2 * TILE * (NB + 1)];
threadgroup uint flag;
threadgroup_barrier(mem_flags::mem_device);
for (uint b0 = 0; b0 < n; b0 += NB) {
  const uint nb = metal::min(uint(NB), n - b0), r0 = b0 + nb;
  const uint failed = kk_chol_diagonal<T, NB, UPPER>(l, n, b0, nb, D, &flag, tid, nt,
                                                      simdgroup_index_in_threadgroup,
                                                      thread_index_in_simdgroup);
  const uint done = failed != 0 ? failed - 1 : nb;  // the block's factored columns
  kk_chol_store_diagonal<T, UPPER>(l, n, b0, nb, done, D, NB + 1, tid, nt);
  kk_chol_panel_rows<T, NB, UPPER>(l, n, b0, done, D, r0, n, tid, nt);
  if (failed != 0) {
    if (tid == 0) info[b] = int(b0 + failed);
    return;
  }
  threadgroup_barrier(mem_flags::mem_device);
  const uint tiles = (n - r0 + TILE - 1) / TILE;
  for (uint ti = 0; ti < tiles; ++ti)
    for (uint tj = 0; tj <= ti; ++tj) kk_chol_update_tile<T, NB, TILE, UPPER>(l, n, b0, nb, ti, tj, P, tid, nt);
  threadgroup_barrier(mem_flags::mem_device);
}
if (tid == 0) info[b] = 0;
