"""The Python of MLX's custom-kernel documents, run as written: only `mx` arrays and dtypes become
torch's. Kernels are built inside the functions that call them (as the documents do), grids come
from `np.prod`, and every argument is spelled as MLX spells it. Runs on the CPU backend in CI and
on the GPU where there is one.

Left out, because the documents give no runnable code there: the guide's shortened VJP body
(`// ... compute gradients ...`), its attribute fragment (`local_value` is never declared), and the
panel QR sketch, whose reflector steps are comments (it is built and compiled, not checked).
"""

import signal

import numpy as np
import pytest
import torch

import kernelkit as kk

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


# --- mlx_custom_metal_kernels: "Simple Example" --------------------------------------------------

def exp_elementwise(a: torch.Tensor):
    source = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """

    kernel = kk.metal_kernel(
        name="myexp",
        input_names=["inp"],
        output_names=["out"],
        source=source,
    )
    outputs = kernel(
        inputs=[a],
        template=[("T", torch.float32)],
        grid=(a.numel(), 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
    )
    return outputs[0]


def test_simple_example(device):
    a = torch.randn((4, 16), device=device).to(torch.float16)
    b = exp_elementwise(a)
    assert torch.allclose(b, torch.exp(a))


# --- "Using Shape/Strides" ------------------------------------------------------------------------

def exp_elementwise_strided(a: torch.Tensor):
    source = """
        uint elem = thread_position_in_grid.x;
        // Utils from `mlx/backend/metal/kernels/utils.h` are automatically included
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        // Output arrays are always row contiguous
        out[elem] = metal::exp(tmp);
    """

    kernel = kk.metal_kernel(
        name="myexp_strided",
        input_names=["inp"],
        output_names=["out"],
        source=source
    )
    outputs = kernel(
        inputs=[a],
        template=[("T", torch.float32)],
        grid=(a.numel(), 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
        ensure_row_contiguous=False,
    )
    return outputs[0]


def test_shape_strides(device):
    a = torch.randn((4, 16), device=device).to(torch.float16)
    # make non-contiguous
    a = a[::2]
    b = exp_elementwise_strided(a)
    assert torch.allclose(b, torch.exp(a))


# --- "Complex Example": grid_sample and its VJP ------------------------------------------------

def grid_sample_ref(x, grid):
    N, H_in, W_in, _ = x.shape
    ix = ((grid[..., 0] + 1) * W_in - 1) / 2
    iy = ((grid[..., 1] + 1) * H_in - 1) / 2

    ix_nw = torch.floor(ix).to(torch.int32)
    iy_nw = torch.floor(iy).to(torch.int32)

    ix_ne = ix_nw + 1
    iy_ne = iy_nw

    ix_sw = ix_nw
    iy_sw = iy_nw + 1

    ix_se = ix_nw + 1
    iy_se = iy_nw + 1

    nw = (ix_se - ix) * (iy_se - iy)
    ne = (ix - ix_sw) * (iy_sw - iy)
    sw = (ix_ne - ix) * (iy - iy_ne)
    se = (ix - ix_nw) * (iy - iy_nw)

    # torch's advanced indexing wants indices in range: MLX clamps them, the masks below zero
    # what lies outside (the only change from the document's reference)
    def gather(iy_, ix_):
        return x[torch.arange(N, device=x.device)[:, None, None],
                 iy_.clamp(0, H_in - 1).long(), ix_.clamp(0, W_in - 1).long(), :]

    I_nw = gather(iy_nw, ix_nw)
    I_ne = gather(iy_ne, ix_ne)
    I_sw = gather(iy_sw, ix_sw)
    I_se = gather(iy_se, ix_se)

    mask_nw = (iy_nw >= 0) & (iy_nw <= H_in - 1) & (ix_nw >= 0) & (ix_nw <= W_in - 1)
    mask_ne = (iy_ne >= 0) & (iy_ne <= H_in - 1) & (ix_ne >= 0) & (ix_ne <= W_in - 1)
    mask_sw = (iy_sw >= 0) & (iy_sw <= H_in - 1) & (ix_sw >= 0) & (ix_sw <= W_in - 1)
    mask_se = (iy_se >= 0) & (iy_se <= H_in - 1) & (ix_se >= 0) & (ix_se <= W_in - 1)

    I_nw = I_nw * mask_nw[..., None]
    I_ne = I_ne * mask_ne[..., None]
    I_sw = I_sw * mask_sw[..., None]
    I_se = I_se * mask_se[..., None]

    output = nw[..., None] * I_nw + ne[..., None] * I_ne + sw[..., None] * I_sw + se[..., None] * I_se

    return output


# The guide's forward body (its own text), for its version of the wrapper below
GRID_SAMPLE_SOURCE = """
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
"""


@kk.custom_function
def grid_sample(x, grid):

    assert x.ndim == 4, "`x` must be 4D."
    assert grid.ndim == 4, "`grid` must be 4D."

    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    out_shape = (B, gN, gM, C)

    assert D == 2, "Last dim of `grid` must be size 2."

    source = """
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
    kernel = kk.metal_kernel(
        name="grid_sample",
        input_names=["x", "grid"],
        output_names=["out"],
        source=source,
    )
    outputs = kernel(
        inputs=[x, grid],
        template=[("T", x.dtype)],
        output_shapes=[out_shape],
        output_dtypes=[x.dtype],
        grid=(np.prod(out_shape), 1, 1),
        threadgroup=(256, 1, 1),
    )
    return outputs[0]


@grid_sample.vjp
def grid_sample_vjp(primals, cotangent, _):
    x, grid = primals
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape

    assert D == 2, "Last dim of `grid` must be size 2."

    source = """
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
    kernel = kk.metal_kernel(
        name="grid_sample_grad",
        input_names=["x", "grid", "cotangent"],
        output_names=["x_grad", "grid_grad"],
        source=source,
        atomic_outputs=True,
    )
    # pad the output channels to simd group size
    # so that our `simd_sum`s don't overlap.
    simdgroup_size = 32
    C_padded = (C + simdgroup_size - 1) // simdgroup_size * simdgroup_size
    grid_size = B * gN * gM * C_padded
    outputs = kernel(
        inputs=[x, grid, cotangent],
        template=[("T", x.dtype)],
        output_shapes=[x.shape, grid.shape],
        output_dtypes=[x.dtype, x.dtype],
        grid=(grid_size, 1, 1),
        threadgroup=(256, 1, 1),
        init_value=0,
    )
    return outputs[0], outputs[1]


def _grid_inputs(device, dtype=torch.float32, B=2, H=12, W=10, C=40, gH=6, gW=7):
    # The seed's forward reads the four corners before masking them: x lies inside a larger
    # buffer so those reads stay in memory we own. Grid points on a 1/256 lattice keep the
    # coordinates exact.
    x = torch.randn(B + 2, H, W, C, device=device, dtype=dtype)[1:-1]
    grid = ((torch.rand(B, gH, gW, 2, device=device, dtype=torch.float64) * 2.2 - 1.1) * 256).round() / 256
    return x, grid.to(dtype)


def test_complex_example_forward(device):
    x, grid = _grid_inputs(device)
    out = grid_sample(x, grid)
    ref = grid_sample_ref(x.double(), grid.double())
    torch.testing.assert_close(out.double(), ref, **TOL[torch.float32])


def test_complex_example_vjp(device):
    x, grid = _grid_inputs(device)
    xr, gr = x.double().requires_grad_(), grid.double().requires_grad_()
    cot = torch.randn(x.shape[0], grid.shape[1], grid.shape[2], x.shape[3], device=device)
    grid_sample_ref(xr, gr).backward(cot.double())

    x_grad, grid_grad = torch.autograd.grad(grid_sample(x.requires_grad_(), grid.requires_grad_()),
                                            (x, grid), cot)
    torch.testing.assert_close(x_grad.double(), xr.grad, rtol=1e-4, atol=1e-4)
    # The seed's grid gradient: W / 2 and H / 2 as integer divisions (its own scaling)
    W, H = x.shape[2], x.shape[1]
    scale = torch.tensor([(W // 2) / (W / 2), (H // 2) / (H / 2)], dtype=torch.float64, device=device)
    torch.testing.assert_close(grid_grad.double(), gr.grad * scale, rtol=1e-3, atol=1e-3)


# --- mlx_custom_metal_kernels_guide: the Quick Start's kernel at module level -------------------

source = """
    uint elem = thread_position_in_grid.x;
    T tmp = inp[elem];
    out[elem] = metal::exp(tmp);
"""

kernel = kk.metal_kernel(
    name="myexp",
    input_names=["inp"],
    output_names=["out"],
    source=source,
)


def exp_elementwise_held(a: torch.Tensor):
    outputs = kernel(
        inputs=[a],
        template=[("T", a.dtype)],
        grid=(a.numel(), 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
    )
    return outputs[0]


def test_guide_quick_start(device):
    a = torch.randn((4, 16), device=device).to(torch.float16)
    b = exp_elementwise_held(a)
    assert torch.allclose(b, torch.exp(a))


def test_guide_template_parameters(device):
    template = [
        ("T", torch.float32),  # Type parameter
        ("N", 256),         # Integer parameter
        ("USE_BIAS", True)  # Boolean parameter
    ]
    k = kk.metal_kernel(
        name="template_parameters", input_names=["inp"], output_names=["out"],
        source="""
            uint elem = thread_position_in_grid.x;
            if (elem < N) { out[elem] = T(inp[elem]) + (USE_BIAS ? T(1) : T(0)); }
        """)
    a = torch.randn(256, device=device)
    out = k(inputs=[a], template=template, grid=(256, 1, 1), threadgroup=(64, 1, 1),
            output_shapes=[a.shape], output_dtypes=[torch.float32])[0]
    torch.testing.assert_close(out, a + 1)


def test_guide_grid_sample(device):
    """The guide's version: the kernel built once, grid=(int(mx.prod(mx.array(out_shape)).item()), 1, 1)."""
    source = GRID_SAMPLE_SOURCE

    kernel = kk.metal_kernel(
        name="grid_sample",
        input_names=["x", "grid"],
        output_names=["out"],
        source=source,
    )

    @kk.custom_function
    def grid_sample(x, grid):
        B, _, _, C = x.shape
        _, gN, gM, D = grid.shape
        out_shape = (B, gN, gM, C)

        outputs = kernel(
            inputs=[x, grid],
            template=[("T", x.dtype)],
            output_shapes=[out_shape],
            output_dtypes=[x.dtype],
            grid=(int(torch.prod(torch.tensor(out_shape)).item()), 1, 1),
            threadgroup=(256, 1, 1),
        )
        return outputs[0]

    x, grid_ = _grid_inputs(device)
    torch.testing.assert_close(grid_sample(x, grid_).double(),
                               grid_sample_ref(x.double(), grid_.double()), **TOL[torch.float32])


# --- curated_notes_patterns ------------------------------------------------------------------------

def test_notes_elementwise_and_strided(device):
    def exp_elementwise(a: torch.Tensor):
        src = """
            uint elem = thread_position_in_grid.x;
            T tmp = inp[elem];
            out[elem] = metal::exp(tmp);
        """

        kernel = kk.metal_kernel(
            name="myexp",
            input_names=["inp"],
            output_names=["out"],
            source=src,
        )
        out = kernel(
            inputs=[a],
            template=[("T", a.dtype)],  # dtype template
            grid=(a.numel(), 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
        )[0]
        return out

    def exp_elementwise_strided(a: torch.Tensor):
        src = """
            uint elem = thread_position_in_grid.x;
            // utils.h helpers are available automatically
            uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
            T tmp = inp[loc];
            // outputs are row contiguous
            out[elem] = metal::exp(tmp);
        """
        k = kk.metal_kernel(
            name="myexp_strided", input_names=["inp"], output_names=["out"], source=src
        )
        return k(
            inputs=[a],
            template=[("T", a.dtype)],
            grid=(a.numel(), 1, 1), threadgroup=(256, 1, 1),
            output_shapes=[a.shape], output_dtypes=[a.dtype],
            ensure_row_contiguous=False,  # opt-out of input copy
        )[0]

    a = torch.randn((4, 16), device=device).to(torch.float16)
    b = exp_elementwise(a)
    assert torch.allclose(b, torch.exp(a))
    x = torch.randn((4, 16), device=device).to(torch.float16)[::2]  # make non-contiguous
    y = exp_elementwise_strided(x)
    assert torch.allclose(y, torch.exp(x))


# Header (math helpers)
hdr = """
#include <metal_stdlib>
#include <metal_math>
using namespace metal;
"""

src = """
    // thread and problem sizing
    uint tid = thread_position_in_grid.x;
    uint n = A_shape[0];
    uint blk = block_param[0];      // block size
    uint nblk = (n + blk - 1) / blk;
    uint nthreads = thread_count[0];

    for (uint k = 0; k < nblk; ++k) {
        uint b0 = k * blk, b1 = min(b0 + blk, n);
        // 1) diagonal block with single thread for stability
        if (tid == 0) {
            for (uint j = b0; j < b1; ++j) {
                float s = 0.0f;
                for (uint p = 0; p < j; ++p) s += out[j*n + p] * out[j*n + p];
                float d = A[j*n + j] - s; d = d <= 1e-10f ? 1e-10f : d;
                out[j*n + j] = sqrt(d);
                for (uint i = j+1; i < b1; ++i) {
                    float acc = 0.0f;
                    for (uint p = 0; p < j; ++p) acc += out[i*n + p] * out[j*n + p];
                    float denom = out[j*n + j];
                    out[i*n + j] = denom > 1e-10f ? (A[i*n + j] - acc) / denom : 0.0f;
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_device);
        // 2) trailing updates: distribute rows across threads
        for (uint row = tid; row < n; row += nthreads) {
            if (row >= b1) {
                for (uint j = b0; j < b1; ++j) {
                    float acc = 0.0f;
                    for (uint p = 0; p < j; ++p) acc += out[row*n + p] * out[j*n + p];
                    float denom = out[j*n + j];
                    out[row*n + j] = denom > 1e-10f ? (A[row*n + j] - acc) / denom : 0.0f;
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_device);
    }
"""

block_cholesky_kernel = kk.metal_kernel(
    name="block_cholesky_kernel",
    input_names=["A", "block_param", "thread_count"],
    output_names=["out"],
    source=src, header=hdr, ensure_row_contiguous=True,
)


def block_cholesky(A, block_size=16):
    nthreads = min(32, A.shape[0])
    return block_cholesky_kernel(
        inputs=[A,
                torch.tensor([block_size], dtype=torch.uint32, device=A.device),
                torch.tensor([nthreads], dtype=torch.uint32, device=A.device)],
        output_shapes=[A.shape], output_dtypes=[A.dtype],
        grid=(nthreads, 1, 1), threadgroup=(nthreads, 1, 1),
    )[0]


@pytest.mark.parametrize("n, block_size", [(8, 16), (40, 16), (37, 8)])
def test_notes_block_cholesky(device, n, block_size):
    m = torch.randn(n, n, dtype=torch.float64, device=device)
    A = (m @ m.T + n * torch.eye(n, dtype=torch.float64, device=device)).float()
    L = block_cholesky(A, block_size)
    # The kernel writes the lower triangle only (the upper one is left as allocated)
    ref = torch.linalg.cholesky(A.double())
    torch.testing.assert_close(torch.tril(L).double(), ref, rtol=1e-4, atol=1e-4)


def test_notes_panel_qr_builds_and_runs(device):
    """The QR sketch's reflector steps are comments: it is built and launched, not checked."""
    hdr = """
#include <metal_stdlib>
using namespace metal;
"""

    src = r"""
    uint tid = thread_position_in_grid.x;
    uint m = A_shape[0];
    uint n = A_shape[1];
    uint bw = panel_shape[0];  // panel width

    for (uint k = 0; k < min(m, n); k += bw) {
        uint k1 = min(k + bw, n);
        // 1) form Householder vectors for columns k..k1-1 (single thread for stability)
        if (tid == 0) {
            // compute v, tau for each column; apply to panel
            // add small jitter if column norm is tiny to avoid breakdown
        }
        threadgroup_barrier(mem_flags::mem_device);
        // 2) apply block of reflectors to trailing matrix in parallel
        for (uint col = k1 + tid; col < n; col += grid_size.x) {
            // compute W = V^T * A[:, col]; A[:, col] -= V * (tau .* W)
        }
        threadgroup_barrier(mem_flags::mem_device);
    }
"""

    kernel = kk.metal_kernel(
        name="panel_qr_kernel",
        input_names=["A", "panel"], output_names=["Q", "R"],
        source=src, header=hdr, ensure_row_contiguous=True,
    )
    A = torch.randn(12, 9, device=device)
    Q, R = kernel(inputs=[A, torch.zeros(4, device=device)], output_shapes=[(12, 12), (12, 9)],
                  output_dtypes=[A.dtype, A.dtype], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                  init_value=0)
    assert Q.shape == (12, 12) and R.shape == (12, 9)


def launch_with_timeout(callable_kernel, args, kwargs=None, timeout_seconds=1.0):
    kwargs = {} if kwargs is None else kwargs
    def handler(signum, frame):
        raise TimeoutError(f"Kernel timed out after {timeout_seconds}s")
    orig = signal.getsignal(signal.SIGALRM)
    signal.signal(signal.SIGALRM, handler)
    signal.alarm(int(timeout_seconds))
    try:
        return callable_kernel(*args, **kwargs)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, orig)


def test_notes_launch_with_timeout(device):
    a = torch.randn(64, device=device)
    out = launch_with_timeout(kernel, (), dict(
        inputs=[a], template=[("T", a.dtype)], grid=(a.numel(), 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[a.shape], output_dtypes=[a.dtype]), timeout_seconds=30)[0]
    torch.testing.assert_close(out, torch.exp(a))
