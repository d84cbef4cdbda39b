// Cholesky of matrices up to 32 x 32, a SIMD-group's lanes a row each (linalg.py's choice on a
// GPU for such matrices, where a threadgroup a matrix spends its time at barriers): P lanes a
// matrix (n rounded up to a power of two), 32 / P matrices a SIMD-group. Each lane holds its row
// of A's lower triangle (UPPER: its upper one) in registers, and the right-looking algorithm
// shares each step's column by simd_shuffle: no barriers but the SIMD-group's, A read once and L
// written once. Every lane runs every step (a finished or failed matrix's lanes only stop
// writing), so the shuffles never diverge. A pivot that is not positive (or NaN) stops its matrix:
// info is its order, as LAPACK's; L's columns before it are the factorization's, the rest as far
// as it got (the failing pivot reduced, the entries right of it updated by the steps before).
//
// The SIMD-group's matrices (contiguous in memory) pass through threadgroup memory on their way
// in and out, so that its lanes read and write device memory 32 consecutive elements at a time: a
// lane reading its own row (n elements 4n or 8n bytes from its neighbour's) touched a line of
// memory for each lane, and took 113 us where the bytes need 7 (4096 matrices 32 x 32, H200).
// In threadgroup memory a matrix's rows are P + 1 apart, so a lane a row reads without conflicts.
const uint lane = thread_index_in_simdgroup;
const uint r = lane % P;  // the lane's row
const uint n = A_shape[1];
const ulong batch = ulong(A_shape[0]);
const ulong b0 = ulong(thread_position_in_grid.x / 32) * (32 / P);  // the SIMD-group's first matrix
const ulong b = b0 + lane / P;                                      // the lane's
const bool mine = b < batch && r < n;
const ushort first = ushort(lane - r);  // the matrix's first lane
threadgroup T stage[4 * 32 * (P + 1)];   // (linalg.py launches 4 SIMD-groups a threadgroup)
threadgroup T* s = stage + simdgroup_index_in_threadgroup * 32 * (P + 1);
const uint count = uint(min(ulong(32 / P), batch - b0)) * n * n;  // the elements of its matrices
device const T* a = A + b0 * n * n;
{
  kk_staged_span<P> w(n, lane);
  for (uint e = lane; e < count; e += 32, w.next()) s[w.at()] = a[e];
}
simdgroup_barrier(mem_flags::mem_threadgroup);
// (r, j) of the lane's matrix in the stage: row r, or for UPPER column r (A's upper triangle)
#define KK_STAGED(j) s[UPPER ? (first + (j)) * (P + 1) + r : lane * (P + 1) + (j)]
T x[P];
#pragma unroll
for (uint j = 0; j < P; ++j) x[j] = mine && j <= r ? KK_STAGED(j) : T(0);
uint failed = 0;
#pragma unroll
for (uint k = 0; k < P; ++k) {
  if (k >= n) break;  // (n is the same for every matrix: a uniform branch)
  const T pivot = simd_shuffle(x[k], ushort(first + k));
  if (failed == 0 && !(pivot > T(0))) failed = k + 1;
  const bool go = failed == 0;
  // L's column k (rows above k hold 0), scaled by 1 / L(k, k) as LAPACK's potf2 does: one
  // reciprocal square root, where a square root and a division took most of the float64 kernel
  const T inv = metal::rsqrt(pivot);
  if (go) x[k] = (r == k ? pivot : x[k]) * inv;
#pragma unroll
  for (uint j = k + 1; j < P; ++j) {
    if (j >= n) break;
    const T ljk = simd_shuffle(x[k], ushort(first + j));
    if (go && r >= j) x[j] -= x[k] * ljk;
  }
}
simdgroup_barrier(mem_flags::mem_threadgroup);  // every lane has read the stage
if (r < n) {
#pragma unroll
  for (uint j = 0; j < P; ++j)
    if (j < n) KK_STAGED(j) = j <= r ? x[j] : T(0);
}
#undef KK_STAGED
simdgroup_barrier(mem_flags::mem_threadgroup);
{
  device T* l = L + b0 * n * n;
  kk_staged_span<P> w(n, lane);
  for (uint e = lane; e < count; e += 32, w.next()) l[e] = s[w.at()];
}
if (mine && r == 0) info[b] = int(failed);
