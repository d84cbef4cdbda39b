// dq from the Hopper backward's float sums (tensor_ops/sm90_attention_backward.h: a query
// block's block_q * D floats in wgmma's accumulator order): dq = scale * sums, in q's dtype and
// the layout BSHD names, (batches, heads, rows, D). A thread 4 floats (16-byte loads): two
// columns of two rows.

  using F = kk::tops::sm90::attention_backward<T, D>;
  constexpr int QB = F::block_q, N = QB * D / 4;  // a query block's float4s
  const long e = long(blockIdx.x) * blockDim.x + threadIdx.x;  // (b, h, query block, N of them)
  const int B = batches[0], H = heads[0], Sq = rows[0], nqb = (Sq + QB - 1) / QB;
  if (e >= long(B) * H * nqb * N) return;
  const long block = e / N;
  const int bh = int(block / nqb), b = bh / H, h = bh - b * H, q0 = int(block % nqb) * QB;
  int row, col;
  F::dq_coord(int(e % N), row, col);
  const float4 x = reinterpret_cast<const float4*>(dq_acc)[e];
  const float f = scale[0];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = q0 + row + 8 * r;
    if (s < Sq) {
      const long at = BSHD ? ((long(b) * Sq + s) * H + h) * D + col : ((long(b) * H + h) * Sq + s) * D + col;
      *reinterpret_cast<unsigned*>(dq + at) =
          kk::tops::sm90::detail::pack_pair<T>((r ? x.z : x.x) * f, (r ? x.w : x.y) * f);
    }
  }
