// The seed's grid_sample kernels (MLX's example), forward and VJP, written by hand as CUDA C++:
// benchmarks/grid_sample.py compiles them with CuPy's RawKernel and times them, outside
// kernelkit, against the same kernels through metal_kernel.

extern "C" __global__ void fwd(const float* x, const float* grid, float* out,
                               int H, int W, int C, int gH, int gW, unsigned n) {
  // the seed's arithmetic and integer types, as CUDA C++
  unsigned elem = blockIdx.x * blockDim.x + threadIdx.x;
  if (elem >= n) return;
  int w_stride = C, h_stride = W * w_stride, b_stride = H * h_stride;
  unsigned grid_idx = elem / C * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
  int ix_nw = floorf(ix), iy_nw = floorf(iy);
  int ix_ne = ix_nw + 1, iy_ne = iy_nw, ix_sw = ix_nw, iy_sw = iy_nw + 1, ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  float nw = (ix_se - ix) * (iy_se - iy), ne = (ix - ix_sw) * (iy_sw - iy);
  float sw = (ix_ne - ix) * (iy - iy_ne), se = (ix - ix_nw) * (iy - iy_nw);
  int batch_idx = elem / C / gH / gW * b_stride;
  int channel_idx = elem % C;
  int base = batch_idx + channel_idx;
  float I_nw = x[base + iy_nw * h_stride + ix_nw * w_stride];
  float I_ne = x[base + iy_ne * h_stride + ix_ne * w_stride];
  float I_sw = x[base + iy_sw * h_stride + ix_sw * w_stride];
  float I_se = x[base + iy_se * h_stride + ix_se * w_stride];
  I_nw = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1 ? I_nw : 0;
  I_ne = iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1 ? I_ne : 0;
  I_sw = iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1 ? I_sw : 0;
  I_se = iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1 ? I_se : 0;
  out[elem] = nw * I_nw + ne * I_ne + sw * I_sw + se * I_se;
}

extern "C" __global__ void vjp(const float* x, const float* grid, const float* cot, float* x_grad,
                               float* grid_grad, int H, int W, int C, int gH, int gW, unsigned n) {
  unsigned elem = blockIdx.x * blockDim.x + threadIdx.x;
  if (elem >= n) return;
  int C_padded = (C + 31) / 32 * 32;
  int w_stride = C, h_stride = W * w_stride, b_stride = H * h_stride;
  unsigned grid_idx = elem / C_padded * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
  int ix_nw = floorf(ix), iy_nw = floorf(iy);
  int ix_ne = ix_nw + 1, iy_ne = iy_nw, ix_sw = ix_nw, iy_sw = iy_nw + 1, ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  float nw = (ix_se - ix) * (iy_se - iy), ne = (ix - ix_sw) * (iy_sw - iy);
  float sw = (ix_ne - ix) * (iy - iy_ne), se = (ix - ix_nw) * (iy - iy_nw);
  int batch_idx = elem / C_padded / gH / gW * b_stride;
  int channel_idx = elem % C_padded;
  int base = batch_idx + channel_idx;
  float gix = 0, giy = 0;
  if (channel_idx < C) {
    float c = cot[elem / C_padded * C + channel_idx];
    if (iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1) {
      int o = base + iy_nw * h_stride + ix_nw * w_stride;
      atomicAdd(&x_grad[o], nw * c); float I = x[o];
      gix -= I * (iy_se - iy) * c; giy -= I * (ix_se - ix) * c;
    }
    if (iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1) {
      int o = base + iy_ne * h_stride + ix_ne * w_stride;
      atomicAdd(&x_grad[o], ne * c); float I = x[o];
      gix += I * (iy_sw - iy) * c; giy -= I * (ix - ix_sw) * c;
    }
    if (iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1) {
      int o = base + iy_sw * h_stride + ix_sw * w_stride;
      atomicAdd(&x_grad[o], sw * c); float I = x[o];
      gix -= I * (iy - iy_ne) * c; giy += I * (ix_ne - ix) * c;
    }
    if (iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1) {
      int o = base + iy_se * h_stride + ix_se * w_stride;
      atomicAdd(&x_grad[o], se * c); float I = x[o];
      gix += I * (iy - iy_nw) * c; giy += I * (ix - ix_nw) * c;
    }
  }
  for (int s = 16; s > 0; s >>= 1) {
    gix += __shfl_xor_sync(0xffffffffu, gix, s);
    giy += __shfl_xor_sync(0xffffffffu, giy, s);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&grid_grad[grid_idx], gix * (W / 2));
    atomicAdd(&grid_grad[grid_idx + 1], giy * (H / 2));
  }
}
