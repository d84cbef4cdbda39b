// Cholesky, one thread a matrix, no synchronisation (linalg.py's choice on the CPU for small
// matrices, where cholesky.metal's barriers cost more than its arithmetic): row by row, each
// entry of L a dot product of two rows made before it (contiguous), A read from its lower
// triangle (UPPER: its upper one, and L transposed in place at the end). info as LAPACK's: after
// a failed pivot, the rows below get only the columns before it (the rest A's entries).
const uint b = thread_position_in_grid.x;
const uint n = A_shape[1];
const device T* a = A + ulong(b) * n * n;
device T* l = L + ulong(b) * n * n;
uint failed = 0;
for (uint i = 0; i < n; ++i) {
  device T* row = l + ulong(i) * n;
  const uint made = failed == 0 ? i + 1 : failed - 1;  // the row's entries to compute
  for (uint j = 0; j < n; ++j) {
    T s = j <= i ? a[kk_at<UPPER>(i, j, n)] : T(0);
    if (j < made) {
      const device T* above = l + ulong(j) * n;
      for (uint c = 0; c < j; ++c) s -= row[c] * above[c];
      if (j < i) s /= above[j];
      else if (s > T(0)) s = metal::sqrt(s);
      else failed = i + 1;  // not positive, or NaN: the reduced pivot stays
    }
    row[j] = s;
  }
}
if (UPPER)
  for (uint i = 0; i < n; ++i)
    for (uint j = 0; j < i; ++j) {
      const T t = l[ulong(i) * n + j];
      l[ulong(i) * n + j] = l[ulong(j) * n + i];
      l[ulong(j) * n + i] = t;
    }
info[b] = int(failed);
