"""Custom Metal kernels from public MLX projects, run as their authors wrote them.

Each kernel's source and header strings are copied verbatim from the repository its docstring
names (only `{...}` / `.replace` substitutions their own Python makes are applied, as they apply
them); the Python around them is translated from mx to torch, keeping every grid, threadgroup and
template argument as written. Each result is checked against a float64 reference written from the
kernel's documented intent; without a GPU, conftest compiles every kernel for sm_90 as well.
"""

import math

import numpy as np
import pytest
import torch

import kernelkit as kk


def launch(kernel, device, **call):
    """`kernel(**call)` on `device` (conftest compiles each variant for sm_90 too, without a GPU)."""
    return kernel(stream=device, **call)


def close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol)


def u32(t):
    """Random 32-bit words as torch.uint32 (and the same words as int64, for references)."""
    return t.to(torch.uint32), t


# --- Blaizzy/mlx-vlm: mlx_vlm/models/kernels.py ------------------------------------------------

def get_optimal_threadgroup(out_w, out_h):
    # mlx_vlm/models/kernels.py, as written
    MAX_THREADS_PER_GROUP = 1024
    MAX_THREADS_PER_DIM = 1024
    max_width = min(MAX_THREADS_PER_DIM, out_w)
    max_height = min(MAX_THREADS_PER_DIM, out_h)
    width = 2 ** (max_width.bit_length() - 1)
    if width > max_width:
        width = width // 2
    height = 2 ** (max_height.bit_length() - 1)
    if height > max_height:
        height = height // 2
    while width * height > MAX_THREADS_PER_GROUP:
        if width >= height:
            width = width // 2
        else:
            height = height // 2
    width = max(8, width)
    height = max(8, height)
    return (width, height, 1)


NEAREST_SOURCE = """
        uint x_out = thread_position_in_grid.x;
        uint y_out = thread_position_in_grid.y;
        uint bc_idx = thread_position_in_grid.z;

        int batch_size = dims[0];
        int channels = dims[1];
        int in_h = dims[2];
        int in_w = dims[3];
        int out_h = dims[4];
        int out_w = dims[5];

        if (x_out >= (uint)out_w || y_out >= (uint)out_h || bc_idx >= (uint)(batch_size * channels))
            return;

        int c = bc_idx % channels;
        int b = bc_idx / channels;

        // PyTorch's coordinate calculation for nearest neighbor
        // This matches: torch.nn.functional.interpolate(..., mode='nearest')
        float scale_h = float(in_h) / float(out_h);
        float scale_w = float(in_w) / float(out_w);

        // PyTorch uses floor for nearest neighbor coordinate mapping
        int y_in = int(floor(float(y_out) * scale_h));
        int x_in = int(floor(float(x_out) * scale_w));

        // Clamp to bounds
        y_in = max(0, min(y_in, in_h - 1));
        x_in = max(0, min(x_in, in_w - 1));

        int input_offset = ((b * channels + c) * in_h + y_in) * in_w + x_in;
        int output_offset = ((b * channels + c) * out_h + y_out) * out_w + x_out;

        output[output_offset] = input[input_offset];
    """


def test_mlx_vlm_nearest_interpolate(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/kernels.py: nearest_interpolate (PyTorch's 'nearest')."""
    batch_size, channels, in_h, in_w, out_h, out_w = 2, 3, 5, 7, 8, 10
    x = torch.randn(batch_size, channels, in_h, in_w, device=device)
    dims = torch.tensor([batch_size, channels, in_h, in_w, out_h, out_w], dtype=torch.int32,
                        device=device)
    kernel = kk.metal_kernel(name="nearest_interpolation", input_names=["input", "dims"],
                             output_names=["output"], source=NEAREST_SOURCE)
    out = launch(kernel, device, inputs=[x.reshape(-1), dims],
                 grid=(out_w, out_h, batch_size * channels),
                 threadgroup=get_optimal_threadgroup(out_w, out_h),
                 output_shapes=[(batch_size * channels * out_h * out_w,)],
                 output_dtypes=[torch.float32])[0]
    expected = torch.nn.functional.interpolate(x.double(), size=(out_h, out_w), mode="nearest")
    close(out.reshape(batch_size, channels, out_h, out_w), expected, rtol=0, atol=0)


BICUBIC_HEADER = """
        // Cubic convolution kernel. PyTorch's non-antialiased bicubic uses
        // a=-0.75 (ATen upsample_bicubic2d); its antialiased path matches
        // Pillow, which uses a=-0.5 (Keys' cubic).
        float cubic_kernel_a(float x, float a) {
            float absx = fabs(x);
            float absx2 = absx * absx;
            float absx3 = absx2 * absx;
            if (absx <= 1.0f) {
                return (a + 2.0f) * absx3 - (a + 3.0f) * absx2 + 1.0f;
            } else if (absx < 2.0f) {
                return a * absx3 - 5.0f * a * absx2 + 8.0f * a * absx - 4.0f * a;
            }
            return 0.0f;
        }

        float cubic_kernel(float x) {
            return cubic_kernel_a(x, -0.75f);
        }

        // Antialiased bicubic kernel - widens the support for downsampling and
        // uses Pillow's a=-0.5 to match PyTorch's antialiased path.
        float cubic_kernel_antialias(float x, float scale) {
            return cubic_kernel_a(x / scale, -0.5f);
        }
    """

BICUBIC_SOURCE = """
        // Get thread position
        uint x_out = thread_position_in_grid.x;
        uint y_out = thread_position_in_grid.y;
        uint bc_idx = thread_position_in_grid.z;

        // Extract dimensions
        int batch_size = dims[0];
        int channels = dims[1];
        int in_h = dims[2];
        int in_w = dims[3];
        int out_h = dims[4];
        int out_w = dims[5];

        // Extract parameters
        float scale_h = params[0];
        float scale_w = params[1];
        bool align_corners = params[2] > 0.5f;
        bool use_antialias = params[3] > 0.5f;
        float filter_scale_h = params[4];
        float filter_scale_w = params[5];
        float support = params[6];

        // Check bounds
        if (x_out >= (uint)out_w || y_out >= (uint)out_h || bc_idx >= (uint)(batch_size * channels))
            return;

        // Calculate batch and channel indices
        int c = bc_idx % channels;
        int b = bc_idx / channels;

        // Calculate input coordinates
        float x_in, y_in;

        if (align_corners && out_w > 1 && out_h > 1) {
            x_in = float(x_out) * (in_w - 1) / (out_w - 1);
            y_in = float(y_out) * (in_h - 1) / (out_h - 1);
        } else {
            // PyTorch's default coordinate mapping
            x_in = ((float(x_out) + 0.5f) / float(out_w)) * float(in_w) - 0.5f;
            y_in = ((float(y_out) + 0.5f) / float(out_h)) * float(in_h) - 0.5f;
        }

        // Calculate the support region based on antialiasing
        float support_h = use_antialias ? support * filter_scale_h : support;
        float support_w = use_antialias ? support * filter_scale_w : support;

        // Calculate the range of input pixels to sample
        int y_start = int(floor(y_in - support_h)) + 1;
        int y_end = int(floor(y_in + support_h)) + 1;
        int x_start = int(floor(x_in - support_w)) + 1;
        int x_end = int(floor(x_in + support_w)) + 1;

        // Clamp to valid range
        y_start = max(0, y_start);
        y_end = min(in_h, y_end);
        x_start = max(0, x_start);
        x_end = min(in_w, x_end);

        // Perform bicubic interpolation with antialiasing
        float result = 0.0f;
        float weight_sum = 0.0f;

        for (int y_pos = y_start; y_pos < y_end; y_pos++) {
            float dy = float(y_pos) - y_in;
            float wy = use_antialias ?
                cubic_kernel_antialias(dy, filter_scale_h) :
                cubic_kernel(dy);

            for (int x_pos = x_start; x_pos < x_end; x_pos++) {
                float dx = float(x_pos) - x_in;
                float wx = use_antialias ?
                    cubic_kernel_antialias(dx, filter_scale_w) :
                    cubic_kernel(dx);

                float weight = wy * wx;

                // Calculate input tensor offset
                int input_offset = ((b * channels + c) * in_h + y_pos) * in_w + x_pos;

                // Add weighted contribution
                result += input[input_offset] * weight;
                weight_sum += weight;
            }
        }

        // Normalize by weight sum
        if (weight_sum > 1e-8f) {
            result /= weight_sum;
        }

        // Calculate output tensor offset
        int output_offset = ((b * channels + c) * out_h + y_out) * out_w + x_out;

        // Assign the result to output
        output[output_offset] = result;
    """


def _bicubic_reference(x, out_h, out_w, align_corners, antialias):
    """The kernel's resampling: cubic taps (a=-0.75, or Pillow's a=-0.5 widened by the downscale
    when antialiasing) over the in-range pixels of the support, normalised by their weight sum."""
    B, C, in_h, in_w = x.shape

    def taps(n_out, n_in):
        scale = n_out / n_in
        fs = 1.0 / scale if antialias and scale < 1.0 else 1.0
        support = 2.0 * fs if antialias else 2.0
        a = -0.5 if antialias else -0.75
        w = torch.zeros(n_out, n_in, dtype=torch.float64)
        for o in range(n_out):
            if align_corners and out_h > 1 and out_w > 1:
                c = o * (n_in - 1) / (n_out - 1)
            else:
                c = (o + 0.5) / n_out * n_in - 0.5
            for p in range(max(0, math.floor(c - support) + 1), min(n_in, math.floor(c + support) + 1)):
                t = abs((p - c) / (fs if antialias else 1.0))
                w[o, p] = ((a + 2) * t ** 3 - (a + 3) * t ** 2 + 1 if t <= 1 else
                           a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a if t < 2 else 0.0)
        return w

    wy, wx = taps(out_h, in_h), taps(out_w, in_w)
    num = torch.einsum("oh,bchw,pw->bcop", wy, x.double().cpu(), wx)
    den = wy.sum(1)[:, None] * wx.sum(1)[None, :]
    return torch.where(den > 1e-8, num / den, num)


@pytest.mark.parametrize("size,align_corners,antialias", [((9, 11), False, False),
                                                          ((4, 3), False, True),
                                                          ((9, 11), True, False)])
def test_mlx_vlm_bicubic_interpolate(device, size, align_corners, antialias):
    """Blaizzy/mlx-vlm, mlx_vlm/models/kernels.py: bicubic_interpolate (up, antialiased down)."""
    x = torch.randn(1, 2, 6, 7, device=device)
    batch_size, channels, in_h, in_w = x.shape
    out_h, out_w = size
    scale_h, scale_w = out_h / in_h, out_w / in_w
    support = 2.0
    params = torch.tensor([scale_h, scale_w, 1.0 if align_corners else 0.0,
                           1.0 if antialias else 0.0,
                           1.0 / scale_h if antialias and scale_h < 1.0 else 1.0,
                           1.0 / scale_w if antialias and scale_w < 1.0 else 1.0, support],
                          dtype=torch.float32, device=device)
    dims = torch.tensor([batch_size, channels, in_h, in_w, out_h, out_w], dtype=torch.int32,
                        device=device)
    kernel = kk.metal_kernel(name="bicubic_interpolation_antialias",
                             input_names=["input", "dims", "params"], output_names=["output"],
                             source=BICUBIC_SOURCE, header=BICUBIC_HEADER)
    out = launch(kernel, device, inputs=[x.reshape(-1), dims, params],
                 grid=(out_w, out_h, batch_size * channels),
                 threadgroup=get_optimal_threadgroup(out_w, out_h),
                 output_shapes=[(batch_size * channels * out_h * out_w,)],
                 output_dtypes=[torch.float32])[0]
    expected = _bicubic_reference(x, out_h, out_w, align_corners, antialias)
    close(out.reshape(batch_size, channels, out_h, out_w), expected, rtol=1e-4, atol=1e-5)


# --- Blaizzy/mlx-vlm: mlx_vlm/quantization/one_bit.py -----------------------------------------

ONE_BIT_QMV_SOURCE = r"""
    uint lane = thread_index_in_simdgroup;
    uint simd_group = simdgroup_index_in_threadgroup;
    uint input_row = threadgroup_position_in_grid.y;
    uint input_dims = x_shape[1];
    uint output_dims = weight_shape[0];
    uint groups = scales_shape[1];
    uint output_start = threadgroup_position_in_grid.x * OUTPUTS_PER_THREADGROUP +
        simd_group * OUTPUTS_PER_SIMDGROUP;

    float accumulators[OUTPUTS_PER_SIMDGROUP] = {0.0f};
    constexpr uint VALUES_PER_THREAD = 16;
    constexpr uint BLOCK_SIZE = VALUES_PER_THREAD * 32;

    // Derived from PrismML's qmv_fast SIMD layout. Each lane owns one packed
    // 16-bit half-word and 16 contiguous activations, lowering register
    // pressure while four output rows reuse the activation block.
    for (uint block_start = lane * VALUES_PER_THREAD;
         block_start < input_dims;
         block_start += BLOCK_SIZE) {
        float x_thread[VALUES_PER_THREAD];
        float total_sum = 0.0f;
        #pragma clang loop unroll(full)
        for (uint i = 0; i < VALUES_PER_THREAD; ++i) {
            float value = static_cast<float>(
                x[input_row * input_dims + block_start + i]);
            x_thread[i] = value;
            total_sum += value;
        }

        uint group = block_start / GROUP_SIZE;
        uint packed_column = block_start >> 5;
        uint packed_shift = block_start & 31;
        for (uint row = 0; row < OUTPUTS_PER_SIMDGROUP; ++row) {
            uint output_row = output_start + row;
            if (ROW_VALID) {
                ushort packed = ushort(
                    weight[output_row * weight_shape[1] + packed_column] >>
                    packed_shift);
                float selected_sum = 0.0f;
                #pragma clang loop unroll(full)
                for (uint i = 0; i < VALUES_PER_THREAD; ++i) {
                    selected_sum +=
                        (packed & (ushort(1) << i)) ? x_thread[i] : 0.0f;
                }

                uint parameter_index = output_row * groups + group;
                accumulators[row] += selected_sum *
                    static_cast<float>(scales[parameter_index]);
                accumulators[row] += total_sum *
                    static_cast<float>(biases[parameter_index]);
            }
        }
    }

    for (uint row = 0; row < OUTPUTS_PER_SIMDGROUP; ++row) {
        accumulators[row] = simd_sum(accumulators[row]);
        uint output_row = output_start + row;
        if (lane == 0 && output_row < output_dims) {
            out[input_row * output_dims + output_row] =
                static_cast<T>(accumulators[row]);
        }
    }
"""

ONE_BIT_QMM_HEADER = r"""
#include <metal_simdgroup>
#include <metal_simdgroup_matrix>
using namespace metal;
"""

ONE_BIT_QMM_SOURCE = r"""
    constexpr short BM = 32;
    constexpr short BK = 32;
    constexpr short BN = 32;
    constexpr short TILE_STRIDE = BK + 16 / sizeof(T);

    const int M = x_shape[0];
    const int K = x_shape[1];
    const int N = weight_shape[0];
    const uint lane = thread_index_in_simdgroup;
    const uint simd_group = simdgroup_index_in_threadgroup;
    const uint thread_index = thread_index_in_threadgroup;
    const int tile_row = threadgroup_position_in_grid.y * BM;
    const int tile_column = threadgroup_position_in_grid.x * BN;
    const int load_row = thread_index / 4;
    const int load_column = (thread_index % 4) * 8;
    const int simd_row = simd_group / 2;
    const int simd_column = simd_group % 2;

    const short quad = lane / 4;
    const short fragment_row = (quad & 4) + ((lane / 2) % 4);
    const short fragment_column = (quad & 2) * 2 + (lane % 2) * 2;

    threadgroup T x_tile[BM * TILE_STRIDE];
    threadgroup T weight_tile[BN * TILE_STRIDE];

    metal::simdgroup_matrix<float, 8, 8> accumulators[2][2];
    #pragma clang loop unroll(full)
    for (short row = 0; row < 2; ++row) {
        #pragma clang loop unroll(full)
        for (short column = 0; column < 2; ++column) {
            accumulators[row][column].thread_elements()[0] = 0.0f;
            accumulators[row][column].thread_elements()[1] = 0.0f;
        }
    }

    for (int k_start = 0; k_start < K; k_start += BK) {
        int input_row = tile_row + load_row;
        int input_column = k_start + load_column;
        int weight_row = tile_column + load_row;
        int packed_column = k_start / 32;
        uint packed = weight_row < N
            ? weight[weight_row * weight_shape[1] + packed_column]
            : 0;
        uchar packed_byte = uchar(packed >> ((thread_index % 4) * 8));
        T scale = weight_row < N
            ? scales[weight_row * scales_shape[1] + k_start / GROUP_SIZE]
            : T(0);
        T bias = weight_row < N
            ? biases[weight_row * biases_shape[1] + k_start / GROUP_SIZE]
            : T(0);

        #pragma clang loop unroll(full)
        for (short element = 0; element < 8; ++element) {
            x_tile[load_row * TILE_STRIDE + load_column + element] =
                input_row < M ? x[input_row * K + input_column + element] : T(0);
            weight_tile[load_row * TILE_STRIDE + load_column + element] =
                bias + ((packed_byte & (uchar(1) << element)) ? scale : T(0));
        }

        threadgroup_barrier(mem_flags::mem_threadgroup);

        #pragma clang loop unroll(full)
        for (short k_fragment = 0; k_fragment < BK; k_fragment += 8) {
            metal::simdgroup_matrix<float, 8, 8> a[2];
            metal::simdgroup_matrix<float, 8, 8> b[2];
            #pragma clang loop unroll(full)
            for (short tile = 0; tile < 2; ++tile) {
                int a_row = simd_row * 16 + tile * 8 + fragment_row;
                int b_row = simd_column * 16 + tile * 8 + fragment_column;
                #pragma clang loop unroll(full)
                for (short element = 0; element < 2; ++element) {
                    a[tile].thread_elements()[element] = static_cast<float>(
                        x_tile[a_row * TILE_STRIDE + k_fragment +
                               fragment_column + element]);
                    b[tile].thread_elements()[element] = static_cast<float>(
                        weight_tile[(b_row + element) * TILE_STRIDE +
                                    k_fragment + fragment_row]);
                }
            }

            #pragma clang loop unroll(full)
            for (short row = 0; row < 2; ++row) {
                #pragma clang loop unroll(full)
                for (short column = 0; column < 2; ++column) {
                    metal::simdgroup_matrix<float, 8, 8> result;
                    simdgroup_multiply_accumulate(
                        result,
                        a[row],
                        b[column],
                        accumulators[row][column]);
                    accumulators[row][column] = result;
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    #pragma clang loop unroll(full)
    for (short row = 0; row < 2; ++row) {
        #pragma clang loop unroll(full)
        for (short column = 0; column < 2; ++column) {
            int output_row = tile_row + simd_row * 16 + row * 8 + fragment_row;
            int output_column =
                tile_column + simd_column * 16 + column * 8 + fragment_column;
            #pragma clang loop unroll(full)
            for (short element = 0; element < 2; ++element) {
                if (output_row < M && output_column + element < N) {
                    out[output_row * N + output_column + element] = static_cast<T>(
                        accumulators[row][column].thread_elements()[element]);
                }
            }
        }
    }
"""


def _one_bit_operands(device, M, K, N, group_size, dtype):
    words = torch.randint(0, 2 ** 32, (N, K // 32), dtype=torch.int64)
    scales = (torch.rand(N, K // group_size) * 0.1 + 0.01).to(dtype)
    biases = (torch.randn(N, K // group_size) * 0.05).to(dtype)
    x = torch.randn(M, K).to(dtype)
    bits = (words[..., None] >> torch.arange(32)) & 1  # dequantize_one_bit, in float64
    dense = bits.reshape(N, K).double() * scales.double().repeat_interleave(group_size, 1) \
        + biases.double().repeat_interleave(group_size, 1)
    expected = x.double() @ dense.T
    return ([t.to(device) for t in (x, words.to(torch.uint32), scales, biases)], expected)


def test_mlx_vlm_one_bit_qmv(device):
    """Blaizzy/mlx-vlm, mlx_vlm/quantization/one_bit.py: 1-bit affine matrix-vector (simd_sum)."""
    group_size, outputs_per_simdgroup, (M, K, N) = 64, 4, (3, 1024, 24)
    inputs, expected = _one_bit_operands(device, M, K, N, group_size, torch.float32)
    source = (ONE_BIT_QMV_SOURCE.replace("GROUP_SIZE", str(group_size))
              .replace("OUTPUTS_PER_THREADGROUP", str(outputs_per_simdgroup * 2))
              .replace("OUTPUTS_PER_SIMDGROUP", str(outputs_per_simdgroup))
              .replace("ROW_VALID", "true" if N % (outputs_per_simdgroup * 2) == 0
                       else "output_row < output_dims"))
    kernel = kk.metal_kernel(name=f"mlx_vlm_affine_1bit_qmv_gs_{group_size}_rows_4_aligned_1",
                             input_names=["x", "weight", "scales", "biases"],
                             output_names=["out"], source=source)
    opt = outputs_per_simdgroup * 2
    out = launch(kernel, device, inputs=inputs, template=[("T", torch.float32)],
                 grid=(((N + opt - 1) // opt) * 64, M, 1), threadgroup=(64, 1, 1),
                 output_shapes=[(M * N,)], output_dtypes=[torch.float32])[0]
    close(out.reshape(M, N), expected, rtol=1e-4, atol=1e-4)


def test_mlx_vlm_one_bit_qmm(device):
    """Blaizzy/mlx-vlm, mlx_vlm/quantization/one_bit.py: 1-bit affine matrix-matrix through
    simdgroup_matrix thread_elements() with Apple's fragment layout, in half precision."""
    group_size, (M, K, N) = 32, (40, 512, 40)
    inputs, expected = _one_bit_operands(device, M, K, N, group_size, torch.float16)
    kernel = kk.metal_kernel(name=f"mlx_vlm_affine_1bit_qmm_gs_{group_size}",
                             input_names=["x", "weight", "scales", "biases"],
                             output_names=["out"], header=ONE_BIT_QMM_HEADER,
                             source=ONE_BIT_QMM_SOURCE.replace("GROUP_SIZE", str(group_size)))
    out = launch(kernel, device, inputs=inputs, template=[("T", torch.float16)],
                 grid=(((N + 31) // 32) * 128, (M + 31) // 32, 1), threadgroup=(128, 1, 1),
                 output_shapes=[(M * N,)], output_dtypes=[torch.float16])[0]
    close(out.reshape(M, N), expected, rtol=2e-2, atol=2e-2)


# --- Blaizzy/mlx-vlm: mlx_vlm/structured.py ----------------------------------------------------

def test_mlx_vlm_llguidance_mask(device):
    """Blaizzy/mlx-vlm, mlx_vlm/structured.py: a packed token bitmask applied to logits (-inf for
    disallowed tokens and for tokens past the mask's words)."""
    kernel = kk.metal_kernel(
        name="mlx_vlm_llguidance_mask",
        input_names=["logits", "mask"],
        output_names=["out"],
        source="""
        uint batch = thread_position_in_grid.y;
        uint token = thread_position_in_grid.x;
        uint word = token >> 5;
        uint bit = token & 31;
        bool allowed = word < mask_shape[1] &&
            ((as_type<uint>(mask[batch * mask_shape[1] + word]) >> bit) & 1u);
        uint offset = batch * logits_shape[1] + token;
        out[offset] = allowed ? logits[offset] : -metal::numeric_limits<T>::infinity();
    """,
    )
    logits = torch.randn(3, 70, device=device)
    words = torch.randint(-2 ** 31, 2 ** 31, (3, 2), dtype=torch.int64)  # 64 tokens' bits
    mask = words.to(torch.int32).to(device)
    out = launch(kernel, device, inputs=[logits, mask], template=[("T", logits.dtype)],
                 grid=(logits.shape[1], logits.shape[0], 1), threadgroup=(256, 1, 1),
                 output_shapes=[logits.shape], output_dtypes=[logits.dtype])[0]
    token = torch.arange(70)
    allowed = (token < 64) & (((words.remainder(2 ** 32)[:, (token // 32).clamp(max=1)]
                                >> (token % 32)) & 1) == 1)
    expected = torch.where(allowed, logits.cpu().double(), -math.inf)
    close(out, expected, rtol=0, atol=0)


# --- Blaizzy/mlx-vlm: mlx_vlm/models/exact_speculative_verify.py -------------------------------

GEMV_HEADER = "#include <metal_simdgroup>\nusing namespace metal;\n"

GEMV_SOURCE = r"""
        uint lane = thread_position_in_grid.x;
        uint out_block = thread_position_in_grid.y;
        uint row = thread_position_in_grid.z;

        constexpr int TM = 4;
        constexpr int TN = 4;
        constexpr int SN = 32;
        constexpr int blockN = SN * TN;

        if (row >= R) {
            return;
        }

        int out_row = int(out_block * TM);
        if (out_row >= O) {
            return;
        }

        const device T* in_vec = x + row * K;
        const device T* mat = weight + out_row * K;

        float result[TM] = {0.0f, 0.0f, 0.0f, 0.0f};
        int col = int(lane * TN);
        int n_iter = K / blockN;
        int leftover = K - blockN * n_iter;

        for (int iter = 0; iter < n_iter; ++iter) {
            float v[TN];
            for (int tn = 0; tn < TN; ++tn) {
                v[tn] = static_cast<float>(in_vec[col + tn]);
            }

            for (int tm = 0; tm < TM; ++tm) {
                for (int tn = 0; tn < TN; ++tn) {
                    result[tm] +=
                        static_cast<float>(mat[tm * K + col + tn]) * v[tn];
                }
            }

            col += blockN;
        }

        if (leftover > 0) {
            float v[TN];
            for (int tn = 0; tn < TN; ++tn) {
                v[tn] =
                    (col + tn < K) ? static_cast<float>(in_vec[col + tn]) : 0.0f;
            }

            for (int tm = 0; tm < TM; ++tm) {
                for (int tn = 0; tn < TN; ++tn) {
                    T m =
                        (col + tn < K) ? mat[tm * K + col + tn] : T(0);
                    result[tm] += static_cast<float>(m) * v[tn];
                }
            }
        }

        for (int tm = 0; tm < TM; ++tm) {
            for (ushort sn = (SN / 2); sn >= 1; sn >>= 1) {
                result[tm] += simd_shuffle_down(result[tm], sn);
            }
        }

        if (lane == 0) {
            for (int tm = 0; tm < TM; ++tm) {
                out[row * O + out_row + tm] = static_cast<T>(result[tm]);
            }
        }
    """

SWITCH_GEMV_SOURCE = r"""
        uint lane = thread_position_in_grid.x;
        uint out_block = thread_position_in_grid.y;
        uint row = thread_position_in_grid.z;

        constexpr int TM = 4;
        constexpr int TN = 4;
        constexpr int SN = 32;
        constexpr int blockN = SN * TN;

        if (row >= R) {
            return;
        }

        int out_row = int(out_block * TM);
        if (out_row >= O) {
            return;
        }

        uint input_row = BROADCAST_EXPERTS ? row / S : row;
        uint expert = expert_indices[row];
        const device T* in_vec = x + input_row * K;
        const device T* mat = weight + expert * O * K + out_row * K;

        float result[TM] = {0.0f, 0.0f, 0.0f, 0.0f};
        int col = int(lane * TN);
        int n_iter = K / blockN;
        int leftover = K - blockN * n_iter;

        for (int iter = 0; iter < n_iter; ++iter) {
            float v[TN];
            for (int tn = 0; tn < TN; ++tn) {
                v[tn] = static_cast<float>(in_vec[col + tn]);
            }

            for (int tm = 0; tm < TM; ++tm) {
                for (int tn = 0; tn < TN; ++tn) {
                    result[tm] +=
                        static_cast<float>(mat[tm * K + col + tn]) * v[tn];
                }
            }

            col += blockN;
        }

        if (leftover > 0) {
            float v[TN];
            for (int tn = 0; tn < TN; ++tn) {
                v[tn] =
                    (col + tn < K) ? static_cast<float>(in_vec[col + tn]) : 0.0f;
            }

            for (int tm = 0; tm < TM; ++tm) {
                for (int tn = 0; tn < TN; ++tn) {
                    T m =
                        (col + tn < K) ? mat[tm * K + col + tn] : T(0);
                    result[tm] += static_cast<float>(m) * v[tn];
                }
            }
        }

        for (int tm = 0; tm < TM; ++tm) {
            for (ushort sn = (SN / 2); sn >= 1; sn >>= 1) {
                result[tm] += simd_shuffle_down(result[tm], sn);
            }
        }

        if (lane == 0) {
            for (int tm = 0; tm < TM; ++tm) {
                out[row * O + out_row + tm] = static_cast<T>(result[tm]);
            }
        }
    """


def test_mlx_vlm_speculative_verify_gemv(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/exact_speculative_verify.py: dense GEMV, 4 outputs a
    SIMD group, reduced with simd_shuffle_down (K with a leftover block)."""
    batch, length, dimensions, outputs = 1, 5, 200, 8
    x = torch.randn(batch, length, dimensions, device=device).to(torch.float16)
    weight = torch.randn(outputs, dimensions, device=device).to(torch.float16)
    kernel = kk.metal_kernel(name="exact_speculative_verify_gemv", input_names=["x", "weight"],
                             output_names=["out"], header=GEMV_HEADER, source=GEMV_SOURCE)
    rows = batch * length
    padded_rows = ((rows + 7) // 8) * 8
    out = launch(kernel, device, inputs=[x.reshape(rows, dimensions), weight],
                 template=[("T", x.dtype), ("K", dimensions), ("O", outputs), ("R", rows)],
                 grid=(32, outputs // 4, padded_rows), threadgroup=(32, 1, 8),
                 output_shapes=[(rows, outputs)], output_dtypes=[x.dtype])[0]
    close(out, x.reshape(rows, dimensions).double() @ weight.double().T, rtol=2e-3, atol=2e-2)


def test_mlx_vlm_speculative_verify_switch_gemv(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/exact_speculative_verify.py: MoE expert-gathered GEMV
    with a bool template (BROADCAST_EXPERTS) and int templates K, O, R, S."""
    x = torch.randn(2, 3, 200, device=device)
    weight = torch.randn(3, 8, 200, device=device)
    expert_indices = torch.randint(0, 3, (2, 3, 2), device=device)
    dimensions, outputs = x.shape[-1], weight.shape[-2]
    selected_shape = expert_indices.shape
    rows = expert_indices.numel()
    padded_rows = ((rows + 7) // 8) * 8
    kernel = kk.metal_kernel(name="exact_speculative_verify_switch_gemv",
                             input_names=["x", "weight", "expert_indices"],
                             output_names=["out"], header=GEMV_HEADER, source=SWITCH_GEMV_SOURCE)
    out = launch(kernel, device,
                 inputs=[x.reshape(-1, dimensions), weight,
                         expert_indices.to(torch.uint32).reshape(-1)],
                 template=[("T", x.dtype), ("K", dimensions), ("O", outputs), ("R", rows),
                           ("S", selected_shape[-1]), ("BROADCAST_EXPERTS", True)],
                 grid=(32, outputs // 4, padded_rows), threadgroup=(32, 1, 8),
                 output_shapes=[(rows, outputs)], output_dtypes=[x.dtype])[0]
    xs = x.double().reshape(-1, dimensions).repeat_interleave(2, 0)
    expected = torch.einsum("rk,rok->ro", xs, weight.double()[expert_indices.reshape(-1)])
    close(out.reshape(*selected_shape, outputs), expected.reshape(*selected_shape, outputs),
          rtol=1e-4, atol=1e-4)


# --- Blaizzy/mlx-vlm: mlx_vlm/models/deepseek_v4/hyper_connection.py ---------------------------

HC_SOURCE = """
        uint tid  = thread_position_in_threadgroup.x;
        uint row  = threadgroup_position_in_grid.x;
        uint lane = tid % 32;
        uint sg   = tid / 32;

        constexpr int MIX      = (2 + HC) * HC;
        constexpr int BASE_OFF = 2 * HC;
        constexpr float EPS = EPS_INT * 1e-9;

        const device float* mix      = (const device float*)mixes + row * MIX;
        device float*       post_out = (device float*)post + row * HC;
        device float*       comb_out = (device float*)comb + row * HC * HC;

        threadgroup float pre_shared[HC];

        // ================================================================
        // PHASE 1: Branchless sinkhorn on simd group 0
        //   All 32 lanes execute identical instructions. Lanes >= HC
        //   compute on clamped indices but multiply by active=0, so they
        //   contribute zero to simd_sum. No divergent branches in the loop.
        // ================================================================
        if (sg == 0) {
            const float pre_scale  = scale[0];
            const float post_scale = scale[1];
            const float comb_scale = scale[2];

            const float active = (lane < (uint)HC) ? 1.0f : 0.0f;
            const uint  llane  = metal::min(lane, (uint)(HC - 1));

            // Pre/post sigmoids: all lanes compute, only active lanes write
            float pre_z  = mix[llane]      * pre_scale  + base[llane];
            float post_z = mix[HC + llane] * post_scale + base[HC + llane];
            float pre_v  = 1.0f / (1.0f + metal::fast::exp(-pre_z)) + EPS;
            float post_v = 2.0f / (1.0f + metal::fast::exp(-post_z));

            if (lane < (uint)HC) {
                pre_shared[lane] = pre_v;
                post_out[lane]   = post_v;
            }

            // Comb softmax: load + mask. Inactive lanes load row 0 (safe)
            // but multiply by active=0 so they hold zeros.
            float4 v = (*(const device float4*)(mix  + BASE_OFF + llane * HC)
                            * comb_scale
                      + *(const device float4*)(base + BASE_OFF + llane * HC))
                     * active;

            float row_max = metal::max(metal::max(v.x, v.y),
                                       metal::max(v.z, v.w));
            float4 e = metal::fast::exp(v - row_max) * active;
            float4 r = e * (1.0f / (e.x + e.y + e.z + e.w + EPS))
                     + EPS * active;

            // Initial column normalization
            float4 col_inv = 1.0f / (float4(
                simd_sum(r.x), simd_sum(r.y),
                simd_sum(r.z), simd_sum(r.w)
            ) + EPS);
            r *= col_inv;

            // Sinkhorn iterations: zero branches in the loop body
            for (int iter = 1; iter < ITERS; ++iter) {
                // Row norm + re-clamp inactive lanes
                r *= (1.0f / (r.x + r.y + r.z + r.w + EPS)) * active;

                // Col norm via simd_sum
                col_inv = 1.0f / (float4(
                    simd_sum(r.x), simd_sum(r.y),
                    simd_sum(r.z), simd_sum(r.w)
                ) + EPS);
                r *= col_inv;
            }

            if (lane < (uint)HC) {
                *(device float4*)(comb_out + lane * HC) = r;
            }
        }

        threadgroup_barrier(mem_flags::mem_threadgroup);

        // ================================================================
        // PHASE 2: Collapse - all 256 threads, vectorized
        // ================================================================
        const float p0 = pre_shared[0];
        const float p1 = pre_shared[1];
        const float p2 = pre_shared[2];
        const float p3 = pre_shared[3];

        const device T* x_row  = (const device T*)x_in
                                         + row * (HC * D);
        device U*       out_row = (device U*)collapsed
                                         + row * D;

        using T4 = vec<T, 4>;
        using U4 = vec<U, 4>;
        const device T4* x_row0 = (const device T4*)(x_row + 0*D);
        const device T4* x_row1 = (const device T4*)(x_row + 1*D);
        const device T4* x_row2 = (const device T4*)(x_row + 2*D);
        const device T4* x_row3 = (const device T4*)(x_row + 3*D);
        device U4*       out4   = (device U4*)out_row;

        constexpr uint D4 = (uint)D / 4;

        for (uint d4 = tid; d4 < D4; d4 += 256) {
            float4 x0 = float4(x_row0[d4]);
            float4 x1 = float4(x_row1[d4]);
            float4 x2 = float4(x_row2[d4]);
            float4 x3 = float4(x_row3[d4]);

            float4 result = fma(float4(p0), x0,
                            fma(float4(p1), x1,
                            fma(float4(p2), x2, float4(p3) * x3)));

            out4[d4] = U4(result);
        }

        // Scalar tail for D not divisible by 4
        #if (D % 4) != 0
        for (uint d = D4 * 4 + tid; d < (uint)D; d += 256) {
            float val = p0*(float)x_row[0*D+d] + p1*(float)x_row[1*D+d]
                      + p2*(float)x_row[2*D+d] + p3*(float)x_row[3*D+d];
            out_row[d] = (U)val;
        }
        #endif
    """


def test_mlx_vlm_hyper_connection_sinkhorn_collapse(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/deepseek_v4/hyper_connection.py: DeepSeek-V4 hyper-
    connection sinkhorn (simd_sum over float4 columns) and pre-weighted collapse (bfloat16)."""
    B, L, hc_mult, D, sinkhorn_iters, eps = 2, 3, 4, 520, 3, 1e-6
    x = torch.randn(B, L, hc_mult, D, device=device).to(torch.bfloat16)
    mix = (2 + hc_mult) * hc_mult
    mixes = torch.randn(B, L, mix, device=device)
    scale = torch.rand(3, device=device) + 0.5
    base = torch.randn(mix, device=device) * 0.1
    kernel = kk.metal_kernel(name="hc_sinkhorn_collapse", input_names=["x_in", "mixes", "scale", "base"],
                             output_names=["collapsed", "post", "comb"], source=HC_SOURCE,
                             ensure_row_contiguous=True)
    collapsed, post, comb = launch(
        kernel, device, inputs=[x, mixes, scale, base],
        template=[("T", x.dtype), ("U", x.dtype), ("HC", hc_mult), ("ITERS", sinkhorn_iters),
                  ("D", D), ("EPS_INT", round(eps / 1e-9))],
        grid=(B * L * 256, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(B, L, D), (B, L, hc_mult), (B, L, hc_mult, hc_mult)],
        output_dtypes=[x.dtype, torch.float32, torch.float32])
    # _hc_split_sinkhorn_ops and _hc_ops of the same file, in float64
    m, s, b = mixes.double().cpu(), scale.double().cpu(), base.double().cpu()
    pre = torch.sigmoid(m[..., :hc_mult] * s[0] + b[:hc_mult]) + eps
    post_ref = 2 * torch.sigmoid(m[..., hc_mult:2 * hc_mult] * s[1] + b[hc_mult:2 * hc_mult])
    c = m[..., 2 * hc_mult:].reshape(B, L, hc_mult, hc_mult) * s[2] \
        + b[2 * hc_mult:].reshape(hc_mult, hc_mult)
    c = torch.softmax(c, -1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    close(post, post_ref, rtol=1e-5, atol=1e-5)
    close(comb, c, rtol=1e-4, atol=1e-5)
    close(collapsed, (pre.float()[..., None].double() * x.double().cpu()).sum(2),
          rtol=1e-2, atol=2e-2)


# --- Blaizzy/mlx-audio: mlx_audio/sts/models/mossformer2_se/depthwise_conv1d_kernel.py ---------

def test_mlx_audio_depthwise_conv1d(device):
    """Blaizzy/mlx-audio, mlx_audio/sts/models/mossformer2_se/depthwise_conv1d_kernel.py:
    stride-1, same-padding depthwise 1-D convolution, channels last (a local named `time`)."""
    kernel = kk.metal_kernel(
        name="custom_depthwise_conv1d",
        input_names=["inp", "weight", "params"],
        output_names=["out"],
        source="""
        const int chan = int(thread_position_in_grid.x);
        const int time = int(thread_position_in_grid.y);
        const int batch = int(thread_position_in_grid.z);

        const int B = params[0];
        const int L_in = params[1];
        const int C = params[2];
        const int K = params[3];
        const int pad = params[4];
        const int L_out = params[5];

        if (batch >= B || time >= L_out || chan >= C) {
            return;
        }

        const int out_index = ((batch * L_out) + time) * C + chan;
        const int weight_base = chan * K;

        T acc = T(0);
        for (int k = 0; k < K; ++k) {
            const int in_time = time + k - pad;
            if (in_time >= 0 && in_time < L_in) {
                const int in_index = ((batch * L_in) + in_time) * C + chan;
                acc += inp[in_index] * weight[weight_base + k];
            }
        }

        out[out_index] = acc;
    """,
    )
    x = torch.randn(2, 17, 6, device=device)
    weight = torch.randn(6, 5, 1, device=device)  # MLX's (C_out, K, C_in / groups)
    kernel_size, padding = weight.shape[1], 2
    output_length = x.shape[1] + 2 * padding - kernel_size + 1
    params = torch.tensor([x.shape[0], x.shape[1], x.shape[2], kernel_size, padding, output_length],
                          dtype=torch.int32, device=device)
    out = launch(kernel, device, inputs=[x, weight, params], template=[("T", x.dtype)],
                 grid=(x.shape[2], output_length, x.shape[0]), threadgroup=(1, 1, 1),
                 output_shapes=[[x.shape[0], output_length, x.shape[2]]],
                 output_dtypes=[x.dtype])[0]
    expected = torch.nn.functional.conv1d(x.double().transpose(1, 2),
                                          weight.double()[:, :, 0][:, None, :],
                                          padding=padding, groups=x.shape[2]).transpose(1, 2)
    close(out, expected)


# --- appautomaton/mlx-speech: src/mlx_speech/models/dots_tts/vocoder.py ------------------------

SNAKEBETA_SOURCE = """
        constexpr int filter_size = 12;
        constexpr int ratio = 2;
        constexpr int outputs_per_thread = 16;
        constexpr int activation_count = 2 * outputs_per_thread + filter_size - 2;

        const int segment = int(thread_position_in_grid.x);
        const int channel = int(thread_position_in_grid.y);
        const int batch = int(thread_position_in_grid.z);
        const int length = int(inp_shape[1]);
        const int channels = int(inp_shape[2]);
        const int output_start = segment * outputs_per_thread;
        if (output_start >= length) {
            return;
        }

        const float alpha_value = metal::precise::exp(float(alpha[channel]));
        const float beta_value = metal::precise::exp(float(beta[channel]));
        float activated[activation_count];

        for (int local = 0; local < activation_count; ++local) {
            int upsample_index = ratio * output_start - (filter_size - 1) + local;
            upsample_index = max(upsample_index, 0);
            float upsampled = 0.0f;
            for (int tap = 0; tap < filter_size; ++tap) {
                const int source_offset = upsample_index - tap;
                if (source_offset >= 0 && (source_offset % ratio) == 0) {
                    const int source_time = source_offset / ratio;
                    if (source_time < length) {
                        const int input_index =
                            (batch * length + source_time) * channels + channel;
                        const int filter_index = channel * filter_size + tap;
                        upsampled +=
                            float(inp[input_index]) * float(up_filter[filter_index]);
                    }
                }
            }
            upsampled *= float(ratio);
            const float periodic = metal::precise::sin(upsampled * alpha_value);
            activated[local] =
                upsampled + periodic * periodic / (beta_value + 1.0e-9f);
        }

        const int valid_outputs = min(outputs_per_thread, length - output_start);
        for (int local = 0; local < valid_outputs; ++local) {
            float value = 0.0f;
            for (int tap = 0; tap < filter_size; ++tap) {
                const int filter_index = channel * filter_size + tap;
                value +=
                    activated[ratio * local + tap]
                    * float(down_filter[filter_index]);
            }
            const int output_index =
                (batch * length + output_start + local) * channels + channel;
            out[output_index] = T(value);
        }
    """


def test_mlx_speech_alias_free_snakebeta(device):
    """appautomaton/mlx-speech, src/mlx_speech/models/dots_tts/vocoder.py: causal BigVGAN
    alias-free SnakeBeta (2x upsample by a polyphase filter, x + sin^2(ax)/b, filter, decimate)."""
    B, length, C, taps, ratio = 2, 37, 3, 12, 2
    value = torch.randn(B, length, C, device=device)
    up_filter, down_filter = torch.randn(C, taps, device=device) * 0.3, torch.randn(C, taps, device=device) * 0.3
    alpha, beta = torch.randn(C, device=device) * 0.3, torch.randn(C, device=device) * 0.3
    kernel = kk.metal_kernel(name="dots_tts_alias_free_snakebeta",
                             input_names=["inp", "up_filter", "down_filter", "alpha", "beta"],
                             output_names=["out"], source=SNAKEBETA_SOURCE)
    segment_count = (length + 15) // 16
    out = launch(kernel, device, inputs=[value, up_filter, down_filter, alpha, beta],
                 grid=(segment_count, int(value.shape[-1]), int(value.shape[0])),
                 threadgroup=(128, 1, 1), template=[("T", value.dtype)],
                 output_shapes=[value.shape], output_dtypes=[value.dtype])[0]
    # the same causal chain in float64: upsampled[u] = ratio * sum_tap x[(u - tap) / ratio] * up[tap]
    # (zero-stuffed, causal, index clamped at 0); y[t] = sum_tap act[2t - 11 + tap] * down[tap]
    x, up, dn = value.double().cpu(), up_filter.double().cpu(), down_filter.double().cpu()
    a, b = alpha.double().cpu().exp(), beta.double().cpu().exp()
    n_up = ratio * length
    stuffed = torch.zeros(B, n_up, C, dtype=torch.float64)
    stuffed[:, ::ratio] = x
    upsampled = torch.zeros(B, n_up, C, dtype=torch.float64)
    for tap in range(taps):
        upsampled[:, tap:] += stuffed[:, :n_up - tap] * up[:, tap]
    upsampled *= ratio
    act = upsampled + torch.sin(upsampled * a) ** 2 / (b + 1e-9)
    expected = torch.zeros(B, length, C, dtype=torch.float64)
    for t in range(length):
        for tap in range(taps):
            expected[:, t] += act[:, max(ratio * t - (taps - 1) + tap, 0)] * dn[:, tap]
    close(out, expected, rtol=1e-4, atol=1e-4)


# --- zakkeown/mlx-primitives: kernels/swiglu.py, primitives/gather_scatter.py, kernels/quantized_linear.py

def test_mlx_primitives_geglu(device):
    """zakkeown/mlx-primitives, mlx_primitives/kernels/swiglu.py: fused GeGLU (tanh GELU * up),
    the grid rounded up past the data."""
    source = """
        uint idx = thread_position_in_grid.x;
        uint size = gate_shape[0];  // Flattened array size
        if (idx >= size) return;

        float g = gate[idx];
        float u = up[idx];

        // GELU approximation (tanh version)
        const float sqrt_2_over_pi = 0.7978845608f;
        const float coeff = 0.044715f;
        float gelu = 0.5f * g * (1.0f + metal::tanh(sqrt_2_over_pi * (g + coeff * g * g * g)));

        out[idx] = gelu * u;
    """
    kernel = kk.metal_kernel(name="geglu_forward", input_names=["gate", "up"],
                             output_names=["out"], source=source)
    gate, up = torch.randn(6, 250, device=device) * 3, torch.randn(6, 250, device=device)
    size = gate.numel()
    threadgroup_size = 256
    num_groups = (size + threadgroup_size - 1) // threadgroup_size
    out = launch(kernel, device, inputs=[gate.reshape(-1), up.reshape(-1)],
                 grid=(num_groups * threadgroup_size, 1, 1), threadgroup=(threadgroup_size, 1, 1),
                 output_shapes=[(size,)], output_dtypes=[gate.dtype])[0]
    g = gate.double()
    expected = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * up.double()
    close(out.reshape(gate.shape), expected, rtol=1e-5, atol=1e-5)


def test_mlx_primitives_selective_gather(device):
    """zakkeown/mlx-primitives, mlx_primitives/primitives/gather_scatter.py: MoE token gather,
    a 2-D grid whose threadgroup does not divide it."""
    source = """
            uint idx = thread_position_in_grid.x;
            uint d = thread_position_in_grid.y;

            // Dereference scalar parameters (passed as single-element arrays)
            uint _capacity = capacity[0];
            uint _dim = dim[0];

            if (idx >= _capacity || d >= _dim) return;

            uint src_idx = indices[idx];
            output[idx * _dim + d] = input[src_idx * _dim + d];
            """
    kernel = kk.metal_kernel(name="selective_gather", input_names=["input", "indices", "capacity", "dim"],
                             output_names=["output"], source=source)
    x = torch.randn(40, 37, device=device)
    indices = torch.randint(0, 40, (45,), device=device).to(torch.uint32)
    capacity, dim = 45, 37
    out = launch(kernel, device,
                 inputs=[x, indices, torch.tensor([capacity], dtype=torch.uint32, device=device),
                         torch.tensor([dim], dtype=torch.uint32, device=device)],
                 grid=(capacity, dim, 1), threadgroup=(min(capacity, 32), min(dim, 32), 1),
                 output_shapes=[(capacity, dim)], output_dtypes=[torch.float32])[0]
    close(out, x.double()[indices.long()], rtol=0, atol=0)


def test_mlx_primitives_selective_scatter_add(device):
    """zakkeown/mlx-primitives, mlx_primitives/primitives/gather_scatter.py: MoE weighted
    scatter-add through a `(device atomic_float*)` cast of a plain float output."""
    source = """
            uint idx = thread_position_in_grid.x;
            uint d = thread_position_in_grid.y;

            // Dereference scalar parameters (passed as single-element arrays)
            uint _capacity = capacity[0];
            uint _dim = dim[0];
            uint _n_tokens = n_tokens[0];

            if (idx >= _capacity || d >= _dim) return;

            uint dst_idx = indices[idx];
            float weight = weights[idx];
            float value = values[idx * _dim + d] * weight;

            // Copy accumulator to output (first thread for each output position)
            // Then atomically add the scatter value
            // Note: This relies on accumulator being pre-copied to output
            atomic_fetch_add_explicit(
                (device atomic_float*)&output[dst_idx * _dim + d],
                value,
                memory_order_relaxed
            );
            """
    kernel = kk.metal_kernel(name="selective_scatter_add",
                             input_names=["values", "indices", "weights", "capacity", "dim", "n_tokens"],
                             output_names=["output"], source=source)
    n_tokens, dim, capacity = 9, 37, 45
    accumulator = torch.randn(n_tokens, dim, device=device)
    values = torch.randn(capacity, dim, device=device)
    indices = torch.randint(0, n_tokens, (capacity,), device=device)
    weights = torch.rand(capacity, device=device)
    scalar = lambda v: torch.tensor([v], dtype=torch.uint32, device=device)  # noqa: E731
    out = launch(kernel, device,
                 inputs=[values, indices.to(torch.uint32), weights, scalar(capacity), scalar(dim),
                         scalar(n_tokens)],
                 grid=(capacity, dim, 1), threadgroup=(min(capacity, 32), min(dim, 32), 1),
                 output_shapes=[(n_tokens, dim)], output_dtypes=[torch.float32],
                 init_value=0.0)[0] + accumulator
    expected = accumulator.double().index_add(0, indices, values.double() * weights.double()[:, None])
    close(out, expected, rtol=1e-5, atol=1e-5)


INT4_SOURCE = """
        uint out_idx = thread_position_in_grid.x;
        uint seq_idx = thread_position_in_grid.y;
        uint batch_idx = thread_position_in_grid.z;

        // Dereference scalar parameters (passed as single-element arrays)
        uint _batch_size = batch_size[0];
        uint _seq_len = seq_len[0];
        uint _in_features = in_features[0];
        uint _out_features = out_features[0];
        uint _group_size = group_size[0];
        uint _has_bias = has_bias[0];

        if (batch_idx >= _batch_size || seq_idx >= _seq_len || out_idx >= _out_features) return;

        uint num_groups = (_in_features + _group_size - 1) / _group_size;
        uint packed_in_dim = _in_features / 2;

        uint x_offset = batch_idx * _seq_len * _in_features + seq_idx * _in_features;
        uint w_offset = out_idx * packed_in_dim;
        uint sz_offset = out_idx * num_groups;

        float acc = 0.0f;

        for (uint g = 0; g < num_groups; g++) {
            float s = scales[sz_offset + g];
            float zp = zero_points[sz_offset + g];

            uint group_start = g * _group_size;
            uint group_end = min(group_start + _group_size, _in_features);

            for (uint d = group_start; d < group_end; d += 2) {
                uint pack_idx = d / 2;
                uint packed = W_packed[w_offset + pack_idx];

                // Unpack lower nibble (bits 0-3)
                int q0 = int(packed & 0xFu);

                float x_val0 = X[x_offset + d];
                float w_val0 = s * (float(q0) - zp);
                acc += x_val0 * w_val0;

                if (d + 1 < group_end) {
                    // Unpack upper nibble (bits 4-7)
                    int q1 = int((packed >> 4) & 0xFu);

                    float x_val1 = X[x_offset + d + 1];
                    float w_val1 = s * (float(q1) - zp);
                    acc += x_val1 * w_val1;
                }
            }
        }

        if (_has_bias > 0) {
            acc += bias[out_idx];
        }

        uint y_offset = batch_idx * _seq_len * _out_features + seq_idx * _out_features + out_idx;
        Y[y_offset] = acc;
        """

INT4_VECTORIZED_SOURCE = """
        uint out_idx = thread_position_in_grid.x;
        uint seq_idx = thread_position_in_grid.y;
        uint batch_idx = thread_position_in_grid.z;

        // Dereference scalar parameters (passed as single-element arrays)
        uint _batch_size = batch_size[0];
        uint _seq_len = seq_len[0];
        uint _in_features = in_features[0];
        uint _out_features = out_features[0];
        uint _group_size = group_size[0];
        uint _has_bias = has_bias[0];

        if (batch_idx >= _batch_size || seq_idx >= _seq_len || out_idx >= _out_features) return;

        uint num_groups = (_in_features + _group_size - 1) / _group_size;
        uint in_dim4 = _in_features / 4;
        uint packed_in_dim8 = _in_features / 8;

        uint x4_offset = batch_idx * _seq_len * in_dim4 + seq_idx * in_dim4;
        uint w_offset = out_idx * packed_in_dim8;
        uint sz_offset = out_idx * num_groups;

        float acc = 0.0f;

        // Process 8 elements at a time (1 uint32 = 8 nibbles = 8 INT4 values)
        for (uint d8 = 0; d8 < packed_in_dim8; d8++) {
            // Determine group for this chunk of 8 elements
            uint base_idx = d8 * 8;
            uint g = base_idx / _group_size;
            float s = scales[sz_offset + g];
            float zp = zero_points[sz_offset + g];

            // Load packed uint containing 8 INT4 values
            uint packed = W_packed[w_offset + d8];

            // Load two float4 vectors for 8 input elements
            float4 x0 = X4[x4_offset + d8 * 2];
            float4 x1 = X4[x4_offset + d8 * 2 + 1];

            // Unpack and dequantize 8 INT4 values using vectorized bit extraction
            float w0 = s * (float((packed >> 0) & 0xFu) - zp);
            float w1 = s * (float((packed >> 4) & 0xFu) - zp);
            float w2 = s * (float((packed >> 8) & 0xFu) - zp);
            float w3 = s * (float((packed >> 12) & 0xFu) - zp);
            float w4 = s * (float((packed >> 16) & 0xFu) - zp);
            float w5 = s * (float((packed >> 20) & 0xFu) - zp);
            float w6 = s * (float((packed >> 24) & 0xFu) - zp);
            float w7 = s * (float((packed >> 28) & 0xFu) - zp);

            // Accumulate using vectorized operations
            acc += x0.x * w0 + x0.y * w1 + x0.z * w2 + x0.w * w3;
            acc += x1.x * w4 + x1.y * w5 + x1.z * w6 + x1.w * w7;
        }

        if (_has_bias > 0) {
            acc += bias[out_idx];
        }

        uint y_offset = batch_idx * _seq_len * _out_features + seq_idx * _out_features + out_idx;
        Y[y_offset] = acc;
        """


def _int4_operands(device, batch_size, seq_len, in_features, out_features, group_size):
    num_groups = (in_features + group_size - 1) // group_size
    q = torch.randint(0, 16, (out_features, in_features))
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    scales = torch.rand(out_features, num_groups) * 0.1 + 0.01
    zero_points = torch.randint(0, 16, (out_features, num_groups)).float()
    bias = torch.randn(out_features)
    x = torch.randn(batch_size, seq_len, in_features)
    w = scales.double().repeat_interleave(group_size, 1)[:, :in_features] * \
        (q.double() - zero_points.double().repeat_interleave(group_size, 1)[:, :in_features])
    scalar = lambda v: torch.tensor([v], dtype=torch.uint32, device=device)  # noqa: E731
    params = [scalar(batch_size), scalar(seq_len), scalar(in_features), scalar(out_features),
              scalar(group_size), scalar(1)]
    return x.to(device), packed.to(device), scales.to(device), zero_points.to(device), \
        bias.to(device), params, w


def test_mlx_primitives_int4_linear(device):
    """zakkeown/mlx-primitives, mlx_primitives/kernels/quantized_linear.py: grouped INT4 linear,
    two nibbles a byte (the scalar kernel, taken when in_features % 8 != 0)."""
    batch_size, seq_len, in_features, out_features, group_size = 2, 3, 30, 70, 16
    x, packed, scales, zero_points, bias, params, w = _int4_operands(
        device, batch_size, seq_len, in_features, out_features, group_size)
    kernel = kk.metal_kernel(name="int4_matmul_grouped",
                             input_names=["X", "W_packed", "scales", "zero_points", "bias",
                                          "batch_size", "seq_len", "in_features", "out_features",
                                          "group_size", "has_bias"],
                             output_names=["Y"], source=INT4_SOURCE)
    out = launch(kernel, device, inputs=[x, packed, scales, zero_points, bias, *params],
                 grid=(out_features, seq_len, batch_size),
                 threadgroup=(min(out_features, 64), 1, 1),
                 output_shapes=[(batch_size, seq_len, out_features)],
                 output_dtypes=[torch.float32])[0]
    close(out, x.double().cpu() @ w.T + bias.double().cpu(), rtol=1e-4, atol=1e-4)


def test_mlx_primitives_int4_linear_vectorized(device):
    """zakkeown/mlx-primitives, mlx_primitives/kernels/quantized_linear.py: the INT4 kernel taken
    when in_features % 8 == 0. Its X4 is the float32 input (`const device float*`), so
    `float4 x0 = X4[i]` splats one float over four lanes and x4_offset counts float4s: the kernel
    does not compute x @ W.T (a bug in the original). Checked is what it defines, which exercises
    the scalar-to-vector conversion and uint32-packed nibbles."""
    batch_size, seq_len, in_features, out_features, group_size = 2, 3, 64, 20, 32
    x, packed, scales, zero_points, bias, params, w = _int4_operands(
        device, batch_size, seq_len, in_features, out_features, group_size)
    kernel = kk.metal_kernel(name="int4_matmul_vectorized",
                             input_names=["X4", "W_packed", "scales", "zero_points", "bias",
                                          "batch_size", "seq_len", "in_features", "out_features",
                                          "group_size", "has_bias"],
                             output_names=["Y"], source=INT4_VECTORIZED_SOURCE)
    out = launch(kernel, device,
                 inputs=[x, packed.contiguous().view(torch.uint32), scales, zero_points, bias,
                         *params],
                 grid=(out_features, seq_len, batch_size),
                 threadgroup=(min(out_features, 64), 1, 1),
                 output_shapes=[(batch_size, seq_len, out_features)],
                 output_dtypes=[torch.float32])[0]
    flat = x.double().cpu().reshape(-1)
    expected = torch.zeros(batch_size, seq_len, out_features, dtype=torch.float64)
    for b in range(batch_size):
        for s in range(seq_len):
            base = (b * seq_len + s) * (in_features // 4)
            # element 8*d8 + j reads X4[base + 2*d8 + j // 4] (one float, splat)
            xs = torch.stack([flat[base + 2 * d8 + j // 4] for d8 in range(in_features // 8)
                              for j in range(8)])
            expected[b, s] = w @ xs + bias.double().cpu()
    close(out, expected, rtol=1e-4, atol=1e-4)


# --- appautomaton/mlx-atomistic: src/mlx_atomistic/metal_kernels.py ---------------------------

LJ_FORCE_SOURCE = r"""
    uint t = thread_position_in_grid.x;
    if (t >= (uint)npair[0]) {
        return;
    }
    int i = pairs_i[t];
    int j = pairs_j[t];

    float dx = positions[3 * i + 0] - positions[3 * j + 0];
    float dy = positions[3 * i + 1] - positions[3 * j + 1];
    float dz = positions[3 * i + 2] - positions[3 * j + 2];

    // orthorhombic minimum image: matches Cell.minimum_image (disp - L * round(disp / L)).
    // rint() is round-half-to-even, matching mx.round.
    float lx = box[0];
    float ly = box[1];
    float lz = box[2];
    dx -= lx * rint(dx / lx);
    dy -= ly * rint(dy / ly);
    dz -= lz * rint(dz / lz);

    float r2 = dx * dx + dy * dy + dz * dz;

    float eps = params[0];
    float sig2 = params[1];
    float cut2 = params[2];
    float eshift = params[3];

    float e = 0.0f;
    if (r2 > 0.0f && r2 < cut2) {
        float sig2_over_r2 = sig2 / r2;
        float inv_r6 = sig2_over_r2 * sig2_over_r2 * sig2_over_r2;
        float inv_r12 = inv_r6 * inv_r6;
        float scalar = 24.0f * eps * (2.0f * inv_r12 - inv_r6) / r2;
        float fx = scalar * dx;
        float fy = scalar * dy;
        float fz = scalar * dz;
        atomic_fetch_add_explicit(&forces[3 * i + 0], fx, memory_order_relaxed);
        atomic_fetch_add_explicit(&forces[3 * i + 1], fy, memory_order_relaxed);
        atomic_fetch_add_explicit(&forces[3 * i + 2], fz, memory_order_relaxed);
        atomic_fetch_add_explicit(&forces[3 * j + 0], -fx, memory_order_relaxed);
        atomic_fetch_add_explicit(&forces[3 * j + 1], -fy, memory_order_relaxed);
        atomic_fetch_add_explicit(&forces[3 * j + 2], -fz, memory_order_relaxed);
        e = 4.0f * eps * (inv_r12 - inv_r6) - eshift;
    }
    atomic_store_explicit(&pair_energy[t], e, memory_order_relaxed);
"""


def test_mlx_atomistic_fused_lj_forces(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: fused Lennard-Jones pair
    energies and forces (atomic float outputs, minimum image with rint)."""
    n_atoms, L, epsilon, sigma, cutoff = 14, 4.0, 0.8, 1.0, 1.9
    positions = (torch.rand(n_atoms, 3) * L).to(device)
    pairs = torch.combinations(torch.arange(n_atoms), 2).to(torch.int32).to(device)
    box = torch.full((3,), L, device=device)
    sigma2, cut2 = sigma * sigma, cutoff * cutoff
    inv_rc6 = (sigma2 / cut2) ** 3
    e_shift = 4.0 * epsilon * (inv_rc6 * inv_rc6 - inv_rc6)
    params = torch.tensor([epsilon, sigma2, cut2, e_shift], dtype=torch.float32, device=device)
    n_pairs = pairs.shape[0]
    npair = torch.tensor([n_pairs], dtype=torch.int32, device=device)
    kernel = kk.metal_kernel(name="fused_lj_force",
                             input_names=["positions", "pairs_i", "pairs_j", "box", "params", "npair"],
                             output_names=["forces", "pair_energy"], source=LJ_FORCE_SOURCE,
                             atomic_outputs=True)
    threads = 256 if n_pairs >= 256 else n_pairs
    forces, pair_energy = launch(kernel, device,
                                 inputs=[positions, pairs[:, 0].contiguous(), pairs[:, 1].contiguous(),
                                         box, params, npair],
                                 output_shapes=[(n_atoms, 3), (n_pairs,)],
                                 output_dtypes=[torch.float32, torch.float32],
                                 grid=(n_pairs, 1, 1), threadgroup=(threads, 1, 1), init_value=0.0)
    p = positions.double().cpu()
    i, j = pairs[:, 0].long().cpu(), pairs[:, 1].long().cpu()
    d = p[i] - p[j]
    d = d - L * torch.round(d / L)
    r2 = (d * d).sum(1)
    inside = (r2 > 0) & (r2 < cut2)
    inv_r6 = (sigma2 / r2) ** 3
    energy = torch.where(inside, 4 * epsilon * (inv_r6 ** 2 - inv_r6) - e_shift, 0.0)
    f = torch.where(inside, 24 * epsilon * (2 * inv_r6 ** 2 - inv_r6) / r2, 0.0)[:, None] * d
    expected = torch.zeros(n_atoms, 3, dtype=torch.float64).index_add(0, i, f).index_add(0, j, -f)
    close(pair_energy, energy, rtol=1e-4, atol=1e-4)
    close(forces, expected, rtol=1e-3, atol=1e-3)


LANGEVIN_SOURCE = r"""
    uint atom = thread_position_in_grid.x;
    if (atom >= (uint)counts[0]) {
        return;
    }

    uint offset = 3u * atom;
    float half_dt = params[0];
    float velocity_decay = params[1];
    bool wrap = params[2] != 0.0f;
    float acceleration_scale = force_scale_over_mass[atom];
    float thermal = thermal_scale[atom];

    for (uint axis = 0u; axis < 3u; axis++) {
        float velocity_half = velocities[offset + axis]
            + half_dt * acceleration_scale * forces[offset + axis];
        float position = positions[offset + axis] + half_dt * velocity_half;
        if (wrap) {
            float length = box[axis];
            position -= length * floor(position / length);
        }
        float middle_velocity = velocity_decay * velocity_half
            + thermal * noise[offset + axis];
        position += half_dt * middle_velocity;
        if (wrap) {
            float length = box[axis];
            position -= length * floor(position / length);
        }
        next_positions[offset + axis] = position;
        middle_velocities[offset + axis] = middle_velocity;
    }
"""


def test_mlx_atomistic_langevin_baoab_drift(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: BAOAB kick, drifts and
    Langevin thermostat in one pass, positions wrapped into the box."""
    atom_count = 11
    positions, velocities, forces, noise = (torch.randn(atom_count, 3, device=device) * 3
                                            for _ in range(4))
    force_scale_over_mass = torch.rand(atom_count, device=device)
    thermal_scale = torch.rand(atom_count, device=device)
    box = torch.tensor([4.0, 5.0, 6.0], device=device)
    parameters = torch.tensor([0.05, 0.9, 1.0], device=device)
    counts = torch.tensor([atom_count], dtype=torch.int32, device=device)
    kernel = kk.metal_kernel(name="langevin_baoab_drift",
                             input_names=["positions", "velocities", "forces", "force_scale_over_mass",
                                          "thermal_scale", "noise", "box", "params", "counts"],
                             output_names=["next_positions", "middle_velocities"],
                             source=LANGEVIN_SOURCE)
    threads = min(256, atom_count)
    next_positions, middle_velocities = launch(
        kernel, device,
        inputs=[positions, velocities, forces, force_scale_over_mass, thermal_scale, noise, box,
                parameters, counts],
        output_shapes=[positions.shape, velocities.shape],
        output_dtypes=[positions.dtype, velocities.dtype],
        grid=(atom_count, 1, 1), threadgroup=(threads, 1, 1), init_value=0.0)
    half_dt, decay = 0.05, 0.9
    v_half = velocities.double() + half_dt * force_scale_over_mass.double()[:, None] * forces.double()
    pos = positions.double() + half_dt * v_half
    pos = pos - box.double() * torch.floor(pos / box.double())
    mid = decay * v_half + thermal_scale.double()[:, None] * noise.double()
    pos = pos + half_dt * mid
    pos = pos - box.double() * torch.floor(pos / box.double())
    close(middle_velocities, mid, rtol=1e-5, atol=1e-5)
    close(next_positions, pos, rtol=1e-5, atol=1e-4)


# --- lisihao/FlashMLX: src/flashmlx/mac/match.py, merge_fused.py -------------------------------

MATCH_TILE_HEADER = """
inline bool better_pair(float val, int idx, float bval, int bidx) {
    return (val < bval) || ((val == bval) && (idx < bidx));
}
"""

MATCH_TILE_SOURCE = """
    // Grid layout: grid.x = N * num_tiles (one threadgroup per (n, tile) pair)
    //              grid.y = H (one row of threadgroups per head)
    // Threadgroup: (BLOCK_THREADS, 1, 1) — typically 256 = 8 SIMD groups
    //
    // Template constants: HEAD_DIM, M_CAP, NUM_HEADS, NUM_QUERIES,
    //                     NUM_TILES, RPT (rows per tile), NUM_WARPS

    uint tg_x = threadgroup_position_in_grid.x;  // n * NUM_TILES + tile
    uint h = threadgroup_position_in_grid.y;
    if (h >= NUM_HEADS) return;

    uint n = tg_x / NUM_TILES;
    uint tile = tg_x % NUM_TILES;
    if (n >= NUM_QUERIES) return;

    uint tid = thread_index_in_threadgroup;
    uint lane = thread_index_in_simdgroup;
    uint warp = simdgroup_index_in_threadgroup;

    // Output index into partial arrays [N * H * NUM_TILES]
    uint idxT = (n * NUM_HEADS + h) * NUM_TILES + tile;

    // Read ring buffer valid length
    int L = request_length[n];  // implicit: req = n
    int V = (L < (int)M_CAP) ? L : (int)M_CAP;

    int tile_start = (int)tile * (int)RPT;

    if (V <= 0 || tile_start >= V) {
        if (tid == 0) {
            partial_min[idxT] = INFINITY;
            partial_idx[idxT] = 0;
        }
        return;
    }

    int tile_end = tile_start + (int)RPT;
    if (tile_end > V) tile_end = V;
    int rows_in_tile = tile_end - tile_start;

    // Load query[n, h, :] into threadgroup memory (bf16 → float)
    threadgroup float q_shared[HEAD_DIM];
    uint q_base = (n * NUM_HEADS + h) * HEAD_DIM;
    for (uint d = tid; d < HEAD_DIM; d += BLOCK_THREADS) {
        q_shared[d] = static_cast<float>(queries[q_base + d]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // Per-SIMD-group best (val, idx)
    float best_val = INFINITY;
    int best_idx = 0;

    // Each SIMD group processes rows in stride
    for (int rr = (int)warp; rr < rows_in_tile; rr += (int)NUM_WARPS) {
        int local_slot = tile_start + rr;

        // L2 distance: sum((q[d] - cache[d])^2)
        float acc = 0.0f;
        uint c_base = ((uint(n) * M_CAP + uint(local_slot)) * NUM_HEADS + h) * HEAD_DIM;

        for (uint d = lane; d < HEAD_DIM; d += threads_per_simdgroup) {
            float qv = q_shared[d];
            float cv = static_cast<float>(q_cache[c_base + d]);
            float diff = qv - cv;
            acc = fma(diff, diff, acc);
        }

        // Warp-level sum reduction
        acc = simd_sum(acc);

        if (lane == 0 && better_pair(acc, local_slot, best_val, best_idx)) {
            best_val = acc;
            best_idx = local_slot;
        }
    }

    // Cross-SIMD-group reduction via threadgroup memory
    threadgroup float warp_vals[NUM_WARPS];
    threadgroup int warp_idxs[NUM_WARPS];
    if (lane == 0) {
        warp_vals[warp] = best_val;
        warp_idxs[warp] = best_idx;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // First SIMD group reduces all warp results
    if (warp == 0) {
        float v = INFINITY;
        int idx = 0;
        if (lane < NUM_WARPS) {
            v = warp_vals[lane];
            idx = warp_idxs[lane];
        }
        // Shuffle-down reduction within SIMD group
        for (uint off = 16; off > 0; off >>= 1) {
            float v2 = simd_shuffle_down(v, off);
            int i2 = simd_shuffle_down(idx, off);
            if (better_pair(v2, i2, v, idx)) {
                v = v2;
                idx = i2;
            }
        }
        if (lane == 0) {
            partial_min[idxT] = v;
            partial_idx[idxT] = idx;
        }
    }
"""

MATCH_REDUCE_SOURCE = """
    // Grid: (N * H * 32, 1, 1) — one SIMD group per (n, h)
    // Threadgroup: (32, 1, 1) — single SIMD group
    //
    // threshold_val is a scalar float input (not template — templates only support int/bool)

    uint nh = thread_position_in_grid.x / threads_per_simdgroup;
    uint lane = thread_index_in_simdgroup;
    if (nh >= NUM_QUERIES * NUM_HEADS) return;

    uint n = nh / NUM_HEADS;
    uint h = nh % NUM_HEADS;

    // Each lane scans part of the tiles
    float best_v = INFINITY;
    int best_i = 0;
    uint base = nh * NUM_TILES;

    for (uint t = lane; t < NUM_TILES; t += threads_per_simdgroup) {
        float v = partial_min[base + t];
        int i = partial_idx[base + t];
        if (better_pair(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }

    // SIMD reduction
    for (uint off = 16; off > 0; off >>= 1) {
        float v2 = simd_shuffle_down(best_v, off);
        int i2 = simd_shuffle_down(best_i, off);
        if (better_pair(v2, i2, best_v, best_i)) {
            best_v = v2;
            best_i = i2;
        }
    }

    // Lane 0 emits results
    if (lane == 0) {
        int p = best_i;  // local ring slot 0..M-1
        indices_out[nh] = p;

        // Threshold: sqrt(dist) < sqrt(2*D) * (1 - threshold)
        // Squared: dist < 2*D * (1-threshold)^2
        float thresh = threshold_val[0];
        float one_minus = 1.0f - thresh;
        bool allow = (one_minus > 0.0f);
        float T_sq = 2.0f * float(HEAD_DIM) * one_minus * one_minus;
        bool is_hit = allow && (best_v < T_sq) && (best_v < INFINITY);

        // Map local ring slot → global index
        int L = request_length[n];
        int g = 0;
        if (L > 0) {
            if (L < (int)M_CAP) {
                g = p;
            } else {
                int base_g = L - (int)M_CAP;
                int tail = L % (int)M_CAP;
                int order = p - tail;
                if (order < 0) order += (int)M_CAP;
                g = base_g + order;
            }
        }

        // left_start = hit ? max(g + 1 - band_r, 0) : 0
        int left_val = 0;
        if (is_hit) {
            int tmp = g + 1 - (int)BAND_R;
            left_val = (tmp > 0) ? tmp : 0;
        }

        hit_out[nh] = is_hit ? 1 : 0;
        left_out[nh] = left_val;
    }
"""


def test_flashmlx_mac_ring_match(device):
    """lisihao/FlashMLX, src/flashmlx/mac/match.py: MAC-attention L2 match over a ring cache of
    past queries, a tile pass (simd_sum, cross-SIMD argmin through threadgroup memory and
    simd_shuffle_down of float and int) and a reduce pass (threshold, ring slot -> global index)."""
    N, H, D, M, RPT, threshold, band_r = 3, 2, 64, 100, 32, 0.6, 16
    lengths = [70, 130, 0]
    q_cache = torch.randn(N, M, H, D).to(torch.bfloat16)
    queries = torch.randn(N, H, D).to(torch.bfloat16)
    queries[0, 1] = q_cache[0, 41, 1] + 0.05 * torch.randn(D)  # near hits
    queries[1, 0] = q_cache[1, 7, 0] + 0.05 * torch.randn(D)
    request_length = torch.tensor(lengths, dtype=torch.int32)
    num_tiles = (M + RPT - 1) // RPT
    BLOCK_THREADS = 256
    NUM_WARPS = BLOCK_THREADS // 32
    tile = kk.metal_kernel(name="mac_match_tile", input_names=["q_cache", "request_length", "queries"],
                           output_names=["partial_min", "partial_idx"], header=MATCH_TILE_HEADER,
                           source=MATCH_TILE_SOURCE)
    partial_min, partial_idx = launch(
        tile, device, inputs=[q_cache.to(device), request_length.to(device), queries.to(device)],
        output_shapes=[(N * H * num_tiles,), (N * H * num_tiles,)],
        output_dtypes=[torch.float32, torch.int32],
        grid=(N * num_tiles * BLOCK_THREADS, H, 1), threadgroup=(BLOCK_THREADS, 1, 1),
        template=[("HEAD_DIM", D), ("M_CAP", M), ("NUM_HEADS", H), ("NUM_QUERIES", N),
                  ("NUM_TILES", num_tiles), ("RPT", RPT), ("NUM_WARPS", NUM_WARPS),
                  ("BLOCK_THREADS", BLOCK_THREADS)])
    reduce = kk.metal_kernel(name="mac_match_reduce",
                             input_names=["partial_min", "partial_idx", "request_length", "threshold_val"],
                             output_names=["hit_out", "left_out", "indices_out"],
                             header=MATCH_TILE_HEADER, source=MATCH_REDUCE_SOURCE)
    hit, left, idx = launch(
        reduce, device,
        inputs=[partial_min, partial_idx, request_length.to(device),
                torch.tensor([threshold], dtype=torch.float32, device=device)],
        output_shapes=[(N * H,), (N * H,), (N * H,)],
        output_dtypes=[torch.int32, torch.int32, torch.int32],
        grid=(N * H * 32, 1, 1), threadgroup=(32, 1, 1),
        template=[("HEAD_DIM", D), ("M_CAP", M), ("NUM_HEADS", H), ("NUM_QUERIES", N),
                  ("NUM_TILES", num_tiles), ("BAND_R", band_r)])
    dist = ((queries.double()[:, None] - q_cache.double()) ** 2).sum(-1)  # (N, M, H)
    t_sq = 2 * D * (1 - threshold) ** 2
    for n in range(N):
        V = min(lengths[n], M)
        for h in range(H):
            nh = n * H + h
            for t in range(num_tiles):
                lo, hi = t * RPT, min(t * RPT + RPT, V)
                if lo >= V:
                    assert partial_min[nh * num_tiles + t] == math.inf
                    assert partial_idx[nh * num_tiles + t] == 0
                    continue
                best = int(dist[n, lo:hi, h].argmin()) + lo
                assert partial_idx[nh * num_tiles + t] == best
                assert math.isclose(partial_min[nh * num_tiles + t], dist[n, best, h], rel_tol=1e-4)
            p = int(dist[n, :V, h].argmin()) if V > 0 else 0
            is_hit = V > 0 and float(dist[n, p, h]) < t_sq
            L = lengths[n]
            g = p if L < M else L - M + (p - L % M) % M
            assert (idx[nh], hit[nh], left[nh]) == (p, int(is_hit),
                                                    max(g + 1 - band_r, 0) if is_hit else 0)
    assert hit.sum() == 2


def test_flashmlx_merge_attention_fused(device):
    """lisihao/FlashMLX, src/flashmlx/mac/merge_fused.py: merging two partial attention outputs
    by their log-sum-exps."""
    source = """
    // Grid: (N * H * BLOCK, 1, 1) where BLOCK = (D + 255) / 256
    // Threadgroup: (256, 1, 1)
    //
    // Each threadgroup processes one (n, h) pair, handling 256 elements of D dimension

    uint global_idx = thread_position_in_grid.x;
    uint tid = thread_index_in_threadgroup;

    uint total_elements = NUM_QUERIES * NUM_HEADS * HEAD_DIM;
    if (global_idx >= total_elements) return;

    uint nh = global_idx / HEAD_DIM;  // which (n, h) pair
    uint d = global_idx % HEAD_DIM;   // which dimension

    // Read LSE values (shared across all D for this n,h)
    float lse_c = lse_cached[nh];
    float lse_f = lse_fresh[nh];

    // Compute merged LSE (log-sum-exp)
    float lse_max = max(lse_c, lse_f);
    float lse_merged_val = lse_max + log(exp(lse_c - lse_max) + exp(lse_f - lse_max));

    // Compute weights
    float w_c = exp(lse_c - lse_merged_val);
    float w_f = exp(lse_f - lse_merged_val);

    // Read output values
    float o_c = o_cached[global_idx];
    float o_f = o_fresh[global_idx];

    // Merge
    float o_m = w_c * o_c + w_f * o_f;

    // Write output
    o_merged[global_idx] = o_m;

    // Write merged LSE (only first thread of each (n,h) block writes)
    if (d == 0) {
        lse_merged[nh] = lse_merged_val;
    }
"""
    N, H, D = 2, 3, 40
    o_cached, o_fresh = torch.randn(N, H, D, device=device), torch.randn(N, H, D, device=device)
    lse_cached, lse_fresh = torch.randn(N, H, device=device) * 3, torch.randn(N, H, device=device) * 3
    kernel = kk.metal_kernel(name="merge_attention_fused",
                             input_names=["o_cached", "lse_cached", "o_fresh", "lse_fresh"],
                             output_names=["o_merged", "lse_merged"], source=source)
    BLOCK_SIZE = 256
    total_elements = N * H * D
    o_merged, lse_merged = launch(
        kernel, device,
        inputs=[o_cached.reshape(-1), lse_cached.reshape(-1), o_fresh.reshape(-1), lse_fresh.reshape(-1)],
        output_shapes=[(N * H * D,), (N * H,)], output_dtypes=[torch.float32, torch.float32],
        grid=((total_elements + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE, 1, 1),
        threadgroup=(BLOCK_SIZE, 1, 1),
        template=[("NUM_QUERIES", N), ("NUM_HEADS", H), ("HEAD_DIM", D)])
    lse = torch.logaddexp(lse_cached.double(), lse_fresh.double())
    expected = (lse_cached.double() - lse).exp()[..., None] * o_cached.double() + \
        (lse_fresh.double() - lse).exp()[..., None] * o_fresh.double()
    close(lse_merged.reshape(N, H), lse, rtol=1e-5, atol=1e-5)
    close(o_merged.reshape(N, H, D), expected, rtol=1e-5, atol=1e-5)


# --- appautomaton/mlx-spatial: src/mlx_spatial/metal/gs_rasterize.metal -----------------------

GS_RASTERIZE_SOURCE = """// Body source for mlx.core.fast.metal_kernel.
//
// One thread renders one output pixel. Inputs are already projected, clipped,
// and sorted front-to-back by the Python side. This intentionally avoids float
// atomics so it works on the M1 baseline targeted by mlx-spatial; it is a
// correctness-first kernel for small/test-size renders before tile binning.

uint pixel_index = thread_position_in_grid.x;
uint total_pixels = uint(width * height);
if (pixel_index >= total_pixels) {
    return;
}

uint image_width = uint(width);
uint x = pixel_index % image_width;
uint y = pixel_index / image_width;
float px = float(x) + 0.5f;
float py = float(y) + 0.5f;

float transmittance = 1.0f;
float out_r = 0.0f;
float out_g = 0.0f;
float out_b = 0.0f;
float out_a = 0.0f;
float depth_weighted = 0.0f;

for (uint i = 0; i < uint(gaussian_count); ++i) {
    float radius = radii[i];
    if (radius <= 0.0f || transmittance <= 0.0039215689f) {
        continue;
    }

    float dx = px - centers_xy[i * 2];
    float dy = py - centers_xy[i * 2 + 1];
    float dist2 = dx * dx + dy * dy;
    if (dist2 > radius * radius) {
        continue;
    }

    float a = conics[i * 3];
    float b = conics[i * 3 + 1];
    float c = conics[i * 3 + 2];
    float mahalanobis = a * dx * dx + 2.0f * b * dx * dy + c * dy * dy;
    if (mahalanobis > mahalanobis_clip_sq) {
        continue;
    }

    float alpha = opacities[i] * metal::exp(-0.5f * mahalanobis);
    if (alpha <= min_alpha) {
        continue;
    }
    alpha = metal::min(alpha, 0.999f);

    float contribution = transmittance * alpha;
    out_r += contribution * colors[i * 3];
    out_g += contribution * colors[i * 3 + 1];
    out_b += contribution * colors[i * 3 + 2];
    out_a += contribution;
    depth_weighted += contribution * depths[i];
    transmittance *= 1.0f - alpha;
}

float inv_alpha = out_a > 1e-6f ? 1.0f / out_a : 0.0f;
rgba[pixel_index * 4] = out_r * inv_alpha;
rgba[pixel_index * 4 + 1] = out_g * inv_alpha;
rgba[pixel_index * 4 + 2] = out_b * inv_alpha;
rgba[pixel_index * 4 + 3] = out_a;
depth[pixel_index] = out_a > 1e-6f ? depth_weighted / out_a : 0.0f;
"""


def test_mlx_spatial_gaussian_rasterize(device):
    """appautomaton/mlx-spatial, src/mlx_spatial/metal/gs_rasterize.metal (body loaded by
    src/mlx_spatial/gs_rasterize.py): per-pixel front-to-back Gaussian-splat compositing, with
    Python int and float scalars among the inputs."""
    width, height, count, min_alpha, clip_sq = 13, 9, 7, 1.0 / 255.0, 9.0
    centers = torch.rand(count, 2) * torch.tensor([width, height])
    depths = torch.sort(torch.rand(count) * 5 + 1).values
    s = torch.rand(count, 2) * 0.5 + 0.1
    conics = torch.stack([s[:, 0], torch.rand(count) * 0.05, s[:, 1]], 1)
    radii = torch.rand(count) * 6 + 1
    radii[3] = 0.0
    colors, opacities = torch.rand(count, 3), torch.rand(count) * 0.9 + 0.05
    kernel = kk.metal_kernel(name="mlx_spatial_gs_rasterize",
                             input_names=["centers_xy", "depths", "conics", "radii", "colors",
                                          "opacities", "gaussian_count", "width", "height",
                                          "min_alpha", "mahalanobis_clip_sq"],
                             output_names=["rgba", "depth"], source=GS_RASTERIZE_SOURCE,
                             ensure_row_contiguous=True, atomic_outputs=False)
    rgba, depth = launch(kernel, device,
                         inputs=[t.to(device) for t in (centers, depths, conics, radii, colors, opacities)]
                         + [count, int(width), int(height), float(min_alpha), float(clip_sq)],
                         grid=(height * width, 1, 1), threadgroup=(256, 1, 1),
                         output_shapes=[(height, width, 4), (height, width)],
                         output_dtypes=[torch.float32, torch.float32])
    yy, xx = torch.meshgrid(torch.arange(height, dtype=torch.float64) + 0.5,
                            torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij")
    trans = torch.ones(height, width, dtype=torch.float64)
    acc = torch.zeros(height, width, 5, dtype=torch.float64)
    for i in range(count):
        dx, dy = xx - centers[i, 0].double(), yy - centers[i, 1].double()
        a, b, c = conics[i].double()
        m = a * dx * dx + 2 * b * dx * dy + c * dy * dy
        alpha = opacities[i].double() * torch.exp(-0.5 * m)
        use = (radii[i] > 0) & (trans > 0.0039215689) & (dx * dx + dy * dy <= radii[i].double() ** 2) \
            & (m <= clip_sq) & (alpha > min_alpha)
        alpha = torch.where(use, alpha.clamp(max=0.999), 0.0)
        contribution = trans * alpha
        acc += contribution[..., None] * torch.cat([colors[i].double(), torch.ones(1, dtype=torch.float64),
                                                    depths[i:i + 1].double()])
        trans = trans * (1 - alpha)
    a = acc[..., 3]
    inv = torch.where(a > 1e-6, 1 / a, 0.0)
    close(rgba, torch.cat([acc[..., :3] * inv[..., None], a[..., None]], -1), rtol=1e-4, atol=1e-5)
    close(depth, acc[..., 4] * inv, rtol=1e-4, atol=1e-5)


# --- Blaizzy/mlx-vlm: mlx_vlm/models/inkling/language.py ---------------------------------------

INKLING_ROUTE_SOURCE = r"""
    // One simdgroup (32 lanes) per token; each lane owns ceil(R/32) experts
    // (strided by 32 so logit reads coalesce). Top-K via K rounds of
    // simd_max; ties resolved to the lowest lane (deterministic).
    uint lane = thread_position_in_grid.x;   // 0..31, simd lane
    uint n = thread_position_in_grid.y;      // token
    if (n >= N) return;
    const device T* lg = logits + (size_t)n * (R + SH);
    float ws = wscale[0];
    constexpr int PER = (R + 31) / 32;
    float sc[PER];
    float tl_[PER];
    bool taken[PER];
    for (int t = 0; t < PER; ++t) {
        uint j = lane + (uint)t * 32u;
        taken[t] = false;
        if (j < R) {
            float l = (float)lg[j];
            tl_[t] = l;
            sc[t] = 1.0f / (1.0f + metal::exp(-l)) + (float)corr[j];
        } else {
            sc[t] = -INFINITY;
        }
    }
    uint bidx[K];
    float btl[K];
    for (uint kk = 0; kk < K; ++kk) {
        float lb = -INFINITY; int lt = -1;
        for (int t = 0; t < PER; ++t)
            if (!taken[t] && sc[t] > lb) { lb = sc[t]; lt = t; }
        float gb = simd_max(lb);
        ushort wl = (ushort)simd_min(lb == gb ? lane : 32u);
        uint wj = simd_shuffle(lt >= 0 ? lane + (uint)lt * 32u : 0u, wl);
        float wtl = simd_shuffle(lt >= 0 ? tl_[lt] : 0.0f, wl);
        if (lane == (uint)wl && lt >= 0 && sc[lt] == gb) taken[lt] = true;
        bidx[kk] = wj; btl[kk] = wtl;
    }
    // Routing weights: softmax over logsigmoid of the K routed + SH shared
    // logits, times route_scale * global_scale (folded into ws). Computed
    // redundantly on every lane (cheap; K + SH values).
    float lp[K + SH];
    float m = -INFINITY;
    for (uint t = 0; t < K + SH; ++t) {
        float tv = (t < K) ? btl[t] : (float)lg[R + (t - K)];
        float a = -tv;
        float lad = metal::max(a, 0.0f)
                  + metal::log(1.0f + metal::exp(-metal::fabs(a)));
        lp[t] = -lad;
        m = metal::max(m, lp[t]);
    }
    float se = 0.0f;
    for (uint t = 0; t < K + SH; ++t) se += metal::exp(lp[t] - m);
    float lse = m + metal::log(se);
    if (lane < K) {
        idx[(size_t)n * K + lane] = bidx[lane];
        wk[(size_t)n * K + lane] = (T)(metal::exp(lp[lane] - lse) * ws);
    }
    T gv[SH];
    for (uint s = 0; s < SH; ++s) gv[s] = (T)(metal::exp(lp[K + s] - lse) * ws);
    device T* gp = gamma + (size_t)n * SH * I;
    for (uint t = lane; t < SH * I; t += 32u) gp[t] = gv[t / I];
"""


def test_mlx_vlm_inkling_moe_route(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/inkling/language.py: MoE routing in one SIMD group
    (sigmoid + bias, top-k by rounds of simd_max / simd_min / simd_shuffle, logsigmoid softmax
    over routed and shared experts; a loop variable named `kk`)."""
    N, n_routed, n_shared, top_k, inter = 3, 70, 2, 6, 5
    logits = torch.randn(N, n_routed + n_shared, device=device)
    corr = torch.randn(n_routed, device=device) * 0.1
    wscale = torch.tensor([2.5], dtype=torch.float32, device=device)
    kernel = kk.metal_kernel(name="inkling_moe_route", input_names=["logits", "corr", "wscale"],
                             output_names=["idx", "wk", "gamma"], source=INKLING_ROUTE_SOURCE)
    idx, wk, gamma = launch(
        kernel, device, inputs=[logits, corr, wscale],
        template=[("T", logits.dtype), ("N", N), ("R", n_routed), ("SH", n_shared),
                  ("K", top_k), ("I", inter)],
        grid=(32, N, 1), threadgroup=(32, 1, 1),
        output_shapes=[(N, top_k), (N, top_k), (N, n_shared * inter)],
        output_dtypes=[torch.uint32, logits.dtype, logits.dtype])
    lg = logits.double().cpu()
    scores = torch.sigmoid(lg[:, :n_routed]) + corr.double().cpu()
    chosen = scores.argsort(-1, descending=True)[:, :top_k]
    tl = torch.cat([lg.gather(1, chosen), lg[:, n_routed:]], 1)
    weights = torch.softmax(torch.nn.functional.logsigmoid(tl), -1) * 2.5
    assert torch.equal(idx.to(torch.int64).cpu(), chosen)
    close(wk, weights[:, :top_k], rtol=1e-5, atol=1e-6)
    close(gamma, weights[:, top_k:].repeat_interleave(inter, 1), rtol=1e-5, atol=1e-6)


INKLING_DOWN_COMBINE_SOURCE = r"""
    // Weighted routed-expert down-projection for decode: gather_qmm's
    // vector-per-expert mode runs at ~200 GB/s on the [2048 -> 4096] down
    // shape (vs ~750 broadcast), so this kernel dequantizes q4/g64 rows
    // directly: one threadgroup per output row, one simdgroup per selected
    // expert, one quant group per lane; the top-k weighted sum over experts
    // is folded in, so the [N, K, out] intermediate never exists.
    uint lane = thread_index_in_simdgroup;
    uint sg   = simdgroup_index_in_threadgroup;   // expert slot (8 sgs, K used)
    uint row  = threadgroup_position_in_grid.y;   // output row [0, OUT)
    uint n    = threadgroup_position_in_grid.z;   // token
    threadgroup float partial[8];
    if (sg < K) {
        uint e = idx[(size_t)n * K + sg];
        const device uint* wr = wq + ((size_t)e * OUT + row) * (IN / 8u);
        const device T* sr = sc + ((size_t)e * OUT + row) * GROUPS;
        const device T* br = bi + ((size_t)e * OUT + row) * GROUPS;
        const device T* xr = xin + ((size_t)n * K + sg) * IN;
        float s = (float)sr[lane];
        float b = (float)br[lane];
        float accq = 0.0f, accx = 0.0f;
        uint base = lane * 8u;      // 8 uint32 = 64 packed q4 values
        uint xbase = lane * 64u;
        for (uint u = 0; u < 8u; ++u) {
            uint w8 = wr[base + u];
            for (uint t = 0; t < 8u; ++t) {
                float xv = (float)xr[xbase + u * 8u + t];
                accq += (float)((w8 >> (4u * t)) & 0xFu) * xv;
                accx += xv;
            }
        }
        float dot = simd_sum(s * accq + b * accx);
        if (lane == 0) {
            // match the unfused chain: down output rounds to T, then the
            // per-expert weight multiply rounds again before the sum
            float dv = (float)((T)dot);
            partial[sg] = (float)((T)(dv * (float)wk[(size_t)n * K + sg]));
        }
    } else if (lane == 0) {
        partial[sg] = 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0 && lane == 0) {
        float tot = 0.0f;
        for (uint t = 0; t < 8u; ++t) tot += partial[t];
        out[(size_t)n * OUT + row] = (T)tot;
    }
"""


# --- Blaizzy/mlx-vlm: mlx_vlm/models/qwen3_5/language.py ----------------------------------------

QWEN35_QLINEAR_HEADER = r"""
    using namespace metal;

    constant constexpr int SIMD_SIZE = 32;
    constant constexpr int BITS = __BITS__;
    constant constexpr int GS = __GS__;
    constant constexpr int PACK_FACTOR = (BITS == 5 ? 8 : 32 / BITS);
    constant constexpr int BYTES_PER_PACK = (BITS == 5 ? 5 : 32 / 8);
    constant constexpr int PACKS_PER_THREAD = 2;
    constant constexpr int VALUES_PER_THREAD = PACK_FACTOR * PACKS_PER_THREAD;
    constant constexpr int BLOCK_SIZE = VALUES_PER_THREAD * SIMD_SIZE;
    constant constexpr int SCALE_STEP_PER_THREAD = GS / VALUES_PER_THREAD;
    constant constexpr int RESULTS_PER_SIMDGROUP = 4;
    constant constexpr int NUM_SIMDGROUPS = 2;
    constant constexpr int BN = RESULTS_PER_SIMDGROUP * NUM_SIMDGROUPS;

    template <typename T>
    inline float load_vector_exact(const device T* x, thread float* x_thread) {
      float sum = 0.0f;
      if (BITS == 4) {
        for (int i = 0; i < VALUES_PER_THREAD; i += 4) {
          sum += x[i] + x[i + 1] + x[i + 2] + x[i + 3];
          x_thread[i] = x[i];
          x_thread[i + 1] = x[i + 1] / 16.0f;
          x_thread[i + 2] = x[i + 2] / 256.0f;
          x_thread[i + 3] = x[i + 3] / 4096.0f;
        }
      } else if (BITS == 5) {
        for (int i = 0; i < VALUES_PER_THREAD; i += 8) {
          sum += x[i] + x[i + 1] + x[i + 2] + x[i + 3] + x[i + 4] + x[i + 5] +
              x[i + 6] + x[i + 7];
          x_thread[i] = x[i];
          x_thread[i + 1] = x[i + 1] / 32.0f;
          x_thread[i + 2] = x[i + 2] / 4.0f;
          x_thread[i + 3] = x[i + 3] / 128.0f;
          x_thread[i + 4] = x[i + 4] / 16.0f;
          x_thread[i + 5] = x[i + 5] / 2.0f;
          x_thread[i + 6] = x[i + 6] / 64.0f;
          x_thread[i + 7] = x[i + 7] / 8.0f;
        }
      }
      return sum;
    }

    inline float qdot_exact(
        const device uint8_t* w,
        const thread float* x_thread,
        float scale,
        float bias,
        float sum) {
      float accum = 0.0f;
      if (BITS == 4) {
        const device uint16_t* ws = (const device uint16_t*)w;
        for (int i = 0; i < (VALUES_PER_THREAD / 4); i++) {
          accum +=
              (x_thread[4 * i] * (ws[i] & 0x000f) +
               x_thread[4 * i + 1] * (ws[i] & 0x00f0) +
               x_thread[4 * i + 2] * (ws[i] & 0x0f00) +
               x_thread[4 * i + 3] * (ws[i] & 0xf000));
        }
      } else if (BITS == 5) {
        for (int i = 0; i < (VALUES_PER_THREAD / 8); i++) {
          const thread float* xt = x_thread + 8 * i;
          const device uint8_t* wb = w + 5 * i;

          accum += (wb[0] & 0x1f) * xt[0];
          accum += (wb[0] & 0xe0) * xt[1];
          accum += (wb[1] & 0x3) * (xt[1] * 256.0f);
          accum += (wb[1] & 0x7c) * xt[2];
          accum += (wb[1] & 0x80) * xt[3];
          accum += (wb[2] & 0xf) * (xt[3] * 256.0f);
          accum += (wb[2] & 0xf0) * xt[4];
          accum += (wb[3] & 0x1) * (xt[4] * 256.0f);
          accum += (wb[3] & 0x3e) * xt[5];
          accum += (wb[3] & 0xc0) * xt[6];
          accum += (wb[4] & 0x7) * (xt[6] * 256.0f);
          accum += (wb[4] & 0xf8) * xt[7];
        }
      }
      return scale * accum + sum * bias;
    }
"""

QWEN35_VERIFY_QMV_SOURCE = r"""
    uint n_tile = threadgroup_position_in_grid.y;
    uint b_idx = threadgroup_position_in_grid.z;
    uint simd_gid = simdgroup_index_in_threadgroup;
    uint simd_lid = thread_index_in_simdgroup;

    int out_row = int(n_tile) * BN + int(simd_gid) * RESULTS_PER_SIMDGROUP;
    int in_vec_size_w = K_SIZE * BYTES_PER_PACK / PACK_FACTOR;
    int in_vec_size_g = K_SIZE / GS;

    const device uint8_t* ws_base =
        (const device uint8_t*)w + out_row * in_vec_size_w +
        int(simd_lid) * PACKS_PER_THREAD * BYTES_PER_PACK;
    const device T* scales_base =
        scales + out_row * in_vec_size_g + int(simd_lid) / SCALE_STEP_PER_THREAD;
    const device T* biases_base =
        biases + out_row * in_vec_size_g + int(simd_lid) / SCALE_STEP_PER_THREAD;
    const device T* x_base =
        x + int(b_idx) * VERIFY_T * K_SIZE + int(simd_lid) * VALUES_PER_THREAD;

    float result[VERIFY_T][RESULTS_PER_SIMDGROUP];
    float x_thread[VERIFY_T][VALUES_PER_THREAD];
    for (int t = 0; t < VERIFY_T; ++t) {
      for (int row = 0; row < RESULTS_PER_SIMDGROUP; ++row) {
        result[t][row] = 0.0f;
      }
    }

    const device uint8_t* ws = ws_base;
    const device T* sc = scales_base;
    const device T* bs = biases_base;
    const device T* xk = x_base;

    for (int k = 0; k < K_SIZE; k += BLOCK_SIZE) {
      float sums[VERIFY_T];
      for (int t = 0; t < VERIFY_T; ++t) {
        sums[t] = load_vector_exact<T>(xk + t * K_SIZE, x_thread[t]);
      }

      for (int row = 0; row < RESULTS_PER_SIMDGROUP; ++row) {
        const device uint8_t* wl = ws + row * in_vec_size_w;
        const device T* sl = sc + row * in_vec_size_g;
        const device T* bl = bs + row * in_vec_size_g;
        float s = float(sl[0]);
        float b = float(bl[0]);
        for (int t = 0; t < VERIFY_T; ++t) {
          result[t][row] += qdot_exact(wl, x_thread[t], s, b, sums[t]);
        }
      }

      ws += BLOCK_SIZE * BYTES_PER_PACK / PACK_FACTOR;
      sc += BLOCK_SIZE / GS;
      bs += BLOCK_SIZE / GS;
      xk += BLOCK_SIZE;
    }

    for (int row = 0; row < RESULTS_PER_SIMDGROUP; ++row) {
      int n = out_row + row;
      for (int t = 0; t < VERIFY_T; ++t) {
        float r = simd_sum(result[t][row]);
        if (simd_lid == 0) {
          y[(int(b_idx) * VERIFY_T + t) * N_SIZE + n] = T(r);
        }
      }
    }
"""


def _mlx_q4(N, K, group_size, dtype):
    """Weights in MLX's 4-bit affine format: eight nibbles a uint32, low nibble first."""
    q = torch.randint(0, 16, (N, K))
    shifts = 4 * torch.arange(8)
    words = (q.reshape(N, K // 8, 8) << shifts).sum(-1)
    scales = (torch.rand(N, K // group_size) * 0.02 + 0.005).to(dtype)
    biases = (torch.randn(N, K // group_size) * 0.05).to(dtype)
    dense = q.double() * scales.double().repeat_interleave(group_size, 1) \
        + biases.double().repeat_interleave(group_size, 1)
    return words.to(torch.uint32), scales, biases, dense


def test_mlx_vlm_qwen3_5_target_verify_qmv(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/qwen3_5/language.py: MLX 4-bit affine qmv for several
    verify tokens at once (qdot through uint16 masks of the packed bytes), in half precision."""
    bits, group_size, B, T, K, N = 4, 64, 2, 3, 512, 16
    w, scales, biases, dense = _mlx_q4(N, K, group_size, torch.float16)
    x = torch.randn(B, T, K).to(torch.float16)
    kernel = kk.metal_kernel(
        name=f"qwen3_5_target_verify_qmv_b{bits}_gs{group_size}_t{T}_k{K}_n{N}_fp16",
        input_names=["x", "w", "scales", "biases"], output_names=["y"],
        header=QWEN35_QLINEAR_HEADER.replace("__BITS__", str(bits)).replace("__GS__", str(group_size)),
        source=QWEN35_VERIFY_QMV_SOURCE)
    out = launch(kernel, device, inputs=[t.to(device) for t in (x, w, scales, biases)],
                 template=[("T", x.dtype), ("VERIFY_T", int(T)), ("K_SIZE", int(K)), ("N_SIZE", int(N))],
                 grid=(32, 2 * (N // 8), B), threadgroup=(32, 2, 1),
                 output_shapes=[(B, T, N)], output_dtypes=[x.dtype])[0]
    close(out, x.double() @ dense.T, rtol=1e-2, atol=1e-2)


def test_mlx_vlm_inkling_moe_down_combine(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/inkling/language.py: decode-time routed-expert down
    projection from MLX 4-bit weights (one quant group a lane, simd_sum) with the top-k weighted
    sum folded in through threadgroup memory."""
    n_tok, top_k, E, OUT, IN = 2, 3, 4, 6, 2048
    wq, sc, bi, dense = zip(*(_mlx_q4(OUT, IN, 64, torch.float16) for _ in range(E)))
    wq, sc, bi, dense = torch.stack(wq), torch.stack(sc), torch.stack(bi), torch.stack(dense)
    xin = (torch.randn(n_tok, top_k, IN) * 0.5).to(torch.float16)
    idx = torch.stack([torch.randperm(E)[:top_k] for _ in range(n_tok)])
    wk = torch.rand(n_tok, top_k).to(torch.float16)
    kernel = kk.metal_kernel(name="inkling_moe_down_combine",
                             input_names=["xin", "wq", "sc", "bi", "idx", "wk"],
                             output_names=["out"], source=INKLING_DOWN_COMBINE_SOURCE)
    out = launch(kernel, device,
                 inputs=[t.to(device) for t in (xin, wq, sc, bi, idx.to(torch.uint32), wk)],
                 template=[("T", torch.float16), ("OUT", OUT), ("IN", IN), ("GROUPS", IN // 64),
                           ("K", top_k)],
                 grid=(256, OUT, n_tok), threadgroup=(256, 1, 1),
                 output_shapes=[(n_tok, OUT)], output_dtypes=[torch.float16])[0]
    dots = torch.einsum("nki,nkoi->nko", xin.double(), dense[idx])
    expected = (dots.half().double() * wk.double()[..., None]).half().double().sum(1)
    close(out, expected, rtol=1e-2, atol=1e-2)
