"""relu(lhs @ rhs + bias) in one kernel: Burn's "custom cubecl kernel" example, with autodiff.

The forward is the tensor-op layer's matmul with the bias and relu applied to the accumulators
before the single store (matmul_add_relu.metal); the backward is Burn's (relu's mask from the saved
output, then two matmuls), its matmuls the same kernel without the relu. Beyond the guide: batch
dims broadcast (torch.broadcast_shapes), bias broadcasts to the output, and every operand is read
through its strides (no copies for broadcast or transposed operands).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch

from .. import cuda_kernel, custom_function, metal_kernel
from ..arrays import aligned
from ..preconditions import FLOATS, Preconditions
from . import hopper

_HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;
"""
_kernel = metal_kernel(name="matmul_add_relu", input_names=["lhs", "rhs", "bias"], output_names=["out"],
                       source=Path(__file__).with_name("matmul_add_relu.metal").read_text(), header=_HEADER,
                       ensure_row_contiguous=False, compile_options={"math_mode": "fast"})

# Hopper, 16-bit types: the layer's persistent GEMM (one threadgroup an SM, the next tile's loads
# under this tile's epilogue), where its TMA copies can read the operands (its shared memory the
# launcher reads off the cubin).
_persistent_kernel = cuda_kernel(
    name="matmul_add_relu_sm90", input_names=["lhs", "rhs", "bias"], output_names=["out"],
    source=Path(__file__).with_name("matmul_add_relu_sm90.cu").read_text(), header=hopper.HEADER,
    ensure_row_contiguous=False)

# (TILEM, TILEN, SG): on NVIDIA, 16-bit types take the warpgroup path with two warpgroups sharing
# a 256 x 128 tile (the talk matmul's fastest, bench/bench_talk_matmul.py); float (exact: mma.sync
# 3xTF32) and the CPU's loops keep 64 x 64 tiles of four SIMD-groups (32 sums a thread).
_WIDE, _NARROW = (256, 128, 8), (64, 64, 4)
_BAND = 16


def _tile(dtype: torch.dtype, device: torch.device, relaxed: bool) -> tuple[int, int, int]:
    wide = device.type == "cuda" and (dtype in (torch.float16, torch.bfloat16) or
                                      (dtype == torch.float32 and relaxed))
    return _WIDE if wide else _NARROW


def _as3d(t: torch.Tensor) -> torch.Tensor | None:
    """t (..., R, C) as a (batch, R, C) view, or None where its batch dims do not collapse."""
    try:
        return t.view(-1, *t.shape[-2:])
    except RuntimeError:
        return None


def _tma_operand(t: torch.Tensor) -> int | None:
    """1 if TMA reads the 3-D operand t K-major (last dim contiguous), 0 if MN-major (rows
    contiguous), None if it cannot: strides and base 16-byte aligned (a batch stride of 0 is a
    broadcast: one matrix)."""
    s = t.stride()
    if s[2] == 1:
        major, row = 1, s[1]
    elif s[1] == 1:
        major, row = 0, s[2]
    else:
        return None
    if (row * 2) % 16 or row <= 0 or (s[0] * 2) % 16:
        return None
    return major if aligned(t, 16) else None


def _persistent(lhs, rhs, bias, out_shape, relu: bool) -> torch.Tensor | None:
    """The fused op by the persistent Hopper GEMM, or None where it does not apply."""
    dev = lhs.device
    if dev.type != "cuda" or lhs.dtype not in (torch.float16, torch.bfloat16) or hopper.sm90_sms(dev) is None:
        return None
    M, K = lhs.shape[-2:]
    N = rhs.shape[-1]
    batch = out_shape[:-2]
    a, b = _as3d(lhs.expand(*batch, M, K)), _as3d(rhs.expand(*batch, K, N))
    c = a if bias is None else _as3d(bias.expand(out_shape))  # (no bias: never read)
    if a is None or b is None or c is None or N % 8 or max(M, N, K, a.shape[0]) >= 2**31:
        return None
    ka, kb = _tma_operand(a), _tma_operand(b.transpose(1, 2))
    if ka is None or kb is None:
        return None
    # the bias: none, tiles the layer stages by TMA, pairs it loads under the last MMAs (a row
    # for all rows: TMA wants a nonzero row stride), or elements the epilogue loads
    s = c.stride()
    pairs = s[2] == 1 and s[0] % 2 == 0 and s[1] % 2 == 0 and aligned(c, 4)
    tiles = pairs and s[1] > 0 and s[1] % 8 == 0 and s[0] % 8 == 0 and aligned(c, 16)
    mode = 0 if bias is None else 3 if tiles else 1 if pairs else 2
    launch = hopper.launch(dev, a.shape[0] * -(-M // 128) * -(-N // 256))
    if launch is None:
        return None
    template = [("T", lhs.dtype), ("KA", ka), ("KB", kb), ("BIAS", mode), ("RELU", int(relu))]
    return _persistent_kernel(inputs=[a, b, c], template=template, output_shapes=[out_shape],
                              output_dtypes=[lhs.dtype], **launch)[0]


def _broadcast(*shapes) -> tuple:
    """torch.broadcast_shapes, without its cost (~25 us a call: symbolic-shape checks) where the
    sizes are plain ints."""
    if any(type(d) is not int for s in shapes for d in s):
        return tuple(torch.broadcast_shapes(*shapes))
    out = []
    for dims in itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        sizes = set(dims) - {1}
        if len(sizes) > 1:
            raise RuntimeError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(reversed(out))


def _output_shape(lhs, rhs, bias) -> tuple[int, ...]:
    """The output's shape, after checking the operands."""
    pre = Preconditions("matmul_add_relu")
    pre.tensor("lhs", lhs, dtype=FLOATS, shape=(..., "M", "K"))
    pre.tensor("rhs", rhs, dtype="lhs", shape=(..., "K", "N"))
    pre.tensor("bias", bias, dtype="lhs")
    try:
        batch = _broadcast(lhs.shape[:-2], rhs.shape[:-2])
    except RuntimeError:
        pre.fail(f"the batch dims of lhs {tuple(lhs.shape)} and rhs {tuple(rhs.shape)} do not broadcast.")
    out_shape = (*batch, pre["M"], pre["N"])
    try:
        ok = _broadcast(out_shape, bias.shape) == out_shape
    except RuntimeError:
        ok = False
    if not ok:
        pre.fail(f"bias of shape {tuple(bias.shape)} does not broadcast to the output's shape {out_shape}.")
    return out_shape


def _fused(lhs, rhs, bias, out_shape, relu: bool, relaxed: bool) -> torch.Tensor:
    """(relu)(lhs @ rhs + bias) for checked operands (bias None: no bias), by the kernel."""
    M, K = lhs.shape[-2:]
    N = rhs.shape[-1]
    if math.prod(out_shape) == 0:
        return lhs.new_empty(out_shape)
    if K == 0:  # an empty sum: nothing to multiply
        b = (lhs.new_zeros(()) if bias is None else bias).expand(out_shape)
        return (torch.relu(b) if relu else b).contiguous()
    fast = _persistent(lhs, rhs, bias, out_shape, relu)
    if fast is not None:
        return fast
    if bias is None:  # a plain product (the backward's): the kernel adds a zero
        bias = lhs.new_zeros(())
    batch = out_shape[:-2]
    tm, tn, sg = _tile(lhs.dtype, lhs.device, relaxed)
    groups = math.prod(batch) * -(-M // tm) * -(-N // tn)
    if groups * 32 * sg >= 2**32:
        raise ValueError(f"matmul_add_relu: output {out_shape} needs {groups} threadgroups, more than "
                         "one launch takes; split the batch.")
    if max(M, N, K) >= 2**31 or max(map(abs, (*lhs.stride(), *rhs.stride(), *bias.stride(), 0))) >= 2**31:
        raise ValueError(f"matmul_add_relu: matrices of {M} x {K} and {K} x {N} (or their or the bias's "
                         "strides) pass 2**31 elements; the tiles index them with 32-bit ints.")
    acc = torch.float64 if lhs.dtype == torch.float64 else torch.float32
    # Broadcasting as views (stride 0): the kernel reads every operand through its strides.
    return _kernel(inputs=[lhs.expand(*batch, M, K), rhs.expand(*batch, K, N), bias.expand(out_shape)],
                   template=[("T", lhs.dtype), ("ACC", acc), ("TILEM", tm), ("TILEN", tn), ("SG", sg),
                             ("BAND", _BAND), ("RELU", int(relu)), ("RELAXED", int(relaxed))],
                   output_shapes=[out_shape], output_dtypes=[lhs.dtype], grid=(groups * 32 * sg, 1, 1),
                   threadgroup=(32 * sg, 1, 1))[0]


def matmul_add_relu_forward(lhs, rhs, bias, relaxed_precision: bool = False) -> torch.Tensor:
    """relu(lhs @ rhs + bias) by the fused kernel, not differentiable."""
    return _fused(lhs, rhs, bias, _output_shape(lhs, rhs, bias), True, relaxed_precision)


def _product_shape(a, b) -> tuple:
    """The shape of a @ b for checked operands (batch dims broadcast)."""
    return (*_broadcast(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])


def _matmul(a, b, relaxed: bool) -> torch.Tensor:
    """a @ b (batch dims broadcast) on the forward's tiles, no epilogue."""
    return _fused(a, b, None, _product_shape(a, b), False, relaxed)


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """The gradient of broadcasting to t.shape from `shape`: sum over the broadcast dims."""
    lead = t.ndim - len(shape)
    if lead:
        t = t.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def matmul_add_relu_backward(lhs, rhs, bias, cotangent, output, relaxed_precision: bool = False):
    """(lhs_grad, rhs_grad, bias_grad), as Burn's backward: relu's mask, then two matmuls (the
    forward's kernel)."""
    grad = torch.where(output > 0, cotangent, torch.zeros((), dtype=cotangent.dtype,
                                                          device=cotangent.device))  # relu_backward
    return (_sum_to(_matmul(grad, rhs.transpose(-1, -2), relaxed_precision), lhs.shape),
            _sum_to(_matmul(lhs.transpose(-1, -2), grad, relaxed_precision), rhs.shape),
            _sum_to(grad, bias.shape))


# The custom functions' operands were checked by matmul_add_relu.
@custom_function
def _exact(lhs, rhs, bias):
    return _fused(lhs, rhs, bias, _product_shape(lhs, rhs), True, False)


@_exact.vjp
def _exact_vjp(primals, cotangent, output):
    return matmul_add_relu_backward(*primals, cotangent, output)


@custom_function
def _relaxed(lhs, rhs, bias):
    return _fused(lhs, rhs, bias, _product_shape(lhs, rhs), True, True)


@_relaxed.vjp
def _relaxed_vjp(primals, cotangent, output):
    return matmul_add_relu_backward(*primals, cotangent, output, relaxed_precision=True)


def matmul_add_relu(lhs: torch.Tensor, rhs: torch.Tensor, bias: torch.Tensor,
                    relaxed_precision: bool = False) -> torch.Tensor:
    """relu(lhs @ rhs + bias) for lhs (..., M, K), rhs (..., K, N) with broadcasting batch dims and
    bias broadcastable to the output (..., M, N); float16/bfloat16/float32/float64, sums in float32
    (float64 for float64). float32 is exact unless relaxed_precision=True allows tf32 products.
    Differentiable in all three (the backward's matmuls on the same tiles)."""
    _output_shape(lhs, rhs, bias)
    return (_relaxed if relaxed_precision else _exact)(lhs, rhs, bias)


def matmul_add_relu_reference(lhs, rhs, bias) -> torch.Tensor:
    """The plain-torch reference, as Burn's: relu(lhs @ rhs + bias)."""
    return torch.relu(lhs @ rhs + bias)
