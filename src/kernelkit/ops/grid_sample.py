"""grid_sample on NHWC data: the "Complex Example" of MLX's custom Metal kernel guide, grown
to torch.nn.functional.grid_sample's 2-D semantics.

First the seed: its forward and VJP kernel sources unchanged, and the Python around them
(`grid_sample_seed`, `grid_sample_vjp`) with torch tensors in place of mx arrays; tests and
benchmarks use them. Then the full op, `grid_sample`: every mode, padding and align_corners,
float16/bfloat16/float32/float64, differentiable through `kk.custom_function`.
"""

from __future__ import annotations

import math

import torch

from .. import custom_function, metal_kernel

# Seed 1 (mlx_custom_metal_kernels.txt), the fused forward kernel, verbatim.
# It reads the four corners of x before masking them: for samples near the
# border those reads fall outside x (see BENCHMARKS.md / the issue notes).
FORWARD_SOURCE = """
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

        T nw = (ix_se - ix)    * (iy_se - iy);
        T ne = (ix    - ix_sw) * (iy_sw - iy);
        T sw = (ix_ne - ix)    * (iy    - iy_ne);
        T se = (ix    - ix_nw) * (iy    - iy_nw);

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
    """

# Seed 1, the VJP kernel (atomic outputs, init_value=0, simd_sum), verbatim.
VJP_SOURCE = """
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

        T nw = (ix_se - ix)    * (iy_se - iy);
        T ne = (ix    - ix_sw) * (iy_sw - iy);
        T sw = (ix_ne - ix)    * (iy    - iy_ne);
        T se = (ix    - ix_nw) * (iy    - iy_nw);

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
    """

_forward = metal_kernel(name="grid_sample", input_names=["x", "grid"], output_names=["out"],
                        source=FORWARD_SOURCE)
_vjp = metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                    output_names=["x_grad", "grid_grad"], source=VJP_SOURCE, atomic_outputs=True)


def grid_sample_seed(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The seed's forward: bilinear sampling of NHWC x at grid (B, gH, gW, 2) in [-1, 1];
    zeros outside, align_corners=False. (`grid_sample` below is the full op.)"""
    assert x.ndim == 4, "`x` must be 4D."
    assert grid.ndim == 4, "`grid` must be 4D."
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    out_shape = (B, gN, gM, C)
    assert D == 2, "Last dim of `grid` must be size 2."
    return _forward(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[out_shape],
                    output_dtypes=[x.dtype], grid=(math.prod(out_shape), 1, 1),
                    threadgroup=(256, 1, 1))[0]


def grid_sample_vjp(x: torch.Tensor, grid: torch.Tensor, cotangent: torch.Tensor):
    """(x_grad, grid_grad) of grid_sample for the given cotangent of its output."""
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    assert D == 2, "Last dim of `grid` must be size 2."
    # pad the output channels to simd group size so that our `simd_sum`s don't overlap.
    simdgroup_size = 32
    C_padded = (C + simdgroup_size - 1) // simdgroup_size * simdgroup_size
    grid_size = B * gN * gM * C_padded
    x_grad, grid_grad = _vjp(inputs=[x, grid, cotangent], template=[("T", x.dtype)],
                             output_shapes=[x.shape, grid.shape], output_dtypes=[x.dtype, x.dtype],
                             grid=(grid_size, 1, 1), threadgroup=(256, 1, 1), init_value=0)
    return x_grad, grid_grad


def grid_sample_reference(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.grid_sample on the NCHW view (bilinear, zeros, align_corners=False)."""
    out = torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, mode="bilinear",
                                          padding_mode="zeros", align_corners=False)
    return out.permute(0, 2, 3, 1)


# ---------------------------------------------------------------------------------------------
# The full op: torch.nn.functional.grid_sample's 2-D semantics on NHWC data, forward and VJP.
#
# Differences from the seed's kernels, and why:
# - every mode (bilinear, nearest), padding (zeros, border, reflection) and align_corners,
#   through PyTorch's own source-index function, so results match torch's;
# - corners outside x are never read (the seed reads, then masks);
# - coordinates and sums in float32 (float64 for float64 data), whatever the storage dtype;
# - one thread per (output pixel, lane) with CL lanes per pixel, each lane looping over the
#   channels lane, lane + CL...: the coordinate math is shared by C / CL channels, consecutive
#   lanes read consecutive channels (coalesced), and no lane is padding when CL divides C;
# - x_grad accumulates in float32 atomics (see _backward_bilinear); grid_grad needs no atomics:
#   the CL lanes of a pixel sum their partial gradients with SIMD shuffles.

# PyTorch's grid_sampler_compute_source_index_set_grad (aten/src/ATen/native/GridSampler.h),
# step for step, in the compute type A. `grad` receives d(source index) / d(grid coordinate).
HEADER = """
template <typename A>
A gs_clip(A in, int size, thread A& grad) {
    // clip_coordinates_set_grad: the borders count as outside for the gradient
    if (in <= A(0)) { grad = A(0); return A(0); }
    A hi = A(size - 1);
    if (in >= hi) { grad = A(0); return hi; }
    grad = A(1);
    return in;
}

template <typename A>
A gs_reflect(A in, int twice_low, int twice_high, thread A& grad) {
    // reflect_coordinates_set_grad
    if (twice_low == twice_high) { grad = A(0); return A(0); }
    A low = A(twice_low) / 2;
    A span = A(twice_high - twice_low) / 2;
    in = in - low;
    A sign = A(1);
    if (in < A(0)) { sign = A(-1); in = -in; }
    A extra = fmod(in, span);
    // PyTorch takes int(floor(in / span)) % 2; the parity computed in A stays defined when the
    // quotient does not fit an int
    bool odd = fmod(floor(in / span), A(2)) != A(0);
    grad = odd ? -sign : sign;
    return odd ? span - extra + low : extra + low;
}

// padding: 0 zeros, 1 border, 2 reflection.
template <typename A>
A gs_source_index(A coord, int size, int padding, bool align_corners, thread A& grad) {
    if (align_corners) {
        grad = A(size - 1) / 2;
        coord = (coord + 1) / 2 * A(size - 1);
    } else {
        grad = A(size) / 2;
        coord = ((coord + 1) * A(size) - 1) / 2;
    }
    A g_clip, g_refl;
    if (padding == 1) {
        coord = gs_clip(coord, size, g_clip);
        grad *= g_clip;
    } else if (padding == 2) {
        coord = align_corners ? gs_reflect(coord, 0, 2 * (size - 1), g_refl)
                              : gs_reflect(coord, -1, 2 * size - 1, g_refl);
        coord = gs_clip(coord, size, g_clip);
        grad *= g_refl * g_clip;
    }
    // CUDA's safe_downgrade_to_int_range (with 2^30 for INT_MAX, which float rounds up): far-off
    // and non-finite coordinates (NaN fails both tests) become -100, outside the image, so
    // that converting them to int stays defined.
    if (!(coord > A(-1073741824) && coord < A(1073741824))) coord = A(-100);
    return coord;
}
"""

# The part of every body that finds the pixel, its batch and its source coordinates.
_PROLOGUE = """
    uint elem = thread_position_in_grid.x;
    uint pix = elem / CL;
    int lane = elem % CL;
    int H = x_shape[1];
    int W = x_shape[2];
    int C = x_shape[3];
    int b = pix / uint(grid_shape[1] * grid_shape[2]);
    A gmx, gmy;  // d(ix)/d(grid x), d(iy)/d(grid y)
    A ix = gs_source_index(A(grid[2 * int64_t(pix)]), W, padding, align_corners, gmx);
    A iy = gs_source_index(A(grid[2 * int64_t(pix) + 1]), H, padding, align_corners, gmy);
    int64_t x_base = int64_t(b) * H * W * C;   // image b in x (and x_grad)
    int64_t o_base = int64_t(pix) * C;         // pixel pix in out (and the cotangent)
"""

# Bilinear corners as PyTorch names them (nw, ne, sw, se) with their weights and offsets.
_CORNERS = """
    int x0 = int(floor(ix));
    int y0 = int(floor(iy));
    int x1 = x0 + 1;
    int y1 = y0 + 1;
    A nw = (A(x1) - ix) * (A(y1) - iy);
    A ne = (ix - A(x0)) * (A(y1) - iy);
    A sw = (A(x1) - ix) * (iy - A(y0));
    A se = (ix - A(x0)) * (iy - A(y0));
    bool x0_in = x0 >= 0 && x0 < W, x1_in = x1 >= 0 && x1 < W;
    bool y0_in = y0 >= 0 && y0 < H, y1_in = y1 >= 0 && y1 < H;
    bool nw_in = y0_in && x0_in, ne_in = y0_in && x1_in, sw_in = y1_in && x0_in, se_in = y1_in && x1_in;
    int64_t nw_at = x_base + (int64_t(y0) * W + x0) * C;
    int64_t ne_at = nw_at + C;
    int64_t sw_at = nw_at + int64_t(W) * C;
    int64_t se_at = sw_at + C;
"""

SAMPLE_SOURCE = _PROLOGUE + """
    device T* o = out + o_base;
    if (nearest) {
        int xn = int(rint(ix));  // nearbyint: halfway cases to even, as PyTorch
        int yn = int(rint(iy));
        if (xn >= 0 && xn < W && yn >= 0 && yn < H) {
            const device T* p = x + x_base + (int64_t(yn) * W + xn) * C;
            for (int c = lane; c < C; c += CL) o[c] = p[c];
        } else {
            for (int c = lane; c < C; c += CL) o[c] = T(0);
        }
        return;
    }
""" + _CORNERS + """
    for (int c = lane; c < C; c += CL) {
        A v = A(0);  // PyTorch's order of the four terms
        if (nw_in) v += A(x[nw_at + c]) * nw;
        if (ne_in) v += A(x[ne_at + c]) * ne;
        if (sw_in) v += A(x[sw_at + c]) * sw;
        if (se_in) v += A(x[se_at + c]) * se;
        o[c] = T(v);
    }
"""

BACKWARD_BILINEAR_SOURCE = _PROLOGUE + _CORNERS + """
    A gix = A(0);
    A giy = A(0);
    // The same trip count on every lane of the pixel, so that they meet again at the shuffles.
    for (int c0 = 0; c0 < C; c0 += CL) {
        int c = c0 + lane;
        if (c >= C) continue;
        A go = A(cotangent[o_base + c]);
        if (nw_in) {
            atomic_fetch_add_explicit(&x_grad[nw_at + c], nw * go, memory_order_relaxed);
            A v = A(x[nw_at + c]);
            gix -= v * (A(y1) - iy) * go;
            giy -= v * (A(x1) - ix) * go;
        }
        if (ne_in) {
            atomic_fetch_add_explicit(&x_grad[ne_at + c], ne * go, memory_order_relaxed);
            A v = A(x[ne_at + c]);
            gix += v * (A(y1) - iy) * go;
            giy -= v * (ix - A(x0)) * go;
        }
        if (sw_in) {
            atomic_fetch_add_explicit(&x_grad[sw_at + c], sw * go, memory_order_relaxed);
            A v = A(x[sw_at + c]);
            gix -= v * (iy - A(y0)) * go;
            giy += v * (A(x1) - ix) * go;
        }
        if (se_in) {
            atomic_fetch_add_explicit(&x_grad[se_at + c], se * go, memory_order_relaxed);
            A v = A(x[se_at + c]);
            gix += v * (iy - A(y0)) * go;
            giy += v * (ix - A(x0)) * go;
        }
    }
    // The pixel's CL lanes are CL consecutive lanes of one SIMD-group, all running (the grid is
    // a multiple of CL): sum over them, both partial sums in one vector (one exchange per step).
    vec<A, 2> gi = vec<A, 2>(gix, giy);
    if (CL == 32) {
        gi = simd_sum(gi);
    } else {
        for (ushort d = CL / 2; d > 0; d /= 2) gi += simd_shuffle_xor(gi, d);  // a butterfly
    }
    if (lane == 0) {  // one writer per element: a plain (atomic) store, no read-modify-write
        atomic_store_explicit(&grid_grad[2 * int64_t(pix)], T(gmx * gi.x), memory_order_relaxed);
        atomic_store_explicit(&grid_grad[2 * int64_t(pix) + 1], T(gmy * gi.y), memory_order_relaxed);
    }
"""

BACKWARD_NEAREST_SOURCE = _PROLOGUE + """
    int xn = int(rint(ix));
    int yn = int(rint(iy));
    if (xn >= 0 && xn < W && yn >= 0 && yn < H) {
        int64_t at = x_base + (int64_t(yn) * W + xn) * C;
        for (int c = lane; c < C; c += CL)
            atomic_fetch_add_explicit(&x_grad[at + c], A(cotangent[o_base + c]), memory_order_relaxed);
    }
"""

# "relaxed" math: FMA contraction as nvcc compiles PyTorch's kernels, and IEEE division.
_OPTIONS = {"math_mode": "relaxed"}
# The settings are scalar inputs, not template values: a branch that every thread takes the same
# way costs next to nothing, and one compiled kernel per dtype serves all twelve settings.
_SETTINGS = ["nearest", "padding", "align_corners"]
_sample = metal_kernel(name="grid_sample_nhwc", input_names=["x", "grid", *_SETTINGS], output_names=["out"],
                       source=SAMPLE_SOURCE, header=HEADER, compile_options=_OPTIONS)
# x_grad is an atomic float32 (float64 for float64 data) output even for half and bfloat16 x,
# cast afterwards: many output pixels scatter into one x element, and a 16-bit running sum
# loses their small contributions once it is large (bfloat16 keeps 8 bits); 16-bit atomics
# are also emulated with compare-and-swap loops on some targets.
_backward_bilinear = metal_kernel(name="grid_sample_nhwc_vjp",
                                  input_names=["x", "grid", "cotangent", *_SETTINGS],
                                  output_names=["x_grad", "grid_grad"], source=BACKWARD_BILINEAR_SOURCE,
                                  header=HEADER, atomic_outputs=True, compile_options=_OPTIONS)
_backward_nearest = metal_kernel(name="grid_sample_nhwc_vjp_nearest",
                                 input_names=["x", "grid", "cotangent", *_SETTINGS], output_names=["x_grad"],
                                 source=BACKWARD_NEAREST_SOURCE, header=HEADER, atomic_outputs=True,
                                 compile_options=_OPTIONS)

MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_THREADGROUP = (256, 1, 1)


def _lanes(C: int, itemsize: int) -> int:
    """Lanes per output pixel: a power of two up to 32 (a SIMD-group), at least 32 bytes of a
    pixel's channels per read (a GPU memory sector) where C allows, with the least padding."""
    cap = min(32, 1 << max(C - 1, 0).bit_length())
    floor_ = min(cap, max(1, 32 // itemsize))
    options = [cl for cl in (32, 16, 8, 4, 2, 1) if floor_ <= cl <= cap]
    return min(options, key=lambda cl: (-(-C // cl) * cl, -cl))


def _check(x, grid, mode, padding_mode, align_corners) -> None:
    for name, t in (("x", x), ("grid", grid)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"grid_sample: `{name}` must be a torch.Tensor, got {type(t).__name__}.")
        if t.ndim != 4:
            raise ValueError(f"grid_sample: `{name}` must be 4-D, got shape {tuple(t.shape)}.")
        if t.dtype not in _FLOATS:
            raise TypeError(f"grid_sample: `{name}` must be float16, bfloat16, float32 or float64, "
                            f"got {t.dtype}.")
    if grid.shape[-1] != 2:
        raise ValueError(f"grid_sample: the last dim of `grid` must be 2 (x, y), got shape "
                         f"{tuple(grid.shape)}.")
    if x.shape[0] != grid.shape[0]:
        raise ValueError(f"grid_sample: `x` and `grid` must have the same batch size, got "
                         f"{x.shape[0]} and {grid.shape[0]}.")
    if x.device != grid.device:
        raise ValueError(f"grid_sample: `x` and `grid` must be on the same device, got {x.device} "
                         f"and {grid.device}.")
    if x.dtype != grid.dtype:
        raise TypeError(f"grid_sample: `x` and `grid` must have the same dtype, got {x.dtype} and "
                        f"{grid.dtype}.")
    if mode not in MODES:
        raise ValueError(f"grid_sample: mode must be one of {MODES}, got {mode!r}.")
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"grid_sample: padding_mode must be one of {PADDING_MODES}, got "
                         f"{padding_mode!r}.")
    if not isinstance(align_corners, bool):
        raise TypeError(f"grid_sample: align_corners must be a bool, got {align_corners!r}.")
    if (x.shape[1] == 0 or x.shape[2] == 0) and grid.shape[1] * grid.shape[2] * x.shape[0] * x.shape[3]:
        raise ValueError(f"grid_sample: `x` must have non-empty spatial dims (H, W), got shape "
                         f"{tuple(x.shape)}.")


def _launch_args(x, grid, mode, padding_mode, align_corners):
    """(settings inputs, template, dispatch grid) of a kernel over grid's pixels."""
    B, gH, gW, _ = grid.shape
    cl = _lanes(x.shape[3], x.element_size())
    threads = B * gH * gW * cl
    if threads >= 2**32:
        raise ValueError(f"grid_sample: {B * gH * gW} grid points x {cl} lanes exceed the 2**32 "
                         "threads of one launch; split the batch.")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    settings = [mode == "nearest", PADDING_MODES.index(padding_mode), align_corners]
    return settings, [("T", x.dtype), ("A", acc), ("CL", cl)], (threads, 1, 1)


def grid_sample_forward(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """grid_sample's output, not differentiable (the kernel alone); arguments as grid_sample."""
    _check(x, grid, mode, padding_mode, align_corners)
    return _forward_checked(x, grid, mode, padding_mode, align_corners)


def _forward_checked(x, grid, mode, padding_mode, align_corners):
    out_shape = (x.shape[0], grid.shape[1], grid.shape[2], x.shape[3])
    if math.prod(out_shape) == 0:
        return x.new_empty(out_shape)
    settings, template, threads = _launch_args(x, grid, mode, padding_mode, align_corners)
    return _sample(inputs=[x, grid, *settings], template=template, output_shapes=[out_shape],
                   output_dtypes=[x.dtype], grid=threads, threadgroup=_THREADGROUP)[0]


def grid_sample_backward(x, grid, cotangent, mode="bilinear", padding_mode="zeros",
                         align_corners=False):
    """(x_grad, grid_grad) of grid_sample for the cotangent of its output (B, gH, gW, C)."""
    _check(x, grid, mode, padding_mode, align_corners)
    return _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners)


def _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners):
    out_shape = (x.shape[0], grid.shape[1], grid.shape[2], x.shape[3])
    if tuple(cotangent.shape) != out_shape:
        raise ValueError(f"grid_sample: the cotangent must have the output's shape {out_shape}, "
                         f"got {tuple(cotangent.shape)}.")
    if math.prod(out_shape) == 0:
        return torch.zeros_like(x), torch.zeros_like(grid)
    cotangent = cotangent.to(device=x.device, dtype=x.dtype)
    settings, template, threads = _launch_args(x, grid, mode, padding_mode, align_corners)
    inputs, acc = [x, grid, cotangent, *settings], template[1][1]
    if mode == "nearest":  # the output is piecewise constant in grid: torch's grid_grad is zero
        x_grad, = _backward_nearest(inputs=inputs, template=template,
                                    output_shapes=[x.shape], output_dtypes=[acc], grid=threads,
                                    threadgroup=_THREADGROUP, init_value=0)
        grid_grad = torch.zeros_like(grid)
    else:
        x_grad, grid_grad = _backward_bilinear(
            inputs=inputs, template=template, output_shapes=[x.shape, grid.shape],
            output_dtypes=[acc, x.dtype], grid=threads, threadgroup=_THREADGROUP, init_value=0)
    return x_grad.to(x.dtype), grid_grad


# The settings are keyword arguments: custom_function passes them to the rules as constants.
# (grid_sample checked the arguments.)
@custom_function
def _grid_sample(x, grid, *, mode, padding_mode, align_corners):
    return _forward_checked(x, grid, mode, padding_mode, align_corners)


@_grid_sample.vjp
def _grid_sample_vjp(primals, cotangent, output, *, mode, padding_mode, align_corners):
    x, grid = primals
    return _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners)


def grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: bool = False) -> torch.Tensor:
    """torch.nn.functional.grid_sample (2-D) on NHWC data: samples x (B, H, W, C) at grid
    (B, gH, gW, 2) of (x, y) in [-1, 1] into (B, gH, gW, C). mode "bilinear" | "nearest",
    padding_mode "zeros" | "border" | "reflection". Differentiable in x and grid (for "nearest",
    grid's gradient is zero, as torch's). float16/bfloat16 compute in float32."""
    _check(x, grid, mode, padding_mode, align_corners)
    return _grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


def grid_sample_torch(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """The plain-torch reference: torch.nn.functional.grid_sample on the NCHW view of x."""
    out = torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, mode=mode,
                                          padding_mode=padding_mode, align_corners=align_corners)
    return out.permute(0, 2, 3, 1)
