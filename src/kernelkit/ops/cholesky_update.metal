// One step of the blocked Cholesky on large matrices, second kernel (after cholesky_panel.metal):
// threadgroup g updates the g-th TILE x TILE tile of the trailing lower triangle (tiles numbered
// row by row), and threadgroup 0 also copies the factored diagonal block from S into L (where the
// block failed, only that). L is written in place; a matrix whose info was set at an earlier
// step is left as it is.
const uint b = threadgroup_position_in_grid.y, g = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup, nt = threads_per_threadgroup.x;
const uint n = L_shape[1], b0 = uint(step), nb = metal::min(uint(NB), n - b0);
const uint failed = uint(info[b]);
if (failed != 0 && (failed <= b0 || failed > b0 + nb)) return;  // failed at an earlier step
device T* l = const_cast<device T*>(L) + ulong(b) * n * n;
if (g == 0)  // the block's factored columns: all, or those before the failed one
  kk_chol_store_diagonal<T, UPPER>(l, n, b0, nb, failed != 0 ? failed - 1 - b0 : nb,
                                   S + ulong(b) * NB * NB, NB, tid, nt);
if (failed != 0) return;
const uint tiles = (n - b0 - nb + TILE - 1) / TILE;
if (g >= tiles * (tiles + 1) / 2) return;
uint ti = uint((metal::sqrt(8.0f * float(g) + 1.0f) - 1.0f) * 0.5f);  // g = ti (ti + 1) / 2 + tj
while (ti * (ti + 1) / 2 > g) --ti;
while ((ti + 1) * (ti + 2) / 2 <= g) ++ti;
threadgroup T P[2 * TILE * (NB + 1)];
kk_chol_update_tile<T, NB, TILE, UPPER>(l, n, b0, nb, ti, g - ti * (ti + 1) / 2, P, tid, nt);
