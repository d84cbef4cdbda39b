// The Hopper backward's per-query inputs (tensor_ops/sm90_attention_backward.h), for each row of
// the (B, H, Sqp) outputs (Sqp: Sq rounded up to the backward's block_q, the rows past Sq zero):
// lse2 = lse * log2(e) and delta = rowsum(dout * o) - dlse; and the backward's float sums zeroed,
// D of them a row, then its tile counter (dq_acc: B * H * Sqp * D + 4 floats), so that no fill
// runs before it. o, dout: (B, H, Sq, D) views, rows packed and 16-byte aligned; lse, dlse:
// (B, H, Sq) views (dlse may broadcast). D / 8 lanes a row, a 16-byte load of each of o and dout
// a lane.

  constexpr int L = D / 8;
  const long r = (long(blockIdx.x) * blockDim.x + threadIdx.x) / L;
  constexpr int QB = kk::tops::sm90::attention_backward<T, D>::block_q;
  const int l = int(threadIdx.x) % L, Sq = o_shape[2], H = o_shape[1], Sqp = (Sq + QB - 1) / QB * QB;
  const long rows = long(o_shape[0]) * H * Sqp;
  if (r >= rows) return;  // (whole warps: rows is a multiple of 64, a warp takes 32 / L of them)
  const int s = int(r % Sqp), h = int(r / Sqp % H), b = int(r / Sqp / H);
  float4* sums = reinterpret_cast<float4*>(dq_acc + r * D) + 2 * l;
  sums[0] = sums[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (r == 0 && l == 0) *reinterpret_cast<float4*>(dq_acc + rows * D) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float sum = 0.0f;
  if (s < Sq) {
    const uint4 x = *reinterpret_cast<const uint4*>(o + b * o_strides[0] + h * o_strides[1] + s * o_strides[2] + 8 * l);
    const uint4 y = *reinterpret_cast<const uint4*>(dout + b * dout_strides[0] + h * dout_strides[1] +
                                                    s * dout_strides[2] + 8 * l);
    const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float x0, x1, y0, y1;
      kk::tops::sm90::detail::unpack_pair<T>(xs[i], x0, x1);
      kk::tops::sm90::detail::unpack_pair<T>(ys[i], y0, y1);
      sum += x0 * y0 + x1 * y1;
    }
  }
#pragma unroll
  for (int m = L / 2; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (l == 0) {
    const bool in = s < Sq;
    const float e = in ? lse[b * lse_strides[0] + h * lse_strides[1] + s * lse_strides[2]] : 0.0f;
    const float de = in ? dlse[b * dlse_strides[0] + h * dlse_strides[1] + s * dlse_strides[2]] : 0.0f;
    lse2[r] = e * 1.4426950408889634f;
    delta[r] = in ? sum - de : 0.0f;
  }
