// The MLX seeds' kernel bodies, unchanged apart from the front end's rewrite,
// in the shape of a generated translation unit: a template body function in
// namespace metal with the MSL attributes as parameters. Run on one thread
// over every grid position (on one lane, simd_sum returns the lane's value and
// every thread is lane 0, so each adds its own gradient: the same totals).
#include "prelude_test.h"

namespace metal {
// A user header, as the front end places it: includes and using-directive
// inside namespace metal, helpers, program-scope constants.
#include <metal_stdlib>
#include <metal_math>
using namespace metal;

KK_PROGRAM_CONSTANT float kTable[4] = {0.5f, 1.0f, 2.0f, M_PI_F};
KK_PROGRAM_CONSTANT half kHalves[3] = {half(0.5f), 2.0f, -1};
KK_PROGRAM_CONSTANT bfloat kBf = 3.0f;
static_assert(half(1.5f).bits == 0x3e00 && half(65520.0f).bits == 0x7c00 && half(0x1.8p-25f).bits == 1,
              "constant-evaluated float -> half");
static_assert(float(half::from_bits(0x3555)) == 0x1.554p-2f && bfloat(1.0f + 3 * 0x1p-8f).bits == 0x3f82,
              "constant-evaluated conversions");

// A helper as MSL headers write them: no KK_FN (NVRTC needs -default-device).
inline float scale_by_table(float x, uint i) { return x * kTable[i & 3]; }
METAL_FUNC half first_half() { return kHalves[0]; }

template <typename T>
KK_FN void custom_kernel_myexp(const float16_t* inp, float16_t* out, const uint3 thread_position_in_grid) {
  uint elem = thread_position_in_grid.x;
  T tmp = inp[elem];
  out[elem] = metal::exp(tmp);
}

template <typename T>
KK_FN void custom_kernel_myexp_strided(const T* inp, const int* inp_shape, const int64_t* inp_strides,
                                       const int& inp_ndim, T* out, const uint3 thread_position_in_grid) {
  uint elem = thread_position_in_grid.x;
  // Utils from `mlx/backend/metal/kernels/utils.h` are automatically included
  uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
  T tmp = inp[loc];
  // Output arrays are always row contiguous
  out[elem] = metal::exp(tmp);
}

template <typename T>
KK_FN void custom_kernel_grid_sample(const T* x, const int* x_shape, const T* grid, const int* grid_shape, T* out,
                                     const uint3 thread_position_in_grid) {
  uint elem = thread_position_in_grid.x;
  int H = x_shape[1];
  int W = x_shape[2];
  int C = x_shape[3];
  int gH = grid_shape[1];
  int gW = grid_shape[2];

  int w_stride = C;
  int h_stride = W * w_stride;
  int b_stride = H * h_stride;

  uint grid_idx = elem / C * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;

  int ix_nw = floor(ix);
  int iy_nw = floor(iy);

  int ix_ne = ix_nw + 1;
  int iy_ne = iy_nw;

  int ix_sw = ix_nw;
  int iy_sw = iy_nw + 1;

  int ix_se = ix_nw + 1;
  int iy_se = iy_nw + 1;

  T nw = (ix_se - ix) * (iy_se - iy);
  T ne = (ix - ix_sw) * (iy_sw - iy);
  T sw = (ix_ne - ix) * (iy - iy_ne);
  T se = (ix - ix_nw) * (iy - iy_nw);

  int batch_idx = elem / C / gH / gW * b_stride;
  int channel_idx = elem % C;
  int base_idx = batch_idx + channel_idx;

  T I_nw = x[base_idx + iy_nw * h_stride + ix_nw * w_stride];
  T I_ne = x[base_idx + iy_ne * h_stride + ix_ne * w_stride];
  T I_sw = x[base_idx + iy_sw * h_stride + ix_sw * w_stride];
  T I_se = x[base_idx + iy_se * h_stride + ix_se * w_stride];

  I_nw = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1 ? I_nw : 0;
  I_ne = iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1 ? I_ne : 0;
  I_sw = iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1 ? I_sw : 0;
  I_se = iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1 ? I_se : 0;

  out[elem] = nw * I_nw + ne * I_ne + sw * I_sw + se * I_se;
}

template <typename T>
KK_FN void custom_kernel_grid_sample_grad(const T* x, const int* x_shape, const T* grid, const int* grid_shape,
                                          const T* cotangent, atomic<T>* x_grad, atomic<T>* grid_grad,
                                          const uint3 thread_position_in_grid, const uint thread_index_in_simdgroup,
                                          const uint threads_per_simdgroup) {
  uint elem = thread_position_in_grid.x;
  int H = x_shape[1];
  int W = x_shape[2];
  int C = x_shape[3];
  // Pad C to the nearest larger simdgroup size multiple
  int C_padded = ceildiv(C, threads_per_simdgroup) * threads_per_simdgroup;

  int gH = grid_shape[1];
  int gW = grid_shape[2];

  int w_stride = C;
  int h_stride = W * w_stride;
  int b_stride = H * h_stride;

  uint grid_idx = elem / C_padded * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;

  int ix_nw = floor(ix);
  int iy_nw = floor(iy);

  int ix_ne = ix_nw + 1;
  int iy_ne = iy_nw;

  int ix_sw = ix_nw;
  int iy_sw = iy_nw + 1;

  int ix_se = ix_nw + 1;
  int iy_se = iy_nw + 1;

  T nw = (ix_se - ix) * (iy_se - iy);
  T ne = (ix - ix_sw) * (iy_sw - iy);
  T sw = (ix_ne - ix) * (iy - iy_ne);
  T se = (ix - ix_nw) * (iy - iy_nw);

  int batch_idx = elem / C_padded / gH / gW * b_stride;
  int channel_idx = elem % C_padded;
  int base_idx = batch_idx + channel_idx;

  T gix = T(0);
  T giy = T(0);
  if (channel_idx < C) {
    int cot_index = elem / C_padded * C + channel_idx;
    T cot = cotangent[cot_index];
    if (iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1) {
      int offset = base_idx + iy_nw * h_stride + ix_nw * w_stride;
      atomic_fetch_add_explicit(&x_grad[offset], nw * cot, memory_order_relaxed);

      T I_nw = x[offset];
      gix -= I_nw * (iy_se - iy) * cot;
      giy -= I_nw * (ix_se - ix) * cot;
    }
    if (iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1) {
      int offset = base_idx + iy_ne * h_stride + ix_ne * w_stride;
      atomic_fetch_add_explicit(&x_grad[offset], ne * cot, memory_order_relaxed);

      T I_ne = x[offset];
      gix += I_ne * (iy_sw - iy) * cot;
      giy -= I_ne * (ix - ix_sw) * cot;
    }
    if (iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1) {
      int offset = base_idx + iy_sw * h_stride + ix_sw * w_stride;
      atomic_fetch_add_explicit(&x_grad[offset], sw * cot, memory_order_relaxed);

      T I_sw = x[offset];
      gix -= I_sw * (iy - iy_ne) * cot;
      giy += I_sw * (ix_ne - ix) * cot;
    }
    if (iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1) {
      int offset = base_idx + iy_se * h_stride + ix_se * w_stride;
      atomic_fetch_add_explicit(&x_grad[offset], se * cot, memory_order_relaxed);

      T I_se = x[offset];
      gix += I_se * (iy - iy_nw) * cot;
      giy += I_se * (ix - ix_nw) * cot;
    }
  }

  T gix_mult = W / 2;
  T giy_mult = H / 2;

  // Reduce across each simdgroup first.
  // This is much faster than relying purely on atomics.
  gix = simd_sum(gix);
  giy = simd_sum(giy);

  if (thread_index_in_simdgroup == 0) {
    atomic_fetch_add_explicit(&grid_grad[grid_idx], gix * gix_mult, memory_order_relaxed);
    atomic_fetch_add_explicit(&grid_grad[grid_idx + 1], giy * giy_mult, memory_order_relaxed);
  }
}

// The reference: the seed's bilinear sampling in double.
KK_TEST_FN double bilinear_ref(const double* x, int H, int W, int C, int b, int c, double gx, double gy) {
  const double ix = ((gx + 1) * W - 1) / 2, iy = ((gy + 1) * H - 1) / 2;
  const int x0 = int(::floor(ix)), y0 = int(::floor(iy));
  double acc = 0;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      const int xx = x0 + dx, yy = y0 + dy;
      if (xx < 0 || xx >= W || yy < 0 || yy >= H) continue;
      const double wgt = (dx ? ix - x0 : x0 + 1 - ix) * (dy ? iy - y0 : y0 + 1 - iy);
      acc += wgt * x[((b * H + yy) * W + xx) * C + c];
    }
  return acc;
}

template <typename T>
KK_TEST_FN void run_grid_sample(kk_test_result& r, double tol) {
  // x: (1, 3, 4, 2), grid: (1, 2, 3, 2), inside and outside the image.
  constexpr int H = 3, W = 4, C = 2, gH = 2, gW = 3, n_out = gH * gW * C;
  const int x_shape[4] = {1, H, W, C}, grid_shape[4] = {1, gH, gW, 2};
  double xd[H * W * C];
  T x[H * W * C];
  for (int i = 0; i < H * W * C; ++i) {
    xd[i] = double(T(0.25f * float(i % 7) - 0.5f));
    x[i] = T(xd[i]);
  }
  const float gvals[gH * gW * 2] = {-1.0f, -1.0f, 0.1f, 0.2f, 0.9f, -0.6f, 1.2f, 0.0f, -0.3f, 0.75f, 0.0f, 0.0f};
  T grid[gH * gW * 2];
  for (int i = 0; i < gH * gW * 2; ++i) grid[i] = T(gvals[i]);
  T out[n_out];
  for (uint e = 0; e < uint(n_out); ++e) custom_kernel_grid_sample<T>(x, x_shape, grid, grid_shape, out, uint3(e, 0, 0));
  for (int e = 0; e < n_out; ++e) {
    const int p = e / C, c = e % C;
    CHECK_NEAR(float(out[e]), bilinear_ref(xd, H, W, C, 0, c, double(float(grid[2 * p])), double(float(grid[2 * p + 1]))), tol);
  }

  // The VJP: x_grad must be cotangent-weighted bilinear weights; grid_grad finite and symmetric in sign.
  constexpr int C_padded = 32;
  T cot[gH * gW * C];
  for (int i = 0; i < gH * gW * C; ++i) cot[i] = T(1);
  KK_THREADGROUP T x_grad[H * W * C];  // atomics need shared or device memory on the GPU
  KK_THREADGROUP T grid_grad[gH * gW * 2];
  for (int i = 0; i < H * W * C; ++i) x_grad[i] = T(0);
  for (int i = 0; i < gH * gW * 2; ++i) grid_grad[i] = T(0);
  for (uint e = 0; e < uint(gH * gW * C_padded); ++e)
    custom_kernel_grid_sample_grad<T>(x, x_shape, grid, grid_shape, cot, reinterpret_cast<atomic<T>*>(x_grad),
                                      reinterpret_cast<atomic<T>*>(grid_grad), uint3(e, 0, 0), 0, 32);
  // Sum of x_grad = sum over output points of the in-bounds bilinear weights, per channel.
  double wsum = 0, gsum = 0;
  for (int p = 0; p < gH * gW; ++p) {
    double ones[H * W * C];
    for (int i = 0; i < H * W * C; ++i) ones[i] = 1.0;
    wsum += C * bilinear_ref(ones, H, W, C, 0, 0, double(float(grid[2 * p])), double(float(grid[2 * p + 1])));
  }
  for (int i = 0; i < H * W * C; ++i) gsum += double(float(x_grad[i]));
  CHECK_NEAR(gsum, wsum, tol);
  // grid_grad of a point at the image centre region: d/dgx of sum_c out = W/2 * d/dix.
  const int p = 1;  // grid (0.1, 0.2)
  const double h = 1e-3, gx = double(float(grid[2 * p])), gy = double(float(grid[2 * p + 1]));
  double fd = 0;
  for (int c = 0; c < C; ++c)
    fd += (bilinear_ref(xd, H, W, C, 0, c, gx + h, gy) - bilinear_ref(xd, H, W, C, 0, c, gx - h, gy)) / (2 * h);
  // The seed multiplies by W / 2 in integer arithmetic (4 / 2 = 2), as MLX does: d ix / d gx = W / 2.
  CHECK_NEAR(float(grid_grad[2 * p]), fd, tol * 10);
}

KK_FN void test_kernels(kk_test_result& r, uint) {
  float16_t inp[8], out[8];
  for (int i = 0; i < 8; ++i) inp[i] = float16_t(0.5f * i - 2.0f);
  for (uint e = 0; e < 8; ++e) custom_kernel_myexp<float>(inp, out, uint3(e, 0, 0));
  for (int i = 0; i < 8; ++i) CHECK_NEAR(float(out[i]), ::exp(0.5 * i - 2.0), 1e-3);
  for (uint e = 0; e < 8; ++e) custom_kernel_myexp<half>(inp, out, uint3(e, 0, 0));
  CHECK_NEAR(float(out[7]), ::exp(1.5), 1e-3);

  // A (2, 3) view of a (3, 2) array, transposed: strides (1, 2).
  const int shape[2] = {2, 3};
  const int64_t strides[2] = {1, 2};
  const int ndim = 2;
  float a[6] = {0, 1, 2, 3, 4, 5}, o[6];
  for (uint e = 0; e < 6; ++e) custom_kernel_myexp_strided<float>(a, shape, strides, ndim, o, uint3(e, 0, 0));
  CHECK_NEAR(o[1], ::exp(2.0), 1e-6);
  CHECK_NEAR(o[3], ::exp(1.0), 1e-6);

  CHECK(scale_by_table(2.0f, 7) == 2 * M_PI_F && first_half() == 0.5f && kHalves[2] == -1 && kBf == 3);

  run_grid_sample<float>(r, 1e-5);
  run_grid_sample<half>(r, 2e-2);
  run_grid_sample<bfloat>(r, 1e-1);
}

}  // namespace metal

KK_TEST_MAIN(test_kernels, 1)
