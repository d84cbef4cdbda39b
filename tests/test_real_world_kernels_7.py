"""A seventh sweep of custom Metal kernels from public MLX projects, run as their authors wrote them.

As in test_real_world_kernels_2.py to _6.py: each kernel's source and header strings are copied
verbatim from the repository (and commit) its section names; where the project generates them in
Python, its generator is copied, mx.fast.metal_kernel becoming kk.metal_kernel. The Python around
them is translated from mx to torch, keeping every grid, threadgroup and template argument as
written. Inputs are fresh random tensors made on `device`; every reference is computed on the CPU
in float64 (or exactly, for integers) from the kernel's documented intent.
"""

import math

import pytest
import torch

import kernelkit as kk
from test_real_world_kernels_4 import close, launch, on


# --- motsognirr/olmlx at 3eea1207: olmlx/engine/shardquant_kernels.py ---------------------------

_K_TPS = 4
_K_NSG = 8
_V_JCHUNK = 512
_MAX_D = 128
_MAX_RANK = 128

_K_SCORES_SRC = r"""
    uint lane = thread_position_in_threadgroup.x;
    uint sg = thread_position_in_threadgroup.y;
    uint sgi = thread_position_in_grid.y;   // simdgroup task index
    uint h = thread_position_in_grid.z;
    int mid = params[0];
    int sink = params[1];
    int rank = params[2];
    int rdims = params[3];
    int G = params[4];
    int D = params[5];
    int cap = params[6];
    int PB = params[7];
    int K = params[8];

    int jbase = (int)sgi * TPS;
    if (jbase >= mid) return;

    // Stage the TPS tokens' dequantized coefficients (simdgroup-private).
    threadgroup float ts_y[NSG][TPS][MAX_RANK];
    for (int idx = (int)lane; idx < TPS * rank; idx += 32) {
        int t = idx / rank;
        int r = idx - t * rank;
        int j = jbase + t;
        if (j < mid) {
            const device uint8_t* crow = kcodes + ((size_t)h * cap + j) * PB;
            uint code;
            if (BITS == 8)      code = crow[r];
            else if (BITS == 4) code = (crow[r >> 1] >> ((r & 1) * 4)) & 0xF;
            else                code = (crow[r >> 2] >> ((r & 3) * 2)) & 0x3;
            ts_y[sg][t][r] = cb[h * K + code];
        } else {
            ts_y[sg][t][r] = 0.0f;
        }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);

    // Back-project all TPS tokens together; lane owns dims d = lane + 32k.
    // Each basis element is loaded once and reused TPS times.
    float kd[TPS][MAX_D / 32] = {{0.0f}};
    int nloc = D / 32;
    const device float* brow = basis + (size_t)h * D * D;
    for (int r = 0; r < rank; ++r) {
        float yv[TPS];
        for (int t = 0; t < TPS; ++t) yv[t] = ts_y[sg][t][r];
        for (int k = 0; k < nloc; ++k) {
            float b = brow[r * D + (int)lane + 32 * k];
            for (int t = 0; t < TPS; ++t) kd[t][k] += yv[t] * b;
        }
    }

    for (int t = 0; t < TPS; ++t) {
        int j = jbase + t;
        if (j >= mid) break;
        float norm = knorms[(size_t)h * cap + j];
        for (int k = 0; k < nloc; ++k) {
            int d = (int)lane + 32 * k;
            kd[t][k] = (kd[t][k] + kmean[h * D + d]) * norm;
        }
        // Re-rope at absolute position sink + j (non-traditional pairs
        // (d, d + rhalf); rhalf % 32 == 0 keeps both halves in this lane.
        // `half` is the Metal fp16 type, hence the name).
        if (rdims > 0) {
            int rhalf = rdims / 2;
            float pos = (float)(sink + j);
            for (int k = 0; k < nloc; ++k) {
                int d = (int)lane + 32 * k;
                if (d < rhalf) {
                    int k2 = k + rhalf / 32;
                    float angle = pos * freqs[d];
                    float c = metal::precise::cos(angle);
                    float s = metal::precise::sin(angle);
                    float a = kd[t][k];
                    float b = kd[t][k2];
                    kd[t][k] = a * c - b * s;
                    kd[t][k2] = a * s + b * c;
                }
            }
        }
        // Dot with each grouped query head.
        for (int g = 0; g < G; ++g) {
            const device float* qrow = q + ((size_t)h * G + g) * D;
            float acc = 0.0f;
            for (int k = 0; k < nloc; ++k)
                acc += kd[t][k] * qrow[(int)lane + 32 * k];
            float total = simd_sum(acc);
            if (lane == 0) scores[((size_t)h * G + g) * mid + j] = total;
        }
    }
"""

_V_ACCUM_SRC = r"""
    int d = (int)thread_position_in_grid.x;
    int g = (int)thread_position_in_grid.y;
    int z = (int)thread_position_in_grid.z;
    int mid = params[0];
    int G = params[1];
    int D = params[2];
    int cap = params[3];
    int P = params[4];
    int GS = params[5];
    int jchunk = params[6];
    int nch = params[7];
    int HK = params[8];
    int K = params[9];
    int woff = params[10];
    int wlen = params[11];
    if (d >= D) return;
    int h = z / nch;
    int ch = z % nch;
    int p = d / GS;
    int sub = d % GS;
    int j0 = ch * jchunk;
    int j1 = metal::min(j0 + jchunk, mid);
    const device uint8_t* codes = vcodes + (size_t)h * cap * P;
    const device float* wrow = w + ((size_t)h * G + g) * wlen + woff;
    float acc = 0.0f;
    for (int j = j0; j < j1; ++j) {
        uint code = codes[(size_t)j * P + p];
        acc += wrow[j] * vnorms[(size_t)h * cap + j]
             * vcb[((size_t)p * K + code) * GS + sub];
    }
    partials[((((size_t)ch * HK + h) * G + g) * (size_t)D) + d] = acc;
"""


def _k_scores_kernel(bits: int):
    return kk.metal_kernel(
        name=f"olmlx_shard_k_scores_b{bits}",
        input_names=[
            "q",
            "kcodes",
            "knorms",
            "basis",
            "cb",
            "kmean",
            "freqs",
            "params",
        ],
        output_names=["scores"],
        source=_K_SCORES_SRC,
    )


def _v_accum_kernel():
    return kk.metal_kernel(
        name="olmlx_shard_v_accum",
        input_names=["w", "vcodes", "vnorms", "vcb", "params"],
        output_names=["partials"],
        source=_V_ACCUM_SRC,
    )


def _pack_codes(codes, bits):
    """codes [..., rank] (values < 2**bits) -> bytes [..., rank * bits / 8], LSB-first, as the
    kernel's unpack reads them."""
    per = 8 // bits
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], -1, per)
    packed = torch.zeros(c.shape[:-1], dtype=torch.int32)
    for i in range(per):
        packed |= c[..., i] << (i * bits)
    return packed.to(torch.uint8)


@pytest.mark.parametrize("bits,rdims", [(2, 64), (4, 0), (8, 64)])
def test_olmlx_shard_k_scores(device, bits, rdims):
    """motsognirr/olmlx, shard_middle_scores_kernel: each simdgroup stages TPS tokens' codebook
    coefficients in its own slice of threadgroup memory (simdgroup_barrier), back-projects them
    through a per-head basis into lane-strided registers, re-ropes at sink + j and reduces the
    dot with each grouped query with simd_sum; BITS / TPS / NSG are int template arguments."""
    torch.manual_seed(bits)
    hk, g, d, cap, mid, sink, rank = 2, 3, 64, 16, 13, 3, 24
    kq = 2 ** bits
    pb = rank * bits // 8
    q = torch.randn(hk, g, d)
    codes = torch.randint(0, kq, (hk, cap, rank))
    kcodes = _pack_codes(codes, bits)
    knorms = torch.rand(hk, cap) + 0.5
    basis = torch.randn(hk, d, d) / math.sqrt(d)
    cb = torch.randn(hk, kq)
    kmean = torch.randn(hk, d) * 0.1
    freqs = (1.0 / 10000 ** (torch.arange(0, rdims, 2, dtype=torch.float32) / rdims)
             if rdims else torch.zeros(1))
    params = torch.tensor([mid, sink, rank, rdims, g, d, cap, pb, kq], dtype=torch.int32)
    rows = (mid + _K_TPS - 1) // _K_TPS
    rows_pad = ((rows + _K_NSG - 1) // _K_NSG) * _K_NSG
    out = launch(_k_scores_kernel(bits), device,
                 inputs=on(device, q, kcodes, knorms, basis, cb, kmean, freqs, params),
                 template=[("BITS", bits), ("TPS", _K_TPS), ("NSG", _K_NSG),
                           ("MAX_RANK", _MAX_RANK), ("MAX_D", _MAX_D)],
                 grid=(32, rows_pad, hk), threadgroup=(32, _K_NSG, 1),
                 output_shapes=[(hk, g, mid)], output_dtypes=[torch.float32])[0]

    y = torch.gather(cb.double(), 1, codes.reshape(hk, -1)).reshape(hk, cap, rank)[:, :mid]
    kd = torch.einsum("hjr,hrd->hjd", y, basis.double()[:, :rank]) + kmean.double()[:, None]
    kd = kd * knorms.double()[:, :mid, None]
    if rdims:
        half = rdims // 2
        pos = torch.arange(sink, sink + mid, dtype=torch.float64)
        ang = pos[:, None] * freqs.double()[None, :]
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = kd[..., :half].clone(), kd[..., half:rdims].clone()
        kd[..., :half] = a * c - b * s
        kd[..., half:rdims] = a * s + b * c
    ref = torch.einsum("hjd,hgd->hgj", kd, q.double())
    close(out, ref, rtol=1e-4, atol=1e-4)


def test_olmlx_shard_v_accum(device):
    """motsognirr/olmlx, shard_middle_weighted_v_kernel: a thread per (dim, query, head x chunk)
    accumulates weight * norm * centroid over a 512-token chunk of uint8 product-quantizer codes;
    int32 sizes in a `params` buffer, partial sums per chunk summed outside the kernel."""
    hk, g, cap, mid, p, kq, gs, woff = 2, 3, 640, 600, 4, 16, 16, 5
    d = p * gs
    wlen = woff + mid
    nch = (mid + _V_JCHUNK - 1) // _V_JCHUNK
    w_full = torch.rand(1, hk, g, wlen)
    vcodes = torch.randint(0, kq, (hk, cap, p), dtype=torch.uint8)
    vnorms = torch.rand(hk, cap) + 0.5
    vcb = torch.randn(p, kq, gs)
    params = torch.tensor([mid, g, d, cap, p, gs, _V_JCHUNK, nch, hk, kq, woff, wlen],
                          dtype=torch.int32)
    partials = launch(_v_accum_kernel(), device,
                      inputs=on(device, w_full.reshape(hk, g, wlen), vcodes, vnorms, vcb, params),
                      grid=(d, g, hk * nch), threadgroup=(min(d, 256), 1, 1),
                      output_shapes=[(nch, hk, g, d)], output_dtypes=[torch.float32])[0]

    # centroid[h, j, p*gs + sub] = vcb[p, code[h, j, p], sub]
    cent = vcb.double()[torch.arange(p)[None, None, :], vcodes.long()]  # [hk, cap, p, gs]
    cent = cent.reshape(hk, cap, d)[:, :mid] * vnorms.double()[:, :mid, None]
    wm = w_full.double()[0, :, :, woff:woff + mid]  # [hk, g, mid]
    ref = torch.zeros(nch, hk, g, d, dtype=torch.float64)
    for ch in range(nch):
        j0, j1 = ch * _V_JCHUNK, min((ch + 1) * _V_JCHUNK, mid)
        ref[ch] = torch.einsum("hgj,hjd->hgd", wm[..., j0:j1], cent[:, j0:j1])
    close(partials, ref, rtol=1e-4, atol=1e-4)


# --- dahai80/fusion-mlx at e7b21b93: fusion_mlx/patches/glm_moe_dsa/sparse_mla.py ---------------
# (its glm_fast.metal_kernel is mx.fast.metal_kernel where no native build provides one)

def _make_topk_indices_to_block_masks_kernel():
    source = r"""
        const uint elem = thread_position_in_grid.x;
        const uint total = B * L * TOPK;
        if (elem >= total) {
          return;
        }

        const uint j = elem % TOPK;
        const uint q_pos = (elem / TOPK) % L;
        const uint b = elem / (TOPK * L);

        const uint q_abs = (K - L) + q_pos;
        if (CAUSAL_PREFIX_INDICES && q_pos < PREFIX_ROWS) {
          const uint valid_length = min(uint(K), q_abs + 1);
          const uint prefix_blocks =
              (valid_length + uint(K_BLOCK) - 1) / uint(K_BLOCK);
          if (j >= prefix_blocks) {
            return;
          }

          const uint q_block = q_pos / Q_BLOCK;
          const uint k_block = j;
          if (q_block >= Q_BLOCKS || k_block >= K_BLOCKS) {
            return;
          }

          const uint block_idx = (b * Q_BLOCKS + q_block) * K_BLOCKS + k_block;
          block_mask[block_idx] = true;

          const uint block_start = k_block * uint(K_BLOCK);
          const uint tokens_in_block =
              min(uint(K_BLOCK), valid_length - block_start);
          const uint full_bits =
              K_BLOCK == 32 ? 0xffffffffu : ((1u << K_BLOCK) - 1u);
          const uint bits = tokens_in_block == K_BLOCK
              ? full_bits
              : ((1u << tokens_in_block) - 1u);
          const uint token_idx = (b * L + q_pos) * K_BLOCKS + k_block;
          block_token_mask[token_idx] = bits;
          return;
        }

        const uint topk_row = COMPACT_PREFIX_TOPK ? q_pos - PREFIX_ROWS : q_pos;
        const uint topk_elem = (b * TOPK_ROWS + topk_row) * TOPK + j;
        const uint k_pos = topk_indices[topk_elem];
        if (k_pos >= K) {
          return;
        }

        if (CAUSAL && k_pos > q_abs) {
          return;
        }

        const uint q_block = q_pos / Q_BLOCK;
        const uint k_block = k_pos / K_BLOCK;
        if (q_block >= Q_BLOCKS || k_block >= K_BLOCKS) {
          return;
        }

        const uint block_idx = (b * Q_BLOCKS + q_block) * K_BLOCKS + k_block;
        block_mask[block_idx] = true;

        const uint bit = 1u << (k_pos - k_block * K_BLOCK);
        const uint token_idx = (b * L + q_pos) * K_BLOCKS + k_block;
        device atomic_uint* atomic_token_mask =
            reinterpret_cast<device atomic_uint*>(block_token_mask);
        atomic_fetch_or_explicit(
            &atomic_token_mask[token_idx],
            bit,
            memory_order_relaxed);
    """

    return kk.metal_kernel(
        name="glm_dsa_topk_indices_to_block_masks",
        input_names=["topk_indices"],
        output_names=["block_mask", "block_token_mask"],
        source=source,
    )


def topk_indices_to_block_masks(topk_indices, device, *, L=None, K, q_block_size=32,
                                k_block_size=16, causal=True, causal_prefix_indices=False,
                                causal_prefix_rows=0):
    """fusion_mlx's topk_indices_to_block_masks, in torch."""
    B, _, L_in, topk = topk_indices.shape
    L = L_in if L is None else L
    causal_prefix_rows = max(0, min(causal_prefix_rows, L))
    compact_prefix_topk = (
        causal_prefix_indices
        and causal_prefix_rows > 0
        and L_in == L - causal_prefix_rows
    )
    q_blocks = (L + q_block_size - 1) // q_block_size
    k_blocks = (K + k_block_size - 1) // k_block_size
    block_mask, block_token_mask = launch(
        _make_topk_indices_to_block_masks_kernel(), device,
        inputs=on(device, topk_indices.to(torch.uint32)),
        template=[
            ("B", B),
            ("L", L),
            ("K", K),
            ("TOPK", topk),
            ("TOPK_ROWS", L_in),
            ("Q_BLOCK", q_block_size),
            ("K_BLOCK", k_block_size),
            ("Q_BLOCKS", q_blocks),
            ("K_BLOCKS", k_blocks),
            ("CAUSAL", causal),
            ("CAUSAL_PREFIX_INDICES", causal_prefix_indices),
            ("PREFIX_ROWS", causal_prefix_rows),
            ("COMPACT_PREFIX_TOPK", compact_prefix_topk),
        ],
        grid=(B * L * topk, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(B, 1, q_blocks, k_blocks), (B, 1, L, k_blocks)],
        output_dtypes=[torch.bool, torch.uint32],
        init_value=0,
    )
    return block_mask, block_token_mask


def _block_masks_reference(idx, L, K, qb, kb, causal, prefix_rows, compact):
    B, _, L_in, topk = idx.shape
    QB, KB = (L + qb - 1) // qb, (K + kb - 1) // kb
    bm = torch.zeros(B, 1, QB, KB, dtype=torch.bool)
    tm = torch.zeros(B, 1, L, KB, dtype=torch.int64)
    for b in range(B):
        for q in range(L):
            q_abs = K - L + q
            if q < prefix_rows:  # causal-prefix rows: every visible block, whole
                valid = min(K, q_abs + 1)
                for blk in range(min(topk, (valid + kb - 1) // kb)):
                    bm[b, 0, q // qb, blk] = True
                    n = min(kb, valid - blk * kb)
                    tm[b, 0, q, blk] = (1 << n) - 1
                continue
            row = q - prefix_rows if compact else q
            for k_pos in idx[b, 0, row].tolist():
                if k_pos >= K or (causal and k_pos > q_abs):
                    continue
                bm[b, 0, q // qb, k_pos // kb] = True
                tm[b, 0, q, k_pos // kb] |= 1 << (k_pos % kb)
    return bm, tm


@pytest.mark.parametrize("prefix", [False, True])
def test_fusion_mlx_topk_indices_to_block_masks(device, prefix):
    """dahai80/fusion-mlx, glm_moe_dsa topk_indices_to_block_masks: top-k key indices (some past
    K, some duplicated, some in the causal future) become a bool block mask and a uint32 per-token
    bit mask; the uint32 output is declared plain (no atomic_outputs) and the kernel
    reinterpret_casts it to `device atomic_uint*` for atomic_fetch_or_explicit, on outputs zeroed
    by init_value=0; bool template arguments select the causal / compact-prefix paths."""
    torch.manual_seed(7)
    B, L, K, topk = 2, 40, 70, 12
    prefix_rows = 9 if prefix else 0
    L_in = L - prefix_rows
    idx = torch.randint(0, K + 6, (B, 1, L_in, topk))
    idx[..., 1] = idx[..., 0]  # duplicates set the same bit twice
    bm, tm = topk_indices_to_block_masks(idx, device, L=L, K=K, q_block_size=32, k_block_size=16,
                                         causal=True, causal_prefix_indices=prefix,
                                         causal_prefix_rows=prefix_rows)
    rbm, rtm = _block_masks_reference(idx, L, K, 32, 16, True, prefix_rows, prefix)
    assert bm.dtype == torch.bool and tm.dtype == torch.uint32
    assert torch.equal(bm.cpu(), rbm)
    assert torch.equal(tm.cpu().to(torch.int64), rtm)


def _make_index_score_reduce_kernel():
    source = r"""
        const uint elem = thread_position_in_grid.x;
        const uint total = B * L * K;
        if (elem >= total) {
          return;
        }

        const uint k_pos = elem % K;
        const uint q_pos = (elem / K) % L;
        const uint b = elem / (L * K);

        if (CAUSAL && k_pos > K - L + q_pos) {
          out[elem] = static_cast<T>(-INFINITY);
          return;
        }

        float acc = 0.0f;
        #pragma clang loop unroll(full)
        for (uint h = 0; h < H; ++h) {
          const uint score_idx = ((b * H + h) * L + q_pos) * K + k_pos;
          const uint weight_idx = (b * H + h) * L + q_pos;
          const float s = static_cast<float>(head_scores[score_idx]);
          const float w = static_cast<float>(weights[weight_idx]);
          acc += metal::max(s, 0.0f) * w;
        }
        out[elem] = static_cast<T>(acc);
    """

    return kk.metal_kernel(
        name="glm_dsa_index_score_reduce",
        input_names=["head_scores", "weights"],
        output_names=["out"],
        source=source,
    )


def fused_index_score_reduce(head_scores, weights, device, *, causal=False):
    """fusion_mlx's fused_index_score_reduce, in torch."""
    B, H, L, K = head_scores.shape
    short_k_threadgroup = 512
    long_k_threshold = 32768
    long_k_threadgroup = 256
    threadgroup_size = (
        long_k_threadgroup if long_k_threshold < K else short_k_threadgroup
    )
    return launch(
        _make_index_score_reduce_kernel(), device,
        inputs=on(device, head_scores, weights),
        template=[
            ("T", head_scores.dtype),
            ("B", B),
            ("H", H),
            ("L", L),
            ("K", K),
            ("CAUSAL", causal),
        ],
        grid=(B * L * K, 1, 1),
        threadgroup=(threadgroup_size, 1, 1),
        output_shapes=[(B, 1, L, K)],
        output_dtypes=[head_scores.dtype],
    )[0]


@pytest.mark.parametrize("dtype,causal", [(torch.float32, True), (torch.bfloat16, False),
                                          (torch.float16, True)])
def test_fusion_mlx_index_score_reduce(device, dtype, causal):
    """dahai80/fusion-mlx, glm_moe_dsa fused_index_score_reduce: sum_h relu(score) * weight_h
    with a `#pragma clang loop unroll(full)` head loop over a template H, -INFINITY in the causal
    future, a typed template T and a 512-thread threadgroup over a grid not a multiple of it."""
    B, H, L, K = 2, 5, 7, 45
    scores = torch.randn(B, H, L, K).to(dtype)
    weights = torch.randn(B, H, L, 1).to(dtype)
    out = fused_index_score_reduce(scores, weights, device, causal=causal)
    ref = (scores.double().clamp_min(0) * weights.double()).sum(1, keepdim=True)
    if causal:
        future = torch.arange(K)[None, :] > (K - L + torch.arange(L))[:, None]
        ref = ref.masked_fill(future, -math.inf)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    close(out, ref, rtol=tol, atol=tol)


# --- jjang-ai/vmlx at 3e256e3f: vmlx_engine/metal/kernel_manager.py -----------------------------

def _create_moe_kernel():
    source = """
            uint b = thread_position_in_grid.x;
            uint expert_local = thread_position_in_grid.y;
            uint od = thread_position_in_grid.z;

            uint expert_id = (uint)expert_ids[expert_local];

            float sum = 0.0f;

            for (uint g = 0; g < (uint)n_groups; g++) {
                uint idx = (uint)indices[(expert_id * (uint)out_dim + od) * (uint)n_groups + g];
                uint cb_base = idx * (uint)group_size;
                uint x_base = b * (uint)in_dim + g * (uint)group_size;

                for (uint i = 0; i < (uint)group_size; i++) {
                    sum += (float)x[x_base + i] * (float)codebook[cb_base + i];
                }
            }

            uint out_idx = (b * (uint)k + expert_local) * (uint)out_dim + od;
            result[out_idx] = sum;
        """
    return kk.metal_kernel(
        name="codebook_moe_matvec",
        input_names=[
            "x",
            "codebook",
            "indices",
            "expert_ids",
            "batch_size",
            "k",
            "out_dim",
            "n_groups",
            "group_size",
            "in_dim",
        ],
        output_names=["result"],
        source=source,
        ensure_row_contiguous=True,
    )


def _create_2d_kernel():
    source = """
            uint b = thread_position_in_grid.x;
            uint od = thread_position_in_grid.y;

            float sum = 0.0f;

            for (uint g = 0; g < (uint)n_groups; g++) {
                uint idx = (uint)indices[od * (uint)n_groups + g];
                uint cb_base = idx * (uint)group_size;
                uint x_base = b * (uint)in_dim + g * (uint)group_size;

                for (uint i = 0; i < (uint)group_size; i++) {
                    sum += (float)x[x_base + i] * (float)codebook[cb_base + i];
                }
            }

            uint out_idx = b * (uint)out_dim + od;
            result[out_idx] = sum;
        """
    return kk.metal_kernel(
        name="codebook_matvec_2d",
        input_names=[
            "x",
            "codebook",
            "indices",
            "batch_size",
            "out_dim",
            "n_groups",
            "group_size",
            "in_dim",
        ],
        output_names=["result"],
        source=source,
        ensure_row_contiguous=True,
    )


def _u32(v):
    return torch.tensor(v, dtype=torch.uint32)


def _codebook_weights(codebook, indices):
    """W[..., od, g * group_size + i] = codebook[indices[..., od, g], i]."""
    w = codebook.double()[indices.long()]  # [..., out_dim, n_groups, group_size]
    return w.reshape(*indices.shape[:-1], -1)


def test_vmlx_codebook_moe_matvec(device):
    """jjang-ai/vmlx, CodebookKernelManager.codebook_moe_matvec: vector-quantized MoE matvec, one
    thread per (batch, selected expert, output row) with a (1, 1, 1) threadgroup; uint16 expert
    ids and codebook indices, a float16 codebook, and every size passed as a 0-d uint32 array
    (MLX binds those as `const constant uint&` scalars), one of them named `k`."""
    batch, n_experts, out_dim, n_groups, group_size, n_codes = 3, 6, 10, 4, 8, 50
    in_dim = n_groups * group_size
    x = torch.randn(batch, in_dim).to(torch.float16)
    codebook = torch.randn(n_codes, group_size).to(torch.float16)
    indices = torch.randint(0, n_codes, (n_experts, out_dim, n_groups)).to(torch.uint16)
    expert_ids = torch.tensor([4, 1, 5], dtype=torch.uint16)
    k = expert_ids.shape[0]
    out = launch(_create_moe_kernel(), device,
                 inputs=on(device, x, codebook, indices, expert_ids, _u32(batch), _u32(k),
                           _u32(out_dim), _u32(n_groups), _u32(group_size), _u32(in_dim)),
                 output_shapes=[(batch, k, out_dim)], output_dtypes=[x.dtype],
                 grid=(batch, k, out_dim), threadgroup=(1, 1, 1))[0]
    w = _codebook_weights(codebook, indices)[expert_ids.long()]  # [k, out_dim, in_dim]
    ref = torch.einsum("bi,koi->bko", x.double(), w)
    assert out.dtype == torch.float16
    close(out, ref, rtol=2e-3, atol=2e-2)


def test_vmlx_codebook_matvec_2d(device):
    """jjang-ai/vmlx, CodebookKernelManager.codebook_matvec_2d: the dense variant, a thread per
    (batch, output row) over a (batch, out_dim, 1) grid, float32 activations."""
    batch, out_dim, n_groups, group_size, n_codes = 4, 9, 5, 8, 33
    in_dim = n_groups * group_size
    x = torch.randn(batch, in_dim)
    codebook = torch.randn(n_codes, group_size).to(torch.float16)
    indices = torch.randint(0, n_codes, (out_dim, n_groups)).to(torch.uint16)
    out = launch(_create_2d_kernel(), device,
                 inputs=on(device, x, codebook, indices, _u32(batch), _u32(out_dim),
                           _u32(n_groups), _u32(group_size), _u32(in_dim)),
                 output_shapes=[(batch, out_dim)], output_dtypes=[x.dtype],
                 grid=(batch, out_dim, 1), threadgroup=(1, 1, 1))[0]
    ref = x.double() @ _codebook_weights(codebook, indices).T
    close(out, ref, rtol=1e-5, atol=1e-5)


# --- gabfssilva/mlx-omnia at b7a60d8e: src/mlx_omnia/engine/core/kernels/{route/sigmoid_topk, ---
# --- conv_step/fused}.py ------------------------------------------------------------------------

def _i32(value: int):
    return torch.tensor(value, dtype=torch.int32)


_ROUTE_SOURCE = """
    uint sg = thread_position_in_threadgroup.x / 32;
    uint lane = thread_position_in_threadgroup.x % 32;
    uint k4 = (uint)KD / 4;

    threadgroup float scores[E];
    const device vec<T, 4>* w = (const device vec<T, 4>*)(RW + (size_t)sg * (uint)KD);
    const device vec<T, 4>* xv = (const device vec<T, 4>*)X;
    float4 acc = float4(0.0f);
    for (uint i = lane; i < k4; i += 32) {
        acc += float4(xv[i]) * float4(w[i]);
    }
    float dot = simd_sum(acc.x + acc.y + acc.z + acc.w);
    if (lane == 0) {
        scores[sg] = 1.0f / (1.0f + metal::exp(-dot));
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg != 0) return;

    float score = scores[lane];
    float selector = score + BIAS[lane];
    float picked[TOPK];
    float total = 0.0f;
    for (uint j = 0; j < TOPK; j++) {
        float best = simd_max(selector);
        int winner = simd_max(selector == best ? (int)lane : -1);
        float s = simd_shuffle(score, (ushort)winner);
        picked[j] = s;
        total += s;
        if ((int)lane == winner) selector = -INFINITY;
        if (lane == 0) OI[j] = (uint)winner;
    }
    if (lane < TOPK) {
        float w = picked[lane];
        OW[lane] = (T)((NORM ? w / (total + 1e-6f) : w) * SCALE);
    }
"""

def _route_kernel():
    return kk.metal_kernel(
        name="moe_route_sigmoid",
        input_names=["X", "RW", "BIAS", "SCALE", "KD"],
        output_names=["OI", "OW"],
        source=_ROUTE_SOURCE,
    )


def moe_route_sigmoid(x, router, bias, scale, k, device, *, normalized):
    """mlx_omnia's moe_route_sigmoid, in torch."""
    experts, kdim = router.shape
    assert experts <= 32 and kdim % 4 == 0 and 0 < k <= 32
    out = launch(
        _route_kernel(), device,
        inputs=on(device, x, router, bias, scale, _i32(kdim)),
        template=[
            ("T", x.dtype),
            ("E", experts),
            ("TOPK", k),
            ("NORM", int(normalized)),
        ],
        grid=(experts * 32, 1, 1),
        threadgroup=(experts * 32, 1, 1),
        output_shapes=[(k,), (k,)],
        output_dtypes=[torch.uint32, x.dtype],
    )
    return out[0], out[1]


@pytest.mark.parametrize("dtype,normalized", [(torch.float32, True), (torch.bfloat16, False)])
def test_mlx_omnia_moe_route_sigmoid(device, dtype, normalized):
    """gabfssilva/mlx-omnia, route/sigmoid_topk.py: one threadgroup, one simdgroup per expert;
    each dots the token with its router row through `const device vec<T, 4>*` casts and
    simd_sum, sigmoids into threadgroup memory sized by the template E, then simdgroup 0 picks
    the top k with simd_max over floats and over lane ids and simd_shuffle(score, (ushort)winner).

    With 32 experts only: simdgroup 0 reads scores[lane] and BIAS[lane] for all 32 lanes, past
    the end of both when E < 32 (the original's out-of-bounds read; its tests use 32 experts)."""
    torch.manual_seed(3)
    experts, hidden, k = 32, 64, 6
    x = torch.randn(hidden).to(dtype)
    router = (torch.randn(experts, hidden) / 4).to(dtype)
    bias = torch.randn(experts) * 0.1
    scale = torch.tensor(2.5)
    oi, ow = moe_route_sigmoid(x, router, bias, scale, k, device, normalized=normalized)
    score = torch.sigmoid(router.double() @ x.double())
    order = torch.argsort(score + bias.double(), descending=True)[:k]
    picked = score[order]
    ref_w = (picked / (picked.sum() + 1e-6) if normalized else picked) * 2.5
    assert oi.dtype == torch.uint32 and ow.dtype == dtype
    assert oi.cpu().long().tolist() == order.tolist()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    close(ow, ref_w, rtol=tol, atol=tol)


_SOURCE = """
    uint c = thread_position_in_grid.x;
    uint cd = (uint)CD;
    if (c >= cd) return;
    {
    #pragma clang fp contract(off)
    constexpr uint k = KERNEL;
    float m = (float)(T)((float)WIN[c] * (float)TAPS[c * k + 0]);
    for (uint t = 1; t + 1 < k; t++) {
        float p = (float)(T)((float)WIN[t * cd + c] * (float)TAPS[c * k + t]);
        m = (float)(T)(m + p);
    }
    float last = (float)(T)((float)X[c] * (float)TAPS[c * k + (k - 1)]);
    m = (float)(T)(m + last);
    if (HAS_BIAS) {
        m = (float)(T)(m + (float)BIAS[c]);
    }
    // mlx's own Sigmoid: 1/(1+exp(|x|)) mirrored by sign, with every op in T — the
    // stock unary kernel is templated on T and a bf16 chain rounds at each step.
    T mt = (T)m;
    T y = (T)1 / ((T)1 + metal::precise::exp(metal::abs(mt)));
    T s = (mt < (T)0) ? y : (T)1 - y;
    OUT[c] = (T)((T)m * s);
    for (uint t = 0; t + 2 < k; t++) {
        WOUT[t * cd + c] = WIN[(t + 1) * cd + c];
    }
    WOUT[(k - 2) * cd + c] = X[c];
    }
"""

def _conv_kernel():
    return kk.metal_kernel(
        name="conv_step",
        input_names=["X", "TAPS", "BIAS", "WIN", "CD"],
        output_names=["OUT", "WOUT"],
        source=_SOURCE,
    )


def conv_step(x, taps, bias, window, conv_dim, kernel, has_bias, device):
    """mlx_omnia's FusedConvStep.__call__, in torch."""
    out = launch(
        _conv_kernel(), device,
        inputs=on(device, x, taps, bias, window, torch.tensor(conv_dim, dtype=torch.int32)),
        template=[
            ("T", x.dtype),
            ("KERNEL", kernel),
            ("HAS_BIAS", has_bias),
        ],
        grid=(conv_dim, 1, 1),
        threadgroup=(min(conv_dim, 256), 1, 1),
        output_shapes=[(conv_dim,), (kernel - 1, conv_dim)],
        output_dtypes=[x.dtype, x.dtype],
    )
    return out[0], out[1]


@pytest.mark.parametrize("dtype,has_bias", [(torch.float32, True), (torch.bfloat16, False)])
def test_mlx_omnia_conv_step(device, dtype, has_bias):
    """gabfssilva/mlx-omnia, conv_step/fused.py: the T=1 causal depthwise conv + SiLU step, a
    thread per channel rounding to T after every op (`#pragma clang fp contract(off)` in a nested
    block, metal::precise::exp on T, a bool template HAS_BIAS) and shifting the window into a
    second output."""
    conv_dim, kernel = 300, 4
    x = torch.randn(conv_dim).to(dtype)
    taps = torch.randn(conv_dim, kernel).to(dtype)
    bias = torch.randn(conv_dim).to(dtype) if has_bias else torch.zeros(conv_dim, dtype=dtype)
    window = torch.randn(kernel - 1, conv_dim).to(dtype)
    out, wout = conv_step(x, taps, bias, window, conv_dim, kernel, has_bias, device)

    def r(v):  # round to T, as the kernel does at each op boundary
        return v.to(dtype).double()

    t = taps.double()
    m = r(window.double()[0] * t[:, 0])
    for i in range(1, kernel - 1):
        m = r(m + r(window.double()[i] * t[:, i]))
    m = r(m + r(x.double() * t[:, kernel - 1]))
    if has_bias:
        m = r(m + bias.double())
    ref = r(m * r(torch.sigmoid(m)))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    close(out, ref, rtol=tol, atol=tol)
    assert torch.equal(wout.cpu(), torch.cat([window[1:], x[None]]))


# --- gabfssilva/mlx-omnia at b7a60d8e: src/mlx_omnia/engine/core/kernels/embed/atlas.py --------

_ATLAS_SOURCE = """
    constexpr uint hidden_size = (uint)H;
    constexpr uint hidden_vectors = hidden_size / 4;
    constexpr uint full_width = (uint)FW;
    constexpr uint sliding_width = (uint)SW;

    uint lane = thread_position_in_grid.x;
    uint token = uint(tokens[0]);
    uint position = uint(atlas_position);

    const device vec<bfloat, 4>* embedding_vectors =
        (const device vec<bfloat, 4>*)(
            embedding_weight + token * hidden_size);
    device vec<bfloat, 4>* hidden_vectors_out =
        (device vec<bfloat, 4>*)(hidden);
    if (lane < hidden_vectors) {
        hidden_vectors_out[lane] = embedding_vectors[lane];
    }

    if (lane < full_width / 4) {
        const device vec<float, 4>* atlas_vectors =
            (const device vec<float, 4>*)(
                full_atlas + position * full_width);
        ((device vec<float, 4>*)(full_angles))[lane] =
            atlas_vectors[lane];
    }
    if (lane < sliding_width / 4) {
        const device vec<float, 4>* atlas_vectors =
            (const device vec<float, 4>*)(
                sliding_atlas + position * sliding_width);
        ((device vec<float, 4>*)(sliding_angles))[lane] =
            atlas_vectors[lane];
    }
"""

_MAX_THREADS = 1024


def _atlas_kernel():
    return kk.metal_kernel(
        name="decode_embedding_rope_atlas_bf16",
        input_names=[
            "tokens",
            "embedding_weight",
            "full_atlas",
            "sliding_atlas",
            "atlas_position",
        ],
        output_names=["hidden", "full_angles", "sliding_angles"],
        source=_ATLAS_SOURCE,
    )


def test_mlx_omnia_embedding_rope_atlas(device):
    """gabfssilva/mlx-omnia, embed/atlas.py: three bit-exact copies in one dispatch (a bf16
    embedding row and two float32 angle-atlas rows), each moved as `vec<bfloat, 4>` /
    `vec<float, 4>` through casts of the device pointers, `constexpr uint` sizes from the
    template, the position a 0-d int32 input (MLX's `const constant int&`)."""
    vocab, hidden, positions, full_width, sliding_width = 50, 96, 20, 32, 64
    embedding = torch.randn(vocab, hidden).to(torch.bfloat16)
    full_atlas = torch.randn(positions, full_width)
    sliding_atlas = torch.randn(positions, sliding_width)
    tokens = torch.tensor([37], dtype=torch.int32)
    position = 11
    threads = max(hidden, full_width, sliding_width) // 4
    hidden_out, full_out, sliding_out = launch(
        _atlas_kernel(), device,
        inputs=on(device, tokens, embedding, full_atlas, sliding_atlas,
                  torch.tensor(position, dtype=torch.int32)),
        template=[("H", hidden), ("FW", full_width), ("SW", sliding_width)],
        grid=(threads, 1, 1),
        threadgroup=(min(threads, _MAX_THREADS), 1, 1),
        output_shapes=[(hidden,), (full_width,), (sliding_width,)],
        output_dtypes=[torch.bfloat16, torch.float32, torch.float32],
    )
    assert torch.equal(hidden_out.cpu(), embedding[37])
    assert torch.equal(full_out.cpu(), full_atlas[position])
    assert torch.equal(sliding_out.cpu(), sliding_atlas[position])


# --- gabfssilva/mlx-omnia at b7a60d8e: src/mlx_omnia/engine/core/kernels/lm_head/argmax.py -----

_PARTIALS = 128
_READS = 4

_ARGMAX_STAGE1_SOURCE = """
    constexpr uint ROW_SIZE = (uint)VOCAB / 128u;
    constexpr uint READS = 4;
    constexpr uint ACTIVE_THREADS = ROW_SIZE / READS;
    constexpr uint SIMD_GROUPS = (ACTIVE_THREADS + 31u) / 32u;

    uint row = threadgroup_position_in_grid.y;
    uint lid = thread_position_in_threadgroup.x;
    uint simd_lane = thread_index_in_simdgroup;
    uint simd_group = simdgroup_index_in_threadgroup;
    threadgroup float shared_vals[32];
    threadgroup uint shared_idxs[32];

    float best = -metal::numeric_limits<float>::infinity();
    uint best_idx = 0xFFFFFFFFu;
    if (lid < ACTIVE_THREADS) {
        uint base = row * ROW_SIZE + lid * READS;
        #pragma clang loop unroll(full)
        for (uint i = 0; i < READS; ++i) {
            float v = coarse[base + i];
            if (v > best || (v == best && base + i < best_idx)) {
                best = v;
                best_idx = base + i;
            }
        }
    }

    #pragma clang loop unroll(full)
    for (ushort sn = 16; sn >= 1; sn >>= 1) {
        float ov = simd_shuffle_down(best, sn);
        uint oi = simd_shuffle_down(best_idx, sn);
        if (ov > best || (ov == best && oi < best_idx)) {
            best = ov;
            best_idx = oi;
        }
    }
    if (simd_lane == 0) {
        shared_vals[simd_group] = best;
        shared_idxs[simd_group] = best_idx;
    }

    threadgroup_barrier(mem_flags::mem_threadgroup);
    best = lid < SIMD_GROUPS
        ? shared_vals[lid]
        : -metal::numeric_limits<float>::infinity();
    best_idx = lid < SIMD_GROUPS ? shared_idxs[lid] : 0xFFFFFFFFu;
    #pragma clang loop unroll(full)
    for (ushort sn = 16; sn >= 1; sn >>= 1) {
        float ov = simd_shuffle_down(best, sn);
        uint oi = simd_shuffle_down(best_idx, sn);
        if (ov > best || (ov == best && oi < best_idx)) {
            best = ov;
            best_idx = oi;
        }
    }
    if (lid == 0) {
        partial_max[row] = best;
        partial_idx[row] = best_idx;
    }
"""


def _argmax_stage1_kernel():
    return kk.metal_kernel(
        name="lm_head_coarse_argmax_stage1",
        input_names=["coarse"],
        output_names=["partial_max", "partial_idx"],
        source=_ARGMAX_STAGE1_SOURCE,
    )


def _argmax_threads(vocab: int) -> int:
    active = vocab // (_PARTIALS * _READS)
    return ((active + 31) // 32) * 32


def lm_head_coarse_argmax_partials(coarse, device):
    """mlx_omnia's lm_head_coarse_argmax_partials, in torch."""
    (vocab,) = coarse.shape
    threads = _argmax_threads(vocab)
    partial_max, partial_idx = launch(
        _argmax_stage1_kernel(), device,
        inputs=on(device, coarse),
        template=[("VOCAB", vocab)],
        grid=(threads, _PARTIALS, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(_PARTIALS,), (_PARTIALS,)],
        output_dtypes=[torch.float32, torch.uint32],
    )
    return partial_max, partial_idx


def test_mlx_omnia_coarse_argmax_partials(device):
    """gabfssilva/mlx-omnia, lm_head/argmax.py stage one: 128 partial (max, index) pairs, each
    threadgroup reducing its partition with `simd_shuffle_down` over a `ushort` offset loop
    (`#pragma clang loop unroll(full)`), then across simdgroups through threadgroup memory, the
    lowest index winning ties; lanes past ACTIVE_THREADS start at -infinity / 0xFFFFFFFF."""
    torch.manual_seed(5)
    vocab = _PARTIALS * _READS * 40  # 160 values a partition: 40 active lanes of 64
    coarse = torch.randn(vocab)
    rows = coarse.view(_PARTIALS, -1)
    rows[3, 100] = rows[3, 7] = 9.0  # a tie across simdgroups: the lower index wins
    rows[8, 5] = rows[8, 6] = 9.0  # a tie inside one lane's reads
    partial_max, partial_idx = lm_head_coarse_argmax_partials(coarse, device)
    ref_max = rows.max(dim=1).values
    first = (rows == ref_max[:, None]).int().argmax(dim=1)  # the lowest index of the max
    close(partial_max, ref_max, rtol=0, atol=0)
    expect = torch.arange(_PARTIALS) * rows.shape[1] + first
    assert partial_idx.cpu().long().tolist() == expect.tolist()
