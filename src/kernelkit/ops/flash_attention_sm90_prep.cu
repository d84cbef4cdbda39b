// The Hopper backward's per-query inputs (tensor_ops/sm90_attention_backward.h), a warp a row of
// the (B, H, Sqp) outputs (Sqp: Sq rounded up to 64, the rows past Sq zero): lse2 = lse * log2(e)
// and delta = rowsum(dout * o) - dlse. o, dout: (B, H, Sq, D) views, the last dim packed; lse,
// dlse: (B, H, Sq) views (dlse may broadcast).

  const long r = long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31, Sq = o_shape[2], H = o_shape[1], Sqp = (Sq + 63) / 64 * 64;
  if (r >= long(o_shape[0]) * H * Sqp) return;
  const int s = int(r % Sqp), h = int(r / Sqp % H), b = int(r / Sqp / H);
  float sum = 0.0f;
  if (s < Sq) {
    const T* x = o + b * o_strides[0] + h * o_strides[1] + s * o_strides[2];
    const T* y = dout + b * dout_strides[0] + h * dout_strides[1] + s * dout_strides[2];
    for (int d = 2 * lane; d < D; d += 64) {  // a pair a lane: 4-byte loads
      float x0, x1, y0, y1;
      kk::tops::sm90::detail::unpack_pair<T>(*reinterpret_cast<const unsigned*>(x + d), x0, x1);
      kk::tops::sm90::detail::unpack_pair<T>(*reinterpret_cast<const unsigned*>(y + d), y0, y1);
      sum += x0 * y0 + x1 * y1;
    }
  }
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (lane == 0) {
    const bool in = s < Sq;
    const float l = in ? lse[b * lse_strides[0] + h * lse_strides[1] + s * lse_strides[2]] : 0.0f;
    const float dl = in ? dlse[b * dlse_strides[0] + h * dlse_strides[1] + s * dlse_strides[2]] : 0.0f;
    lse2[r] = l * 1.4426950408889634f;
    delta[r] = in ? sum - dl : 0.0f;
  }
