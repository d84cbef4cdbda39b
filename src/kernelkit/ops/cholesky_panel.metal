// One step of the blocked Cholesky on large matrices, first kernel (cholesky_update.metal is the
// second; linalg.py launches both for each NB columns): each threadgroup factors the step's
// diagonal block itself (a few thousand flops: less than a launch between), then solves its share
// of the panel's rows. Threadgroup 0 writes the factored block to S, which the second kernel
// copies into L (here other groups still read the block), and sets info where the block fails
// (its factored columns still solved below it). L and info are written in place. A matrix whose info
// was set at an earlier step is left as it is.
const uint b = threadgroup_position_in_grid.y, g = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup, nt = threads_per_threadgroup.x;
const uint n = L_shape[1], b0 = uint(step), nb = metal::min(uint(NB), n - b0);
if (info[b] != 0 && uint(info[b]) <= b0) return;  // (set in this step: by threadgroup 0, below)
device T* l = const_cast<device T*>(L) + ulong(b) * n * n;
threadgroup T D[NB * (NB + 1)];
threadgroup uint flag;
const uint failed = kk_chol_diagonal<T, NB, UPPER>(l, n, b0, nb, D, &flag, tid, nt,
                                                    simdgroup_index_in_threadgroup,
                                                    thread_index_in_simdgroup);
const uint done = failed != 0 ? failed - 1 : nb;  // the block's factored columns
if (g == 0) {
  kk_chol_store_diagonal<T, false>(S + ulong(b) * NB * NB, NB, 0, nb, done, D, NB + 1, tid, nt);
  if (failed != 0 && tid == 0) const_cast<device int*>(info)[b] = int(b0 + failed);
}
// the rows below the block, in equal shares; their columns before a failed one only
const uint r0 = b0 + nb, per = (n - r0 + threadgroups_per_grid.x - 1) / threadgroups_per_grid.x;
const uint first = r0 + g * per;
kk_chol_panel_rows<T, NB, UPPER>(l, n, b0, done, D, first, metal::min(first + per, n), tid, nt);
