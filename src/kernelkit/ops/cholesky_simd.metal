// Cholesky of matrices up to 32 x 32, a SIMD-group's lanes a row each (linalg.py's choice on a
// GPU for such matrices, where a threadgroup a matrix spends its time at barriers): P lanes a
// matrix (n rounded up to a power of two), 32 / P matrices a SIMD-group. Each lane holds its row
// of A's lower triangle (UPPER: its upper one) in registers, and the right-looking algorithm
// shares each step's column by simd_shuffle: no threadgroup memory, no barriers, A read once and
// L written once. Every lane runs every step (a finished or failed matrix's lanes only stop
// writing), so the shuffles never diverge. A pivot that is not positive (or NaN) stops its matrix:
// info is its order, as LAPACK's; L's columns before it are the factorization's, the rest as far
// as it got (the failing pivot reduced, the entries right of it updated by the steps before).
const uint lane = thread_index_in_simdgroup;
const uint r = lane % P;  // the lane's row
const uint n = A_shape[1];
const ulong b = ulong(thread_position_in_grid.x / 32) * (32 / P) + lane / P;  // its matrix
const bool mine = b < ulong(A_shape[0]) && r < n;
const ushort first = ushort(lane - r);  // the matrix's first lane
const ulong at = b * n * n;
T x[P];
#pragma unroll
for (uint j = 0; j < P; ++j) x[j] = mine && j <= r ? A[at + kk_at<UPPER>(r, j, n)] : T(0);
uint failed = 0;
#pragma unroll
for (uint k = 0; k < P; ++k) {
  if (k >= n) break;  // (n is the same for every matrix: a uniform branch)
  const T pivot = simd_shuffle(x[k], ushort(first + k));
  if (failed == 0 && !(pivot > T(0))) failed = k + 1;
  const bool go = failed == 0;
  const T d = metal::sqrt(pivot);
  if (go) x[k] = r == k ? d : x[k] / d;  // L's column k (rows above k hold 0)
#pragma unroll
  for (uint j = k + 1; j < P; ++j) {
    if (j >= n) break;
    const T ljk = simd_shuffle(x[k], ushort(first + j));
    if (go && r >= j) x[j] -= x[k] * ljk;
  }
}
if (mine) {
#pragma unroll
  for (uint j = 0; j < P; ++j)
    if (j < n) L[at + kk_at<UPPER>(r, j, n)] = j <= r ? x[j] : T(0);
  if (r == 0) info[b] = int(failed);
}
