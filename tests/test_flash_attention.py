"""kk.ops.flash_attention (issue 18): outputs, log-sum-exps and gradients against a float64
plain-torch reference of softmax(q k^T * scale) v, for lengths off the tiles, query and key
lengths that differ, causal (top-left, as torch's is_causal) and not, grouped-query attention and
both layouts; gradcheck in float64; errors. Every kernel built here is also compiled for sm_90a in
CI (conftest); the GPU's own configurations are compiled explicitly below."""

import importlib

import pytest
import torch

import kernelkit as kk
from kernelkit.ops import flash_attention, flash_attention_reference

fa = importlib.import_module("kernelkit.ops.flash_attention")  # the module (kk.ops.flash_attention is the op)


def _qkv(B, H, Hkv, Sq, Sk, D, dtype, device, layout="bhsd", grad=False):
    def one(h, s):
        x = torch.randn((B, h, s, D) if layout == "bhsd" else (B, s, h, D), dtype=torch.float64)
        return x.to(device=device, dtype=dtype).requires_grad_(grad)
    return one(H, Sq), one(Hkv, Sk), one(Hkv, Sk)


def _reference(q, k, v, causal, layout, dout, dlse):
    """(o, lse, dq, dk, dv) of the float64 reference for the cotangents dout and dlse."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    o, lse = flash_attention_reference(q, k, v, causal, layout=layout, return_lse=True)
    grads = torch.autograd.grad((o * dout.double()).sum() + (lse * dlse.double()).sum(), (q, k, v))
    return (o.detach(), lse.detach(), *grads)


def _check(B, H, Hkv, Sq, Sk, D, causal, layout, dtype, device, tol):
    _compare(*_qkv(B, H, Hkv, Sq, Sk, D, dtype, device, layout, grad=True), causal, layout, tol)


def _compare(q, k, v, causal, layout, tol):
    """The op's output, lse and gradients against the float64 reference's."""
    dtype = q.dtype
    o, lse = flash_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == fa._bhsd(q, layout).shape[:3]
    dout, dlse = torch.randn_like(o), torch.randn_like(lse)
    grads = torch.autograd.grad((o * dout).sum() + (lse * dlse).sum(), (q, k, v))
    refs = _reference(q, k, v, causal, layout, dout, dlse)
    for name, got, ref in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads), refs):
        assert got.shape == ref.shape, name
        # relative to the largest magnitude: half-precision inputs round P and dS as FlashAttention does
        torch.testing.assert_close(got.double().cpu(), ref.cpu(), rtol=tol, atol=tol * max(1.0, ref.abs().max().item()),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("B, H, Hkv, Sq, Sk, D, causal, layout", [
    (1, 2, 2, 1, 1, 64, False, "bhsd"),
    (1, 2, 1, 17, 33, 64, True, "bhsd"),      # GQA, fewer queries than keys
    (2, 2, 2, 70, 17, 64, True, "bshd"),      # more queries than keys
    (1, 4, 2, 33, 70, 128, False, "bshd"),
    (1, 2, 1, 70, 70, 128, True, "bhsd"),
    (1, 1, 1, 33, 20, 256, True, "bhsd"),
])
def test_against_float64_reference(B, H, Hkv, Sq, Sk, D, causal, layout):
    _check(B, H, Hkv, Sq, Sk, D, causal, layout, torch.float32, torch.device("cpu"), 2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(device, dtype):
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    _check(1, 4, 2, 45, 70, 128, True, "bhsd", dtype, device, tol)


@pytest.mark.parametrize("D", [64, 128])
def test_running_max_moves_by_more_and_less_than_the_threshold(device, D):
    """Scores that rise along the keys at rates per head (flat; 3.7, 9.2 and 15 a 128-key tile in
    log2 units; falling): a row's running max moves by less and by more than the forward's rescaling
    threshold (8) between tiles, and the output, lse and gradients still match."""
    B, H, S = 1, 5, 400
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) * 0.3 for _ in range(3))
    rate = torch.tensor([0.0, 4.0, 10.0, 16.0, -10.0], dtype=torch.float64)  # per head
    q[..., 0] = rate.view(1, H, 1) * D ** 0.5
    k[..., 0] = torch.arange(S, dtype=torch.float64) * 0.005  # scores rate * key / 200
    # float16: a max that lagged past the threshold would overflow its probabilities (65504)
    q, k, v = (x.to(device=device, dtype=torch.float16).requires_grad_() for x in (q, k, v))
    _compare(q, k, v, False, "bhsd", 4e-3)


def test_matches_torch_sdpa():
    """Same semantics as scaled_dot_product_attention: its causal alignment for Sq != Sk, GQA
    (enable_gqa), an explicit scale."""
    F = torch.nn.functional
    for Sq, Sk in ((20, 9), (9, 20)):
        q, k, v = _qkv(2, 4, 2, Sq, Sk, 64, torch.float32, "cpu")
        for causal in (False, True):
            got = flash_attention(q, k, v, causal=causal, scale=0.3)
            want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = _qkv(1, 2, 1, 5, 3, 64, torch.float64, "cpu", "bshd", grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, layout="bshd", return_lse=True), (q, k, v),
        fast_mode=True)


def test_strided_inputs_and_empty_sequences():
    q, k, v = _qkv(1, 2, 2, 20, 30, 64, torch.float32, "cpu")
    qs = torch.randn(1, 20, 2, 64).transpose(1, 2)  # a (B, H, S, D) view of a bshd tensor
    torch.testing.assert_close(flash_attention(qs, k, v), flash_attention_reference(qs, k, v), rtol=1e-5, atol=1e-5)
    empty = torch.zeros(1, 2, 0, 64)
    assert torch.equal(flash_attention(q, empty, empty), torch.zeros_like(q))  # no keys: zeros, as torch
    assert flash_attention(empty, k, v).shape == (1, 2, 0, 64)


def test_errors():
    q = torch.randn(1, 4, 8, 64)
    with pytest.raises(TypeError, match="flash_attention: q has dtype int32"):
        flash_attention(q.int(), q.int(), q.int())
    with pytest.raises(ValueError, match=r"head dim D=48 is not supported; expected one of \(64, 128, 256\)"):
        x = torch.randn(1, 4, 8, 48)
        flash_attention(x, x, x)
    with pytest.raises(ValueError, match="q has 4 heads and k, v have 3; grouped-query attention"):
        kv = torch.randn(1, 3, 8, 64)
        flash_attention(q, kv, kv)
    with pytest.raises(ValueError, match=r"k has shape \(1, 4, 8, 128\); expected \(B=1, Hkv, Sk, D=64\)"):
        flash_attention(q, torch.randn(1, 4, 8, 128), q)
    with pytest.raises(ValueError, match="layout must be one of"):
        flash_attention(q, q, q, layout="sbhd")
    with pytest.raises(TypeError, match="flash_attention: causal must be a bool"):
        flash_attention(q, q, q, causal=1)
    with pytest.raises(TypeError, match="flash_attention: scale must be a finite number or None"):
        flash_attention(q, q, q, scale=float("nan"))
    with pytest.raises(TypeError, match="flash_attention: v has dtype float16; expected float32"):
        flash_attention(q, q, q.half())
    assert kk.ops.flash_attention is flash_attention and "flash_attention" in kk.ops.__all__


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_kernels_compile_for_sm90a(dtype, D, nvrtc):
    """The three kernels as an H100 launches them, compiled by NVRTC without a GPU; each one's
    ops take the warpgroup path (wgmma, staging through dynamic shared memory the cubin names)."""
    from kernelkit.backends.cuda import tensor_ops_shared
    meta = torch.empty(2, 16, 256, D, dtype=dtype, device="meta")
    acc = torch.empty(2, 16, 256, dtype=torch.float32, device="meta")
    for name, kernel, inputs, outs in (
            ("forward", fa._forward, [meta, meta, meta, 0.1, True], [dtype, torch.float32]),
            ("dq", fa._dq, [meta, meta, meta, meta, meta, acc, acc, 0.1, True], [dtype, torch.float32]),
            ("dkdv", fa._dkdv, [meta, meta, meta, meta, acc, acc, 0.1, True], [dtype, dtype])):
        template = fa._template(dtype, D, "bhsd", name)
        compiled = kk.compile_for(kernel, "sm_90", inputs=inputs, output_dtypes=outs, template=template)
        assert compiled.arch == "sm_90a" and compiled.binary
        assert tensor_ops_shared(compiled.binary) >= 64 * 128


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_forward_compiles_and_names_its_shared_memory(dtype, D, causal, nvrtc):
    """Hopper's warp-specialised forward (tensor_ops/sm90_attention.h) as an H100 launches it."""
    from kernelkit.backends.cuda import tensor_ops_shared
    meta = torch.empty(2, 16, 256, D, dtype=dtype, device="meta")
    block_q, threads = fa._sm90_forward_shape(D)
    consumers = block_q // 64
    compiled = kk.compile_for(fa._sm90_forward[D], "sm_90", inputs=[meta, meta, meta, 0.1],
                              output_shapes=[meta.shape, (2, 16, 256), (1,)],
                              output_dtypes=[dtype, torch.float32, torch.int32],
                              template=[("T", dtype), ("D", D), ("BSHD", False), ("CAUSAL", causal)],
                              grid=(threads, 1, 1), threadgroup=(threads, 1, 1))
    # two Q buffers (64 queries a consumer warpgroup: three at D = 64, two at D = 128), 4 stages of
    # K and V blocks of 128 keys at D = 64 (2 at D = 128), a 64 x D output buffer a consumer,
    # barriers and maps
    stages = 4 if D == 64 else 2
    assert compiled.arch == "sm_90a"
    assert tensor_ops_shared(compiled.binary) == (2 * 64 * consumers * D * 2 + 2 * stages * 128 * D * 2
                                                  + consumers * 64 * D * 2 + 2560)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
def test_sm90_backward_compiles_and_names_its_shared_memory(dtype, D, nvrtc):
    """Hopper's warp-specialised backward (tensor_ops/sm90_attention_backward.h) and the kernels
    around it, as an H100 launches them."""
    from kernelkit.backends.cuda import tensor_ops_shared
    meta = torch.empty(2, 16, 256, D, dtype=dtype, device="meta")
    rows = torch.empty(2, 16, 256, dtype=torch.float32, device="meta")
    sums = torch.empty(2 * 16 * 256 * D + 4, device="meta")
    compiled = kk.compile_for(fa._sm90_backward, "sm_90", inputs=[meta, meta, meta, meta, rows, rows, sums, 0.1],
                              output_shapes=[meta.shape, meta.shape], output_dtypes=[dtype, dtype],
                              template=[("T", dtype), ("D", D), ("BSHD", False), ("CAUSAL", True)],
                              grid=(384 * 132, 1, 1), threadgroup=(384, 1, 1))
    # K and V (128 x D), two stages of Q, dO (block_q x D: 128 queries at D = 64, else 64) and their
    # lse2 and delta, the 128 x block_q dS^T buffers (one at D = 64, else two), four 64 x 64 float
    # dQ buffers, barriers and maps
    block_q, ds_buffers = (128, 1) if D == 64 else (64, 2)
    assert compiled.arch == "sm_90a"
    assert tensor_ops_shared(compiled.binary) == (2 * 128 * D * 2 + 2 * (2 * block_q * D * 2 + 2 * 4 * block_q)
                                                  + ds_buffers * 128 * block_q * 2 + 4 * 16384 + 1792)
    for kernel, inputs, outs, template in (
            (fa._sm90_prep, [meta, meta, rows, rows], [rows.shape, rows.shape, sums.shape], [("T", dtype), ("D", D)]),
            (fa._sm90_dq, [sums, 0.1, 2, 16, 256], [meta.shape], [("T", dtype), ("D", D), ("BSHD", True)])):
        assert kk.compile_for(kernel, "sm_90", inputs=inputs, output_shapes=outs, template=template,
                              output_dtypes=[torch.float32] * len(outs), grid=(256, 1, 1),
                              threadgroup=(256, 1, 1)).binary


def test_sm90_forward_takes_only_what_tma_reads():
    """The Hopper kernels' operands: views TMA cannot read (misaligned strides or base, a stride of
    0, the last dim not packed) go to the other path, or are copied where asked; a size-1 dim's
    stride is made valid; bshd tensors are read as their (B, H, S, D) views."""
    def view(x, layout="bhsd", copy=False):
        views = fa._Views((x,), layout).take((x,), copy=copy)
        return None if views is None else views[0]

    x = torch.empty(2, 3, 5, 64, dtype=torch.bfloat16)
    assert view(x) is x
    assert view(x[..., 1:, :]) is not None                              # rows off the base: 128 bytes
    assert view(torch.empty(2, 3, 5, 72, dtype=torch.bfloat16)[..., :64]) is not None
    assert view(torch.empty(2, 3, 5, 68, dtype=torch.bfloat16)[..., :64]) is None  # 136-byte rows
    off = torch.randn(x.numel() + 4).to(x.dtype)[4:].view(x.shape)    # base off 16 bytes
    assert view(off) is None
    assert view(off, copy=True).is_contiguous() and torch.equal(view(off, copy=True), off)
    assert view(x[:, :1].expand(2, 3, 5, 64)) is None                   # a broadcast head
    assert view(torch.empty(2, 3, 5, 128, dtype=torch.bfloat16)[..., ::2]) is None  # D not packed
    one = torch.empty(1, 1, 5, 64, dtype=torch.bfloat16).as_strided((1, 1, 5, 64), (7, 3, 64, 1))
    assert view(one).stride() == (320, 320, 64, 1)
    bshd = torch.randn(2, 5, 3, 64).to(torch.bfloat16)
    assert torch.equal(view(bshd, "bshd"), bshd.transpose(1, 2))
    assert torch.equal(view(bshd[:, :, :1].expand(2, 5, 3, 64), "bshd", copy=True), bshd[:, :, :1].expand(2, 5, 3, 64).transpose(1, 2))


_SM90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                           reason="needs an sm_90 GPU")


@pytest.mark.gpu
@_SM90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B, H, Hkv, Sq, Sk, D, causal, layout", [
    (4, 16, 4, 700, 900, 128, True, "bhsd"),   # more tiles than SMs, GQA, Sq < Sk
    (4, 16, 16, 700, 900, 128, False, "bshd"),
    (2, 8, 2, 1100, 513, 64, True, "bhsd"),    # Sq > Sk: causal rows past the keys; tiles overlap
    (3, 5, 5, 1, 1000, 64, False, "bhsd"),     # a single query
    (1, 3, 1, 257, 1, 128, True, "bshd"),      # a single key
    (2, 2, 2, 128, 256, 64, True, "bhsd"),     # one tile, a third of it past Sq
    (2, 4, 4, 300, 320, 64, False, "bshd"),    # a last key block half read
])
def test_sm90_forward_against_float64(dtype, B, H, Hkv, Sq, Sk, D, causal, layout):
    """The Hopper forward (output and lse; the backward is the other kernels') against float64."""
    q, k, v = _qkv(B, H, Hkv, Sq, Sk, D, dtype, torch.device("cuda"), layout)
    assert fa._sm90(q, k, v, causal, D ** -0.5, layout) is not None  # this path runs
    o, lse = flash_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    ref_o, ref_lse = flash_attention_reference(q.double(), k.double(), v.double(), causal, layout=layout,
                                               return_lse=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(o.double(), ref_o, rtol=tol, atol=tol * max(1.0, ref_o.abs().max().item()))
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)
    # rows that two causal tiles both write (the first overlaps the next) are written alike
    o2, lse2 = flash_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.gpu
@_SM90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B, H, Hkv, Sq, Sk, D, causal, layout", [
    (4, 16, 4, 700, 900, 128, True, "bshd"),   # GQA: a threadgroup sums over 4 query heads
    (2, 4, 4, 300, 300, 128, True, "bhsd"),
    (2, 8, 2, 513, 1100, 64, False, "bshd"),   # keys past the last query block
    (2, 8, 2, 1100, 513, 64, True, "bhsd"),    # causal rows past the keys
    (3, 5, 5, 1, 1000, 64, False, "bhsd"),     # a single query
    (1, 3, 1, 257, 1, 128, True, "bshd"),      # a single key
    (1, 2, 2, 128, 256, 128, False, "bhsd"),   # whole blocks
    (2, 4, 4, 320, 320, 64, True, "bhsd"),     # D = 64's 128-query steps: half of the last one past Sq
])
def test_sm90_backward_against_float64(dtype, B, H, Hkv, Sq, Sk, D, causal, layout):
    """The Hopper backward (dq, dk, dv, with the lse's cotangent too) against float64."""
    q, k, v = _qkv(B, H, Hkv, Sq, Sk, D, dtype, torch.device("cuda"), layout, grad=True)
    with torch.no_grad():
        o, lse = fa._attend(q, k, v, causal, None, layout)
        assert fa._sm90_gradients(q, k, v, o, lse, torch.randn_like(o), None, causal, D ** -0.5, layout) is not None
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    _compare(q, k, v, causal, layout, tol)
    # a broadcast cotangent (out.sum(): stride 0), which TMA cannot read, is copied first
    dq, = torch.autograd.grad(flash_attention(q, k, v, causal=causal, layout=layout).sum(), q)
    ref = _reference(q, k, v, causal, layout, torch.ones_like(q), torch.zeros(fa._bhsd(q, layout).shape[:3], device=q.device))[2]
    torch.testing.assert_close(dq.double().cpu(), ref.cpu(), rtol=tol, atol=tol * max(1.0, ref.abs().max().item()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B, H, Hkv, Sq, Sk, D, causal, layout", [
    (2, 8, 8, 1000, 1000, 128, True, "bhsd"),
    (2, 8, 2, 513, 1100, 64, False, "bshd"),
    (1, 4, 4, 300, 300, 256, True, "bhsd"),
])
def test_gpu_against_float64_reference(dtype, B, H, Hkv, Sq, Sk, D, causal, layout):
    _check(B, H, Hkv, Sq, Sk, D, causal, layout, dtype, torch.device("cuda"), 2e-2 if dtype == torch.bfloat16 else 4e-3)


def test_a_call_checked_before_is_checked_again_where_its_signature_differs():
    """The op checks each signature of a call once: a bad argument in a call like a good one
    (another dtype, shape or flag) still gets its error."""
    q = torch.randn(1, 2, 5, 64)
    flash_attention(q, q, q)
    flash_attention(q, q, q)
    with pytest.raises(TypeError, match="causal"):
        flash_attention(q, q, q, causal=1)
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(q, q, q.to(torch.float64))
    with pytest.raises(TypeError, match="scale"):
        flash_attention(q, q, q, scale=float("nan"))
    with pytest.raises(TypeError, match="scale"):
        flash_attention(q, q, q, scale=[1.0])
