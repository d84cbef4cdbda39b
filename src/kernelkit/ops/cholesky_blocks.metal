// The blocked Cholesky's three parts (linalg.py), used by the one-threadgroup kernel
// (cholesky.metal) and by the two kernels of a step on large matrices (cholesky_panel.metal,
// cholesky_update.metal), after linalg.metal. The block is NB columns (a SIMD-group's lanes:
// NB <= 32); D, the diagonal block in threadgroup memory, has rows of NB + 1 (no bank conflicts
// between rows; the last column holds 1 / L11's diagonal).

// D = L11 L11^T in place, for D's nb x nb lower triangle, by one SIMD-group: lane i holds row i.
// Returns 0, or the order (1-based) of the first pivot that is not positive (or NaN): LAPACK's
// info, the columns before it factored, the rest updated by them only.
template <typename T, uint NB>
inline uint kk_chol_factor(threadgroup T* D, uint nb, uint lane) {
  for (uint j = 0; j < nb; ++j) {
    const T d = D[j * (NB + 1) + j];
    if (!(d > T(0))) return j + 1;  // every lane read the same d: they leave together
    const T r = metal::sqrt(d);
    simdgroup_barrier(mem_flags::mem_threadgroup);  // d read by all before lane j writes it
    if (lane == j) {
      D[j * (NB + 1) + j] = r;
      D[j * (NB + 1) + NB] = T(1) / r;  // (the padding column: the panel multiplies by it)
    } else if (lane > j && lane < nb) {
      D[lane * (NB + 1) + j] /= r;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    if (lane > j && lane < nb) {
      const T lij = D[lane * (NB + 1) + j];
      for (uint c = j + 1; c <= lane; ++c) D[lane * (NB + 1) + c] -= lij * D[c * (NB + 1) + j];
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
  return 0;
}

// The diagonal block of the step at column b0 (nb x nb) read from l into D and factored there;
// every thread of the group gets kk_chol_factor's result (through `flag`).
template <typename T, uint NB, bool UPPER>
inline uint kk_chol_diagonal(const device T* l, uint n, uint b0, uint nb, threadgroup T* D,
                             threadgroup uint* flag, uint tid, uint nt, uint simdgroup, uint lane) {
  for (uint e = tid; e < nb * nb; e += nt) {
    const uint i = e / nb, j = e % nb;
    if (j <= i) D[i * (NB + 1) + j] = l[kk_at<UPPER>(b0 + i, b0 + j, n)];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simdgroup == 0) {
    const uint f = kk_chol_factor<T, NB>(D, nb, lane);
    if (lane == 0) *flag = f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return *flag;
}

// A factored diagonal block's lower triangle, its first `cols` columns (all nb rows), copied
// from `src` (rows of `ld`: D in threadgroup memory, or S in device memory) to `out` at (b0, b0)
// (a matrix of n columns).
template <typename T, bool UPPER, typename Src>
inline void kk_chol_store_diagonal(device T* out, uint n, uint b0, uint nb, uint cols, Src src,
                                   uint ld, uint tid, uint nt) {
  for (uint e = tid; e < nb * nb; e += nt) {
    const uint i = e / nb, j = e % nb;
    if (j <= i && j < cols) out[kk_at<UPPER>(b0 + i, b0 + j, n)] = src[i * ld + j];
  }
}

// The panel's rows first..last (below the diagonal block): L21 = A21 L11^-T, each thread a row
// by forward substitution, its nb values in registers (D's last column holds 1 / L11's diagonal).
template <typename T, uint NB, bool UPPER>
inline void kk_chol_panel_rows(device T* l, uint n, uint b0, uint nb, const threadgroup T* D,
                               uint first, uint last, uint tid, uint nt) {
  for (uint i = first + tid; i < last; i += nt) {
    T x[NB];
#pragma unroll
    for (uint c = 0; c < NB; ++c) x[c] = c < nb ? l[kk_at<UPPER>(i, b0 + c, n)] : T(0);
#pragma unroll
    for (uint j = 0; j < NB; ++j) {
      x[j] *= D[j * (NB + 1) + NB];
#pragma unroll 1
      for (uint c = j + 1; c < NB; ++c) x[c] -= x[j] * D[c * (NB + 1) + j];
    }
#pragma unroll
    for (uint c = 0; c < NB; ++c)
      if (c < nb) l[kk_at<UPPER>(i, b0 + c, n)] = x[c];
  }
}

// The trailing update L22 -= L21 L21^T on one TILE x TILE tile of its lower triangle: rows
// r0 + ti * TILE.., columns r0 + tj * TILE.. (tj <= ti; r0 = b0 + nb). The panel's rows of the
// tile's rows and of its columns are staged in P (2 x TILE rows of NB + 1); each thread takes
// 4 x 4 blocks of the tile. Ends with a barrier: P is free again.
template <typename T, uint NB, uint TILE, bool UPPER>
inline void kk_chol_update_tile(device T* l, uint n, uint b0, uint nb, uint ti, uint tj,
                                threadgroup T* P, uint tid, uint nt) {
  threadgroup T* rows = P;
  threadgroup T* cols = P + TILE * (NB + 1);
  const uint i0 = b0 + nb + ti * TILE, j0 = b0 + nb + tj * TILE;
  for (uint e = tid; e < TILE * nb; e += nt) {
    const uint r = e / nb, c = e % nb;
    rows[r * (NB + 1) + c] = i0 + r < n ? l[kk_at<UPPER>(i0 + r, b0 + c, n)] : T(0);
    cols[r * (NB + 1) + c] = j0 + r < n ? l[kk_at<UPPER>(j0 + r, b0 + c, n)] : T(0);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint q = tid; q < (TILE / 4) * (TILE / 4); q += nt) {
    const uint bi = q / (TILE / 4) * 4, bj = q % (TILE / 4) * 4;
    if (i0 + bi >= n || j0 + bj > i0 + bi + 3) continue;  // past the matrix, or above the diagonal
    T acc[4][4] = {};
    for (uint c = 0; c < nb; ++c) {
      T x[4], y[4];
#pragma unroll
      for (uint u = 0; u < 4; ++u) {
        x[u] = rows[(bi + u) * (NB + 1) + c];
        y[u] = cols[(bj + u) * (NB + 1) + c];
      }
#pragma unroll
      for (uint u = 0; u < 4; ++u)
#pragma unroll
        for (uint v = 0; v < 4; ++v) acc[u][v] += x[u] * y[v];
    }
#pragma unroll
    for (uint u = 0; u < 4; ++u)
#pragma unroll
      for (uint v = 0; v < 4; ++v) {
        const uint i = i0 + bi + u, j = j0 + bj + v;
        if (i < n && j <= i) l[kk_at<UPPER>(i, j, n)] -= acc[u][v];
      }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
