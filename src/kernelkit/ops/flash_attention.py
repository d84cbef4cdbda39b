"""Flash attention, as the tensor-ops talk writes it: softmax(q k^T * scale) v in one pass over
the keys, never holding the scores, with a FlashAttention-2 backward; differentiable.

The forward (flash_attention_forward.metal) is the talk's loop on kernelkit's tensor-op layer:
QK^T into a cooperative tensor by matmul2d, reduce_rows for the running max, map_iterator for
the exponentials and the rescaling, and the probabilities reused in registers as the left input
of the PV matmul2d. It keeps each row's log-sum-exp for the backward, which recomputes the
probabilities from it: one kernel for dQ (it also computes D = rowsum(dO * O)), one for dK and
dV (each threadgroup owns a block of keys and sums over every query head that reads them), so no
atomics. Every kernel's ops span its threadgroup (on Hopper a warpgroup's wgmma, a left-input
cooperative tensor its register operand, the tiles read from device memory staged by the ops).
On Hopper the 16-bit forward at D = 64 and 128 runs instead on the layer's warp-specialised
kernel (tensor_ops/sm90_attention.h, flash_attention_sm90.cu), where TMA can read the tensors,
and so does the backward (tensor_ops/sm90_attention_backward.h, flash_attention_sm90_backward.cu).
Causal masking is top-left aligned, as torch's scaled_dot_product_attention(is_causal=True):
query i sees keys j <= i, whatever the two lengths.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .. import cuda_kernel, custom_function, metal_kernel
from ..arrays import aligned
from ..autodiff import kernel_backward, record_op
from ..preconditions import FLOATS, Preconditions, check_once
from . import hopper

_HERE = Path(__file__)
_HEADER = _HERE.with_name("flash_attention.metal").read_text()
# SIMD-groups a threadgroup, 16 query (or key) rows each: one warpgroup (two, sharing the staged
# tiles, measured 7-18% slower in every kernel: one threadgroup an SM in lockstep, H100)
_NW = 4
_HEAD_DIMS = (64, 128, 256)
_LAYOUTS = ("bhsd", "bshd")


def _kernel(name: str, inputs: list[str], outputs: list[str]):
    return metal_kernel(name=f"flash_attention_{name}", input_names=inputs, output_names=outputs,
                        source=_HERE.with_name(f"flash_attention_{name}.metal").read_text(),
                        header=_HEADER, ensure_row_contiguous=False,
                        compile_options={"math_mode": "fast"})  # contracted FMAs, exp2 approximations


_forward = _kernel("forward", ["q", "k", "v", "scale", "causal"], ["o", "lse"])
_dq = _kernel("dq", ["q", "k", "v", "o", "dout", "lse", "dlse", "scale", "causal"], ["dq", "delta"])
_dkdv = _kernel("dkdv", ["q", "k", "v", "dout", "lse", "delta", "scale", "causal"], ["dk", "dv"])


# Hopper, 16-bit types, D = 64 or 128: the layer's warp-specialised forward (a producer warpgroup
# streaming K and V by TMA, consumers of 64 queries each overlapping softmax with the MMAs), one
# threadgroup an SM.
def _sm90_kernel(name: str, inputs: list[str], outputs: list[str], threads: int = hopper.THREADS):
    return cuda_kernel(name=f"flash_attention_{name}", input_names=inputs, output_names=outputs,
                       source=_HERE.with_name(f"flash_attention_{name}.cu").read_text(), header=hopper.header(threads),
                       ensure_row_contiguous=False)


def _sm90_forward_shape(d: int) -> tuple[int, int]:
    """(queries a tile, threads) of the forward at this D (attention_forward's block_q and
    threads): consumer warpgroups of 64 queries, three at D = 64, two at D = 128, and a producer."""
    consumers = 3 if d == 64 else 2
    return 64 * consumers, 128 * (consumers + 1)


_sm90_forward = {d: _sm90_kernel("sm90", ["q", "k", "v", "scale"], ["o", "lse", "next_tile"],
                                 threads=_sm90_forward_shape(d)[1]) for d in (64, 128)}
# Its backward (tensor_ops/sm90_attention_backward.h): persistent threadgroups over the blocks of
# keys, each block's K and V held, the query blocks streamed; the per-query inputs (and its zeroed
# float sums) made before it, dq from those sums after.
_sm90_prep = _sm90_kernel("sm90_prep", ["o", "dout", "lse", "dlse"], ["lse2", "delta", "dq_acc"])
_sm90_backward = _sm90_kernel("sm90_backward", ["q", "k", "v", "dout", "lse2", "delta", "dq_acc", "scale"],
                              ["dk", "dv"])
_sm90_dq = _sm90_kernel("sm90_dq", ["dq_acc", "scale", "batches", "heads", "rows"], ["dq"])
_SM90_BLOCK = 128  # keys a backward tile


def _sm90_rows(d: int) -> int:
    """Queries a backward step (attention_backward's block_q)."""
    return 128 if d == 64 else 64


def _tma_strides(shape, strides, size: int) -> tuple | None:
    """The strides with which TMA reads a (B, H, S, D) view of these shape and strides (elements of
    `size` bytes), or None where it cannot: the last dim packed, strides 16-byte aligned, nonzero
    and below 2**40 bytes (a size-1 dim's stride, never used, made valid)."""
    if strides[3] != 1:
        return None
    strides, inner = list(strides), shape[3]
    for i in (2, 1, 0):
        if shape[i] == 1 and strides[i] != inner:
            strides[i] = inner
        if strides[i] <= 0 or (strides[i] * size) % 16 or strides[i] * size >= 2**40:
            return None
        inner = strides[i] * shape[i]
    return tuple(strides)


class _Views:
    """How the Hopper kernels see tensors of one signature (shapes, strides, dtypes), worked out
    once (a call's glue is a sizeable share of its host time at small sizes): for each tensor
    the shape and TMA strides of its (B, H, S, D) view, _AS_IS where that is the tensor itself,
    None where TMA cannot read it."""

    __slots__ = ("layout", "views")

    def __init__(self, tensors, layout: str):
        self.layout, self.views = layout, []
        for x in tensors:
            shape, strides = _bhsd_dims(x.shape, layout), _bhsd_dims(x.stride(), layout)
            tma = _tma_strides(shape, strides, x.element_size())
            self.views.append(None if tma is None else _AS_IS if layout == "bhsd" and tma == strides
                              else (torch.Size(shape), tma))

    def take(self, tensors, first: int = 0, copy: bool = False) -> list | None:
        """The views of a call's tensors (those of this signature from the `first`): None if one
        cannot be read (its strides, or its base off 16 bytes), or with copy=True a packed copy
        of that one (which the prep kernel's pair loads read too)."""
        out = []
        for x, view in zip(tensors, self.views[first:]):
            if view is None or not aligned(x, 16):
                if not copy:
                    return None
                out.append(_bhsd(x, self.layout).contiguous())
            else:
                out.append(x if view is _AS_IS else x.as_strided(*view))
        return out


_AS_IS = "as is"


_SIGNATURES: dict = {}  # the Hopper calls' plans, by signature (a few hundred at most)


def _signature(kind: str, tensors, flags: tuple, make):
    """The plan of a call of this kind, tensors (their shapes, strides, dtypes and device) and
    flags: make() on the first call of a signature."""
    key = [kind, flags, tensors[0].device]
    for x in tensors:  # (a loop: generators cost more, on every call)
        key += (x.dtype, x.shape, x.stride())
    key = tuple(key)
    plan = _SIGNATURES.get(key, False)
    if plan is False:
        if len(_SIGNATURES) >= 512:
            _SIGNATURES.clear()
        plan = _SIGNATURES[key] = make()
    return plan


def _hopper(q) -> bool:
    """Whether the Hopper kernels take this call: 16-bit types, D = 64 or 128, on sm_90."""
    return (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] in (64, 128)
            and hopper.sm90_sms(q.device) is not None)


def _sm90_forward_plan(q, k, v, causal: bool, layout: str):
    """(views, the forward kernel's arguments but its inputs), or None where it does not apply."""
    if not _hopper(q):
        return None
    views = _Views((q, k, v), layout)
    if None in views.views:
        return None
    B, H, Sq, D = _bhsd(q, layout).shape
    block_q, threads = _sm90_forward_shape(D)
    launch = hopper.launch(q.device, B * H * -(-Sq // block_q), threads)
    if launch is None:
        return None
    template = [("T", q.dtype), ("D", D), ("BSHD", layout == "bshd"),
                ("CAUSAL", causal)]  # (a kernel for each: flash_attention_sm90.cu)
    return views, dict(template=template,
                       output_shapes=[q.shape, (B, H, Sq), (1,)], output_dtypes=[q.dtype, torch.float32, torch.int32],
                       init_value=[None, None, 0] if causal else None, **launch)  # (next_tile: causal only)


def _sm90(q, k, v, causal: bool, scale: float, layout: str):
    """(o, lse) by the Hopper kernel, or None where it does not apply."""
    plan = _signature("forward", (q, k, v), (causal, layout), lambda: _sm90_forward_plan(q, k, v, causal, layout))
    if plan is None or scale <= 0:
        return None
    views, args = plan
    tensors = views.take((q, k, v))
    if tensors is None:
        return None
    o, lse, _ = _sm90_forward[q.shape[-1]](inputs=[*tensors, float(scale)], **args)
    return o, lse


def _sm90_backward_plan(q, k, v, o, dout, causal: bool, layout: str):
    """(views of q, k, v, o, dout, the three kernels' arguments but their inputs, (B, H, Sq) of
    dq's kernel), or None where they do not apply."""
    if not _hopper(q):
        return None
    views = _Views((q, k, v, o, dout), layout)
    if None in views.views[:3]:
        return None
    B, H, Sq, D = _bhsd(q, layout).shape
    Hkv, Sk = _bhsd(k, layout).shape[1:3]
    rows = _sm90_rows(D)
    sqp = -(-Sq // rows) * rows
    launch = hopper.launch(q.device, -(-Sk // _SM90_BLOCK) * Hkv * B)
    if launch is None:
        return None
    types = [("T", q.dtype), ("D", D)]
    sums = B * H * sqp * D
    f32 = torch.float32
    return (views,  # (dq_acc: the backward's float sums, zeroed, and its tile counter)
            dict(template=types, output_shapes=[(B, H, sqp), (B, H, sqp), (sums + 4,)], output_dtypes=[f32] * 3,
                 grid=(sums // 8, 1, 1), threadgroup=(256, 1, 1)),
            dict(template=types + [("BSHD", layout == "bshd"), ("CAUSAL", causal)],
                 output_shapes=[k.shape, v.shape], output_dtypes=[q.dtype, q.dtype], **launch),
            dict(template=types + [("BSHD", layout == "bshd")], output_shapes=[q.shape], output_dtypes=[q.dtype],
                 grid=(sums // 4, 1, 1), threadgroup=(256, 1, 1)),
            (B, H, Sq))


def _sm90_gradients(q, k, v, o, lse, dout, dlse, causal: bool, scale: float, layout: str):
    """(dq, dk, dv) by the Hopper kernels, or None where they do not apply."""
    dout = dout if dout.dtype == q.dtype else dout.to(q.dtype)
    plan = _signature("backward", (q, k, v, o, dout), (causal, layout),
                      lambda: _sm90_backward_plan(q, k, v, o, dout, causal, layout))
    if plan is None or scale <= 0:
        return None
    views, prep_args, backward_args, dq_args, (B, H, Sq) = plan
    qkv = views.take((q, k, v))
    if qkv is None:
        return None
    o4, do4 = views.take((o, dout), first=3, copy=True)
    if dlse is None:
        dlse = torch.zeros((), dtype=torch.float32, device=q.device)
    elif dlse.dtype != torch.float32:
        dlse = dlse.to(torch.float32)
    if dlse.shape != (B, H, Sq):  # (custom_function's zero for an unused lse is one already)
        dlse = dlse.expand(B, H, Sq)
    lse2, delta, dq_acc = _sm90_prep(inputs=[o4, do4, lse, dlse], **prep_args)
    dk, dv = _sm90_backward(inputs=[*qkv, do4, lse2, delta, dq_acc, float(scale)], **backward_args)
    dq, = _sm90_dq(inputs=[dq_acc, float(scale), B, H, Sq], **dq_args)
    return dq, dk, dv


def _keys(d: int) -> int:
    """Keys a forward step reads: the forward's ops read K and V from device memory (on Hopper
    they stage them themselves for wgmma, whose n is a multiple of 64 up to 256), as many as
    the scores and the output leave registers for (a step's fixed costs shared by more keys:
    at D = 64, 256 keys 289 TFLOP/s against 231 with 128, H100)."""
    return 256 if d <= 64 else 128 if d <= 128 else 64


def _step(d: int) -> int:
    """Keys a dQ step reads, queries a dK / dV step: its scores and dP stay in registers beside
    the sums (at D = 64 a step of 128 has room: the backward 131 -> 167 TFLOP/s at B=4 H=16
    S=4096, H100)."""
    return 128 if d <= 64 else 64


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with its last dim packed (the kernels read any other strides as they are)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The (B, H, S, D) view of x."""
    return x.transpose(1, 2) if layout == "bshd" else x


def _bhsd_dims(dims, layout: str) -> tuple:
    """The sizes (or strides) of the (B, H, S, D) view of a tensor of these."""
    return (dims[0], dims[2], dims[1], dims[3]) if layout == "bshd" else tuple(dims)


def _scale(scale: float, dtype: torch.dtype, device):
    """A float32 scalar, or a float64 one for float64 (a Python float is passed as float32)."""
    return torch.tensor(scale, dtype=dtype, device=device) if dtype == torch.float64 else float(scale)


def _template(dtype: torch.dtype, d: int, layout: str, kernel: str):
    """The template arguments of kernel "forward", "dq" or "dkdv"."""
    bk = _keys(d) if kernel == "forward" else _step(d)
    return [("T", dtype), ("A", _acc(dtype)), ("D", d), ("BK", bk), ("NW", _NW), ("BSHD", layout == "bshd")]


def _launch(rows: int, heads: int, batch: int) -> dict:
    """Grid and threadgroup of a kernel over `rows` queries (or keys) of `heads` heads and `batch`."""
    return dict(grid=(_NW * 32 * -(-rows // (_NW * 16)), heads, batch), threadgroup=(_NW * 32, 1, 1))


def _check(q, k, v, causal, scale, layout) -> Preconditions:
    pre = Preconditions("flash_attention")
    pre.choice("layout", layout, _LAYOUTS)
    dims = ("B", "H", "Sq", "D") if layout == "bhsd" else ("B", "Sq", "H", "D")
    kv_dims = ("B", "Hkv", "Sk", "D") if layout == "bhsd" else ("B", "Sk", "Hkv", "D")
    pre.tensor("q", q, dtype=FLOATS, shape=dims)
    pre.tensor("k", k, dtype="q", shape=kv_dims)
    pre.tensor("v", v, dtype="q", shape=kv_dims)
    pre.flag("causal", causal)
    if pre["D"] not in _HEAD_DIMS:
        pre.fail(f"head dim D={pre['D']} is not supported; expected one of {_HEAD_DIMS}.")
    if pre["Hkv"] == 0 or pre["H"] % pre["Hkv"]:
        pre.fail(f"q has {pre['H']} heads and k, v have {pre['Hkv']}; grouped-query attention needs "
                 "the query heads to be a multiple of the key/value heads.")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        pre.fail(f"scale must be a finite number or None, got {scale!r}.", TypeError)
    for name, n in (("B", pre["B"]), ("H", pre["H"])):
        if n > 65535:
            pre.fail(f"{name}={n} is more than a launch takes (65535); split the call.")
    return pre


def _dims(q, k, layout: str) -> tuple[int, ...]:
    """(B, H, Sq, D, Hkv, Sk) of checked operands."""
    B, H, Sq, D = _bhsd(q, layout).shape
    return B, H, Sq, D, *_bhsd(k, layout).shape[1:3]


def _attend(q, k, v, causal: bool, scale: float | None, layout: str):
    """(output, lse) of checked operands."""
    B, H, Sq, D, _, Sk = _dims(q, k, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    acc = _acc(q.dtype)
    if B * H * Sq == 0 or Sk == 0:  # no keys: softmax over nothing is zeros, as torch's SDPA
        lse = torch.full((B, H, Sq), -math.inf, dtype=acc, device=q.device)
        return torch.zeros_like(q, memory_format=torch.contiguous_format), lse
    fast = _sm90(q, k, v, causal, scale, layout)
    if fast is not None:
        return fast
    o, lse = _forward(inputs=[_rows(_bhsd(q, layout)), _rows(_bhsd(k, layout)), _rows(_bhsd(v, layout)),
                              _scale(scale, acc, q.device), causal],
                      template=_template(q.dtype, D, layout, "forward"), output_shapes=[q.shape, (B, H, Sq)],
                      output_dtypes=[q.dtype, acc], **_launch(Sq, H, B))
    return o, lse


def _gradients(q, k, v, o, lse, dout, dlse, causal: bool, scale: float | None, layout: str):
    """(dq, dk, dv) of checked operands."""
    B, H, Sq, D, Hkv, Sk = _dims(q, k, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    acc = _acc(q.dtype)
    if B * H * Sq == 0 or Sk == 0:  # nothing depends on q, k or v
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    fast = _sm90_gradients(q, k, v, o, lse, dout, dlse, causal, scale, layout)
    if fast is not None:
        return fast
    dlse = torch.zeros((), dtype=acc, device=q.device) if dlse is None else dlse
    q4, k4, v4 = (_rows(_bhsd(x, layout)) for x in (q, k, v))
    o4, do4 = _rows(_bhsd(o, layout)), _rows(_bhsd(dout.to(q.dtype), layout))
    lse = lse.to(acc).contiguous()
    s = _scale(scale, acc, q.device)
    dq, delta = _dq(inputs=[q4, k4, v4, o4, do4, lse, dlse.to(acc).expand(B, H, Sq).contiguous(), s, causal],
                    template=_template(q.dtype, D, layout, "dq"), output_shapes=[q.shape, (B, H, Sq)],
                    output_dtypes=[q.dtype, acc],
                    **_launch(Sq, H, B))
    dk, dv = _dkdv(inputs=[q4, k4, v4, do4, lse, delta, s, causal],
                   template=_template(q.dtype, D, layout, "dkdv"),
                   output_shapes=[k.shape, v.shape], output_dtypes=[q.dtype, q.dtype],
                   **_launch(Sk, Hkv, B))
    return dq, dk, dv


def _check_call(q, k, v, causal, scale, layout, return_lse) -> None:
    _check(q, k, v, causal, scale, layout).flag("return_lse", return_lse)


def flash_attention_forward(q, k, v, causal: bool = False, scale: float | None = None,
                            layout: str = "bhsd") -> tuple[torch.Tensor, torch.Tensor]:
    """(output, lse) by the forward kernel, not differentiable. lse: (B, H, Sq), the natural log of
    each row's sum of exp(scores * scale), float32 (float64 for float64)."""
    _check(q, k, v, causal, scale, layout)
    return _attend(q, k, v, causal, scale, layout)


def flash_attention_backward(q, k, v, o, lse, dout, dlse=None, causal: bool = False,
                             scale: float | None = None, layout: str = "bhsd"):
    """(dq, dk, dv) from the output o and lse of the forward and the output's cotangent dout (and
    lse's, dlse, if any): FlashAttention-2's backward, in two kernels (on Hopper, where the
    forward's kernel runs, FlashAttention-3's: tensor_ops/sm90_attention_backward.h)."""
    _check(q, k, v, causal, scale, layout)
    return _gradients(q, k, v, o, lse, dout, dlse, causal, scale, layout)


# The op checks its operands (~25 us on the H100's host) once for each signature of a call, so its
# forward and backward take the unchecked paths.
@custom_function
def _attention(q, k, v, *, causal, scale, layout):
    return _attend(q, k, v, causal, scale, layout)


@kernel_backward
def _op_gradients(q, k, v, o, lse, dout, dlse, *, causal, scale, layout):
    """(dq, dk, dv): the backward of both roads (autodiff.record_op's, and the vjp's)."""
    return _gradients(q, k, v, o, lse, dout, dlse, causal, scale, layout)


@_attention.vjp
def _attention_vjp(primals, cotangents, outputs, **settings):
    return _op_gradients(*primals, *outputs, *cotangents, **settings)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, layout: str = "bhsd", return_lse: bool = False):
    """softmax(q k^T * scale + mask) v, as torch's scaled_dot_product_attention, in one kernel.

    q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D) with H a multiple of Hkv (grouped-query attention:
    query head h reads key/value head h // (H / Hkv)); with layout="bshd" the tensors are
    (B, S, H, D). D: 64, 128 or 256; any lengths. float16, bfloat16 or float32 (float64 too, for
    gradchecks), products of float16/bfloat16 on the tensor cores, sums in float32. scale defaults
    to 1 / sqrt(D); causal masks top-left aligned, as torch's is_causal: query i sees keys j <= i.
    Differentiable in q, k and v. Returns the output, in q's layout and dtype; with
    return_lse=True also the log-sum-exp of each row of scaled scores, (B, H, Sq), float32
    (float64 for float64), differentiable too.
    """
    check_once(_check_call, q, k, v, causal, scale, layout, return_lse)
    o, lse = record_op(_attention, (q, k, v), {"causal": causal, "scale": scale, "layout": layout}, _op_gradients)
    return (o, lse) if return_lse else o


def flash_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                              scale: float | None = None, layout: str = "bhsd", return_lse: bool = False):
    """The plain-torch reference, in the inputs' dtype (float64 for the tests):
    softmax(q k^T * scale) v with k, v repeated over the query heads that share them."""
    q, k, v = (_bhsd(x, layout) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        seen = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(s, -1)
    o = _bhsd(torch.softmax(s, -1) @ v, layout)
    return (o, lse) if return_lse else o
