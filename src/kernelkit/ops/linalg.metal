// The factorizations' shared code (linalg.py), before each kernel's body; nothing here
// synchronises threads, so that the one-thread-a-matrix kernels (cholesky_serial.metal,
// qr_serial.metal) run without fibers on the CPU. A matrix is n x n, row-major; with UPPER its
// element (i, j) is stored at (j, i): the upper triangle of A read as the lower one of A^T, and
// U = L^T written where L would be, so the same code makes both.

template <bool UPPER>
inline ulong kk_at(uint i, uint j, uint n) { return UPPER ? ulong(j) * n + i : ulong(i) * n + j; }

// Where element e of a span of whole n x n matrices lies in a stage whose rows are P + 1 apart, a
// matrix every P rows: for W lanes walking the span W elements at a time (e = lane, lane + W, ...;
// next() after each), so that device memory is read and written in whole lines.
template <uint P, uint W>
struct kk_staged_span {
  uint n, m = 0, i = 0, j;
  kk_staged_span(uint n, uint lane) : n(n), j(lane) { settle(); }
  uint at() const { return (m * P + i) * (P + 1) + j; }
  void next() {
    j += W;
    settle();
  }
  void settle() {
    while (j >= n) {
      j -= n;
      if (++i == n) {
        i = 0;
        ++m;
      }
    }
  }
};

// LAPACK's dlarfg from x = (alpha, rest): amax the largest |rest|, squares the sum of
// (rest / amax)^2 (||rest|| without overflow). Returns tau of H = I - tau v v^T with v = (1,
// scale * rest) and H x = (beta, 0...); tau 0 (H = I) where rest is zero.
template <typename T>
inline T kk_reflector(T alpha, T amax, T squares, thread T& beta, thread T& scale) {
  beta = alpha;
  scale = T(1);
  if (!(amax > T(0))) return T(0);
  const T norm = amax * metal::sqrt(squares);
  const T big = metal::max(metal::abs(alpha), norm);
  beta = -metal::copysign(big * metal::sqrt((alpha / big) * (alpha / big) + (norm / big) * (norm / big)),
                          alpha);
  scale = T(1) / (alpha - beta);
  return (beta - alpha) / beta;
}

// The reflector of x[0..len) made in place by one thread: x = (beta, v without its 1); its tau.
template <typename T>
inline T kk_householder(device T* x, uint len) {
  T amax = T(0), squares = T(0), beta, scale;
  for (uint i = 1; i < len; ++i) amax = metal::max(amax, metal::abs(x[i]));
  if (amax > T(0))
    for (uint i = 1; i < len; ++i) squares += (x[i] / amax) * (x[i] / amax);
  const T tau = kk_reflector(x[0], amax, squares, beta, scale);
  for (uint i = 1; i < len; ++i) x[i] *= scale;
  x[0] = beta;
  return tau;
}

// y[0..len) = (I - tau v v^T) y by one thread, v = (1, x[1..len)) as kk_householder left it.
template <typename T>
inline void kk_reflect(const device T* x, T tau, device T* y, uint len) {
  T d = y[0];
  for (uint i = 1; i < len; ++i) d += x[i] * y[i];
  d *= tau;
  y[0] -= d;
  for (uint i = 1; i < len; ++i) y[i] -= x[i] * d;
}
