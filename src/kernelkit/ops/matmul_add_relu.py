"""relu(lhs @ rhs + bias) in one kernel: Burn's "custom cubecl kernel" example, with autodiff.

As in Burn's guide, the forward is a fused kernel and the backward is built from plain tensor
ops (relu's mask from the saved output, then two matmuls), so only the forward needs a kernel.
Beyond the guide: batch dims broadcast (torch.broadcast_shapes), bias broadcasts to the output,
inputs are read through their strides (no copies for broadcast or transposed operands), and
the matmul is tiled through threadgroup memory rather than one dot product per thread.
"""

from __future__ import annotations

import math

import torch

from .. import custom_function, metal_kernel
from ..preconditions import FLOATS, Preconditions

# A threadgroup of 16 x 16 threads computes a 64 x 64 tile of one batch's output, stepping
# through K 16 at a time: both operand tiles go through threadgroup memory, so every value
# read from device memory is used 64 times, and each thread keeps a 4 x 4 block of sums in
# registers. Thread (tx, ty) owns rows ty + 16 i and columns tx + 16 j: in the inner loop, a
# row of 16 threads reads one lhs value (a broadcast) and 16 consecutive rhs values (no bank
# conflicts), and the final stores of those 16 threads are consecutive in memory.
SOURCE = """
    const int nd = lhs_ndim;
    const int M = lhs_shape[nd - 2];
    const int K = lhs_shape[nd - 1];
    const int N = rhs_shape[nd - 1];
    const uint tiles_n = ceildiv(N, BN);
    const uint tiles_m = ceildiv(M, BM);
    const uint g = threadgroup_position_in_grid.x;
    const int n0 = (g % tiles_n) * BN;
    const int m0 = (g / tiles_n % tiles_m) * BM;
    const uint batch = g / (tiles_n * tiles_m);
    const uint tid = thread_index_in_threadgroup;
    const int tx = tid % 16;
    const int ty = tid / 16;

    // Where this batch's matrices start: the batch dims may broadcast (stride 0).
    const device T* a = lhs + elem_to_loc(int64_t(batch), lhs_shape, lhs_strides, nd - 2);
    const device T* b = rhs + elem_to_loc(int64_t(batch), rhs_shape, rhs_strides, nd - 2);
    const device T* c = bias + elem_to_loc(int64_t(batch), bias_shape, bias_strides, nd - 2);
    const int64_t a_m = lhs_strides[nd - 2], a_k = lhs_strides[nd - 1];
    const int64_t b_k = rhs_strides[nd - 2], b_n = rhs_strides[nd - 1];
    const int64_t c_m = bias_strides[nd - 2], c_n = bias_strides[nd - 1];

    // +1: the lhs tile is stored transposed (As[k][m]), the padding spreads its stores over banks
    threadgroup A As[BK][BM + 1];
    threadgroup A Bs[BK][BN];
    A acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = A(0);

    for (int k0 = 0; k0 < K; k0 += BK) {
        // Load the tiles, zero past the edges; consecutive threads take consecutive k (lhs)
        // and consecutive n (rhs), the contiguous dims of row-major operands.
        for (uint e = tid; e < BM * BK; e += 256) {
            int r = e / BK, q = e % BK;
            int m = m0 + r, k = k0 + q;
            As[q][r] = m < M && k < K ? A(a[m * a_m + k * a_k]) : A(0);
        }
        for (uint e = tid; e < BK * BN; e += 256) {
            int q = e / BN, col = e % BN;
            int k = k0 + q, n = n0 + col;
            Bs[q][col] = k < K && n < N ? A(b[k * b_k + n * b_n]) : A(0);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int q = 0; q < BK; ++q) {
            A av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = As[q][ty + 16 * i];
            for (int j = 0; j < 4; ++j) bv[j] = Bs[q][tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next tiles overwrite these
    }

    device T* o = out + int64_t(batch) * M * N;
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty + 16 * i;
        if (m >= M) break;
        for (int j = 0; j < 4; ++j) {
            int n = n0 + tx + 16 * j;
            if (n >= N) break;
            A v = acc[i][j] + A(c[m * c_m + n * c_n]);
            o[int64_t(m) * N + n] = T(v < A(0) ? A(0) : v);  // relu; NaN stays NaN, as torch.relu
        }
    }
"""

_BM, _BN, _BK = 64, 64, 16
_kernel = metal_kernel(name="matmul_add_relu", input_names=["lhs", "rhs", "bias"], output_names=["out"],
                       source=SOURCE, ensure_row_contiguous=False,
                       compile_options={"math_mode": "relaxed"})  # FMA contraction, IEEE division


def _output_shape(lhs, rhs, bias) -> tuple[int, ...]:
    """The output's shape, after checking the operands."""
    pre = Preconditions("matmul_add_relu")
    pre.tensor("lhs", lhs, dtype=FLOATS, shape=(..., "M", "K"))
    pre.tensor("rhs", rhs, dtype="lhs", shape=(..., "K", "N"))
    pre.tensor("bias", bias, dtype="lhs")
    try:
        batch = torch.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2])
    except RuntimeError:
        pre.fail(f"the batch dims of lhs {tuple(lhs.shape)} and rhs {tuple(rhs.shape)} do not broadcast.")
    out_shape = (*batch, pre["M"], pre["N"])
    try:
        ok = torch.broadcast_shapes(out_shape, bias.shape) == out_shape
    except RuntimeError:
        ok = False
    if not ok:
        pre.fail(f"bias of shape {tuple(bias.shape)} does not broadcast to the output's shape {out_shape}.")
    return out_shape


def matmul_add_relu_forward(lhs, rhs, bias) -> torch.Tensor:
    """relu(lhs @ rhs + bias) by the fused kernel, not differentiable."""
    out_shape = _output_shape(lhs, rhs, bias)
    M, K = lhs.shape[-2:]
    N = rhs.shape[-1]
    if math.prod(out_shape) == 0:
        return lhs.new_empty(out_shape)
    if K == 0:  # an empty sum: nothing to multiply
        return torch.relu(bias.expand(out_shape)).contiguous()
    batch = out_shape[:-2]
    groups = math.prod(batch) * -(-M // _BM) * -(-N // _BN)
    if groups * 256 >= 2**32:
        raise ValueError(f"matmul_add_relu: output {out_shape} needs {groups} threadgroups, more than "
                         "one launch takes; split the batch.")
    acc = torch.float64 if lhs.dtype == torch.float64 else torch.float32
    # Broadcasting as views (stride 0): the kernel reads every operand through its strides.
    return _kernel(inputs=[lhs.expand(*batch, M, K), rhs.expand(*batch, K, N), bias.expand(out_shape)],
                   template=[("T", lhs.dtype), ("A", acc), ("BM", _BM), ("BN", _BN), ("BK", _BK)],
                   output_shapes=[out_shape], output_dtypes=[lhs.dtype], grid=(groups * 256, 1, 1),
                   threadgroup=(256, 1, 1))[0]


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """The gradient of broadcasting to t.shape from `shape`: sum over the broadcast dims."""
    lead = t.ndim - len(shape)
    if lead:
        t = t.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def matmul_add_relu_backward(lhs, rhs, bias, cotangent, output):
    """(lhs_grad, rhs_grad, bias_grad) from plain torch ops, as Burn's backward."""
    grad = torch.where(output > 0, cotangent, torch.zeros((), dtype=cotangent.dtype,
                                                          device=cotangent.device))  # relu_backward
    return (_sum_to(grad @ rhs.transpose(-1, -2), lhs.shape),
            _sum_to(lhs.transpose(-1, -2) @ grad, rhs.shape),
            _sum_to(grad, bias.shape))


@custom_function
def _matmul_add_relu(lhs, rhs, bias):
    return matmul_add_relu_forward(lhs, rhs, bias)


@_matmul_add_relu.vjp
def _matmul_add_relu_vjp(primals, cotangent, output):
    return matmul_add_relu_backward(*primals, cotangent, output)


def matmul_add_relu(lhs: torch.Tensor, rhs: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(lhs @ rhs + bias) for lhs (..., M, K), rhs (..., K, N) with broadcasting batch dims and
    bias broadcastable to the output (..., M, N); float16/bfloat16/float32/float64, sums in float32
    (float64 for float64). Differentiable in all three."""
    _output_shape(lhs, rhs, bias)
    return _matmul_add_relu(lhs, rhs, bias)


def matmul_add_relu_reference(lhs, rhs, bias) -> torch.Tensor:
    """The plain-torch reference, as Burn's: relu(lhs @ rhs + bias)."""
    return torch.relu(lhs @ rhs + bias)
