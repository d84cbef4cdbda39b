// Cholesky of matrices up to 64 x 64, a lane a row (linalg.py's choice on a GPU for such
// matrices, where a threadgroup a matrix spends its time at barriers): P lanes a matrix (n rounded
// up to a power of two). Up to 32, 32 / P matrices a SIMD-group; at 64, a matrix a threadgroup of
// two SIMD-groups. Each lane holds its row of A's lower triangle (UPPER: its upper one) in
// registers, and the right-looking algorithm shares each step's column: by simd_shuffle within a
// SIMD-group, through threadgroup memory (a barrier a step) across two. A read once, L written
// once. Every lane runs every step (a finished or failed matrix's lanes only stop writing), so the
// shuffles and barriers never diverge. A pivot that is not positive (or NaN) stops its matrix:
// info is its order, as LAPACK's; L's columns before it are the factorization's, the rest as far
// as it got (the failing pivot reduced, the entries right of it updated by the steps before).
//
// The lanes' matrices (contiguous in memory) pass through threadgroup memory on their way in and
// out, so that device memory is read and written W consecutive elements at a time: a lane reading
// its own row (n elements 4n or 8n bytes from its neighbour's) touched a line of memory for each
// lane, and took 113 us where the bytes need 7 (4096 matrices 32 x 32, H200). In threadgroup
// memory a matrix's rows are P + 1 apart, so a lane a row reads without conflicts.
const uint W = P > 32 ? P : 32;  // the lanes that share a stage: a SIMD-group, or the threadgroup
const uint lane = P > 32 ? thread_index_in_threadgroup : thread_index_in_simdgroup;
const uint r = lane % P;  // the lane's row
const uint n = A_shape[1];
const ulong batch = ulong(A_shape[0]);
const ulong b0 = ulong(thread_position_in_grid.x / W) * (W / P);  // the stage's first matrix
const ulong b = b0 + lane / P;                                    // the lane's
const bool mine = b < batch && r < n;
const uint first = lane - r;  // the matrix's first lane
// (linalg.py launches 4 SIMD-groups a threadgroup up to P = 32, one matrix's two at 64)
threadgroup T stage[(P > 32 ? 1 : 4) * W * (P + 1)];
alignas(16) threadgroup T column[2][P > 32 ? P : 1];  // P = 64: each step's column, the steps alternating
threadgroup T* s = stage + (P > 32 ? 0 : simdgroup_index_in_threadgroup * 32 * (P + 1));
const uint count = uint(min(ulong(W / P), batch - b0)) * n * n;  // the elements of its matrices
#define KK_SYNC() (P > 32 ? threadgroup_barrier(mem_flags::mem_threadgroup) : simdgroup_barrier(mem_flags::mem_threadgroup))
{
  device const T* a = A + b0 * n * n;
  kk_staged_span<P, W> w(n, lane);
  for (uint e = lane; e < count; e += W, w.next()) s[w.at()] = a[e];
}
KK_SYNC();
// (r, j) of the lane's matrix in the stage: row r, or for UPPER column r (A's upper triangle)
#define KK_STAGED(j) s[UPPER ? (first + (j)) * (P + 1) + r : lane * (P + 1) + (j)]
T x[P];
#pragma unroll
for (uint j = 0; j < P; ++j) x[j] = mine && j <= r ? KK_STAGED(j) : T(0);
uint failed = 0;
#pragma unroll
for (uint k = 0; k < P; ++k) {
  if (k >= n) break;  // (n is the same for every matrix: a uniform branch)
  // A's column k as the steps before left it (c(j) = row j's x[k]), and its pivot c(k)
  const T xk = x[k];
  if (P > 32) {
    column[k & 1][r] = xk;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // (the other buffer is read until the next)
  }
#define KK_COLUMN(j) (P > 32 ? column[k & 1][j] : simd_shuffle(xk, ushort(first + (j))))
  const T pivot = KK_COLUMN(k);
  if (failed == 0 && !(pivot > T(0))) failed = k + 1;
  const bool go = failed == 0;
  // L(r, k) = c(r) / L(k, k), scaled by one reciprocal square root as LAPACK's potf2 does (a
  // square root and a division took most of the float64 kernel); rows above k hold 0
  const T inv = metal::rsqrt(pivot);
  const T l = (r == k ? pivot : xk) * inv;
  if (go) x[k] = l;
  const T t = l * inv;  // L(r, k) L(j, k) = t c(j)
  // up to n rounded up to 4 (the lanes past n hold zeros): a break at every j left each read's
  // latency exposed (1.4x slower at n = 64, H200), one every 4 lets 4 reads go together
#pragma unroll
  for (uint j = k + 1; j < P; ++j) {
    if (j % 4 == 0 && j >= n) break;
    const T cj = KK_COLUMN(j);
    if (go && r >= j) x[j] -= t * cj;
  }
#undef KK_COLUMN
}
KK_SYNC();  // every lane has read the stage
if (r < n) {
#pragma unroll
  for (uint j = 0; j < P; ++j)
    if (j < n) KK_STAGED(j) = j <= r ? x[j] : T(0);
}
#undef KK_STAGED
KK_SYNC();
{
  device T* l = L + b0 * n * n;
  kk_staged_span<P, W> w(n, lane);
  for (uint e = lane; e < count; e += W, w.next()) l[e] = s[w.at()];
}
#undef KK_SYNC
if (mine && r == 0) info[b] = int(failed);
