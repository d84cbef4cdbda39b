// Householder QR, one thread a matrix, no synchronisation (linalg.py's choice on the CPU for
// small matrices, where qr.metal's SIMD-group sums cost more than its arithmetic): the same
// reflectors, buffers and layout as qr.metal, each loop run by the one thread.
const uint b = thread_position_in_grid.x;
const uint m = A_shape[1], n = A_shape[2], k = metal::min(m, n);
const device T* a = A + ulong(b) * m * n;
device T* w = W + ulong(b) * m * n;
device T* t = tau + ulong(b) * k;
for (uint c = 0; c < n; ++c)
  for (uint i = 0; i < m; ++i) w[ulong(c) * m + i] = a[ulong(i) * n + c];
for (uint j = 0; j < k; ++j) {
  device T* v = w + ulong(j) * m;
  const T h = kk_householder(v + j, m - j);
  t[j] = h;
  if (h != T(0))
    for (uint c = j + 1; c < n; ++c) kk_reflect(v + j, h, w + ulong(c) * m + j, m - j);
}
device T* r = RT + ulong(b) * n * rr;
for (uint c = 0; c < n; ++c)
  for (uint i = 0; i < rr; ++i) r[ulong(c) * rr + i] = i <= c ? w[ulong(c) * m + i] : T(0);
if (WANT_Q) {
  device T* qt = QT + ulong(b) * q * m;
  for (uint c = 0; c < q; ++c)
    for (uint i = 0; i < m; ++i) qt[ulong(c) * m + i] = i == c ? T(1) : T(0);
  for (uint j = k; j-- > 0;)
    if (t[j] != T(0))
      for (uint c = j; c < q; ++c) kk_reflect(w + ulong(j) * m + j, t[j], qt + ulong(c) * m + j, m - j);
}
