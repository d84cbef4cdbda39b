"""A fifth sweep of custom Metal kernels from public MLX projects, run as their authors wrote them.

As in test_real_world_kernels_2.py to _4.py: each kernel's source and header strings are copied
verbatim from the repository (and, where named, the commit) its docstring gives; where the project
generates them in Python, its generator is copied, mx.fast.metal_kernel becoming kk.metal_kernel
and its Metal-availability guards dropped. The Python around them is translated from mx to torch,
keeping every grid, threadgroup and template argument as written. Inputs are fresh random tensors
made on `device`; every reference is computed on the CPU in float64 (or exactly, for integers) from
the kernel's documented intent.
"""

from typing import Any

import pytest
import torch

# ZMLX's header, zmlx.metal.kernel and MetalKernel.__call__ (its launch defaults) as
# test_real_world_kernels_4.py copied them from Hmbown/ZMLX; the same code at 1930c6af
from test_real_world_kernels_4 import DEFAULT_HEADER, _validate_tg, close, metal_kernel, zmlx_launch

# --- Hmbown/ZMLX at 1930c6af: src/zmlx/kernels/{loss,indexing,bits,optimizers,moe}.py ---------
# The kernel factories are ZMLX's, copied as written (their @cache dropped).


def _softmax_ce_kernel(d: int, tg: int) -> Any:
    D = int(d)
    TG = _validate_tg(tg)
    
    source = f"""
        constexpr uint D = {D};
        constexpr uint TG = {TG};

        uint gid = thread_position_in_grid.x;
        uint tid = thread_position_in_threadgroup.x;
        uint row = gid / TG;
        uint base = row * D;

        threadgroup float buf[TG];

        // 1. Max pass
        float m = -INFINITY;
        for (uint j = tid; j < D; j += TG) {{
            m = metal::max(m, (float)logits[base + j]);
        }}
        buf[tid] = m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = TG/2; s > 0; s >>= 1) {{
            if (tid < s) buf[tid] = metal::max(buf[tid], buf[tid + s]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float max_val = buf[0];
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 2. Sum(exp) pass
        float sum_exp = 0.0f;
        for (uint j = tid; j < D; j += TG) {{
            sum_exp += metal::exp((float)logits[base + j] - max_val);
        }}
        buf[tid] = sum_exp;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = TG/2; s > 0; s >>= 1) {{
            if (tid < s) buf[tid] += buf[tid + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float log_sum_exp = max_val + metal::log(buf[0]);
        
        // 3. Final loss calculation (only thread 0)
        if (tid == 0) {{
            uint target_idx = targets[row];
            float target_logit = (float)logits[base + target_idx];
            out[row] = (T)(log_sum_exp - target_logit);
        }}
    """
    return metal_kernel(
        name=f"kk_softmax_ce_D{D}_TG{TG}",
        input_names=["logits", "targets"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )

def _softmax_ce_bwd_kernel(d: int, tg: int) -> Any:
    D = int(d)
    TG = _validate_tg(tg)

    source = f"""
        constexpr uint D = {D};
        constexpr uint TG = {TG};

        uint gid = thread_position_in_grid.x;
        uint tid = thread_position_in_threadgroup.x;
        uint row = gid / TG;
        uint base = row * D;

        threadgroup float buf[TG];

        // 1. Max pass
        float m = -INFINITY;
        for (uint j = tid; j < D; j += TG) {{
            m = metal::max(m, (float)logits[base + j]);
        }}
        buf[tid] = m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = TG/2; s > 0; s >>= 1) {{
            if (tid < s) buf[tid] = metal::max(buf[tid], buf[tid + s]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float max_val = buf[0];
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 2. Sum(exp) pass
        float sum_exp = 0.0f;
        for (uint j = tid; j < D; j += TG) {{
            sum_exp += metal::exp((float)logits[base + j] - max_val);
        }}
        buf[tid] = sum_exp;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = TG/2; s > 0; s >>= 1) {{
            if (tid < s) buf[tid] += buf[tid + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float inv_sum = 1.0f / buf[0];
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 3. Compute gradient: (softmax - one_hot) * cotan
        uint target_idx = targets[row];
        float c = (float)cotan[row];
        for (uint j = tid; j < D; j += TG) {{
            float y = metal::exp((float)logits[base + j] - max_val) * inv_sum;
            float grad = (j == target_idx) ? (y - 1.0f) : y;
            dlogits[base + j] = (T)(grad * c);
        }}
    """

    return metal_kernel(
        name=f"kk_softmax_ce_bwd_D{D}_TG{TG}",
        input_names=["logits", "targets", "cotan"],
        output_names=["dlogits"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zmlx_softmax_cross_entropy(device, dtype):
    """Hmbown/ZMLX, src/zmlx/kernels/loss.py: _softmax_ce_kernel (softmax_cross_entropy), the
    per-row cross-entropy logsumexp(logits) - logits[target] with uint32 class labels, one
    threadgroup of 256 per row doing a max and a sum tree reduction in threadgroup memory; float32
    loss (cd) from float32 or bf16 logits. D = 1000 is no multiple of the threadgroup."""
    B, S, D, TG = 3, 5, 1000, 256
    logits = (torch.randn(B, S, D) * 4).to(dtype)
    targets = torch.randint(0, D, (B, S)).to(torch.uint32)
    rows = logits.numel() // D
    (loss,) = zmlx_launch(_softmax_ce_kernel(D, TG), device, logits, targets,
                          template=[("T", torch.float32)], grid=(rows * TG, 1, 1),
                          threadgroup=(TG, 1, 1), output_shapes=[logits.shape[:-1]],
                          output_dtypes=[torch.float32])
    ref = torch.nn.functional.cross_entropy(logits.double().reshape(rows, D),
                                            targets.long().reshape(rows), reduction="none")
    close(loss, ref.reshape(B, S), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zmlx_softmax_cross_entropy_grad(device, dtype):
    """Hmbown/ZMLX, src/zmlx/kernels/loss.py: _softmax_ce_bwd_kernel
    (softmax_cross_entropy_grad), d loss / d logits = (softmax(logits) - one_hot(target)) * cotan
    per row, written in the logits' dtype (T = logits.dtype)."""
    rows, D, TG = 7, 777, 256
    logits = (torch.randn(rows, D) * 3).to(dtype)
    targets = torch.randint(0, D, (rows,)).to(torch.uint32)
    cotan = torch.randn(rows).to(dtype)
    (dlogits,) = zmlx_launch(_softmax_ce_bwd_kernel(D, TG), device, logits, targets, cotan,
                             template=[("T", logits.dtype)], grid=(rows * TG, 1, 1),
                             threadgroup=(TG, 1, 1), output_shapes=[logits.shape],
                             output_dtypes=[logits.dtype])
    x = logits.double().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x, targets.long(), reduction="none")
    (ref,) = torch.autograd.grad(loss, x, cotan.double())
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    assert dlogits.dtype == dtype
    close(dlogits, ref, rtol=tol, atol=tol)


def _gather_add_kernel(d: int) -> Any:
    D = int(d)
    source = f"""
        constexpr uint D = {D};
        uint gid = thread_position_in_grid.x;
        uint i = gid / D;
        uint j = gid % D;
        
        uint idx = indices[i];
        out[gid] = (T)((float)src[idx * D + j] + (float)other[gid]);
    """
    return metal_kernel(
        name=f"kk_gather_add_D{D}",
        input_names=["src", "indices", "other"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


def _scatter_add_kernel(d: int) -> Any:
    D = int(d)
    # Use atomic_fetch_add_explicit for thread-safe accumulation
    source = f"""
        constexpr uint D = {D};
        uint gid = thread_position_in_grid.x;
        uint i = gid / D;
        uint j = gid % D;
        
        uint idx = indices[i];
        // Metal atomics work on device atomic<float>* for atomic_outputs=True
        atomic_fetch_add_explicit(&out[idx * D + j], (float)updates[gid], memory_order_relaxed);
    """
    return metal_kernel(
        name=f"kk_scatter_add_D{D}",
        input_names=["indices", "updates"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        atomic_outputs=True,
        cache=True,
    )


def test_zmlx_fused_gather_add(device):
    """Hmbown/ZMLX, src/zmlx/kernels/indexing.py: _gather_add_kernel (fused_gather_add),
    out[i] = src[indices[i]] + other[i] row by row (an embedding lookup plus a residual), one thread
    per output element, the default (elementwise) threadgroup; output in src's dtype."""
    N, M, D = 50, 37, 24
    src = torch.randn(N, D).half()
    indices = torch.randint(0, N, (M,), dtype=torch.int32)
    other = torch.randn(M, D).half()
    (out,) = zmlx_launch(_gather_add_kernel(D), device, src, indices, other,
                         template=[("T", torch.float32)], grid=(M * D, 1, 1),
                         output_shapes=[(M, D)], output_dtypes=[src.dtype])
    ref = src.double()[indices.long()] + other.double()
    assert out.dtype == torch.float16
    close(out, ref, rtol=1e-3, atol=1e-3)


def test_zmlx_fused_scatter_add(device):
    """Hmbown/ZMLX, src/zmlx/kernels/indexing.py: _scatter_add_kernel (fused_scatter_add), an
    index_add of update rows into a zeroed (init_value=0.0) float32 output through
    atomic_fetch_add_explicit on the atomic output; repeated indices collide."""
    N, M, D = 9, 64, 12
    indices = torch.randint(0, N, (M,), dtype=torch.int32)
    updates = torch.randn(M, D)
    (out,) = zmlx_launch(_scatter_add_kernel(D), device, indices, updates,
                         template=[("T", torch.float32)], grid=(M * D, 1, 1),
                         output_shapes=[(N, D)], output_dtypes=[torch.float32], init_value=0.0)
    ref = torch.zeros(N, D, dtype=torch.float64).index_add_(0, indices.long(), updates.double())
    close(out, ref, rtol=1e-5, atol=1e-5)


def _pack_bits_kernel() -> Any:
    source = """
        uint gid = thread_position_in_grid.x;
        uint base = gid * 8;
        uint8_t res = 0;
        for (uint i = 0; i < 8; ++i) {
            if (inp[base + i]) {
                res |= (1 << i);
            }
        }
        out[gid] = res;
    """
    return metal_kernel(
        name="kk_pack_bits",
        input_names=["inp"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )

def _unpack_bits_kernel() -> Any:
    source = """
        uint gid = thread_position_in_grid.x;
        uint byte_idx = gid / 8;
        uint bit_idx = gid % 8;
        uint8_t val = inp[byte_idx];
        out[gid] = (val & (1 << bit_idx)) ? 1 : 0;
    """
    return metal_kernel(
        name="kk_unpack_bits",
        input_names=["inp"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_zmlx_pack_bits(device, dtype):
    """Hmbown/ZMLX, src/zmlx/kernels/bits.py: _pack_bits_kernel (pack_bits), eight booleans (or
    nonzero bytes) per uint8, little-endian in the bit index (numpy.packbits with
    bitorder="little"); checked exactly."""
    x = torch.rand(3, 40) > 0.5
    if dtype == torch.uint8:
        x = x.to(torch.uint8) * torch.randint(1, 256, x.shape, dtype=torch.uint8)
    n = x.numel() // 8
    (out,) = zmlx_launch(_pack_bits_kernel(), device, x, template=[("T", torch.uint8)],
                         grid=(n, 1, 1), output_shapes=[(n,)], output_dtypes=[torch.uint8])
    bits = (x.reshape(n, 8) != 0).long()
    ref = (bits << torch.arange(8)).sum(-1).to(torch.uint8)
    assert torch.equal(out.cpu(), ref)


def test_zmlx_unpack_bits(device):
    """Hmbown/ZMLX, src/zmlx/kernels/bits.py: _unpack_bits_kernel (unpack_bits), the inverse:
    one 0/1 byte per bit of the packed uint8 input, little-endian; checked exactly."""
    packed = torch.randint(0, 256, (37,), dtype=torch.uint8)
    out_size = packed.numel() * 8
    (out,) = zmlx_launch(_unpack_bits_kernel(), device, packed, template=[("T", torch.uint8)],
                         grid=(out_size, 1, 1), output_shapes=[(out_size,)],
                         output_dtypes=[torch.uint8])
    ref = ((packed.long()[:, None] >> torch.arange(8)) & 1).reshape(-1).to(torch.uint8)
    assert torch.equal(out.cpu(), ref)


def _adamw_kernel(
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
) -> Any:
    source = f"""
        uint gid = thread_position_in_grid.x;
        float p_val = (float)p[gid];
        float g_val = (float)g[gid];
        float m_val = (float)m[gid];
        float v_val = (float)v[gid];
        float lr_val = (float)lr[0];
        float step_val = (float)step[0];

        float m_new = {beta1}f * m_val + (1.0f - {beta1}f) * g_val;
        float v_new = {beta2}f * v_val + (1.0f - {beta2}f) * g_val * g_val;

        float m_hat = m_new / (1.0f - pow({beta1}f, step_val));
        float v_hat = v_new / (1.0f - pow({beta2}f, step_val));

        float p_new = p_val - lr_val * (m_hat / (sqrt(v_hat) + {eps}f) + {wd}f * p_val);

        p_out[gid] = (T)p_new;
        m_out[gid] = (T)m_new;
        v_out[gid] = (T)v_new;
    """
    return metal_kernel(
        name=f"kk_adamw_b1_{beta1}_b2_{beta2}_eps_{eps}_wd_{wd}",
        input_names=["p", "g", "m", "v", "lr", "step"],
        output_names=["p_out", "m_out", "v_out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


@pytest.mark.parametrize("beta1,beta2,eps,wd", [(0.9, 0.999, 1e-8, 0.01), (0.8, 0.95, 1e-6, 0.1)])
def test_zmlx_adamw_step(device, monkeypatch, beta1, beta2, eps, wd):
    """Hmbown/ZMLX, src/zmlx/kernels/optimizers.py: _adamw_kernel (adamw_step), one fused AdamW
    update with bias correction (pow(beta, step)) and decoupled weight decay, the hyperparameters
    baked into the source as float literals (1e-08f among them); launched with
    MetalKernel.__call__'s defaults: outputs shaped and typed like p, one thread per element.

    A bug in the original: the factory also bakes them into the kernel name
    (kk_adamw_b1_0.9_b2_0.999_eps_1e-08_wd_0.01), which MLX declares as the Metal function
    custom_kernel_<name>_<template hash>, so Metal cannot compile it; kernelkit refuses the name up
    front. The source is then run, unchanged, under that name with '.' and '-' made '_' (as
    ZMLX's own norms.py does for eps)."""
    with pytest.raises(ValueError, match="not a C\\+\\+ identifier"):
        _adamw_kernel(beta1, beta2, eps, wd)
    original = metal_kernel
    monkeypatch.setitem(globals(), "metal_kernel", lambda *, name, **kw: original(
        name=name.replace(".", "_").replace("-", "_"), **kw))
    p, g, m = torch.randn(3, 100), torch.randn(3, 100), torch.randn(3, 100) * 0.1
    v = torch.rand(3, 100) * 0.01
    lr, step = torch.tensor([1e-2]), torch.tensor([7.0])
    p_out, m_out, v_out = zmlx_launch(_adamw_kernel(beta1, beta2, eps, wd), device,
                                      p, g, m, v, lr, step, template=[("T", p.dtype)],
                                      output_shapes=[p.shape, m.shape, v.shape],
                                      output_dtypes=[p.dtype, m.dtype, v.dtype])
    p64, g64, m64, v64, t = p.double(), g.double(), m.double(), v.double(), 7.0
    m_ref = beta1 * m64 + (1 - beta1) * g64
    v_ref = beta2 * v64 + (1 - beta2) * g64 * g64
    m_hat, v_hat = m_ref / (1 - beta1 ** t), v_ref / (1 - beta2 ** t)
    p_ref = p64 - 1e-2 * (m_hat / (v_hat.sqrt() + eps) + wd * p64)
    close(m_out, m_ref, rtol=1e-5, atol=1e-6)
    close(v_out, v_ref, rtol=1e-5, atol=1e-7)
    close(p_out, p_ref, rtol=1e-5, atol=1e-5)


def _topk_gating_simd_kernel(d: int, k: int) -> Any:
    D = int(d)
    K = int(k)
    if D <= 0:
        raise ValueError("topk_gating_softmax: last dimension must be > 0")
    if D > 32:
        raise ValueError("topk_gating_softmax: simd kernel requires D <= 32")
    if K <= 0 or K > _MAX_FUSED_TOPK:
        raise ValueError("topk_gating_softmax: invalid k for simd kernel")

    source = f"""
        constexpr uint D = {D};
        constexpr uint K = {K};
        constexpr uint SG = 32;

        uint gid = thread_position_in_grid.x;
        uint tid = thread_position_in_threadgroup.x;
        uint row = gid / SG;
        uint base = row * D;

        float v = -INFINITY;
        if (tid < D) {{
            v = (float)inp[base + tid];
        }}

        thread float topk_vals[K];
        thread uint topk_idx[K];

        float cur = v;
        for (uint i = 0; i < K; ++i) {{
            float cur_max = simd_max(cur);
            uint candidate = (cur == cur_max && tid < D) ? tid : 0;
            uint winner = simd_max(candidate);
            if (tid == 0) {{
                topk_vals[i] = cur_max;
                topk_idx[i] = winner;
            }}
            cur = (tid == winner) ? -INFINITY : cur;
        }}

        if (tid == 0) {{
            float m = topk_vals[0];
            float s = 0.0f;
            for (uint i = 0; i < K; ++i) {{
                s += metal::exp(topk_vals[i] - m);
            }}
            float inv = 1.0f / s;
            uint out_base = row * K;
            for (uint i = 0; i < K; ++i) {{
                weights[out_base + i] = (T)(metal::exp(topk_vals[i] - m) * inv);
                indices[out_base + i] = topk_idx[i];
            }}
        }}
    """
    return metal_kernel(
        name=f"kk_topk_gating_simd_D{D}_K{K}",
        input_names=["inp"],
        output_names=["weights", "indices"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


_MAX_FUSED_TOPK = 8  # src/zmlx/kernels/moe.py's bound on the fused top-k paths


@pytest.mark.parametrize("D,K", [(24, 4), (32, 6)])
def test_zmlx_topk_gating_simd(device, D, K):
    """Hmbown/ZMLX, src/zmlx/kernels/moe.py: _topk_gating_simd_kernel (topk_gating_softmax's
    D <= 32 path), MoE router gating with one 32-lane SIMD group per token: K rounds of simd_max
    over the logits and of simd_max over the winning lane ids pick the top-K experts in order,
    then lane 0 writes the softmax over those K logits and their uint32 expert ids. Random logits
    have no ties (a tie would go to the higher expert id)."""
    x = torch.randn(3, 5, D)
    TG, rows = 32, x.numel() // D
    weights, indices = zmlx_launch(_topk_gating_simd_kernel(D, K), device, x,
                                   template=[("T", torch.float32)], grid=(rows * TG, 1, 1),
                                   threadgroup=(TG, 1, 1),
                                   output_shapes=[x.shape[:-1] + (K,), x.shape[:-1] + (K,)],
                                   output_dtypes=[torch.float32, torch.uint32])
    top, idx = x.double().topk(K, dim=-1)
    assert torch.equal(indices.cpu().long(), idx)
    close(weights, torch.softmax(top, -1), rtol=1e-5, atol=1e-6)
