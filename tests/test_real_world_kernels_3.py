"""More custom Metal kernels from public MLX projects, run as their authors wrote them.

As in test_real_world_kernels_2.py: each kernel's source and header strings are copied verbatim
from the repository its docstring names (where that repository generates them in Python, its
generator is copied, mx.fast.metal_kernel becoming kk.metal_kernel and its Metal-availability
guards dropped); the Python around them is translated from mx to torch, keeping every grid,
threadgroup and template argument as written. Inputs are made on `device`; every reference is
computed on the CPU in float64 (or exactly, for integers) from the kernel's documented intent.
"""

import math

import numpy as np
import pytest
import torch

import kernelkit as kk
from test_real_world_kernels_2 import QWEN35_QLINEAR_HEADER


def launch(kernel, device, **call):
    """`kernel(**call)` on `device` (conftest compiles each variant for sm_90 too, without a GPU)."""
    return kernel(stream=device, **call)


def close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol)


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def pack_bits(values, bits):
    """(..., L) integers below 2**bits -> (..., ceil(L*bits/32)) uint32 words: one little-endian
    bit stream, value i at bits [i*bits, (i+1)*bits) (turboquant's _pack_lowbit, MLX's layout)."""
    values = np.asarray(values, dtype=np.uint64)
    length = values.shape[-1]
    width = (length * bits + 31) // 32
    stream = (values[..., None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    stream = stream.reshape(*values.shape[:-1], length * bits)
    stream = np.concatenate(
        [stream, np.zeros((*values.shape[:-1], width * 32 - length * bits), np.uint64)], -1)
    words = (stream.reshape(*values.shape[:-1], width, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    return torch.from_numpy(words.astype(np.int64)).to(torch.uint32)


def unpack_bits(words, bits, length):
    """The inverse of pack_bits: (..., W) uint32 words -> (..., length) int64 values."""
    w = words.cpu().to(torch.int64).numpy().astype(np.uint64)
    stream = (w[..., None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)
    stream = stream.reshape(*w.shape[:-1], -1)[..., :length * bits]
    values = (stream.reshape(*w.shape[:-1], length, bits) << np.arange(bits, dtype=np.uint64)).sum(-1)
    return torch.from_numpy(values.astype(np.int64))


def codebook(bits):
    """A sorted Lloyd-Max-like codebook of 2**bits float32 entries around 0."""
    return torch.sort(torch.randn(2 ** bits) * 0.1).values


# --- Blaizzy/mlx-vlm: mlx_vlm/turboquant.py (TurboQuant KV-cache codecs) ------------------------
# The kernel factories below are turboquant.py's, copied as written.

def _mse_score_tiled_kernel(repeat_count: int):
    """Tiled MSE score: preload R queries into registers, loop over tokens.
    Processes TokTileSize tokens per threadgroup instead of 1.
    Reduces threadgroup count by TokTileSize×, amortizing dispatch overhead."""

    lines = [
        "        auto lane = thread_position_in_grid.x;",
        "        auto n = thread_position_in_grid.z;",
        "",
        "        auto token_count = norms_shape[2];",
        "        auto kv_heads = norms_shape[1];",
        "        auto num_tok_tiles = (token_count + TokTileSize - 1) / TokTileSize;",
        "        auto bh = n / num_tok_tiles;",
        "        auto tok_tile = n % num_tok_tiles;",
        "        int t_start = tok_tile * TokTileSize;",
        "        int t_end = min(t_start + TokTileSize, (int)token_count);",
        "",
        "        auto q_base = q_rot + (bh * RepeatCount) * Dim;",
        "        auto pk = packed + bh * token_count * PackedWidth;",
        "        auto nm = norms + bh * token_count;",
        "",
        "        // Preload query values into registers (constant across all tokens)",
    ]

    for r in range(repeat_count):
        lines += [
            f"        float qr_{r}[DimsPerLane];",
            f"        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32)",
            f"            qr_{r}[i] = (d < Dim) ? static_cast<float>(q_base[{r} * Dim + d]) : 0.0f;",
        ]

    lines += [
        "",
        "        // Precompute bit offsets for key unpacking",
        "        int k_words[DimsPerLane], k_offs[DimsPerLane];",
        "        bool k_spills[DimsPerLane];",
        "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32) {",
        "            int bo = d * Bits;",
        "            k_words[i] = bo / 32;",
        "            k_offs[i] = bo % 32;",
        "            k_spills[i] = (bo % 32 + Bits) > 32;",
        "        }",
        "        constexpr uint mask = (1u << Bits) - 1u;",
        "",
        "        // Token loop: key data changes, queries stay in registers",
        "        for (int t = t_start; t < t_end; t++) {",
        "            auto pt = pk + t * PackedWidth;",
        "            float kn = static_cast<float>(nm[t]);",
        "",
    ]

    for r in range(repeat_count):
        lines += [f"            float ps_{r} = 0.0f;"]

    lines += [
        "            for (int i = 0; i < DimsPerLane; i++) {",
        "                uint vv = (pt[k_words[i]] >> k_offs[i]);",
        "                if (k_spills[i]) vv |= pt[k_words[i]+1] << (Bits - (k_offs[i]+Bits-32));",
        "                float code = codebook[vv & mask];",
    ]

    for r in range(repeat_count):
        lines += [f"                ps_{r} += qr_{r}[i] * code;"]

    lines += [
        "            }",
        "",
    ]

    for r in range(repeat_count):
        lines += [f"            float s_{r} = simd_sum(ps_{r});"]

    lines += [
        "            if (thread_index_in_simdgroup == 0) {",
    ]
    for r in range(repeat_count):
        lines += [
            f"                out[(bh * RepeatCount + {r}) * token_count + t] = kn * s_{r};",
        ]
    lines += [
        "            }",
        "        }",
    ]

    return kk.metal_kernel(
        name=f"turboquant_mse_score_tiled_{repeat_count}",
        input_names=["q_rot", "norms", "packed", "codebook"],
        output_names=["out"],
        source="\n".join(lines),
    )


def _pack_lowbit_kernel():
    source = r"""
        auto word = thread_position_in_grid.x;
        auto row = thread_position_in_grid.y;

        if (row >= values_shape[0] || word >= PackedWidth) {
            return;
        }

        auto values_ptr = values + row * Length;
        uint packed_word = 0u;
        int start = max(0, (int(word) * 32 - (Bits - 1)) / Bits);
        int end = min(Length, ((int(word) + 1) * 32 + (Bits - 1)) / Bits);

        for (int idx = start; idx < end; ++idx) {
            int bit_offset = idx * Bits;
            int word_idx = bit_offset / 32;
            int offset = bit_offset % 32;
            uint value = values_ptr[idx] & ((1u << Bits) - 1u);
            if (word_idx == word) {
                packed_word |= value << offset;
            }
            if (word_idx + 1 == word) {
                int spill = offset + Bits - 32;
                if (spill > 0) {
                    packed_word |= value >> (Bits - spill);
                }
            }
        }

        out[row * PackedWidth + word] = packed_word;
    """
    return kk.metal_kernel(
        name="turboquant_pack_lowbit",
        input_names=["values"],
        output_names=["out"],
        source=source,
    )


def _unpack_lowbit_kernel():
    source = r"""
        auto idx = thread_position_in_grid.x;
        auto row = thread_position_in_grid.y;

        if (row >= packed_shape[0] || idx >= Length) {
            return;
        }

        auto packed_ptr = packed + row * PackedWidth;
        int bit_offset = idx * Bits;
        int word_idx = bit_offset / 32;
        int offset = bit_offset % 32;
        uint value = packed_ptr[word_idx] >> offset;
        int spill = offset + Bits - 32;
        if (spill > 0) {
            value |= packed_ptr[word_idx + 1] << (Bits - spill);
        }
        out[row * Length + idx] = value & ((1u << Bits) - 1u);
    """
    return kk.metal_kernel(
        name="turboquant_unpack_lowbit",
        input_names=["packed"],
        output_names=["out"],
        source=source,
    )


def _prod_score_repeat_kernel(repeat_count: int):
    # Group-by-codebook-entry scoring: accumulate q_rot by index, then
    # dot with codebook after the dim loop. Removes codebook multiply from
    # the inner loop (D additions instead of D FMAs, then 2^b FMAs).
    lines = [
        "        auto lane = thread_position_in_grid.x;",
        "        auto n = thread_position_in_grid.z;",
        "",
        "        auto token_count = norms_shape[2];",
        "        auto kv_heads = norms_shape[1];",
        "        auto repeat_count = q_rot_shape[2];",
        "        constexpr uint mse_mask = (1u << MseBits) - 1u;",
        "        constexpr int num_entries = 1 << MseBits;",
        "",
        "        auto b = n / (kv_heads * token_count);",
        "        auto rem = n % (kv_heads * token_count);",
        "        auto h = rem / token_count;",
        "        auto t = rem % token_count;",
        "",
        "        auto q_rot_base = q_rot + ((b * kv_heads + h) * repeat_count) * Dim;",
        "        auto q_proj_base = q_proj + ((b * kv_heads + h) * repeat_count) * Dim;",
        "        auto mse_ptr = mse_packed + ((b * kv_heads + h) * token_count + t) * MsePackedWidth;",
        "        auto sign_ptr = signs + ((b * kv_heads + h) * token_count + t) * SignPackedWidth;",
        "",
        "        auto idx = (b * kv_heads + h) * token_count + t;",
        "        float norm = static_cast<float>(norms[idx]);",
        "        float residual_norm = static_cast<float>(residual_norms[idx]);",
        "",
    ]
    # Per-repeat group accumulators and QJL accumulators
    for r in range(repeat_count):
        lines.append(f"        float grp_{r}[num_entries] = {{}};")
        lines.append(f"        float qjl_acc_{r} = 0.0f;")
    lines += [
        "",
        "        for (int d = lane; d < Dim; d += 32) {",
        "            int bit_offset = d * MseBits;",
        "            int word_idx = bit_offset / 32;",
        "            int offset = bit_offset % 32;",
        "            uint value = mse_ptr[word_idx] >> offset;",
        "            int spill = offset + MseBits - 32;",
        "            if (spill > 0) {",
        "                value |= mse_ptr[word_idx + 1] << (MseBits - spill);",
        "            }",
        "            value &= mse_mask;",
        "",
        "            int sign_word = d / 32;",
        "            int sign_offset = d % 32;",
        "            uint bit = (sign_ptr[sign_word] >> sign_offset) & 1u;",
        "            float sign = bit ? 1.0f : -1.0f;",
        "",
    ]
    # Group q_rot by codebook index (no multiply in inner loop)
    for r in range(repeat_count):
        lines.append(
            f"            grp_{r}[value] += static_cast<float>(q_rot_base[{r} * Dim + d]);"
        )
        lines.append(
            f"            qjl_acc_{r} += static_cast<float>(q_proj_base[{r} * Dim + d]) * sign;"
        )
    lines += [
        "        }",
        "",
        "        // Dot product: group sums × codebook entries",
    ]
    for r in range(repeat_count):
        lines.append(f"        float mse_acc_{r} = 0.0f;")
        lines.append(f"        for (int k = 0; k < num_entries; k++)")
        lines.append(f"            mse_acc_{r} += grp_{r}[k] * codebook[k];")

    lines.append("")
    for r in range(repeat_count):
        lines.append(f"        float mse_sum_{r} = simd_sum(mse_acc_{r});")
        lines.append(f"        float qjl_sum_{r} = simd_sum(qjl_acc_{r});")
    lines += [
        "",
        "        if (thread_index_in_simdgroup == 0) {",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            out[((b * kv_heads + h) * repeat_count + {r}) * token_count + t] ="
        )
        lines.append(
            f"                norm * (mse_sum_{r} + scale[0] * residual_norm * qjl_sum_{r});"
        )
    lines += [
        "        }",
    ]

    source = "\n".join(lines)
    return kk.metal_kernel(
        name=f"turboquant_prod_score_repeat_{repeat_count}",
        input_names=[
            "q_rot",
            "q_proj",
            "norms",
            "residual_norms",
            "mse_packed",
            "signs",
            "codebook",
            "scale",
        ],
        output_names=["out"],
        source=source,
    )


def _polar_turbo_score_repeat_kernel(level_bits: tuple[int, ...], repeat_count: int):
    bits1, bits2, bits3, bits4 = level_bits
    mask1 = (1 << bits1) - 1
    mask2 = (1 << bits2) - 1
    mask3 = (1 << bits3) - 1
    mask4 = (1 << bits4) - 1

    input_names = ["q_rot", "q_proj", "norms", "radii"]
    for level in range(4):
        input_names.append(f"angles_{level + 1}")
    input_names.extend(["residual_norms", "signs", "scale"])
    for level in range(4):
        input_names.append(f"cos_{level + 1}")
        input_names.append(f"sin_{level + 1}")

    lines = [
        "        auto lane = thread_position_in_grid.x;",
        "        auto n = thread_position_in_grid.z;",
        "",
        "        auto token_count = norms_shape[2];",
        "        auto kv_heads = norms_shape[1];",
        "",
        "        auto b = n / (kv_heads * token_count);",
        "        auto rem = n % (kv_heads * token_count);",
        "        auto h = rem / token_count;",
        "        auto t = rem % token_count;",
        "",
        "        auto q_rot_base = q_rot + ((b * kv_heads + h) * RepeatCount) * Dim;",
        "        auto q_proj_base = q_proj + ((b * kv_heads + h) * RepeatCount) * Dim;",
        "        auto radii_ptr = radii + ((b * kv_heads + h) * token_count + t) * BlockCount;",
        "        auto angle1_ptr = angles_1 + ((b * kv_heads + h) * token_count + t) * PackedWidth1;",
        "        auto angle2_ptr = angles_2 + ((b * kv_heads + h) * token_count + t) * PackedWidth2;",
        "        auto angle3_ptr = angles_3 + ((b * kv_heads + h) * token_count + t) * PackedWidth3;",
        "        auto angle4_ptr = angles_4 + ((b * kv_heads + h) * token_count + t) * PackedWidth4;",
        "        auto sign_ptr = signs + ((b * kv_heads + h) * token_count + t) * SignPackedWidth;",
        "",
        "        auto idx = (b * kv_heads + h) * token_count + t;",
        "        float norm = static_cast<float>(norms[idx]);",
        "        float residual_norm = static_cast<float>(residual_norms[idx]);",
        "",
    ]
    for r in range(repeat_count):
        lines.append(f"        threadgroup float level1_{r}[Dim / 2];")
        lines.append(f"        threadgroup float level2_{r}[Dim / 4];")
        lines.append(f"        threadgroup float level3_{r}[Dim / 8];")
        lines.append(f"        threadgroup float level4_{r}[BlockCount];")
    lines += [""]
    for r in range(repeat_count):
        lines.append(f"        float qjl_acc_{r} = 0.0f;")
    lines += [
        "",
        "        for (int pair_idx = lane; pair_idx < Dim / 2; pair_idx += 32) {",
        f"            int bit_offset_1 = pair_idx * {bits1};",
        "            int word_idx_1 = bit_offset_1 / 32;",
        "            int offset_1 = bit_offset_1 % 32;",
        "            uint value_1 = angle1_ptr[word_idx_1] >> offset_1;",
        f"            int spill_1 = offset_1 + {bits1} - 32;",
        "            if (spill_1 > 0) {",
        f"                value_1 |= angle1_ptr[word_idx_1 + 1] << ({bits1} - spill_1);",
        "            }",
        f"            value_1 &= {mask1}u;",
        "            float cos_1_val = static_cast<float>(cos_1[value_1]);",
        "            float sin_1_val = static_cast<float>(sin_1[value_1]);",
        "            int d0 = pair_idx << 1;",
        "            int d1 = d0 + 1;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            level1_{r}[pair_idx] = static_cast<float>(q_rot_base[{r} * Dim + d0]) * cos_1_val + static_cast<float>(q_rot_base[{r} * Dim + d1]) * sin_1_val;"
        )
    lines += [
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        for (int pair_idx = lane; pair_idx < Dim / 4; pair_idx += 32) {",
        f"            int bit_offset_2 = pair_idx * {bits2};",
        "            int word_idx_2 = bit_offset_2 / 32;",
        "            int offset_2 = bit_offset_2 % 32;",
        "            uint value_2 = angle2_ptr[word_idx_2] >> offset_2;",
        f"            int spill_2 = offset_2 + {bits2} - 32;",
        "            if (spill_2 > 0) {",
        f"                value_2 |= angle2_ptr[word_idx_2 + 1] << ({bits2} - spill_2);",
        "            }",
        f"            value_2 &= {mask2}u;",
        "            float cos_2_val = static_cast<float>(cos_2[value_2]);",
        "            float sin_2_val = static_cast<float>(sin_2[value_2]);",
        "            int child = pair_idx << 1;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            level2_{r}[pair_idx] = level1_{r}[child] * cos_2_val + level1_{r}[child + 1] * sin_2_val;"
        )
    lines += [
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        for (int pair_idx = lane; pair_idx < Dim / 8; pair_idx += 32) {",
        f"            int bit_offset_3 = pair_idx * {bits3};",
        "            int word_idx_3 = bit_offset_3 / 32;",
        "            int offset_3 = bit_offset_3 % 32;",
        "            uint value_3 = angle3_ptr[word_idx_3] >> offset_3;",
        f"            int spill_3 = offset_3 + {bits3} - 32;",
        "            if (spill_3 > 0) {",
        f"                value_3 |= angle3_ptr[word_idx_3 + 1] << ({bits3} - spill_3);",
        "            }",
        f"            value_3 &= {mask3}u;",
        "            float cos_3_val = static_cast<float>(cos_3[value_3]);",
        "            float sin_3_val = static_cast<float>(sin_3[value_3]);",
        "            int child = pair_idx << 1;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            level3_{r}[pair_idx] = level2_{r}[child] * cos_3_val + level2_{r}[child + 1] * sin_3_val;"
        )
    lines += [
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        for (int pair_idx = lane; pair_idx < BlockCount; pair_idx += 32) {",
        f"            int bit_offset_4 = pair_idx * {bits4};",
        "            int word_idx_4 = bit_offset_4 / 32;",
        "            int offset_4 = bit_offset_4 % 32;",
        "            uint value_4 = angle4_ptr[word_idx_4] >> offset_4;",
        f"            int spill_4 = offset_4 + {bits4} - 32;",
        "            if (spill_4 > 0) {",
        f"                value_4 |= angle4_ptr[word_idx_4 + 1] << ({bits4} - spill_4);",
        "            }",
        f"            value_4 &= {mask4}u;",
        "            float cos_4_val = static_cast<float>(cos_4[value_4]);",
        "            float sin_4_val = static_cast<float>(sin_4[value_4]);",
        "            int child = pair_idx << 1;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            level4_{r}[pair_idx] = level3_{r}[child] * cos_4_val + level3_{r}[child + 1] * sin_4_val;"
        )
    lines += [
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        for (int d = lane; d < Dim; d += 32) {",
        "            int sign_word = d / 32;",
        "            int sign_offset = d % 32;",
        "            uint bit = (sign_ptr[sign_word] >> sign_offset) & 1u;",
        "            float sign = bit ? 1.0f : -1.0f;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            qjl_acc_{r} += static_cast<float>(q_proj_base[{r} * Dim + d]) * sign;"
        )
    lines += [
        "        }",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"        float polar_acc_{r} = lane < BlockCount ? static_cast<float>(radii_ptr[lane]) * level4_{r}[lane] : 0.0f;"
        )
        lines.append(f"        float polar_sum_{r} = simd_sum(polar_acc_{r});")
        lines.append(f"        float qjl_sum_{r} = simd_sum(qjl_acc_{r});")
    lines += [
        "",
        "        if (thread_index_in_simdgroup == 0) {",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            out[((b * kv_heads + h) * RepeatCount + {r}) * token_count + t] ="
        )
        lines.append(
            f"                norm * (polar_sum_{r} + scale[0] * residual_norm * qjl_sum_{r});"
        )
    lines += [
        "        }",
    ]

    return kk.metal_kernel(
        name="turboquant_polar_turbo_score_"
        + "_".join(str(bit) for bit in level_bits)
        + f"_repeat_{repeat_count}",
        input_names=input_names,
        output_names=["out"],
        source="\n".join(lines),
    )


def _mse_scores_weighted_rot_repeat_kernel(repeat_count: int):
    """Single-pass fused softmax + weighted sum kernel.

    Takes precomputed max_scores to avoid a separate token-dimension pass.
    """

    lines = [
        "        auto lane = thread_position_in_grid.x;",
        "        auto dim_idx = thread_position_in_grid.y;",
        "        auto n = thread_position_in_grid.z;",
        "",
        "        if (dim_idx >= Dim) {",
        "            return;",
        "        }",
        "",
        "        auto token_count = norms_shape[2];",
        "        auto kv_heads = norms_shape[1];",
        "        auto repeat_count = scores_shape[2];",
        "        auto b = n / kv_heads;",
        "        auto h = n % kv_heads;",
        "",
        "        auto scores_base = scores + ((b * kv_heads + h) * repeat_count) * token_count;",
        "        auto norms_ptr = norms + (b * kv_heads + h) * token_count;",
        "        auto packed_ptr = packed + ((b * kv_heads + h) * token_count) * PackedWidth;",
        "        auto max_base = max_scores + (b * kv_heads + h) * repeat_count;",
        "",
        "        int bit_offset = dim_idx * Bits;",
        "        int word_idx = bit_offset / 32;",
        "        int offset = bit_offset % 32;",
        "",
    ]
    for r in range(repeat_count):
        lines.append(
            f"        float max_score_{r} = static_cast<float>(max_base[{r}]);"
        )
        lines.append(f"        float acc_{r} = 0.0f;")
        lines.append(f"        float denom_{r} = 0.0f;")
    lines += [
        "",
        "        for (int t = lane; t < token_count; t += 32) {",
        "            auto token_ptr = packed_ptr + t * PackedWidth;",
        "            uint value = token_ptr[word_idx] >> offset;",
        "            int spill = offset + Bits - 32;",
        "            if (spill > 0) {",
        "                value |= token_ptr[word_idx + 1] << (Bits - spill);",
        "            }",
        "            value &= ((1u << Bits) - 1u);",
        "            float code = codebook[value];",
        "            float norm = static_cast<float>(norms_ptr[t]);",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            float weight_{r} = exp(static_cast<float>(scores_base[{r} * token_count + t]) - max_score_{r});"
        )
        lines.append(f"            acc_{r} += weight_{r} * norm * code;")
        lines.append(f"            denom_{r} += weight_{r};")
    lines += [
        "        }",
        "",
    ]
    for r in range(repeat_count):
        lines.append(f"        float acc_sum_{r} = simd_sum(acc_{r});")
        lines.append(f"        float denom_sum_{r} = simd_sum(denom_{r});")
    lines += [
        "",
        "        if (thread_index_in_simdgroup == 0) {",
    ]
    for r in range(repeat_count):
        lines.append(
            f"            out[((b * kv_heads + h) * repeat_count + {r}) * Dim + dim_idx] ="
        )
        lines.append(f"                acc_sum_{r} / max(denom_sum_{r}, 1e-6f);")
    lines += [
        "        }",
    ]

    source = "\n".join(lines)
    return kk.metal_kernel(
        name=f"turboquant_mse_scores_weighted_rot_repeat_{repeat_count}",
        input_names=["scores", "norms", "packed", "codebook", "max_scores"],
        output_names=["out"],
        source=source,
    )


def _fully_fused_decode_kernel(
    bits: int,
    repeat_count: int,
    dims_per_lane: int,
    key_mse_bits: int = -1,
    use_rht: bool = False,
):
    """Fully fused decode: score + online softmax + value + normalize + rotation
    in a single Metal dispatch. Processes ALL tokens (no tiling), outputs in
    original space. Reduces dispatch count from 7 to 1."""

    mse_bits = key_mse_bits if key_mse_bits >= 0 else max(bits - 1, 0)
    mse_mask = (1 << mse_bits) - 1
    val_mask = (1 << bits) - 1
    num_mse_entries = 1 << mse_bits

    lines = [
        "        auto lane = thread_position_in_grid.x;",
        "        auto bh = thread_position_in_grid.z;",
        "        auto token_count = key_norms_shape[2];",
        "        auto kv_heads = key_norms_shape[1];",
        "        auto b = bh / kv_heads;",
        "        auto h = bh % kv_heads;",
        "        auto base = (b * kv_heads + h);",
        "",
        "        auto k_norms = key_norms + base * token_count;",
        "        auto k_mse = key_mse + base * token_count * KMsePackedWidth;",
        "        auto k_res = key_res_norms + base * token_count;",
        "        auto k_signs = key_signs + base * token_count * KSignPackedWidth;",
        "        auto v_norms = val_norms + base * token_count;",
        "        auto v_packed = val_packed + base * token_count * VPackedWidth;",
        "",
        "        // Precompute value bit offsets",
        "        int v_words[DimsPerLane], v_offs[DimsPerLane];",
        "        bool v_spills[DimsPerLane], v_valids[DimsPerLane];",
        "        for (int i = 0, vd = lane; i < DimsPerLane; i++, vd += 32) {",
        f"            v_valids[i] = vd < Dim;",
        f"            int vbo = vd * {bits};",
        f"            v_words[i] = vbo / 32;",
        f"            v_offs[i] = vbo % 32;",
        f"            v_spills[i] = (vbo % 32 + {bits}) > 32;",
        "        }",
        "",
    ]

    for r in range(repeat_count):
        lines += [
            f"        auto qr_{r} = q_rot + (base * RepeatCount + {r}) * Dim;",
            f"        auto qp_{r} = q_proj + (base * RepeatCount + {r}) * Dim;",
        ]

    for r in range(repeat_count):
        lines += [
            f"        float lmax_{r} = -INFINITY, lsum_{r} = 0.0f;",
            f"        float lacc_{r}[DimsPerLane] = {{}};",
        ]

    # Token loop: score + online softmax + value accumulation
    lines += [
        "",
        "        for (int t = 0; t < (int)token_count; t++) {",
        "            auto mse_t = k_mse + t * KMsePackedWidth;",
        "            auto sign_t = k_signs + t * KSignPackedWidth;",
        "            float kn = static_cast<float>(k_norms[t]);",
        "            float ksr = kn * key_scale[0] * static_cast<float>(k_res[t]);",
        "",
    ]

    # Score with grouped codebook optimization
    for r in range(repeat_count):
        lines += [f"            float ps_{r} = 0.0f;"]

    lines += [
        f"            for (int d = lane; d < Dim; d += 32) {{",
        f"                int bo = d * {mse_bits};",
        f"                uint idx = (mse_t[bo >> 5] >> (bo & 31));",
        f"                if (((bo & 31) + {mse_bits}) > 32) idx |= mse_t[(bo >> 5) + 1] << ({mse_bits} - ((bo & 31) + {mse_bits} - 32));",
        f"                idx &= {mse_mask}u;",
        f"                float code = key_codebook[idx];",
        f"                uint sb = (sign_t[d >> 5] >> (d & 31)) & 1u;",
    ]
    for r in range(repeat_count):
        lines += [
            f"                ps_{r} += kn * static_cast<float>(qr_{r}[d]) * code + ksr * (sb ? static_cast<float>(qp_{r}[d]) : -static_cast<float>(qp_{r}[d]));"
        ]
    lines += ["            }"]

    for r in range(repeat_count):
        lines += [f"            float s_{r} = simd_sum(ps_{r});"]

    # Online softmax + value accumulation
    lines += [
        "",
        "            auto vt = v_packed + t * VPackedWidth;",
        "            float vnorm = static_cast<float>(v_norms[t]);",
    ]

    for r in range(repeat_count):
        lines += [
            f"            {{ float om = lmax_{r};",
            f"              lmax_{r} = max(lmax_{r}, s_{r});",
            f"              float rs = exp(om - lmax_{r});",
            f"              float w = exp(s_{r} - lmax_{r});",
            f"              lsum_{r} = lsum_{r} * rs + w;",
            f"              for (int i = 0; i < DimsPerLane; i++) {{",
            f"                  lacc_{r}[i] *= rs;",
            f"                  if (v_valids[i]) {{",
            f"                      uint vv = (vt[v_words[i]] >> v_offs[i]);",
            f"                      if (v_spills[i]) vv |= vt[v_words[i]+1] << ({bits} - (v_offs[i]+{bits}-32));",
            f"                      lacc_{r}[i] += w * val_codebook[vv & {val_mask}u] * vnorm;",
            f"                  }}",
            f"              }}",
            f"            }}",
        ]

    lines += ["        }", ""]

    # Normalize by softmax sum
    for r in range(repeat_count):
        lines += [
            f"        float inv_sum_{r} = 1.0f / lsum_{r};",
            f"        for (int i = 0; i < DimsPerLane; i++)",
            f"            lacc_{r}[i] *= inv_sum_{r};",
        ]

    # Fuse rotation via shared memory
    if use_rht:
        # RHT inverse: butterfly WHT on each repeat's accumulated values
        # Process one repeat at a time to reuse shared memory
        lines += [
            "",
            f"        threadgroup float shared_rot[DimPadded];",
            f"        float wht_tmp[DimsPerLanePadded];",
        ]
        for r in range(repeat_count):
            lines += [
                f"        // RHT inverse for repeat {r}",
                f"        for (int i = 0, vd = lane; i < DimsPerLanePadded; vd += 32, i++)",
                f"            shared_rot[vd < Dim ? vd : 0] = (vd < Dim) ? lacc_{r}[i] : 0.0f;",
            ]
            if repeat_count > 1 or True:
                # Zero padding region
                lines += [
                    f"        if (lane < (DimPadded - Dim) && (Dim + lane) < DimPadded)",
                    f"            shared_rot[Dim + lane] = 0.0f;",
                    f"        threadgroup_barrier(mem_flags::mem_threadgroup);",
                ]
            lines += _metal_butterfly_wht_inverse(
                "shared_rot", "sign_vec", "wht_tmp", "DimsPerLanePadded"
            )
            lines += [
                f"        for (int i = 0, vd = lane; i < DimsPerLane; vd += 32, i++)",
                f"            if (vd < Dim) out[(bh * RepeatCount + {r}) * Dim + vd] = shared_rot[vd];",
                f"",
            ]
    else:
        # Dense rotation via shared memory matmul
        lines += [
            "",
            f"        threadgroup float shared_rot[{repeat_count} * Dim];",
        ]
        for r in range(repeat_count):
            lines += [
                f"        for (int i = 0, vd = lane; i < DimsPerLane; i++, vd += 32)",
                f"            if (vd < Dim) shared_rot[{r} * Dim + vd] = lacc_{r}[i];",
            ]
        lines += [
            "        threadgroup_barrier(mem_flags::mem_threadgroup);",
            "",
            "        // Apply dense rotation: output in original space",
        ]
        for r in range(repeat_count):
            lines += [
                f"        for (int i = 0, vd = lane; i < DimsPerLane; i++, vd += 32) {{",
                f"            if (vd < Dim) {{",
                f"                float rot_val = 0.0f;",
                f"                auto rot_row = rotation_t + vd * Dim;",
                f"                for (int j = 0; j < (int)Dim; j++)",
                f"                    rot_val += shared_rot[{r} * Dim + j] * rot_row[j];",
                f"                out[(bh * RepeatCount + {r}) * Dim + vd] = rot_val;",
                f"            }}",
                f"        }}",
            ]

    name_suffix = "_rht" if use_rht else ""
    rotation_input = "sign_vec" if use_rht else "rotation_t"
    return kk.metal_kernel(
        name=f"turboquant_fully_fused_{bits}_r{repeat_count}{name_suffix}",
        input_names=[
            "q_rot",
            "q_proj",
            "key_norms",
            "key_mse",
            "key_res_norms",
            "key_signs",
            "val_norms",
            "val_packed",
            "key_codebook",
            "key_scale",
            "val_codebook",
            rotation_input,
        ],
        output_names=["out"],
        source="\n".join(lines),
    )


def _gen_unrolled_extract(
    bits: int, n_elems: int, codebook_name: str, bit_off_var: str = ""
) -> list:
    """Generate fully-unrolled byte extraction for n_elems packed at `bits` bits.

    When *bit_off_var* is empty the extraction assumes element 0 starts at bit 0
    of the byte pointer (fast path — compile-time constant offsets, works when
    ``n_elems * bits % 8 == 0``).

    When *bit_off_var* names a Metal ``int`` variable (e.g. ``"k_bit_off"``),
    each element's bit position is computed as ``bit_off_var + i * bits`` at
    runtime, still fully unrolled (one expression per element, no loops).
    """
    mask = (1 << bits) - 1
    exprs: list[str] = []

    if not bit_off_var:
        # --- Fast path: compile-time constant offsets ---
        for i in range(n_elems):
            bit_offset = i * bits
            byte_idx = bit_offset // 8
            bit_in_byte = bit_offset % 8

            if bit_in_byte + bits <= 8:
                if bit_in_byte == 0:
                    expr = f"{codebook_name}[kb[{byte_idx}] & {mask}u]"
                else:
                    expr = (
                        f"{codebook_name}[(kb[{byte_idx}] >> {bit_in_byte}) & {mask}u]"
                    )
            else:
                low_bits = 8 - bit_in_byte
                high_mask = (1 << (bits - low_bits)) - 1
                expr = (
                    f"{codebook_name}[((kb[{byte_idx}] >> {bit_in_byte}) & {(1 << low_bits) - 1}u)"
                    f" | ((kb[{byte_idx + 1}] & {high_mask}u) << {low_bits})]"
                )
            exprs.append(expr)
    else:
        # --- General path: runtime bit offset, still fully unrolled ---
        for i in range(n_elems):
            bo = f"({bit_off_var} + {i * bits})" if i else bit_off_var
            by = f"({bo} >> 3)"
            bi = f"({bo} & 7)"
            expr = (
                f"{codebook_name}["
                f"(({bi} + {bits} <= 8)"
                f" ? (kb[{by}] >> {bi})"
                f" : ((kb[{by}] >> {bi}) | (kb[{by} + 1] << (8 - {bi}))))"
                f" & {mask}u]"
            )
            exprs.append(expr)
    return exprs


def _gen_unrolled_score(bits: int, n_elems: int, bit_off_var: str = "") -> str:
    """Generate score accumulation with unrolled key extraction."""
    exprs = _gen_unrolled_extract(bits, n_elems, "key_codebook", bit_off_var)
    terms = [f"q[{i}] * {expr}" for i, expr in enumerate(exprs)]
    return "\n                + ".join(terms)


def _gen_unrolled_value(bits: int, n_elems: int, bit_off_var: str = "") -> str:
    """Generate value accumulation with unrolled extraction."""
    exprs = _gen_unrolled_extract(bits, n_elems, "val_codebook", bit_off_var)
    exprs = [e.replace("kb[", "vb[") for e in exprs]
    lines = []
    for i, expr in enumerate(exprs):
        lines.append(f"            o[{i}] = o[{i}] * factor + exp_score * {expr} * vn;")
    return "\n".join(lines)


def _fused_mse_decode_kernel(key_bits: int, val_bits: int, dim: int = 256):
    """Fused MSE decode: 32 simdgroups × 32 lanes, online softmax + weighted sum."""
    if dim < 32 or dim % 32 != 0:
        return None  # dim must be a multiple of 32 SIMD lanes

    k_mask = (1 << key_bits) - 1
    v_mask = (1 << val_bits) - 1
    elems_per_lane = dim // 32

    source = f"""
        constexpr int BN = 32;  // simdgroups per threadgroup
        constexpr int BD = 32;  // lanes per simdgroup
        constexpr int qk_per_thread = Dim / BD;
        constexpr int v_per_thread = Dim / BD;
        constexpr uint k_mask = {k_mask}u;
        constexpr uint v_mask = {v_mask}u;
        constexpr int k_bits = {key_bits};
        constexpr int v_bits = {val_bits};

        typedef float U;

        // Thread identity — grid is total threads, so use threadgroup position
        auto bqh = threadgroup_position_in_grid.x;  // batch*q_head index
        auto simd_gid = simdgroup_index_in_threadgroup;
        auto simd_lid = thread_index_in_simdgroup;

        auto token_count = key_norms_shape[2];
        auto kv_heads = key_norms_shape[1];
        auto bh = bqh / RepeatCount;  // map q_head -> kv_head

        auto k_nm = key_norms + bh * token_count;
        auto k_pk = key_packed + bh * token_count * KPackedWidth;
        auto v_nm = val_norms + bh * token_count;
        auto v_pk = val_packed + bh * token_count * VPackedWidth;

        // Shared memory for cross-simdgroup reduction
        threadgroup U max_scores[BN];
        threadgroup U sum_exp_scores[BN];
        threadgroup U shared[BN * BD];

        // Preload pre-rotated query into registers
        thread U q[qk_per_thread];
        auto qr = queries + bqh * Dim + simd_lid * qk_per_thread;
        for (int i = 0; i < qk_per_thread; i++)
            q[i] = static_cast<U>(qr[i]);

        // Initialize accumulators
        thread U o[v_per_thread] = {{}};
        U max_score = -INFINITY;
        U sum_exp_score = 0;

        // Byte/bit offset for this lane's first element (constant across all tokens)
        int k_bit_start = simd_lid * qk_per_thread * k_bits;
        int v_bit_start = simd_lid * v_per_thread * v_bits;
        int k_byte_base = k_bit_start >> 3;
        int v_byte_base = v_bit_start >> 3;
        {"int k_bit_off = k_bit_start & 7;" if (elems_per_lane * key_bits) % 8 else ""}
        {"int v_bit_off = v_bit_start & 7;" if (elems_per_lane * val_bits) % 8 else ""}

        // KV loop: each simdgroup handles tokens simd_gid, simd_gid+32, ...
        for (int t = simd_gid; t < (int)token_count; t += BN) {{
            U kn = static_cast<U>(k_nm[t]);

            // Key score — unrolled byte extraction
            auto kb = (const device uint8_t*)(k_pk + t * KPackedWidth) + k_byte_base;
            U score = {_gen_unrolled_score(key_bits, elems_per_lane, "k_bit_off" if (elems_per_lane * key_bits) % 8 else "")};
            score = simd_sum(score) * kn;

            // Online softmax
            auto vb = (const device uint8_t*)(v_pk + t * VPackedWidth) + v_byte_base;
            U vn = static_cast<U>(v_nm[t]);

            U new_max = max(max_score, score);
            U factor = fast::exp(max_score - new_max);
            U exp_score = fast::exp(score - new_max);
            max_score = new_max;
            sum_exp_score = sum_exp_score * factor + exp_score;

            // Value accumulation — unrolled byte extraction
            {_gen_unrolled_value(val_bits, elems_per_lane, "v_bit_off" if (elems_per_lane * val_bits) % 8 else "")}
        }}

        // Cross-simdgroup reduction (matches MLX SDPA pattern)
        // 1. Communicate max and sum_exp across simdgroups
        if (simd_lid == 0) {{
            max_scores[simd_gid] = max_score;
            sum_exp_scores[simd_gid] = sum_exp_score;
        }}
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 2. Reduce max and sum across all simdgroups
        U sg_max = max_scores[simd_lid];
        U new_max = simd_max(sg_max);
        U factor = fast::exp(sg_max - new_max);
        U total_sum = simd_sum(sum_exp_scores[simd_lid] * factor);

        // 3. Rescale this simdgroup's factor for the global max
        U my_factor = fast::exp(max_score - new_max);

        // 4. Transpose-reduce outputs through shared memory
        for (int i = 0; i < v_per_thread; i++) {{
            shared[simd_lid * BD + simd_gid] = o[i] * my_factor;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            o[i] = simd_sum(shared[simd_gid * BD + simd_lid]);
            o[i] = total_sum > 0 ? o[i] / total_sum : 0;
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}

        // Write output (in rotated space — caller applies inverse rotation)
        if (simd_lid == 0) {{
            for (int i = 0; i < v_per_thread; i++) {{
                out[bqh * Dim + simd_gid * v_per_thread + i] = static_cast<U>(o[i]);
            }}
        }}
    """

    return kk.metal_kernel(
        name=f"turboquant_fused_mse_sdpa_k{key_bits}_v{val_bits}_d{dim}",
        input_names=[
            "queries",
            "key_norms",
            "key_packed",
            "key_codebook",
            "val_norms",
            "val_packed",
            "val_codebook",
        ],
        output_names=["out"],
        source=source,
    )


def _metal_butterfly_wht_forward(
    shared_name: str,
    sign_name: str,
    temp_name: str,
    dims_per_lane_padded: str = "DimsPerLanePadded",
):
    """Generate Metal code for in-place RHT forward in shared memory.
    RHT forward = WHT(signs * x) / sqrt(DimPadded).
    Requires: shared[DimPadded], sign_vec[Dim], temp[DimsPerLanePadded] (thread-local).
    Returns list of Metal source lines."""
    return [
        f"        // RHT forward: apply signs, butterfly WHT, scale",
        f"        for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++)",
        f"            if (d < Dim) {shared_name}[d] *= {sign_name}[d];",
        f"        threadgroup_barrier(mem_flags::mem_threadgroup);",
        f"",
        f"        for (int stride = 1; stride < DimPadded; stride *= 2) {{",
        f"            for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++) {{",
        f"                if (d < DimPadded) {{",
        f"                    int pair = d ^ stride;",
        f"                    float a = {shared_name}[min(d, pair)];",
        f"                    float b = {shared_name}[max(d, pair)];",
        f"                    {temp_name}[i] = (d < pair) ? (a + b) : (a - b);",
        f"                }}",
        f"            }}",
        f"            threadgroup_barrier(mem_flags::mem_threadgroup);",
        f"            for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++)",
        f"                if (d < DimPadded) {shared_name}[d] = {temp_name}[i];",
        f"            threadgroup_barrier(mem_flags::mem_threadgroup);",
        f"        }}",
        f"",
        f"        // Scale by 1/sqrt(DimPadded)",
        f"        float rht_scale = 1.0f / sqrt((float)DimPadded);",
    ]


def _metal_butterfly_wht_inverse(
    shared_name: str,
    sign_name: str,
    temp_name: str,
    dims_per_lane_padded: str = "DimsPerLanePadded",
):
    """Generate Metal code for in-place RHT inverse in shared memory.
    RHT inverse = signs * WHT(x) / sqrt(DimPadded).
    Same butterfly as forward, then multiply by signs."""
    return [
        f"        // RHT inverse: butterfly WHT, then apply signs and scale",
        f"        for (int stride = 1; stride < DimPadded; stride *= 2) {{",
        f"            for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++) {{",
        f"                if (d < DimPadded) {{",
        f"                    int pair = d ^ stride;",
        f"                    float a = {shared_name}[min(d, pair)];",
        f"                    float b = {shared_name}[max(d, pair)];",
        f"                    {temp_name}[i] = (d < pair) ? (a + b) : (a - b);",
        f"                }}",
        f"            }}",
        f"            threadgroup_barrier(mem_flags::mem_threadgroup);",
        f"            for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++)",
        f"                if (d < DimPadded) {shared_name}[d] = {temp_name}[i];",
        f"            threadgroup_barrier(mem_flags::mem_threadgroup);",
        f"        }}",
        f"",
        f"        // Scale and apply signs",
        f"        float rht_scale = 1.0f / sqrt((float)DimPadded);",
        f"        for (int i = 0, d = lane; i < {dims_per_lane_padded}; d += 32, i++)",
        f"            if (d < Dim) {shared_name}[d] *= rht_scale * {sign_name}[d];",
        f"        threadgroup_barrier(mem_flags::mem_threadgroup);",
    ]


def _fused_kv_quantize_kernel(key_bits: int, val_bits: int):
    """Fused key+value quantize in 1 dispatch."""

    k_midpoints = (1 << key_bits) - 1
    v_midpoints = (1 << val_bits) - 1
    k_mask = (1 << key_bits) - 1
    v_mask = (1 << val_bits) - 1

    source = f"""
        auto d = thread_position_in_threadgroup.x;
        auto bh = threadgroup_position_in_grid.x;
        auto is_val = threadgroup_position_in_grid.y;  // 0=key, 1=value
        auto sg_id = simdgroup_index_in_threadgroup;
        auto sg_lid = thread_index_in_simdgroup;

        // Select key or value params based on grid.y
        int bits = is_val ? {val_bits} : {key_bits};
        int n_mid = is_val ? {v_midpoints} : {k_midpoints};
        uint idx_mask = is_val ? {v_mask}u : {k_mask}u;
        int pw = is_val ? VPackedWidth : KPackedWidth;

        // Step 1: Load vector element
        float v;
        if (is_val)
            v = (d < Dim) ? static_cast<float>(val_vectors[bh * Dim + d]) : 0.0f;
        else
            v = (d < Dim) ? static_cast<float>(key_vectors[bh * Dim + d]) : 0.0f;

        // Compute norm (2-stage cross-simdgroup reduction)
        float sq = v * v;
        float sg_sum = simd_sum(sq);
        threadgroup float sg_norms[8];
        if (sg_lid == 0) sg_norms[sg_id] = sg_sum;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float total_sq = (sg_id == 0 && sg_lid < 8) ? sg_norms[sg_lid] : 0.0f;
        total_sq = simd_sum(total_sq);
        if (sg_id == 0 && sg_lid == 0) sg_norms[0] = total_sq;
        threadgroup_barrier(mem_flags::mem_threadgroup);

        float norm = sqrt(sg_norms[0]);
        float inv_norm = (norm > 1e-10f) ? (1.0f / norm) : 0.0f;
        if (d == 0) {{
            if (is_val) out_val_norms[bh] = half(norm);
            else out_key_norms[bh] = half(norm);
        }}

        // Step 2: Unit vector → shared
        threadgroup float shared[Dim];
        if (d < Dim) shared[d] = v * inv_norm;
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Step 3: Rotate (1 dim per thread, 256 FMAs)
        float rotated = 0.0f;
        if (d < Dim) {{
            auto row = is_val ? (val_rotation + d * Dim) : (key_rotation + d * Dim);
            for (int j = 0; j < (int)Dim; j++)
                rotated += shared[j] * row[j];
        }}

        // Step 4: Comparison-based quantize
        threadgroup uint shared_idx[Dim];
        uint idx = 0;
        if (d < Dim) {{
            if (is_val) {{
                for (int m = 0; m < n_mid; m++)
                    idx += (rotated > val_midpoints[m]) ? 1u : 0u;
            }} else {{
                for (int m = 0; m < n_mid; m++)
                    idx += (rotated > key_midpoints[m]) ? 1u : 0u;
            }}
            shared_idx[d] = idx;
        }}
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Step 5: Pack indices — thread-per-word, race-free, no atomics.
        // Each thread d (d < pw) walks the dims whose
        // [i*bits, (i+1)*bits) range intersects [32d, 32(d+1)) and
        // accumulates them into a private register, then writes the
        // word once. `bits` and `pw` are runtime-uniform here so the
        // loop bound is well-defined per dispatch.
        if (d < pw) {{
            uint w_val = 0u;
            int word_start = (int)d * 32;
            int i_min = word_start / bits;
            int i_max = (word_start + 31) / bits;
            if (i_max >= (int)Dim) i_max = (int)Dim - 1;
            for (int i = i_min; i <= i_max; i++) {{
                uint idx_val = shared_idx[i] & idx_mask;
                int bit_off = i * bits - word_start;
                if (bit_off >= 0) {{
                    w_val |= idx_val << bit_off;
                }} else {{
                    w_val |= idx_val >> (-bit_off);
                }}
            }}
            if (is_val)
                out_val_packed[bh * pw + d] = w_val;
            else
                out_key_packed[bh * pw + d] = w_val;
        }}
    """

    return kk.metal_kernel(
        name=f"turboquant_fused_kv_quantize_k{key_bits}_v{val_bits}",
        input_names=[
            "key_vectors",
            "val_vectors",
            "key_rotation",
            "val_rotation",
            "key_midpoints",
            "val_midpoints",
        ],
        output_names=[
            "out_key_norms",
            "out_key_packed",
            "out_val_norms",
            "out_val_packed",
        ],
        source=source,
    )


def _fused_prod_quantize_kernel(mse_bits: int, use_rht: bool = False):
    """Fused Prod quantize: norm + rotate + MSE quantize + residual + QJL in 1 dispatch."""
    num_entries = 1 << mse_bits
    num_midpoints = num_entries - 1
    mse_mask = num_entries - 1

    lines = [
        "        auto lane = thread_position_in_threadgroup.x;",
        "        auto bh = thread_position_in_grid.z;",
        "        auto vec_ptr = vectors + bh * Dim;",
        "",
        "        // Step 1: Load & compute norm",
        "        float v[DimsPerLane];",
        "        float partial_sq = 0.0f;",
        "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32) {",
        "            float x = (d < Dim) ? static_cast<float>(vec_ptr[d]) : 0.0f;",
        "            v[i] = x;",
        "            partial_sq += x * x;",
        "        }",
        "        float norm = sqrt(simd_sum(partial_sq));",
        "        float inv_norm = (norm > 1e-10f) ? (1.0f / norm) : 0.0f;",
        "        if (lane == 0) out_norms[bh] = half(norm);",
        "",
    ]

    if use_rht:
        lines += [
            "        threadgroup float shared[DimPadded];",
            "        for (int i = 0, d = lane; i < DimsPerLanePadded; d += 32, i++)",
            "            shared[d < Dim ? d : 0] = (d < Dim) ? v[i] * inv_norm : 0.0f;",
            "        if (lane < (DimPadded - Dim) && (Dim + lane) < DimPadded)",
            "            shared[Dim + lane] = 0.0f;",
            "        threadgroup_barrier(mem_flags::mem_threadgroup);",
            "",
        ]
        lines += _metal_butterfly_wht_forward(
            "shared", "sign_vec", "v", "DimsPerLanePadded"
        )
        lines += [
            "",
            "        float rotated[DimsPerLane];",
            "        for (int i = 0, d = lane; i < DimsPerLane; d += 32, i++)",
            "            rotated[i] = (d < Dim) ? shared[d] * rht_scale : 0.0f;",
        ]
    else:
        lines += [
            "        threadgroup float shared[Dim];",
            "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32)",
            "            if (d < Dim) shared[d] = v[i] * inv_norm;",
            "        threadgroup_barrier(mem_flags::mem_threadgroup);",
            "",
            "        float rotated[DimsPerLane];",
            "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32) {",
            "            float sum = 0.0f;",
            "            if (d < Dim) {",
            "                auto row = mse_rotation + d * Dim;",
            "                for (int j = 0; j < (int)Dim; j++)",
            "                    sum += shared[j] * row[j];",
            "            }",
            "            rotated[i] = sum;",
            "        }",
        ]

    # Steps 4-8 are the same for both paths
    lines += [
        "",
        "        // Step 4: MSE quantize + compute rotated residual",
        "        float rot_residual[DimsPerLane];",
        "        threadgroup uint shared_mse_idx[Dim];",
        "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32) {",
        "            uint idx = 0;",
        f"            if (d < Dim) {{",
        f"                for (int m = 0; m < {num_midpoints}; m++)",
        f"                    idx += (rotated[i] > midpoints[m]) ? 1u : 0u;",
        f"            }}",
        "            float estimate = codebook[idx];",
        "            rot_residual[i] = rotated[i] - estimate;",
        "            if (d < Dim) shared_mse_idx[d] = idx;",
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        // Step 5: Pack MSE indices",
        "        for (int w = lane; w < MsePackedWidth; w += 32) {",
        "            uint word = 0;",
        f"            for (int b = 0; b < 32; b += {mse_bits}) {{",
        f"                int dim = (w * 32 + b) / {mse_bits};",
        f"                if (dim < Dim) word |= (shared_mse_idx[dim] & {mse_mask}u) << b;",
        f"            }}",
        "            out_mse_packed[bh * MsePackedWidth + w] = word;",
        "        }",
        "",
        "        // Step 6: Residual norm",
        "        float res_sq = 0.0f;",
        "        for (int i = 0; i < DimsPerLane; i++)",
        "            res_sq += rot_residual[i] * rot_residual[i];",
        "        float res_norm = sqrt(simd_sum(res_sq));",
        "        if (lane == 0) out_res_norms[bh] = half(res_norm);",
        "",
        "        // Step 7: QJL projection (rotated_residual @ combined_proj_t)",
        "        //   combined_proj_t = (mse_rotation @ projection_t).T",
        "        //   so row d gives the projection for output dim d",
        "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32)",
        "            if (d < Dim) shared[d] = rot_residual[i];",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        threadgroup uint shared_signs[Dim];",
        "        for (int i = 0, d = lane; i < DimsPerLane; i++, d += 32) {",
        "            float proj = 0.0f;",
        "            if (d < Dim) {",
        "                auto row = combined_proj_t + d * Dim;",
        "                for (int j = 0; j < (int)Dim; j++)",
        "                    proj += shared[j] * row[j];",
        "            }",
        "            shared_signs[d < Dim ? d : 0] = (proj >= 0.0f) ? 1u : 0u;",
        "        }",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);",
        "",
        "        // Step 8: Pack sign bits (1 bit per dim)",
        "        for (int w = lane; w < SignPackedWidth; w += 32) {",
        "            uint word = 0;",
        "            for (int b = 0; b < 32; b++) {",
        "                int dim = w * 32 + b;",
        "                if (dim < Dim) word |= shared_signs[dim] << b;",
        "            }",
        "            out_signs[bh * SignPackedWidth + w] = word;",
        "        }",
    ]

    name_suffix = "_rht" if use_rht else ""
    rotation_input = "sign_vec" if use_rht else "mse_rotation"
    return kk.metal_kernel(
        name=f"turboquant_fused_prod_quantize_{mse_bits}{name_suffix}",
        input_names=[
            "vectors",
            rotation_input,
            "midpoints",
            "codebook",
            "combined_proj_t",
        ],
        output_names=[
            "out_norms",
            "out_mse_packed",
            "out_res_norms",
            "out_signs",
        ],
        source="\n".join(lines),
    )




def _tq_scale(D):
    return torch.tensor([math.sqrt(math.pi / 2) / D], dtype=torch.float32)


def _orthogonal(D):
    return torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))[0].float()


def _near(values, edges, tol):
    """Where a float64 value lies within tol of one of `edges` (a float32 kernel may go either way)."""
    return ((values[..., None] - edges.double()).abs() < tol).any(-1)


def _quantize_ref(rotated, midpoints, kernel_idx, tol=1e-5):
    """Comparison quantizer: how many midpoints each value exceeds; the kernel's own index is
    taken where a value ties a midpoint within float32 rounding."""
    idx = (rotated[..., None] > midpoints.double()).sum(-1)
    return torch.where(_near(rotated, midpoints, tol), kernel_idx, idx)


@pytest.mark.parametrize("bits", [1, 3])
def test_turboquant_pack_lowbit(device, bits):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _pack_lowbit_kernel, one thread per output word
    gathering every value (and the spill of the one before) that touches it."""
    rows, length = 6, 70
    values = torch.randint(0, 2 ** bits, (rows, length))
    packed_width = (length * bits + 31) // 32
    out = launch(_pack_lowbit_kernel(), device, inputs=[values.to(torch.uint32).to(device)],
                 template=[("Bits", bits), ("Length", length), ("PackedWidth", packed_width)],
                 grid=(packed_width, rows, 1), threadgroup=(min(32, packed_width), 1, 1),
                 output_shapes=[(rows, packed_width)], output_dtypes=[torch.uint32])[0]
    assert torch.equal(out.cpu().to(torch.int64), pack_bits(values, bits).to(torch.int64))


def test_turboquant_unpack_lowbit(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _unpack_lowbit_kernel (5-bit values straddling
    32-bit words; unused high bits of the last word ignored)."""
    bits, rows, length = 5, 4, 45
    packed_width = (length * bits + 31) // 32
    words = torch.randint(0, 2 ** 32, (rows, packed_width)).to(torch.uint32)
    out = launch(_unpack_lowbit_kernel(), device, inputs=[words.to(device)],
                 template=[("Bits", bits), ("Length", length), ("PackedWidth", packed_width)],
                 grid=(length, rows, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(rows, length)], output_dtypes=[torch.uint32])[0]
    assert torch.equal(out.cpu().to(torch.int64), unpack_bits(words, bits, length))


def test_turboquant_mse_score_tiled(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _mse_score_tiled_kernel(R): q . codebook[idx] * norm
    for R query heads per KV head, queries held in registers over a 64-token tile (3-bit keys).
    D a multiple of 32: the original reads packed words past a row (and past the buffer for the
    last token) otherwise."""
    B, H, R, D, T, bits = 1, 2, 3, 128, 100, 3
    q_rot = torch.randn(B, H, R, D)
    norms = (torch.rand(B, H, T) + 0.5).half()
    idx = torch.randint(0, 2 ** bits, (B, H, T, D))
    indices, cb = pack_bits(idx, bits), codebook(bits)
    tok_tile_size = 64
    num_tok_tiles = (T + tok_tile_size - 1) // tok_tile_size
    out = launch(_mse_score_tiled_kernel(R), device, inputs=on(device, q_rot, norms, indices, cb),
                 template=[("Dim", D), ("DimsPerLane", (D + 31) // 32), ("Bits", bits),
                           ("PackedWidth", indices.shape[-1]), ("RepeatCount", R),
                           ("TokTileSize", tok_tile_size)],
                 grid=(32, 1, B * H * num_tok_tiles), threadgroup=(32, 1, 1),
                 output_shapes=[(B, H, R, T)], output_dtypes=[torch.float32])[0]
    expected = torch.einsum("bhrd,bhtd->bhrt", q_rot.double(), cb.double()[idx]) \
        * norms.double()[:, :, None, :]
    close(out, expected, rtol=1e-4, atol=1e-4)


def _prod_key_state(B, H, T, D, mse_bits):
    """A TurboQuantProdState: fp16 norms, packed MSE indices, fp16 residual norms, QJL sign bits."""
    norms = (torch.rand(B, H, T) + 0.5).half()
    res_norms = (torch.rand(B, H, T) * 0.3).half()
    idx = torch.randint(0, 2 ** mse_bits, (B, H, T, D))
    sign_bits = torch.randint(0, 2, (B, H, T, D))
    return norms, pack_bits(idx, mse_bits), res_norms, pack_bits(sign_bits, 1), idx, sign_bits


def _prod_scores(q_rot, q_proj, norms, res_norms, idx, sign_bits, cb, scale):
    """<q, k> for the TurboQuant-prod key k = norm * (codebook[idx] + scale * res_norm * signs)."""
    mse = torch.einsum("bhrd,bhtd->bhrt", q_rot.double(), cb.double()[idx])
    qjl = torch.einsum("bhrd,bhtd->bhrt", q_proj.double(), 2.0 * sign_bits.double() - 1)
    return norms.double()[:, :, None] * (mse + scale.double() * res_norms.double()[:, :, None] * qjl)


def test_turboquant_prod_score_repeat(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _prod_score_repeat_kernel(R): MSE + QJL key score,
    q summed per codebook entry in a per-thread array indexed by the unpacked code (bf16 queries)."""
    B, H, R, D, T, mse_bits = 2, 2, 2, 128, 9, 2
    q_rot, q_proj = torch.randn(2, B, H, R, D).bfloat16()
    norms, mse, res_norms, signs, idx, sign_bits = _prod_key_state(B, H, T, D, mse_bits)
    cb, scale = codebook(mse_bits), _tq_scale(D)
    out = launch(_prod_score_repeat_kernel(R), device,
                 inputs=on(device, q_rot, q_proj, norms, res_norms, mse, signs, cb, scale),
                 template=[("Dim", D), ("RepeatCount", R), ("MseBits", mse_bits),
                           ("MsePackedWidth", mse.shape[-1]), ("SignPackedWidth", signs.shape[-1])],
                 grid=(32, 1, B * H * T), threadgroup=(32, 1, 1),
                 output_shapes=[(B, H, R, T)], output_dtypes=[torch.float32])[0]
    expected = _prod_scores(q_rot, q_proj, norms, res_norms, idx, sign_bits, cb, scale)
    close(out, expected, rtol=1e-4, atol=1e-4)


def test_turboquant_polar_turbo_score_repeat(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _polar_turbo_score_repeat_kernel: the key is a
    4-level polar code (block radius times a cos/sin per level, angles packed at 4/3/3/2 bits),
    contracted level by level through threadgroup arrays, plus the QJL residual term."""
    level_bits, B, H, R, D, T = (4, 3, 3, 2), 1, 2, 2, 128, 5
    block_count = D >> 4
    q_rot, q_proj = torch.randn(2, B, H, R, D)
    norms, _, res_norms, signs, _, sign_bits = _prod_key_state(B, H, T, D, 1)
    radii = (torch.rand(B, H, T, block_count) + 0.1).half()
    angles, tables = [], []
    for level, bits in enumerate(level_bits, start=1):
        angles.append(torch.randint(0, 2 ** bits, (B, H, T, D >> level)))
        theta = torch.rand(2 ** bits) * (2 * math.pi if level == 1 else math.pi / 2)
        tables += [torch.cos(theta), torch.sin(theta)]
    scale = _tq_scale(D)
    packed_angles = [pack_bits(a, bits) for a, bits in zip(angles, level_bits)]
    template = [("Dim", D), ("Levels", 4), ("RepeatCount", R), ("BlockCount", block_count),
                ("SignPackedWidth", signs.shape[-1])]
    template += [(f"PackedWidth{n}", a.shape[-1]) for n, a in enumerate(packed_angles, start=1)]
    out = launch(_polar_turbo_score_repeat_kernel(level_bits, R), device,
                 inputs=on(device, q_rot, q_proj, norms, radii, *packed_angles, res_norms, signs,
                           scale, *tables),
                 template=template, grid=(32, 1, B * H * T), threadgroup=(32, 1, 1),
                 output_shapes=[(B, H, R, T)], output_dtypes=[torch.float32])[0]
    d = torch.arange(D)
    unit = radii.double()[..., d >> 4]
    for level, a in enumerate(angles, start=1):
        code = a[..., d >> level]
        cos, sin = tables[2 * level - 2].double(), tables[2 * level - 1].double()
        unit = unit * torch.where(((d >> (level - 1)) & 1).bool(), sin[code], cos[code])
    polar = torch.einsum("bhrd,bhtd->bhrt", q_rot.double(), unit)
    qjl = torch.einsum("bhrd,bhtd->bhrt", q_proj.double(), 2.0 * sign_bits.double() - 1)
    expected = norms.double()[:, :, None] * (polar + scale.double() * res_norms.double()[:, :, None] * qjl)
    close(out, expected, rtol=1e-4, atol=1e-4)


def test_turboquant_mse_scores_weighted_rot_repeat(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _mse_scores_weighted_rot_repeat_kernel(R): softmax
    (given each row's max) fused with the weighted sum of 4-bit MSE-coded values."""
    B, H, R, D, T, bits = 1, 2, 4, 64, 70, 4
    scores = torch.randn(B, H, R, T) * 2
    norms = (torch.rand(B, H, T) + 0.5).half()
    idx = torch.randint(0, 2 ** bits, (B, H, T, D))
    packed, cb = pack_bits(idx, bits), codebook(bits)
    max_scores = scores.max(-1).values
    out = launch(_mse_scores_weighted_rot_repeat_kernel(R), device,
                 inputs=on(device, scores, norms, packed, cb, max_scores),
                 template=[("Dim", D), ("Bits", bits), ("PackedWidth", packed.shape[-1])],
                 grid=(32, D, B * H), threadgroup=(32, 1, 1),
                 output_shapes=[(B, H, R, D)], output_dtypes=[torch.float32])[0]
    values = norms.double()[..., None] * cb.double()[idx]
    expected = torch.softmax(scores.double(), -1) @ values
    close(out, expected, rtol=1e-4, atol=1e-5)


def test_turboquant_fully_fused_decode(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _fully_fused_decode_kernel (dense rotation, as its
    caller builds it): prod-key scores, online softmax over all tokens, 3-bit MSE values, and the
    inverse value rotation through threadgroup memory, in one dispatch."""
    bits, key_mse_bits, B, H, R, D, T = 3, 2, 1, 2, 2, 64, 50
    dims_per_lane = (D + 31) // 32
    q_rot, q_proj = torch.randn(2, B, H, R, D)
    k_norms, k_mse, k_res, k_signs, k_idx, k_sign_bits = _prod_key_state(B, H, T, D, key_mse_bits)
    v_norms = (torch.rand(B, H, T) + 0.5).half()
    v_idx = torch.randint(0, 2 ** bits, (B, H, T, D))
    v_packed = pack_bits(v_idx, bits)
    k_cb, v_cb, scale, rotation_t = codebook(key_mse_bits), codebook(bits), _tq_scale(D), _orthogonal(D)
    kernel = _fully_fused_decode_kernel(bits, R, dims_per_lane, key_mse_bits, use_rht=False)
    out = launch(kernel, device,
                 inputs=on(device, q_rot, q_proj, k_norms, k_mse, k_res, k_signs, v_norms, v_packed,
                           k_cb, scale, v_cb, rotation_t),
                 template=[("Dim", D), ("RepeatCount", R), ("DimsPerLane", dims_per_lane),
                           ("KMsePackedWidth", k_mse.shape[-1]), ("KSignPackedWidth", k_signs.shape[-1]),
                           ("VPackedWidth", v_packed.shape[-1])],
                 grid=(32, 1, B * H), threadgroup=(32, 1, 1),
                 output_shapes=[(B * H, R, D)], output_dtypes=[torch.float32])[0]
    scores = _prod_scores(q_rot, q_proj, k_norms, k_res, k_idx, k_sign_bits, k_cb, scale)
    values = v_norms.double()[..., None] * v_cb.double()[v_idx]
    expected = (torch.softmax(scores, -1) @ values) @ rotation_t.double().T
    close(out.reshape(B, H, R, D), expected, rtol=1e-4, atol=1e-5)


def test_turboquant_fused_mse_decode(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _fused_mse_decode_kernel: quantized SDPA decode in
    MLX's sdpa_vector layout (32 simdgroups of 32 lanes, tokens strided over simdgroups, transpose
    reduction through threadgroup memory), keys read as bytes with generated unrolled extraction
    (3-bit keys: runtime bit offsets; 2-bit values: constant offsets)."""
    key_bits, val_bits, D, B, n_kv, n_rep, T = 3, 2, 128, 1, 2, 2, 75
    BQH = B * n_kv * n_rep
    q = torch.randn(BQH, D)
    k_norms = (torch.rand(B, n_kv, T) + 0.5).half()
    v_norms = (torch.rand(B, n_kv, T) + 0.5).half()
    k_idx = torch.randint(0, 2 ** key_bits, (B, n_kv, T, D))
    v_idx = torch.randint(0, 2 ** val_bits, (B, n_kv, T, D))
    k_packed, v_packed = pack_bits(k_idx, key_bits), pack_bits(v_idx, val_bits)
    k_cb, v_cb = codebook(key_bits), codebook(val_bits)
    out = launch(_fused_mse_decode_kernel(key_bits, val_bits, D), device,
                 inputs=on(device, q, k_norms, k_packed, k_cb, v_norms, v_packed, v_cb),
                 template=[("Dim", D), ("RepeatCount", n_rep), ("KPackedWidth", k_packed.shape[-1]),
                           ("VPackedWidth", v_packed.shape[-1])],
                 grid=(BQH * 1024, 1, 1), threadgroup=(1024, 1, 1),
                 output_shapes=[(BQH, D)], output_dtypes=[torch.float32])[0]
    keys = (k_norms.double()[..., None] * k_cb.double()[k_idx]).reshape(B * n_kv, T, D)
    values = (v_norms.double()[..., None] * v_cb.double()[v_idx]).reshape(B * n_kv, T, D)
    qh = q.double().reshape(B * n_kv, n_rep, D)
    expected = torch.softmax(qh @ keys.transpose(1, 2), -1) @ values
    close(out, expected.reshape(BQH, D), rtol=1e-4, atol=1e-5)


def test_turboquant_fused_kv_quantize(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _fused_kv_quantize_kernel: keys (grid.y = 0) and
    values (grid.y = 1) each normed across 8 simdgroups, rotated, quantized against midpoints and
    packed a word per thread (3-bit keys, 2-bit values, fp16 norms). D = 256: the original always
    reads all 8 simdgroups' partial norms, uninitialised threadgroup memory below that."""
    key_bits, val_bits, D, BH = 3, 2, 256, 3
    keys, vals = (torch.randn(2, BH, D) * 2).half()
    k_rot, v_rot = _orthogonal(D), _orthogonal(D)
    k_cb, v_cb = codebook(key_bits) * 0.5, codebook(val_bits) * 0.5
    k_mid, v_mid = (k_cb[1:] + k_cb[:-1]) / 2, (v_cb[1:] + v_cb[:-1]) / 2
    k_pw, v_pw = (D * key_bits + 31) // 32, (D * val_bits + 31) // 32
    k_norms, k_packed, v_norms, v_packed = launch(
        _fused_kv_quantize_kernel(key_bits, val_bits), device,
        inputs=on(device, keys, vals, k_rot, v_rot, k_mid, v_mid),
        template=[("Dim", D), ("KPackedWidth", k_pw), ("VPackedWidth", v_pw)],
        grid=(D * BH, 2, 1), threadgroup=(D, 1, 1),
        output_shapes=[(BH,), (BH, k_pw), (BH,), (BH, v_pw)],
        output_dtypes=[torch.float16, torch.uint32, torch.float16, torch.uint32])
    for x, rot, mid, bits, norms, packed in ((keys, k_rot, k_mid, key_bits, k_norms, k_packed),
                                             (vals, v_rot, v_mid, val_bits, v_norms, v_packed)):
        norm = x.double().norm(dim=-1)
        rotated = (x.double() / norm[:, None]) @ rot.double().T
        got = unpack_bits(packed, bits, D)
        close(norms, norm, rtol=1e-3, atol=0)
        assert torch.equal(got, _quantize_ref(rotated, mid, got))


def _hadamard(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def test_turboquant_fused_prod_quantize_rht(device):
    """Blaizzy/mlx-vlm, mlx_vlm/turboquant.py: _fused_prod_quantize_kernel(use_rht=True): norm,
    randomized Hadamard rotation (butterfly in threadgroup memory), 2-bit MSE quantization, the
    residual's norm and the packed signs of its QJL projection. D a power of two: otherwise the
    original's padding lanes overwrite element 0 and its transform overruns v[DimsPerLane]."""
    mse_bits, D, BH = 2, 128, 4
    vectors = (torch.randn(BH, D) * 3).half()
    sign_vec = torch.randint(0, 2, (D,)).float() * 2 - 1
    cb = codebook(mse_bits) * 0.6
    midpoints = (cb[1:] + cb[:-1]) / 2
    combined_proj_t = torch.randn(D, D) / math.sqrt(D)
    mse_pw, sign_pw = (D * mse_bits + 31) // 32, (D + 31) // 32
    norms, mse_packed, res_norms, signs = launch(
        _fused_prod_quantize_kernel(mse_bits, use_rht=True), device,
        inputs=on(device, vectors, sign_vec, midpoints, cb, combined_proj_t),
        template=[("Dim", D), ("DimsPerLane", (D + 31) // 32), ("MsePackedWidth", mse_pw),
                  ("SignPackedWidth", sign_pw), ("DimPadded", D), ("DimsPerLanePadded", (D + 31) // 32)],
        grid=(32, 1, BH), threadgroup=(32, 1, 1),
        output_shapes=[(BH,), (BH, mse_pw), (BH,), (BH, sign_pw)],
        output_dtypes=[torch.float16, torch.uint32, torch.float16, torch.uint32])
    norm = vectors.double().norm(dim=-1)
    rotated = (vectors.double() / norm[:, None] * sign_vec.double()) @ _hadamard(D) / math.sqrt(D)
    got_idx = unpack_bits(mse_packed, mse_bits, D)
    idx = _quantize_ref(rotated, midpoints, got_idx)
    assert torch.equal(got_idx, idx)
    residual = rotated - cb.double()[idx]
    close(norms, norm, rtol=1e-3, atol=0)
    close(res_norms, residual.norm(dim=-1), rtol=2e-3, atol=1e-4)
    proj = residual @ combined_proj_t.double().T
    got_signs = unpack_bits(signs, 1, D)
    expected_signs = torch.where(proj.abs() < 1e-5, got_signs, (proj >= 0).long())
    assert torch.equal(got_signs, expected_signs)


# --- Blaizzy/mlx-vlm: mlx_vlm/models/qwen3_5/language.py (masked variant) -----------------------
# QWEN35_QLINEAR_HEADER (the module's _target_verify_qlinear_header) is imported from
# test_real_world_kernels_2.py, which runs the unmasked qmv kernel.

QWEN35_QARGMAX_SOURCE = r"""
    uint n_tile = threadgroup_position_in_grid.y;
    uint b_idx = threadgroup_position_in_grid.z;
    uint simd_gid = simdgroup_index_in_threadgroup;
    uint simd_lid = thread_index_in_simdgroup;

    int out_row = int(n_tile) * BN + int(simd_gid) * RESULTS_PER_SIMDGROUP;
    int in_vec_size_w = K_SIZE * BYTES_PER_PACK / PACK_FACTOR;
    int in_vec_size_g = K_SIZE / GS;

    threadgroup float tile_best_values[VERIFY_T][NUM_SIMDGROUPS];
    threadgroup int tile_best_indices[VERIFY_T][NUM_SIMDGROUPS];

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

    for (int t = 0; t < VERIFY_T; ++t) {
      float best_value = -3.4028234663852886e38f;
      int best_index = 0;
      for (int row = 0; row < RESULTS_PER_SIMDGROUP; ++row) {
        int n = out_row + row;
        if (n < N_SIZE) {
          float rounded = float(T(simd_sum(result[t][row])));
          if (rounded > best_value) {
            best_value = rounded;
            best_index = n;
          }
        }
      }

      if (simd_lid == 0) {
        tile_best_values[t][simd_gid] = best_value;
        tile_best_indices[t][simd_gid] = best_index;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    if (simd_gid == 0 && simd_lid == 0) {
      for (int t = 0; t < VERIFY_T; ++t) {
        float best = tile_best_values[t][0];
        int best_idx = tile_best_indices[t][0];
        for (int i = 1; i < NUM_SIMDGROUPS; ++i) {
          float candidate = tile_best_values[t][i];
          int candidate_idx = tile_best_indices[t][i];
          if (candidate > best) {
            best = candidate;
            best_idx = candidate_idx;
          }
        }
        int offset = (int(b_idx) * VERIFY_T + t) * NUM_TILES + int(n_tile);
        tile_values[offset] = T(best);
        tile_indices[offset] = best_idx;
      }
    }
"""


QWEN35_MASKED_QARGMAX_SOURCE = QWEN35_QARGMAX_SOURCE.replace(
    "if (n < N_SIZE) {",
    """if (
          n < N_SIZE &&
          ((as_type<uint>(mask[
                (int(b_idx) * VERIFY_T + t) * mask_shape[1] + (n >> 5)]) >>
            (n & 31)) & 1u) != 0u) {""",
)


def test_mlx_vlm_qwen3_5_target_verify_masked_qargmax(device):
    """Blaizzy/mlx-vlm, mlx_vlm/models/qwen3_5/language.py: _target_verify_masked_qargmax_kernel:
    per 8-row tile argmax of an MLX 5-bit affine lm_head (bf16) for several verify tokens, rows
    allowed by an int32 packed token bitmask (read through as_type<uint>)."""
    bits, group_size, B, T, K, N = 5, 64, 2, 2, 512, 40
    num_tiles = N // 8
    q = torch.randint(0, 32, (N, K))
    w = pack_bits(q, bits)
    scales = (torch.rand(N, K // group_size) * 0.02 + 0.005).bfloat16()
    biases = (torch.randn(N, K // group_size) * 0.05).bfloat16()
    dense = q.double() * scales.double().repeat_interleave(group_size, 1) \
        + biases.double().repeat_interleave(group_size, 1)
    x = torch.randn(B, T, K).bfloat16()
    allowed = torch.rand(B * T, 64) < 0.4
    allowed[0, :8] = False  # token 0's first tile: nothing allowed
    allowed[1, 8:16] = True
    mask_words = (allowed.long() << torch.arange(32).repeat(2)).reshape(B * T, 2, 32).sum(-1)
    mask = torch.where(mask_words >= 2 ** 31, mask_words - 2 ** 32, mask_words).to(torch.int32)
    kernel = kk.metal_kernel(
        name=f"qwen3_5_target_verify_masked_qargmax_b{bits}_gs{group_size}_t{T}_k{K}_n{N}_bf16",
        input_names=["x", "w", "scales", "biases", "mask"],
        output_names=["tile_values", "tile_indices"],
        header=QWEN35_QLINEAR_HEADER.replace("__BITS__", str(bits)).replace("__GS__", str(group_size)),
        source=QWEN35_MASKED_QARGMAX_SOURCE)
    tile_values, tile_indices = launch(
        kernel, device, inputs=on(device, x, w, scales, biases, mask),
        template=[("T", x.dtype), ("VERIFY_T", int(T)), ("K_SIZE", int(K)), ("N_SIZE", int(N)),
                  ("NUM_TILES", int(num_tiles))],
        grid=(32, 2 * num_tiles, B), threadgroup=(32, 2, 1),
        output_shapes=[(B, T, num_tiles), (B, T, num_tiles)],
        output_dtypes=[x.dtype, torch.int32])
    logits = (x.double() @ dense.T).reshape(B * T, num_tiles, 8)
    ok = allowed[:, :N].reshape(B * T, num_tiles, 8)
    values = tile_values.cpu().double().reshape(B * T, num_tiles)
    indices = tile_indices.cpu().long().reshape(B * T, num_tiles)
    for row in range(B * T):
        for tile in range(num_tiles):
            if not ok[row, tile].any():  # -FLT_MAX stays the best, at row 0
                assert values[row, tile] < -3e38 and indices[row, tile] == 0
                continue
            best = logits[row, tile][ok[row, tile]].max().item()
            n = indices[row, tile].item()
            assert n // 8 == tile and allowed[row, n]
            tol = 0.01 * abs(best) + 0.02  # the kernel compares logits rounded to bf16
            assert logits[row, tile, n % 8] > best - tol
            assert abs(values[row, tile].item() - best) < tol


# --- Blaizzy/mlx-vlm: mlx_vlm/models/rope_utils.py ----------------------------------------------

_HAS_METAL = True
_HALF_SPLIT = "half_split"
_EVEN_ODD = "even_odd"



def _mrope_apply_kernel(
    rotary_dim: int,
    position_ndim: int,
    pairing: str,
):
    if not _HAS_METAL:
        return None

    if position_ndim == 2:
        position_expr = "position_ids[b * q_len + t]"
        selector_source = ""
    else:
        position_expr = "position_ids[(axis * q_bsz + b) * q_len + t]"
        selector_source = "int axis = int(position_selector[freq_idx]);"

    if pairing == _EVEN_ODD:
        pair_source = f"""
        int freq_idx = slot;
        int d = freq_idx * 2;
        int pair_d = d + 1;
        {selector_source}
        float pos = static_cast<float>({position_expr});
        float angle = pos * static_cast<float>(inv_freq[freq_idx]);
        float c = metal::cos(angle);
        float s = metal::sin(angle);
        """
    else:
        pair_source = f"""
        int freq_idx = slot;
        int d = freq_idx;
        int pair_d = d + half_dim;
        {selector_source}
        float pos = static_cast<float>({position_expr});
        float angle = pos * static_cast<float>(inv_freq[freq_idx]);
        float c = metal::cos(angle);
        float s = metal::sin(angle);
        """

    source = f"""
        uint elem = thread_position_in_grid.x;

        const int half_dim = {rotary_dim // 2};
        const int q_bsz = x_shape[0];
        const int q_heads = x_shape[1];
        const int q_len = x_shape[2];
        const int q_dim = x_shape[3];
        const int slots = half_dim + q_dim - {rotary_dim};
        const int work_size = q_bsz * q_heads * q_len * slots;

        if (elem >= uint(work_size)) {{
            return;
        }}

        int local = int(elem);
        int slot = local % slots;
        int tmp = local / slots;
        int t = tmp % q_len;
        tmp = tmp / q_len;
        int h = tmp % q_heads;
        int b = tmp / q_heads;
        int base = ((b * q_heads + h) * q_len + t) * q_dim;

        if (slot >= half_dim) {{
            int pass_d = {rotary_dim} + slot - half_dim;
            int pass_idx = base + pass_d;
            x_out[pass_idx] = x[pass_idx];
            return;
        }}

        {pair_source}

        int idx = base + d;
        float xv = static_cast<float>(x[idx]);
        float xp = static_cast<float>(x[base + pair_d]);
        x_out[idx] = static_cast<T>(xv * c - xp * s);
        x_out[base + pair_d] = static_cast<T>(xp * c + xv * s);
    """

    return kk.metal_kernel(
        name=f"mrope_apply_{pairing}_{rotary_dim}_{position_ndim}d",
        input_names=["x", "position_ids", "inv_freq", "position_selector"],
        output_names=["x_out"],
        source=source,
    )


def _chunked_position_selector(mrope_section, freq_dim):
    # rope_utils.py, returning a torch tensor
    selector = [0] * freq_dim
    offset = mrope_section[0]
    for dim, length in enumerate(mrope_section[1:], start=1):
        for idx in range(offset, min(offset + length, freq_dim)):
            selector[idx] = dim
        offset += length
    return torch.tensor(selector, dtype=torch.int32)


@pytest.mark.parametrize("pairing", [_HALF_SPLIT, _EVEN_ODD])
def test_mlx_vlm_mrope_apply(device, pairing):
    """Blaizzy/mlx-vlm, mlx_vlm/models/rope_utils.py: _mrope_apply_kernel: multimodal RoPE with
    3-D (temporal, height, width) positions, each frequency taking its axis from a selector, on a
    partial rotary dimension (the tail passes through), fp16."""
    B, H, L, q_dim, rotary_dim = 2, 3, 7, 80, 64
    half = rotary_dim // 2
    x = torch.randn(B, H, L, q_dim).half()
    position_ids = torch.randint(0, 300, (3, B, L), dtype=torch.int32)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    selector = _chunked_position_selector([8, 12, 12], half)
    kernel = _mrope_apply_kernel(rotary_dim, 3, pairing)
    slots = half + x.shape[-1] - half * 2
    work_size = x.shape[0] * x.shape[1] * x.shape[2] * slots
    (out,) = launch(kernel, device, inputs=on(device, x, position_ids, inv_freq, selector),
                    template=[("T", x.dtype)], grid=(work_size, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[x.shape], output_dtypes=[x.dtype])
    pos = position_ids.double()[selector.long()]  # (half, B, L): each frequency's axis
    angle = pos.permute(1, 2, 0)[:, None] * inv_freq.double()  # (B, 1, L, half)
    c, s = torch.cos(angle), torch.sin(angle)
    xd = x.double()
    if pairing == _HALF_SPLIT:
        d, pair = torch.arange(half), torch.arange(half) + half
    else:
        d, pair = torch.arange(half) * 2, torch.arange(half) * 2 + 1
    expected = xd.clone()
    expected[..., d] = xd[..., d] * c - xd[..., pair] * s
    expected[..., pair] = xd[..., pair] * c + xd[..., d] * s
    close(out, expected, rtol=2e-3, atol=2e-3)


# --- appautomaton/mlx-atomistic: src/mlx_atomistic/metal_kernels.py (constraints) ---------------

CONSTRAINT_HEADER = r"""
inline float3 constraint_load3(device const float* values, int atom) {
    return float3(
        values[3 * atom + 0],
        values[3 * atom + 1],
        values[3 * atom + 2]
    );
}

inline float3 constraint_minimum_image(
    float3 value,
    constant const float* box,
    int periodic
) {
    if (periodic != 0) {
        value.x -= box[0] * rint(value.x / box[0]);
        value.y -= box[1] * rint(value.y / box[1]);
        value.z -= box[2] * rint(value.z / box[2]);
    }
    return value;
}

inline float3 constraint_safe_normalize(float3 value) {
    return value * rsqrt(max(dot(value, value), 1.0e-20f));
}
"""


SETTLE_WATER_POSITION_SOURCE = r"""
    uint water = thread_position_in_grid.x;
    if (water >= (uint)params[0]) {
        return;
    }
    int oxygen = waters[3 * water + 0];
    int hydrogen_a = waters[3 * water + 1];
    int hydrogen_b = waters[3 * water + 2];
    int periodic = params[1];

    float3 reference_o = constraint_load3(reference_positions, oxygen);
    float3 reference_a = constraint_load3(reference_positions, hydrogen_a);
    float3 reference_b = constraint_load3(reference_positions, hydrogen_b);
    float3 predicted_o = constraint_load3(predicted_positions, oxygen);
    float3 predicted_a = constraint_load3(predicted_positions, hydrogen_a);
    float3 predicted_b = constraint_load3(predicted_positions, hydrogen_b);
    float3 old_b = constraint_minimum_image(reference_a - reference_o, box, periodic);
    float3 old_c = constraint_minimum_image(reference_b - reference_o, box, periodic);
    float3 step_o = constraint_minimum_image(predicted_o - reference_o, box, periodic);
    float3 step_a = constraint_minimum_image(predicted_a - reference_a, box, periodic);
    float3 step_b = constraint_minimum_image(predicted_b - reference_b, box, periodic);

    float mass_o = masses[oxygen];
    float mass_a = masses[hydrogen_a];
    float mass_b = masses[hydrogen_b];
    float total_mass = mass_o + mass_a + mass_b;
    float3 center = (
        mass_o * step_o
        + mass_a * (old_b + step_a)
        + mass_b * (old_c + step_b)
    ) / total_mass;
    float3 centered_o = step_o - center;
    float3 centered_a = old_b + step_a - center;
    float3 centered_b = old_c + step_b - center;

    float3 axis_z = constraint_safe_normalize(cross(old_b, old_c));
    float3 axis_x = constraint_safe_normalize(cross(centered_o, axis_z));
    float3 axis_y = constraint_safe_normalize(cross(axis_z, axis_x));
    float old_b_x = dot(old_b, axis_x);
    float old_b_y = dot(old_b, axis_y);
    float old_c_x = dot(old_c, axis_x);
    float old_c_y = dot(old_c, axis_y);
    float centered_o_z = dot(centered_o, axis_z);
    float centered_a_x = dot(centered_a, axis_x);
    float centered_a_y = dot(centered_a, axis_y);
    float centered_a_z = dot(centered_a, axis_z);
    float centered_b_x = dot(centered_b, axis_x);
    float centered_b_y = dot(centered_b, axis_y);
    float centered_b_z = dot(centered_b, axis_z);

    float half_hh = 0.5f * geometry[1];
    float oxygen_to_h_axis = sqrt(max(geometry[0] * geometry[0] - half_hh * half_hh, 0.0f));
    float oxygen_radius = oxygen_to_h_axis * (mass_a + mass_b) / total_mass;
    float hydrogen_radius = oxygen_to_h_axis - oxygen_radius;
    float sin_phi = clamp(centered_o_z / oxygen_radius, -1.0f, 1.0f);
    float cos_phi = sqrt(max(1.0f - sin_phi * sin_phi, 0.0f));
    float sin_psi = clamp(
        (centered_a_z - centered_b_z) / max(2.0f * half_hh * cos_phi, 1.0e-20f),
        -1.0f,
        1.0f
    );
    float cos_psi = sqrt(max(1.0f - sin_psi * sin_psi, 0.0f));

    float oxygen_y = oxygen_radius * cos_phi;
    float hydrogen_x = -half_hh * cos_psi;
    float hydrogen_a_y = -hydrogen_radius * cos_phi - half_hh * sin_psi * sin_phi;
    float hydrogen_b_y = -hydrogen_radius * cos_phi + half_hh * sin_psi * sin_phi;
    float hydrogen_x_squared = hydrogen_x * hydrogen_x;
    float current_hh_squared = 4.0f * hydrogen_x_squared
        + (hydrogen_a_y - hydrogen_b_y) * (hydrogen_a_y - hydrogen_b_y)
        + (centered_a_z - centered_b_z) * (centered_a_z - centered_b_z);
    float delta_x = 2.0f * hydrogen_x + sqrt(max(
        4.0f * hydrogen_x_squared - current_hh_squared + geometry[1] * geometry[1],
        0.0f
    ));
    hydrogen_x -= 0.5f * delta_x;

    float alpha = hydrogen_x * (old_b_x - old_c_x)
        + old_b_y * hydrogen_a_y + old_c_y * hydrogen_b_y;
    float beta = hydrogen_x * (old_c_y - old_b_y)
        + old_b_x * hydrogen_a_y + old_c_x * hydrogen_b_y;
    float gamma = old_b_x * centered_a_y - centered_a_x * old_b_y
        + old_c_x * centered_b_y - centered_b_x * old_c_y;
    float alpha_beta_squared = alpha * alpha + beta * beta;
    float sin_theta = (
        alpha * gamma - beta * sqrt(max(alpha_beta_squared - gamma * gamma, 0.0f))
    ) / max(alpha_beta_squared, 1.0e-20f);
    sin_theta = clamp(sin_theta, -1.0f, 1.0f);
    float cos_theta = sqrt(max(1.0f - sin_theta * sin_theta, 0.0f));

    float oxygen_x = -oxygen_y * sin_theta;
    oxygen_y *= cos_theta;
    float hydrogen_a_x = hydrogen_x * cos_theta - hydrogen_a_y * sin_theta;
    hydrogen_a_y = hydrogen_x * sin_theta + hydrogen_a_y * cos_theta;
    float hydrogen_b_x = -hydrogen_x * cos_theta - hydrogen_b_y * sin_theta;
    hydrogen_b_y = -hydrogen_x * sin_theta + hydrogen_b_y * cos_theta;

    float3 projected_o = reference_o + center
        + oxygen_x * axis_x + oxygen_y * axis_y + centered_o_z * axis_z;
    float3 projected_a = reference_o + center
        + hydrogen_a_x * axis_x + hydrogen_a_y * axis_y + centered_a_z * axis_z;
    float3 projected_b = reference_o + center
        + hydrogen_b_x * axis_x + hydrogen_b_y * axis_y + centered_b_z * axis_z;
    float3 delta_o = projected_o - predicted_o;
    float3 delta_a = projected_a - predicted_a;
    float3 delta_b = projected_b - predicted_b;
    uint output = 9 * water;
    deltas[output + 0] = delta_o.x;
    deltas[output + 1] = delta_o.y;
    deltas[output + 2] = delta_o.z;
    deltas[output + 3] = delta_a.x;
    deltas[output + 4] = delta_a.y;
    deltas[output + 5] = delta_a.z;
    deltas[output + 6] = delta_b.x;
    deltas[output + 7] = delta_b.y;
    deltas[output + 8] = delta_b.z;
"""

SETTLE_WATER_VELOCITY_SOURCE = r"""
    uint water = thread_position_in_grid.x;
    if (water >= (uint)params[0]) {
        return;
    }
    int oxygen = waters[3 * water + 0];
    int hydrogen_a = waters[3 * water + 1];
    int hydrogen_b = waters[3 * water + 2];
    int periodic = params[1];

    float3 position_o = constraint_load3(positions, oxygen);
    float3 position_a = constraint_load3(positions, hydrogen_a);
    float3 position_b = constraint_load3(positions, hydrogen_b);
    float3 velocity_o = constraint_load3(velocities, oxygen);
    float3 velocity_a = constraint_load3(velocities, hydrogen_a);
    float3 velocity_b = constraint_load3(velocities, hydrogen_b);
    float3 q_oh_a = constraint_minimum_image(position_o - position_a, box, periodic);
    float3 q_oh_b = constraint_minimum_image(position_o - position_b, box, periodic);
    float3 q_hh = constraint_minimum_image(position_a - position_b, box, periodic);

    float inverse_o = 1.0f / masses[oxygen];
    float inverse_a = 1.0f / masses[hydrogen_a];
    float inverse_b = 1.0f / masses[hydrogen_b];
    float dot_oh = dot(q_oh_a, q_oh_b);
    float dot_a_hh = dot(q_oh_a, q_hh);
    float dot_b_hh = dot(q_oh_b, q_hh);
    float3 row_0 = float3(
        (inverse_o + inverse_a) * dot(q_oh_a, q_oh_a),
        inverse_o * dot_oh,
        -inverse_a * dot_a_hh
    );
    float3 row_1 = float3(
        inverse_o * dot_oh,
        (inverse_o + inverse_b) * dot(q_oh_b, q_oh_b),
        inverse_b * dot_b_hh
    );
    float3 row_2 = float3(
        -inverse_a * dot_a_hh,
        inverse_b * dot_b_hh,
        (inverse_a + inverse_b) * dot(q_hh, q_hh)
    );
    float3 rhs = -float3(
        dot(q_oh_a, velocity_o - velocity_a),
        dot(q_oh_b, velocity_o - velocity_b),
        dot(q_hh, velocity_a - velocity_b)
    );
    float3 cross_12 = cross(row_1, row_2);
    float determinant = dot(row_0, cross_12);
    float safe_determinant = fabs(determinant) > 1.0e-20f ? determinant : 1.0f;
    float3 multipliers = (
        rhs.x * cross_12
        + rhs.y * cross(row_2, row_0)
        + rhs.z * cross(row_0, row_1)
    ) / safe_determinant;
    float3 correction_o = inverse_o * (
        multipliers.x * q_oh_a + multipliers.y * q_oh_b
    );
    float3 correction_a = inverse_a * (
        -multipliers.x * q_oh_a + multipliers.z * q_hh
    );
    float3 correction_b = inverse_b * (
        -multipliers.y * q_oh_b - multipliers.z * q_hh
    );
    uint output = 9 * water;
    deltas[output + 0] = correction_o.x;
    deltas[output + 1] = correction_o.y;
    deltas[output + 2] = correction_o.z;
    deltas[output + 3] = correction_a.x;
    deltas[output + 4] = correction_a.y;
    deltas[output + 5] = correction_a.z;
    deltas[output + 6] = correction_b.x;
    deltas[output + 7] = correction_b.y;
    deltas[output + 8] = correction_b.z;
"""

SHAKE_CLUSTER_POSITION_SOURCE = r"""
    uint cluster = thread_position_in_grid.x;
    if (cluster >= (uint)params[0]) {
        return;
    }

    int peripheral_count = peripheral_counts[cluster];
    int atom[4];
    float x[4];
    float y[4];
    float z[4];
    float base_x[4];
    float base_y[4];
    float base_z[4];
    float inverse_mass[4];
    for (int slot = 0; slot < 4; slot++) {
        atom[slot] = cluster_atoms[4 * cluster + slot];
        if (slot <= peripheral_count) {
            int index = atom[slot];
            x[slot] = predicted_positions[3 * index + 0];
            y[slot] = predicted_positions[3 * index + 1];
            z[slot] = predicted_positions[3 * index + 2];
            base_x[slot] = x[slot];
            base_y[slot] = y[slot];
            base_z[slot] = z[slot];
            inverse_mass[slot] = 1.0f / masses[index];
        } else {
            x[slot] = 0.0f;
            y[slot] = 0.0f;
            z[slot] = 0.0f;
            base_x[slot] = 0.0f;
            base_y[slot] = 0.0f;
            base_z[slot] = 0.0f;
            inverse_mass[slot] = 0.0f;
        }
    }

    float reference_x[3];
    float reference_y[3];
    float reference_z[3];
    for (int peripheral = 0; peripheral < peripheral_count; peripheral++) {
        int slot = peripheral + 1;
        int center_atom = atom[0];
        int outer_atom = atom[slot];
        float dx = reference_positions[3 * center_atom + 0]
            - reference_positions[3 * outer_atom + 0];
        float dy = reference_positions[3 * center_atom + 1]
            - reference_positions[3 * outer_atom + 1];
        float dz = reference_positions[3 * center_atom + 2]
            - reference_positions[3 * outer_atom + 2];
        if (params[2] != 0) {
            dx -= box[0] * rint(dx / box[0]);
            dy -= box[1] * rint(dy / box[1]);
            dz -= box[2] * rint(dz / box[2]);
        }
        reference_x[peripheral] = dx;
        reference_y[peripheral] = dy;
        reference_z[peripheral] = dz;
    }

    float target_squared = distances[cluster] * distances[cluster];
    for (int iteration = 0; iteration < params[1]; iteration++) {
        float center_delta_x = 0.0f;
        float center_delta_y = 0.0f;
        float center_delta_z = 0.0f;
        for (int peripheral = 0; peripheral < peripheral_count; peripheral++) {
            int slot = peripheral + 1;
            float dx = x[0] - x[slot];
            float dy = y[0] - y[slot];
            float dz = z[0] - z[slot];
            if (params[2] != 0) {
                dx -= box[0] * rint(dx / box[0]);
                dy -= box[1] * rint(dy / box[1]);
                dz -= box[2] * rint(dz / box[2]);
            }
            float reference_dot = dx * reference_x[peripheral]
                + dy * reference_y[peripheral]
                + dz * reference_z[peripheral];
            float denominator = 2.0f
                * (inverse_mass[0] + inverse_mass[slot])
                * reference_dot;
            if (fabs(denominator) <= 1.0e-20f) {
                denominator = denominator < 0.0f ? -1.0e-20f : 1.0e-20f;
            }
            float error_squared = target_squared - (dx * dx + dy * dy + dz * dz);
            float multiplier = error_squared / denominator;
            float correction_x = multiplier * reference_x[peripheral];
            float correction_y = multiplier * reference_y[peripheral];
            float correction_z = multiplier * reference_z[peripheral];
            center_delta_x += inverse_mass[0] * correction_x;
            center_delta_y += inverse_mass[0] * correction_y;
            center_delta_z += inverse_mass[0] * correction_z;
            x[slot] -= inverse_mass[slot] * correction_x;
            y[slot] -= inverse_mass[slot] * correction_y;
            z[slot] -= inverse_mass[slot] * correction_z;
        }
        x[0] += center_delta_x;
        y[0] += center_delta_y;
        z[0] += center_delta_z;
    }

    for (int slot = 0; slot < 4; slot++) {
        uint output = 12 * cluster + 3 * slot;
        if (slot <= peripheral_count) {
            deltas[output + 0] = x[slot] - base_x[slot];
            deltas[output + 1] = y[slot] - base_y[slot];
            deltas[output + 2] = z[slot] - base_z[slot];
        } else {
            deltas[output + 0] = 0.0f;
            deltas[output + 1] = 0.0f;
            deltas[output + 2] = 0.0f;
        }
    }
"""

SHAKE_CLUSTER_VELOCITY_SOURCE = r"""
    uint cluster = thread_position_in_grid.x;
    if (cluster >= (uint)params[0]) {
        return;
    }

    int peripheral_count = peripheral_counts[cluster];
    int center_atom = cluster_atoms[4 * cluster];
    float3 center_velocity = constraint_load3(velocities, center_atom);
    float inverse_center = 1.0f / masses[center_atom];
    float3 unit[3] = {
        float3(0.0f),
        float3(0.0f),
        float3(0.0f)
    };
    float3 outer_velocity[3] = {
        float3(0.0f),
        float3(0.0f),
        float3(0.0f)
    };
    float inverse_outer[3] = {0.0f, 0.0f, 0.0f};
    float relative[3] = {0.0f, 0.0f, 0.0f};
    for (int peripheral = 0; peripheral < peripheral_count; peripheral++) {
        int outer_atom = cluster_atoms[4 * cluster + peripheral + 1];
        float3 displacement = constraint_minimum_image(
            constraint_load3(positions, center_atom)
                - constraint_load3(positions, outer_atom),
            box,
            params[2]
        );
        unit[peripheral] = constraint_safe_normalize(displacement);
        outer_velocity[peripheral] = constraint_load3(velocities, outer_atom);
        inverse_outer[peripheral] = 1.0f / masses[outer_atom];
        relative[peripheral] = dot(
            center_velocity - outer_velocity[peripheral],
            unit[peripheral]
        );
    }

    float coupling_01 = inverse_center * dot(unit[0], unit[1]);
    float coupling_02 = inverse_center * dot(unit[0], unit[2]);
    float coupling_12 = inverse_center * dot(unit[1], unit[2]);
    float3 row_0 = float3(
        peripheral_count > 0 ? inverse_center + inverse_outer[0] : 1.0f,
        peripheral_count > 1 ? coupling_01 : 0.0f,
        peripheral_count > 2 ? coupling_02 : 0.0f
    );
    float3 row_1 = float3(
        peripheral_count > 1 ? coupling_01 : 0.0f,
        peripheral_count > 1 ? inverse_center + inverse_outer[1] : 1.0f,
        peripheral_count > 2 ? coupling_12 : 0.0f
    );
    float3 row_2 = float3(
        peripheral_count > 2 ? coupling_02 : 0.0f,
        peripheral_count > 2 ? coupling_12 : 0.0f,
        peripheral_count > 2 ? inverse_center + inverse_outer[2] : 1.0f
    );
    float3 rhs = -float3(relative[0], relative[1], relative[2]);
    float3 cross_12 = cross(row_1, row_2);
    float determinant = dot(row_0, cross_12);
    float safe_determinant = fabs(determinant) > 1.0e-20f ? determinant : 1.0f;
    float3 multipliers = (
        rhs.x * cross_12
        + rhs.y * cross(row_2, row_0)
        + rhs.z * cross(row_0, row_1)
    ) / safe_determinant;

    float3 center_delta = float3(0.0f);
    for (int peripheral = 0; peripheral < peripheral_count; peripheral++) {
        center_delta += inverse_center * multipliers[peripheral] * unit[peripheral];
    }
    uint center_output = 12 * cluster;
    deltas[center_output + 0] = center_delta.x;
    deltas[center_output + 1] = center_delta.y;
    deltas[center_output + 2] = center_delta.z;
    for (int peripheral = 0; peripheral < 3; peripheral++) {
        uint output = center_output + 3 * (peripheral + 1);
        float3 outer_delta = peripheral < peripheral_count
            ? -inverse_outer[peripheral] * multipliers[peripheral] * unit[peripheral]
            : float3(0.0f);
        deltas[output + 0] = outer_delta.x;
        deltas[output + 1] = outer_delta.y;
        deltas[output + 2] = outer_delta.z;
    }
"""

OH, HH, M_O, M_H, M_C = 0.09572, 0.15139, 15.9994, 1.008, 12.011


def _constraint_matrix(pairs, n_atoms, inverse_mass):
    """G[k, a]: how far atom a moves along bond k's vector per unit multiplier (+w_i, -w_j);
    D[k, m]: how bond k's length vector changes per unit multiplier m."""
    G = np.zeros((len(pairs), n_atoms))
    for k, (i, j) in enumerate(pairs):
        G[k, i], G[k, j] = inverse_mass[i], -inverse_mass[j]
    D = np.stack([G[:, i] - G[:, j] for i, j in pairs])
    return G, D


def _shake_solution(reference, predicted, inverse_mass, pairs, distances):
    """SHAKE's equations solved in float64 (Newton): displace atoms along their reference bond
    vectors, in proportion to inverse mass, until every bond has its target length."""
    G, D = _constraint_matrix(pairs, len(reference), inverse_mass)
    r0 = np.stack([reference[i] - reference[j] for i, j in pairs])
    g = np.zeros(len(pairs))
    for _ in range(30):
        p = predicted + (G * g[:, None]).T @ r0
        bonds = np.stack([p[i] - p[j] for i, j in pairs])
        f = (bonds ** 2).sum(-1) - np.asarray(distances) ** 2
        g -= np.linalg.solve(2 * D * (bonds @ r0.T), f)
    return (G * g[:, None]).T @ r0


def _rattle_velocity(positions, velocities, inverse_mass, pairs):
    """RATTLE's velocity step in float64: the impulses along each bond that remove every
    bond's relative velocity along it."""
    G, D = _constraint_matrix(pairs, len(positions), inverse_mass)
    r = np.stack([positions[i] - positions[j] for i, j in pairs])
    rel = np.array([r[k] @ (velocities[i] - velocities[j]) for k, (i, j) in enumerate(pairs)])
    mu = np.linalg.solve(D * (r @ r.T), -rel)
    return (G * mu[:, None]).T @ r


def _rotations(n):
    q = np.linalg.qr(np.random.randn(n, 3, 3))[0]
    return q * np.sign(np.linalg.det(q))[:, None, None]


def _waters(n, box):
    """n rigid waters (O, H, H) at random places and orientations, unwrapped, float64."""
    h = math.sqrt(OH ** 2 - (HH / 2) ** 2)
    local = np.array([[0, 0, 0], [HH / 2, -h, 0], [-HH / 2, -h, 0]])
    return np.random.rand(n, 1, 3) * box + local @ _rotations(n).transpose(0, 2, 1)


def _scatter_atoms(molecules, box):
    """Molecule-major (n, k, 3) coordinates -> shuffled per-atom rows, each atom wrapped into
    the box on its own (molecules straddle its faces), and each molecule's atom indices."""
    n, k, _ = molecules.shape
    perm = np.random.permutation(n * k)
    atoms = np.empty((n * k, 3))
    atoms[perm] = molecules.reshape(-1, 3)
    return atoms - box * np.floor(atoms / box), perm.reshape(n, k)


def _f32(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32))


def test_mlx_atomistic_settle_water_positions(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: SETTLE, the analytical
    solution of the rigid-water position constraints (float3 math, rint minimum images through
    `constant` box pointers, in a periodic box the waters straddle). Compared modulo the box: the
    original rebuilds a straddling water from its oxygen's image, whole box lengths apart."""
    n, box = 24, 1.2
    reference = _waters(n, box)
    predicted = reference + np.random.randn(n, 3, 3) * 0.003
    ref_atoms, waters = _scatter_atoms(reference, box)
    pred_atoms = np.empty_like(ref_atoms)
    pred_atoms[waters.reshape(-1)] = predicted.reshape(-1, 3)
    pred_atoms -= box * np.floor(pred_atoms / box)
    masses = np.empty(3 * n)
    masses[waters] = [M_O, M_H, M_H]
    kernel = kk.metal_kernel(
        name="settle_water_positions",
        input_names=["reference_positions", "predicted_positions", "masses", "waters", "geometry",
                     "box", "params"],
        output_names=["deltas"], source=SETTLE_WATER_POSITION_SOURCE, header=CONSTRAINT_HEADER)
    (deltas,) = launch(kernel, device,
                       inputs=on(device, _f32(ref_atoms), _f32(pred_atoms), _f32(masses),
                                 torch.from_numpy(waters).to(torch.int32), _f32([OH, HH]),
                                 _f32([box] * 3), torch.tensor([n, 1], dtype=torch.int32)),
                       output_shapes=[(n, 3, 3)], output_dtypes=[torch.float32],
                       grid=(n, 1, 1), threadgroup=(min(256, n), 1, 1), init_value=0.0)
    expected = np.stack([_shake_solution(reference[w], predicted[w], 1 / np.array([M_O, M_H, M_H]),
                                         [(0, 1), (0, 2), (1, 2)], [OH, OH, HH]) for w in range(n)])
    diff = deltas.cpu().double().numpy() - expected
    diff -= box * np.round(diff / box)  # a delta may carry whole boxes between wrapped images
    assert np.abs(diff).max() < 2e-5


def test_mlx_atomistic_settle_water_velocities(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: SETTLE's velocity step
    (a 3x3 solve by cross products): remove each rigid water's bond-stretching velocities."""
    n, box = 20, 1.2
    positions = _waters(n, box)
    velocities = np.random.randn(n, 3, 3) * 0.5
    pos_atoms, waters = _scatter_atoms(positions, box)
    vel_atoms = np.empty_like(pos_atoms)
    vel_atoms[waters.reshape(-1)] = velocities.reshape(-1, 3)
    masses = np.empty(3 * n)
    masses[waters] = [M_O, M_H, M_H]
    kernel = kk.metal_kernel(
        name="settle_water_velocities",
        input_names=["positions", "velocities", "masses", "waters", "box", "params"],
        output_names=["deltas"], source=SETTLE_WATER_VELOCITY_SOURCE, header=CONSTRAINT_HEADER)
    (deltas,) = launch(kernel, device,
                       inputs=on(device, _f32(pos_atoms), _f32(vel_atoms), _f32(masses),
                                 torch.from_numpy(waters).to(torch.int32), _f32([box] * 3),
                                 torch.tensor([n, 1], dtype=torch.int32)),
                       output_shapes=[(n, 3, 3)], output_dtypes=[torch.float32],
                       grid=(n, 1, 1), threadgroup=(min(256, n), 1, 1), init_value=0.0)
    expected = np.stack([_rattle_velocity(positions[w], velocities[w], 1 / np.array([M_O, M_H, M_H]),
                                          [(0, 1), (0, 2), (1, 2)]) for w in range(n)])
    close(deltas, torch.from_numpy(expected), rtol=1e-4, atol=2e-5)


def _clusters(n, box):
    """n X-H_k groups (k = 1..3 hydrogens at one bond length per group), unwrapped, float64;
    molecule-major with 4 slots (unused slots at the center) and their hydrogen counts."""
    counts = np.random.randint(1, 4, n)
    lengths = 0.1 + np.random.rand(n) * 0.01
    directions = np.random.randn(n, 3, 3)
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    centers = np.random.rand(n, 1, 3) * box
    atoms = np.concatenate([centers, centers - lengths[:, None, None] * directions], 1)
    return atoms, counts, lengths


def _cluster_inputs(atoms, counts):
    """Per-atom rows for the used slots of each cluster, and cluster_atoms with -1 in unused slots."""
    n = len(counts)
    used = [(c, s) for c in range(n) for s in range(counts[c] + 1)]
    perm = np.random.permutation(len(used))
    rows = np.empty((len(used), 3))
    cluster_atoms = np.full((n, 4), -1, dtype=np.int32)
    for a, (c, s) in zip(perm, used):
        rows[a] = atoms[c, s]
        cluster_atoms[c, s] = a
    return rows, cluster_atoms


def test_mlx_atomistic_shake_cluster_positions(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: iterative SHAKE for
    disjoint X-H1..3 clusters, one thread a cluster, state in per-thread arrays."""
    n, box, iterations = 30, 1.5, 50
    reference, counts, lengths = _clusters(n, box)
    predicted = reference + np.random.randn(n, 4, 3) * 0.002
    ref_rows, cluster_atoms = _cluster_inputs(reference, counts)
    pred_rows = np.empty_like(ref_rows)
    for c in range(n):
        for s in range(counts[c] + 1):
            pred_rows[cluster_atoms[c, s]] = predicted[c, s]
    ref_rows -= box * np.floor(ref_rows / box)  # each atom wrapped on its own
    pred_rows -= box * np.floor(pred_rows / box)
    masses = np.full(len(ref_rows), M_H)
    masses[cluster_atoms[:, 0]] = M_C
    kernel = kk.metal_kernel(
        name="shake_cluster_positions",
        input_names=["reference_positions", "predicted_positions", "masses", "cluster_atoms",
                     "peripheral_counts", "distances", "box", "params"],
        output_names=["deltas"], source=SHAKE_CLUSTER_POSITION_SOURCE)
    (deltas,) = launch(kernel, device,
                       inputs=on(device, _f32(ref_rows), _f32(pred_rows), _f32(masses),
                                 torch.from_numpy(cluster_atoms),
                                 torch.from_numpy(counts).to(torch.int32), _f32(lengths),
                                 _f32([box] * 3), torch.tensor([n, iterations, 1], dtype=torch.int32)),
                       output_shapes=[(n, 4, 3)], output_dtypes=[torch.float32],
                       grid=(n, 1, 1), threadgroup=(min(256, n), 1, 1), init_value=0.0)
    expected = np.zeros((n, 4, 3))
    for c in range(n):
        k = counts[c] + 1
        expected[c, :k] = _shake_solution(reference[c, :k], predicted[c, :k],
                                          1 / np.array([M_C] + [M_H] * counts[c]),
                                          [(0, s) for s in range(1, k)], [lengths[c]] * counts[c])
    close(deltas, torch.from_numpy(expected), rtol=0, atol=2e-5)


def test_mlx_atomistic_shake_cluster_velocities(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: the analytical RATTLE
    velocity step for X-H1..3 clusters (float3 arrays, float3 subscripted by a loop index)."""
    n, box = 30, 1.5
    positions, counts, _ = _clusters(n, box)
    velocities = np.random.randn(n, 4, 3) * 0.5
    pos_rows, cluster_atoms = _cluster_inputs(positions, counts)
    vel_rows = np.empty_like(pos_rows)
    for c in range(n):
        for s in range(counts[c] + 1):
            vel_rows[cluster_atoms[c, s]] = velocities[c, s]
    pos_rows -= box * np.floor(pos_rows / box)
    masses = np.full(len(pos_rows), M_H)
    masses[cluster_atoms[:, 0]] = M_C
    kernel = kk.metal_kernel(
        name="shake_cluster_velocities",
        input_names=["positions", "velocities", "masses", "cluster_atoms", "peripheral_counts",
                     "box", "params"],
        output_names=["deltas"], source=SHAKE_CLUSTER_VELOCITY_SOURCE, header=CONSTRAINT_HEADER)
    (deltas,) = launch(kernel, device,
                       inputs=on(device, _f32(pos_rows), _f32(vel_rows), _f32(masses),
                                 torch.from_numpy(cluster_atoms),
                                 torch.from_numpy(counts).to(torch.int32), _f32([box] * 3),
                                 torch.tensor([n, 0, 1], dtype=torch.int32)),
                       output_shapes=[(n, 4, 3)], output_dtypes=[torch.float32],
                       grid=(n, 1, 1), threadgroup=(min(256, n), 1, 1), init_value=0.0)
    expected = np.zeros((n, 4, 3))
    for c in range(n):
        k = counts[c] + 1
        expected[c, :k] = _rattle_velocity(positions[c, :k], velocities[c, :k],
                                           1 / np.array([M_C] + [M_H] * counts[c]),
                                           [(0, s) for s in range(1, k)])
    close(deltas, torch.from_numpy(expected), rtol=1e-4, atol=2e-5)


# --- appautomaton/mlx-spatial: src/mlx_spatial/spatialkit/mlx_qem.py (batched QEM collapses) ----

QEM_VERTEX_QEM_SOURCE = r"""
uint vertex_id = thread_position_in_grid.x;
if (vertex_id >= uint(vertex_count)) return;
float q[10] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
for (int item = vertex_face_offsets[vertex_id]; item < vertex_face_offsets[vertex_id + 1]; ++item) {
    int face_id = vertex_faces[item];
    int i0 = faces[face_id * 3];
    int i1 = faces[face_id * 3 + 1];
    int i2 = faces[face_id * 3 + 2];
    float3 a = float3(vertices[i0 * 3], vertices[i0 * 3 + 1], vertices[i0 * 3 + 2]);
    float3 b = float3(vertices[i1 * 3], vertices[i1 * 3 + 1], vertices[i1 * 3 + 2]);
    float3 c = float3(vertices[i2 * 3], vertices[i2 * 3 + 1], vertices[i2 * 3 + 2]);
    float3 normal = metal::cross(b - a, c - a);
    float length = metal::length(normal);
    if (!metal::isfinite(length) || length <= 1.0e-18f) continue;
    normal /= length;
    float d = -metal::dot(normal, a);
    float p[4] = {normal.x, normal.y, normal.z, d};
    q[0] += p[0] * p[0]; q[1] += p[0] * p[1]; q[2] += p[0] * p[2]; q[3] += p[0] * p[3];
    q[4] += p[1] * p[1]; q[5] += p[1] * p[2]; q[6] += p[1] * p[3];
    q[7] += p[2] * p[2]; q[8] += p[2] * p[3]; q[9] += p[3] * p[3];
}
for (uint index = 0; index < 10; ++index) qems[vertex_id * 10 + index] = q[index];
"""


QEM_EDGE_TOPOLOGY_HEADER = r"""
inline int mlx_spatial_other_endpoint(device const int* edges, int edge_id, int vertex_id) {
    int a = edges[edge_id * 2];
    int b = edges[edge_id * 2 + 1];
    return a == vertex_id ? b : a;
}

inline bool mlx_spatial_face_contains(device const int* faces, int face_id, int vertex_id) {
    return faces[face_id * 3] == vertex_id ||
        faces[face_id * 3 + 1] == vertex_id ||
        faces[face_id * 3 + 2] == vertex_id;
}

inline int2 mlx_spatial_other_face_vertices(
    device const int* faces,
    int face_id,
    int excluded_vertex) {
    int2 other = int2(-1, -1);
    int write = 0;
    for (uint corner = 0; corner < 3; ++corner) {
        int vertex_id = faces[face_id * 3 + corner];
        if (vertex_id == excluded_vertex) continue;
        if (write == 0) other.x = vertex_id;
        else other.y = vertex_id;
        write += 1;
    }
    return other;
}
"""


QEM_EDGE_TOPOLOGY_SOURCE = r"""
uint edge_id = thread_position_in_grid.x;
if (edge_id >= uint(edge_count)) return;
if (preserve_manifold == 0) {
    topology_valid[edge_id] = 1;
    return;
}
int e0 = edges[edge_id * 2];
int e1 = edges[edge_id * 2 + 1];

// Match the topology-preserving native QEM contract: only collapse an
// interior two-manifold edge whose endpoints are not on a boundary.
if (edge_face_counts[edge_id] != 2 ||
    boundary_vertices[e0] != 0 || boundary_vertices[e1] != 0) {
    topology_valid[edge_id] = 0;
    return;
}

int opposite0 = -1;
int opposite1 = -1;
int incident_count = 0;
for (int item = vertex_face_offsets[e0]; item < vertex_face_offsets[e0 + 1]; ++item) {
    int face_id = vertex_faces[item];
    if (!mlx_spatial_face_contains(faces, face_id, e1)) continue;
    int2 other = mlx_spatial_other_face_vertices(faces, face_id, e0);
    int opposite = other.x == e1 ? other.y : other.x;
    if (incident_count == 0) opposite0 = opposite;
    else if (incident_count == 1) opposite1 = opposite;
    incident_count += 1;
}
if (incident_count != 2 || opposite0 < 0 || opposite1 < 0 || opposite0 == opposite1) {
    topology_valid[edge_id] = 0;
    return;
}

// Link condition: the endpoints must share exactly the two opposite vertices
// of the incident triangles. Extra common neighbours create a pinch.
int common_count = 0;
bool found_opposite0 = false;
bool found_opposite1 = false;
for (int item0 = vertex_edge_offsets[e0]; item0 < vertex_edge_offsets[e0 + 1]; ++item0) {
    int neighbour = mlx_spatial_other_endpoint(edges, vertex_edges[item0], e0);
    if (neighbour == e1) continue;
    bool shared = false;
    for (int item1 = vertex_edge_offsets[e1]; item1 < vertex_edge_offsets[e1 + 1]; ++item1) {
        if (mlx_spatial_other_endpoint(edges, vertex_edges[item1], e1) == neighbour) {
            shared = true;
            break;
        }
    }
    if (!shared) continue;
    common_count += 1;
    found_opposite0 = found_opposite0 || neighbour == opposite0;
    found_opposite1 = found_opposite1 || neighbour == opposite1;
}
if (common_count != 2 || !found_opposite0 || !found_opposite1) {
    topology_valid[edge_id] = 0;
    return;
}

// Retargeting e1 -> e0 must not create duplicate canonical faces.
for (int item1 = vertex_face_offsets[e1]; item1 < vertex_face_offsets[e1 + 1]; ++item1) {
    int face1 = vertex_faces[item1];
    if (mlx_spatial_face_contains(faces, face1, e0)) continue;
    int2 pair1 = mlx_spatial_other_face_vertices(faces, face1, e1);
    for (int item0 = vertex_face_offsets[e0]; item0 < vertex_face_offsets[e0 + 1]; ++item0) {
        int face0 = vertex_faces[item0];
        if (mlx_spatial_face_contains(faces, face0, e1)) continue;
        int2 pair0 = mlx_spatial_other_face_vertices(faces, face0, e0);
        if ((pair0.x == pair1.x && pair0.y == pair1.y) ||
            (pair0.x == pair1.y && pair0.y == pair1.x)) {
            topology_valid[edge_id] = 0;
            return;
        }
    }
}
topology_valid[edge_id] = 1;
"""


QEM_EDGE_COST_HEADER = r"""
inline bool mlx_spatial_process_incident(
    int face_id,
    int keep_vertex,
    int other_vertex,
    device const float* vertices,
    device const int* faces,
    float3 new_position,
    thread float& skinny_cost,
    thread int& triangle_count) {
    int3 ids = int3(faces[face_id * 3], faces[face_id * 3 + 1], faces[face_id * 3 + 2]);
    if (ids.x == other_vertex || ids.y == other_vertex || ids.z == other_vertex) return true;
    float3 a = float3(vertices[ids.x * 3], vertices[ids.x * 3 + 1], vertices[ids.x * 3 + 2]);
    float3 b = float3(vertices[ids.y * 3], vertices[ids.y * 3 + 1], vertices[ids.y * 3 + 2]);
    float3 c = float3(vertices[ids.z * 3], vertices[ids.z * 3 + 1], vertices[ids.z * 3 + 2]);
    float3 na = ids.x == keep_vertex ? new_position : a;
    float3 nb = ids.y == keep_vertex ? new_position : b;
    float3 nc = ids.z == keep_vertex ? new_position : c;
    float3 old_normal = metal::cross(b - a, c - a);
    float3 new_normal = metal::cross(nb - na, nc - na);
    float old_area2 = metal::length(old_normal);
    float new_area2 = metal::length(new_normal);
    if (!metal::isfinite(old_area2) || !metal::isfinite(new_area2) ||
        old_area2 <= 1.0e-12f || new_area2 <= 1.0e-12f) return false;
    float alignment = metal::dot(old_normal, new_normal) / (old_area2 * new_area2);
    if (!metal::isfinite(alignment) || alignment <= 0.2f) return false;
    float new_area = 0.5f * new_area2;
    float denominator = metal::length_squared(nc - nb) + metal::length_squared(nb - na) + metal::length_squared(nc - na);
    denominator = metal::max(denominator, 1.0e-12f);
    float shape = 4.0f * metal::sqrt(3.0f) * new_area / denominator;
    if (!metal::isfinite(shape) || shape < 1.0e-4f) return false;
    skinny_cost += 1.0f - metal::clamp(shape, 0.0f, 1.0f);
    triangle_count += 1;
    return true;
}

inline float mlx_spatial_eval_qem(device const float* qems, int a, int b, float3 p) {
    float q[10];
    for (uint i = 0; i < 10; ++i) q[i] = qems[a * 10 + i] + qems[b * 10 + i];
    return q[0] * p.x * p.x + 2.0f * q[1] * p.x * p.y + 2.0f * q[2] * p.x * p.z
        + 2.0f * q[3] * p.x + q[4] * p.y * p.y + 2.0f * q[5] * p.y * p.z
        + 2.0f * q[6] * p.y + q[7] * p.z * p.z + 2.0f * q[8] * p.z + q[9];
}
"""


QEM_EDGE_COST_SOURCE = r"""
uint edge_id = thread_position_in_grid.x;
if (edge_id >= uint(edge_count)) return;
int e0 = edges[edge_id * 2];
int e1 = edges[edge_id * 2 + 1];
if (topology_valid[edge_id] == 0) {
    costs[edge_id] = INFINITY;
    return;
}
float3 v0 = float3(vertices[e0 * 3], vertices[e0 * 3 + 1], vertices[e0 * 3 + 2]);
float3 v1 = float3(vertices[e1 * 3], vertices[e1 * 3 + 1], vertices[e1 * 3 + 2]);
bool b0 = boundary_vertices[e0] != 0;
bool b1 = boundary_vertices[e1] != 0;
float weight0 = b0 && !b1 ? 1.0f : (!b0 && b1 ? 0.0f : 0.5f);
float3 target = v0 * weight0 + v1 * (1.0f - weight0);
float length_squared = metal::length_squared(v1 - v0);
float cost = mlx_spatial_eval_qem(qems, e0, e1, target) + lambda_edge_length * length_squared;
float skinny_cost = 0.0f;
int triangle_count = 0;
for (int item = vertex_face_offsets[e0]; item < vertex_face_offsets[e0 + 1]; ++item) {
    if (!mlx_spatial_process_incident(vertex_faces[item], e0, e1, vertices, faces, target, skinny_cost, triangle_count)) {
        costs[edge_id] = INFINITY;
        return;
    }
}
for (int item = vertex_face_offsets[e1]; item < vertex_face_offsets[e1 + 1]; ++item) {
    if (!mlx_spatial_process_incident(vertex_faces[item], e1, e0, vertices, faces, target, skinny_cost, triangle_count)) {
        costs[edge_id] = INFINITY;
        return;
    }
}
if (triangle_count > 0) skinny_cost /= float(triangle_count);
cost += lambda_skinny * skinny_cost * length_squared;
costs[edge_id] = metal::isfinite(cost) ? cost : INFINITY;
"""


QEM_FACE_MIN_SOURCE = r"""
uint face_id = thread_position_in_grid.x;
if (face_id >= uint(face_count)) return;
int3 ids = int3(faces[face_id * 3], faces[face_id * 3 + 1], faces[face_id * 3 + 2]);
float best_cost = INFINITY;
int best_edge = 2147483647;
for (uint corner = 0; corner < 3; ++corner) {
    int vertex_id = corner == 0 ? ids.x : (corner == 1 ? ids.y : ids.z);
    for (int item = vertex_edge_offsets[vertex_id]; item < vertex_edge_offsets[vertex_id + 1]; ++item) {
        int edge_id = vertex_edges[item];
        float cost = costs[edge_id];
        if (cost < best_cost || (cost == best_cost && edge_id < best_edge)) {
            best_cost = cost;
            best_edge = edge_id;
        }
    }
}
face_best_edges[face_id] = best_edge;
"""


QEM_EDGE_SELECT_SOURCE = r"""
uint edge_id = thread_position_in_grid.x;
if (edge_id >= uint(edge_count)) return;
float cost = costs[edge_id];
if (!metal::isfinite(cost) || cost > threshold) {
    selected[edge_id] = 0;
    return;
}
int e0 = edges[edge_id * 2];
int e1 = edges[edge_id * 2 + 1];
for (int item = vertex_face_offsets[e0]; item < vertex_face_offsets[e0 + 1]; ++item) {
    if (face_best_edges[vertex_faces[item]] != int(edge_id)) {
        selected[edge_id] = 0;
        return;
    }
}
for (int item = vertex_face_offsets[e1]; item < vertex_face_offsets[e1 + 1]; ++item) {
    if (face_best_edges[vertex_faces[item]] != int(edge_id)) {
        selected[edge_id] = 0;
        return;
    }
}
selected[edge_id] = 1;
"""




def _qem_mesh():
    """Disjoint components: a 6x5 torus (closed), a 4x4-vertex grid (with boundary), a
    tetrahedron and an octahedron (collapses that break the link condition or duplicate faces);
    vertices jittered, faces consistently oriented."""
    vertices, faces = [], []

    def add(vs, fs, offset):
        base = sum(len(v) for v in vertices)
        vertices.append(np.asarray(vs, dtype=np.float64) + offset)
        faces.append(np.asarray(fs) + base)

    nu, nv = 6, 5
    u, v = np.meshgrid(np.arange(nu) * 2 * np.pi / nu, np.arange(nv) * 2 * np.pi / nv, indexing="ij")
    torus = np.stack([(1 + 0.4 * np.cos(v)) * np.cos(u), (1 + 0.4 * np.cos(v)) * np.sin(u),
                      0.4 * np.sin(v)], -1).reshape(-1, 3)
    quads = [(i * nv + j, ((i + 1) % nu) * nv + j, ((i + 1) % nu) * nv + (j + 1) % nv,
              i * nv + (j + 1) % nv) for i in range(nu) for j in range(nv)]
    add(torus, [f for a, b, c, d in quads for f in ((a, b, c), (a, c, d))], 0)
    g = 4
    grid = [(x * 0.5, y * 0.5, 0.0) for x in range(g) for y in range(g)]
    cells = [(x * g + y, (x + 1) * g + y, (x + 1) * g + y + 1, x * g + y + 1)
             for x in range(g - 1) for y in range(g - 1)]
    add(grid, [f for a, b, c, d in cells for f in ((a, b, c), (a, c, d))], (3.0, 0, 0))
    add([(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)], [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)],
        (0, 3.0, 0))
    octa = [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]
    add(octa, [(0, 2, 4), (2, 1, 4), (1, 3, 4), (3, 0, 4), (2, 0, 5), (1, 2, 5), (3, 1, 5), (0, 3, 5)],
        (3.0, 3.0, 0))
    vertices = np.concatenate(vertices)
    vertices += np.random.randn(*vertices.shape) * 0.01
    return vertices.astype(np.float32), np.concatenate(faces).astype(np.int32)


def _qem_topology(vertex_count, faces):
    """mlx_qem.py's _build_topology_numpy: unique edges sorted by (low, high), faces per edge,
    boundary vertices, and vertex -> face / vertex -> edge CSR lists (in item order)."""
    left, right = faces.reshape(-1), faces[:, [1, 2, 0]].reshape(-1)
    keys = np.minimum(left, right).astype(np.int64) << 32 | np.maximum(left, right)
    unique, counts = np.unique(keys, return_counts=True)
    edges = np.stack([unique >> 32, unique & 0xFFFFFFFF], 1).astype(np.int32)
    boundary = np.zeros(vertex_count, dtype=np.uint8)
    boundary[edges[counts != 2].reshape(-1)] = 1

    def csr(ids, items):
        order = np.argsort(ids, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=vertex_count))])
        return offsets.astype(np.int32), items[order].astype(np.int32)

    vf = csr(faces.reshape(-1), np.repeat(np.arange(len(faces)), 3))
    ve = csr(edges.reshape(-1), np.repeat(np.arange(len(edges)), 2))
    return edges, counts.astype(np.int32), boundary, vf, ve


def _qem_ref_plane_quadrics(vertices, faces, vf):
    v = vertices.astype(np.float64)
    q = np.zeros((len(v), 10))
    for vertex in range(len(v)):
        for face in vf[1][vf[0][vertex]:vf[0][vertex + 1]]:
            a, b, c = v[faces[face]]
            normal = np.cross(b - a, c - a)
            length = np.linalg.norm(normal)
            if length <= 1e-18:
                continue
            p = np.append(normal / length, -normal @ a / length)
            q[vertex] += np.outer(p, p)[np.triu_indices(4)]
    return q


def test_mlx_spatial_qem_vertex_quadrics(device):
    """appautomaton/mlx-spatial, src/mlx_spatial/spatialkit/mlx_qem.py: per-vertex quadric error
    matrices (upper triangle of the sum of p p^T over incident face planes); a Python int input."""
    vertices, faces = _qem_mesh()
    edges, counts, boundary, vf, ve = _qem_topology(len(vertices), faces)
    kernel = kk.metal_kernel(
        name="mlx_spatial_vertex_qem",
        input_names=["vertices", "faces", "vertex_face_offsets", "vertex_faces", "vertex_count"],
        output_names=["qems"], source=QEM_VERTEX_QEM_SOURCE, ensure_row_contiguous=True)
    qems = launch(kernel, device,
                  inputs=[*on(device, *map(torch.from_numpy, (vertices, faces, *vf))),
                          int(vertices.shape[0])],
                  grid=(int(vertices.shape[0]), 1, 1), threadgroup=(256, 1, 1),
                  output_shapes=[(int(vertices.shape[0]), 10)], output_dtypes=[torch.float32])[0]
    close(qems, torch.from_numpy(_qem_ref_plane_quadrics(vertices, faces, vf)), rtol=1e-4, atol=1e-5)


def _qem_ref_topology_valid(faces, edges, counts, boundary, vf):
    """The collapse contract: an interior two-manifold edge, off the boundary, whose endpoints
    share exactly the two opposite vertices, and whose collapse duplicates no face."""
    faces_of = [set(vf[1][vf[0][v]:vf[0][v + 1]]) for v in range(len(boundary))]
    neighbours = [set() for _ in boundary]
    for a, b in edges:
        neighbours[a].add(b)
        neighbours[b].add(a)
    valid = np.zeros(len(edges), dtype=np.uint8)
    for e, (e0, e1) in enumerate(edges):
        if counts[e] != 2 or boundary[e0] or boundary[e1]:
            continue
        shared = faces_of[e0] & faces_of[e1]
        opposite = {v for f in shared for v in faces[f]} - {e0, e1}
        if len(shared) != 2 or len(opposite) != 2:
            continue
        if (neighbours[e0] - {e1}) & (neighbours[e1] - {e0}) != opposite:
            continue
        rest0 = {frozenset(set(faces[f]) - {e0}) for f in faces_of[e0] - shared}
        rest1 = {frozenset(set(faces[f]) - {e1}) for f in faces_of[e1] - shared}
        valid[e] = not (rest0 & rest1)
    return valid


def test_mlx_spatial_qem_edge_topology_guard(device):
    """appautomaton/mlx-spatial, src/mlx_spatial/spatialkit/mlx_qem.py: which edges may collapse
    without breaking the manifold (header helpers returning int2; uint8 inputs and output)."""
    vertices, faces = _qem_mesh()
    edges, counts, boundary, vf, ve = _qem_topology(len(vertices), faces)
    kernel = kk.metal_kernel(
        name="mlx_spatial_edge_topology_guard",
        input_names=["faces", "edges", "edge_face_counts", "boundary_vertices", "vertex_face_offsets",
                     "vertex_faces", "vertex_edge_offsets", "vertex_edges", "edge_count",
                     "preserve_manifold"],
        output_names=["topology_valid"], header=QEM_EDGE_TOPOLOGY_HEADER,
        source=QEM_EDGE_TOPOLOGY_SOURCE, ensure_row_contiguous=True)
    expected = _qem_ref_topology_valid(faces, edges, counts, boundary, vf)
    assert 0 < expected.sum() < len(edges)
    for preserve in (1, 0):
        valid = launch(kernel, device,
                       inputs=[*on(device, *map(torch.from_numpy, (faces, edges, counts, boundary,
                                                                   *vf, *ve))),
                               int(edges.shape[0]), preserve],
                       grid=(int(edges.shape[0]), 1, 1), threadgroup=(256, 1, 1),
                       output_shapes=[(int(edges.shape[0]),)], output_dtypes=[torch.uint8])[0]
        assert valid.cpu().numpy().tolist() == (expected if preserve else np.ones_like(expected)).tolist()


def _qem_ref_edge_costs(vertices, faces, edges, boundary, valid, qems, vf, lam_len, lam_skinny):
    v = vertices.astype(np.float64)
    q = qems.astype(np.float64)
    iu = np.triu_indices(4)
    costs = np.full(len(edges), np.inf)
    for e, (e0, e1) in enumerate(edges):
        if not valid[e]:
            continue
        b0, b1 = boundary[e0] != 0, boundary[e1] != 0
        w0 = 1.0 if b0 and not b1 else (0.0 if b1 and not b0 else 0.5)
        target = v[e0] * w0 + v[e1] * (1 - w0)
        Q = np.zeros((4, 4))
        Q[iu] = q[e0] + q[e1]
        Q = Q + Q.T - np.diag(np.diag(Q))
        p = np.append(target, 1.0)
        length2 = ((v[e1] - v[e0]) ** 2).sum()
        cost = p @ Q @ p + lam_len * length2
        skinny, count, ok = 0.0, 0, True
        for keep, other in ((e0, e1), (e1, e0)):
            for f in vf[1][vf[0][keep]:vf[0][keep + 1]]:
                ids = faces[f]
                if other in ids:
                    continue
                old = v[ids]
                new = np.where((ids == keep)[:, None], target, old)
                n_old = np.cross(old[1] - old[0], old[2] - old[0])
                n_new = np.cross(new[1] - new[0], new[2] - new[0])
                a_old, a_new = np.linalg.norm(n_old), np.linalg.norm(n_new)
                if a_old <= 1e-12 or a_new <= 1e-12 or n_old @ n_new / (a_old * a_new) <= 0.2:
                    ok = False
                    continue
                denominator = max(((new[2] - new[1]) ** 2).sum() + ((new[1] - new[0]) ** 2).sum()
                                  + ((new[2] - new[0]) ** 2).sum(), 1e-12)
                shape = 4 * math.sqrt(3) * 0.5 * a_new / denominator
                if shape < 1e-4:
                    ok = False
                    continue
                skinny += 1 - min(max(shape, 0.0), 1.0)
                count += 1
        if ok:
            costs[e] = cost + lam_skinny * (skinny / count if count else 0.0) * length2
    return costs


def test_mlx_spatial_qem_edge_costs(device):
    """appautomaton/mlx-spatial, src/mlx_spatial/spatialkit/mlx_qem.py: collapse cost (summed
    quadric at the target, edge length and skinny-triangle terms; INFINITY for guarded edges or
    flipped/degenerate triangles), header helpers taking `thread float&` out-parameters; Python
    int and float inputs."""
    vertices, faces = _qem_mesh()
    edges, counts, boundary, vf, ve = _qem_topology(len(vertices), faces)
    valid = _qem_ref_topology_valid(faces, edges, counts, boundary, vf)
    valid[np.random.rand(len(valid)) < 0.2] = 1  # let some guarded edges through to the cost
    qems = _qem_ref_plane_quadrics(vertices, faces, vf).astype(np.float32)
    lam_len, lam_skinny = 1.0e-2, 1.0e-3
    kernel = kk.metal_kernel(
        name="mlx_spatial_edge_qem_cost",
        input_names=["vertices", "faces", "edges", "boundary_vertices", "topology_valid", "qems",
                     "vertex_face_offsets", "vertex_faces", "edge_count", "lambda_edge_length",
                     "lambda_skinny"],
        output_names=["costs"], header=QEM_EDGE_COST_HEADER, source=QEM_EDGE_COST_SOURCE,
        ensure_row_contiguous=True)
    costs = launch(kernel, device,
                   inputs=[*on(device, *map(torch.from_numpy, (vertices, faces, edges, boundary, valid,
                                                               qems, *vf))),
                           int(edges.shape[0]), float(lam_len), float(lam_skinny)],
                   grid=(int(edges.shape[0]), 1, 1), threadgroup=(256, 1, 1),
                   output_shapes=[(int(edges.shape[0]),)], output_dtypes=[torch.float32])[0]
    expected = _qem_ref_edge_costs(vertices, faces, edges, boundary, valid, qems, vf, lam_len, lam_skinny)
    got = costs.cpu().double().numpy()
    assert np.isfinite(expected).sum() > 10
    assert (np.isinf(got) == np.isinf(expected)).all()
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-3, atol=1e-5)


def test_mlx_spatial_qem_local_minimum_selection(device):
    """appautomaton/mlx-spatial, src/mlx_spatial/spatialkit/mlx_qem.py: each face's cheapest edge
    among its vertices' edges (ties to the lower id, INFINITY included), then the edges that are
    the choice of every face around both endpoints and within the threshold."""
    vertices, faces = _qem_mesh()
    edges, counts, boundary, vf, ve = _qem_topology(len(vertices), faces)
    costs = (np.random.randint(0, 6, len(edges)) / 4).astype(np.float32)
    costs[costs > 1] = np.inf  # ties and infinities
    face_min = kk.metal_kernel(
        name="mlx_spatial_face_local_min_edge",
        input_names=["faces", "vertex_edge_offsets", "vertex_edges", "costs", "face_count"],
        output_names=["face_best_edges"], source=QEM_FACE_MIN_SOURCE, ensure_row_contiguous=True)
    select = kk.metal_kernel(
        name="mlx_spatial_select_conflict_free_edges",
        input_names=["edge_count", "edges", "costs", "vertex_face_offsets", "vertex_faces",
                     "face_best_edges", "threshold"],
        output_names=["selected"], source=QEM_EDGE_SELECT_SOURCE, ensure_row_contiguous=True)
    faces_t, edges_t, costs_t = on(device, *map(torch.from_numpy, (faces, edges, costs)))
    face_best = launch(face_min, device,
                       inputs=[faces_t, *on(device, *map(torch.from_numpy, ve)), costs_t,
                               int(faces.shape[0])],
                       grid=(int(faces.shape[0]), 1, 1), threadgroup=(256, 1, 1),
                       output_shapes=[(int(faces.shape[0]),)], output_dtypes=[torch.int32])[0]
    expected_best = np.array([
        min((costs[e], e) for v in face for e in ve[1][ve[0][v]:ve[0][v + 1]])[1] for face in faces])
    assert face_best.cpu().numpy().tolist() == expected_best.tolist()
    threshold = 0.6
    selected = launch(select, device,
                      inputs=[edges.shape[0], edges_t, costs_t,
                              *on(device, *map(torch.from_numpy, vf)), face_best, threshold],
                      grid=(int(edges.shape[0]), 1, 1), threadgroup=(256, 1, 1),
                      output_shapes=[(int(edges.shape[0]),)], output_dtypes=[torch.uint8])[0]
    expected = [int(np.isfinite(costs[e]) and costs[e] <= threshold and all(
        expected_best[f] == e for v in edge for f in vf[1][vf[0][v]:vf[0][v + 1]]))
        for e, edge in enumerate(edges)]
    assert sum(expected) > 0
    assert selected.cpu().numpy().tolist() == expected
