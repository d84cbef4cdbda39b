"""A fourth sweep of custom Metal kernels from public MLX projects, run as their authors wrote them.

As in test_real_world_kernels_2.py and _3.py: each kernel's source and header strings are copied
verbatim from the repository (and, where named, the commit) its docstring gives; where the project
generates them in Python, its generator is copied, mx.fast.metal_kernel becoming kk.metal_kernel
and its Metal-availability guards dropped. The Python around them is translated from mx to torch,
keeping every grid, threadgroup and template argument as written. Inputs are fresh random tensors
made on `device`; every reference is computed on the CPU in float64 (or exactly, for integers) from
the kernel's documented intent.
"""

import math
from typing import Any

import pytest
import torch

import kernelkit as kk


def launch(kernel, device, **call):
    """`kernel(**call)` on `device` (conftest compiles each variant for sm_90 too, without a GPU)."""
    return kernel(stream=device, **call)


def close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol)


def on(device, *tensors):
    return [t.to(device) for t in tensors]


# --- ml-explore/mlx-lm: mlx_lm/models/gated_delta.py -------------------------------------------

def _make_gated_delta_kernel(has_mask=False, vectorized=False):
    mask_source = "mask[b_idx * T + t]" if has_mask else "true"

    # Configure g indexing based on whether gating is vectorized
    if vectorized:
        g_comment = "// g: [B, T, Hv, Dk]"
        g_setup = "auto g_ = g + (b_idx * T * Hv + hv_idx) * Dk;"
        g_access = "g_[s_idx]"
        g_advance = "g_ += Hv * Dk;"
    else:
        g_comment = "// g: [B, T, Hv]"
        g_setup = "auto g_ = g + b_idx * T * Hv;"
        g_access = "g_[hv_idx]"
        g_advance = "g_ += Hv;"

    source = f"""
        auto n = thread_position_in_grid.z;
        auto b_idx = n / Hv;
        auto hv_idx = n % Hv;
        auto hk_idx = hv_idx / (Hv / Hk);
        constexpr int n_per_t = Dk / 32;

        // q, k: [B, T, Hk, Dk]
        auto q_ = q + b_idx * T * Hk * Dk + hk_idx * Dk;
        auto k_ = k + b_idx * T * Hk * Dk + hk_idx * Dk;

        // v, y: [B, T, Hv, Dv]
        auto v_ = v + b_idx * T * Hv * Dv + hv_idx * Dv;
        y += b_idx * T * Hv * Dv + hv_idx * Dv;

        auto dk_idx = thread_position_in_threadgroup.x;
        auto dv_idx = thread_position_in_grid.y;

        // state_in, state_out: [B, Hv, Dv, Dk]
        auto i_state = state_in + (n * Dv + dv_idx) * Dk;
        auto o_state = state_out + (n * Dv + dv_idx) * Dk;

        float state[n_per_t];
        for (int i = 0; i < n_per_t; ++i) {{
          auto s_idx = n_per_t * dk_idx + i;
          state[i] = static_cast<float>(i_state[s_idx]);
        }}

        {g_comment}
        {g_setup}
        auto beta_ = beta + b_idx * T * Hv;

        for (int t = 0; t < T; ++t) {{
          if ({mask_source}) {{
            float kv_mem = 0.0f;
            for (int i = 0; i < n_per_t; ++i) {{
              auto s_idx = n_per_t * dk_idx + i;
              state[i] = state[i] * {g_access};
              kv_mem += state[i] * k_[s_idx];
            }}
            kv_mem = simd_sum(kv_mem);

            auto delta = (v_[dv_idx] - kv_mem) * beta_[hv_idx];

            float out = 0.0f;
            for (int i = 0; i < n_per_t; ++i) {{
              auto s_idx = n_per_t * dk_idx + i;
              state[i] = state[i] + k_[s_idx] * delta;
              out += state[i] * q_[s_idx];
            }}
            out = simd_sum(out);
            if (thread_index_in_simdgroup == 0) {{
              y[dv_idx] = static_cast<InT>(out);
            }}
          }} else {{
            y[dv_idx] = static_cast<InT>(0);
          }}
          // Increment data pointers to next time step
          q_ += Hk * Dk;
          k_ += Hk * Dk;
          v_ += Hv * Dv;
          y += Hv * Dv;
          {g_advance}
          beta_ += Hv;
        }}
        for (int i = 0; i < n_per_t; ++i) {{
          auto s_idx = n_per_t * dk_idx + i;
          o_state[s_idx] = static_cast<StT>(state[i]);
        }}
    """
    inputs = ["q", "k", "v", "g", "beta", "state_in", "T"]
    if has_mask:
        inputs.append("mask")

    suffix = ""
    if vectorized:
        suffix += "_vec"
    if has_mask:
        suffix += "_mask"

    return kk.metal_kernel(
        name=f"gated_delta_step{suffix}",
        input_names=inputs,
        output_names=["y", "state_out"],
        source=source,
    )


def _gated_delta_reference(q, k, v, g, beta, state, mask):
    """gated_delta_ops in float64: per step, decay the state, write v - state.k along k (scaled by
    beta), read it with q; where mask is False the step leaves the state and outputs 0."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    repeat = v.shape[2] // k.shape[2]
    q, k = q.repeat_interleave(repeat, 2), k.repeat_interleave(repeat, 2)
    ys = []
    for t in range(q.shape[1]):
        decay = g[:, t, :, None, None] if g.ndim == 3 else g[:, t, :, None, :]
        new = state * decay
        delta = (v[:, t] - (new * k[:, t, :, None, :]).sum(-1)) * beta[:, t, :, None]
        new = new + k[:, t, :, None, :] * delta[..., None]
        y = (new * q[:, t, :, None, :]).sum(-1)
        if mask is not None:
            y = torch.where(mask[:, t, None, None], y, 0.0)
            new = torch.where(mask[:, t, None, None, None], new, state)
        ys.append(y)
        state = new
    return torch.stack(ys, 1), state


@pytest.mark.parametrize("has_mask,vectorized", [(False, False), (True, True)])
def test_mlx_lm_gated_delta_step(device, has_mask, vectorized):
    """ml-explore/mlx-lm, mlx_lm/models/gated_delta.py: the gated delta rule (Qwen3-Next linear
    attention) over T steps, a 32-lane SIMD group per (batch, value head, value row) holding the
    state row in registers (simd_sum reads); bf16 activations, fp32 state, grouped key heads,
    scalar or per-key (vectorized) gates, and a padding mask. Dv = 22 leaves the last
    threadgroup of 4 rows partial."""
    B, T, Hk, Hv, Dk, Dv = 2, 5, 2, 4, 64, 22
    q = torch.randn(B, T, Hk, Dk).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(B, T, Hk, Dk), dim=-1).bfloat16()
    v = torch.randn(B, T, Hv, Dv).bfloat16()
    g = torch.rand(B, T, Hv, Dk) if vectorized else torch.rand(B, T, Hv)
    beta = torch.rand(B, T, Hv).bfloat16()
    state = torch.randn(B, Hv, Dv, Dk)
    mask = torch.rand(B, T) > 0.3 if has_mask else None
    inputs = on(device, q, k, v, g, beta, state) + [T] + (on(device, mask) if has_mask else [])
    kernel = _make_gated_delta_kernel(has_mask=has_mask, vectorized=vectorized)
    y, state_out = launch(kernel, device, inputs=inputs,
                          template=[("InT", q.dtype), ("StT", state.dtype), ("Dk", Dk), ("Dv", Dv),
                                    ("Hk", Hk), ("Hv", Hv)],
                          grid=(32, Dv, B * Hv), threadgroup=(32, 4, 1),
                          output_shapes=[(B, T, Hv, Dv), state.shape],
                          output_dtypes=[q.dtype, state.dtype])
    y_ref, state_ref = _gated_delta_reference(q, k, v, g, beta, state, mask)
    close(y, y_ref, rtol=1e-2, atol=2e-2)
    close(state_out, state_ref, rtol=1e-4, atol=1e-4)


# --- ml-explore/mlx-lm: mlx_lm/models/ssm.py --------------------------------------------------

def make_ssm_kernel():
    source = """
        auto n = thread_position_in_grid.z;
        auto h_idx = n % H;
        auto g_idx = n / G;
        constexpr int n_per_t = Ds / 32;

        auto x = X + n * Dh;
        out += n * Dh;
        auto i_state = state_in + n * Dh * Ds;
        auto o_state = state_out + n * Dh * Ds;

        // C and B have shape [batch, group, state_dim]
        // C and B need to be offset by group size
        auto C_ = C + g_idx * Ds;
        auto B_ = B + g_idx * Ds;

        auto ds_idx = thread_position_in_threadgroup.x;
        auto d_idx = thread_position_in_grid.y;

        auto dt_ = static_cast<float>(dt[n]);
        auto A = -fast::exp(static_cast<float>(A_log[h_idx]));
        auto dA = fast::exp(A * dt_);

        float acc = 0.0;
        auto x_ = static_cast<float>(x[d_idx]);

        for (int i = 0; i < n_per_t; ++i) {
            auto s_idx = n_per_t * ds_idx + i;
            auto idx = d_idx * Ds + s_idx;
            auto dB_by_x = x_ * dt_ * static_cast<float>(B_[s_idx]);
            auto state = dA * i_state[idx] + dB_by_x;
            o_state[idx] = static_cast<U>(state);
            acc += state * C_[s_idx];
        }
        acc = simd_sum(acc);
        if (thread_index_in_simdgroup == 0) {
            out[d_idx] = static_cast<T>(acc + x_ * D[h_idx]);
        }
    """
    return kk.metal_kernel(
        name="ssm_kernel",
        input_names=["X", "A_log", "B", "C", "D", "dt", "state_in"],
        output_names=["out", "state_out"],
        source=source,
    )


_ssm_kernel = make_ssm_kernel()


def test_mlx_lm_ssm_update(device):
    """ml-explore/mlx-lm, mlx_lm/models/ssm.py: make_ssm_kernel, the Mamba-2 single-token state
    update (fast::exp decay, x dt B written into the fp32 state, simd_sum read-out through C, plus
    the D skip), 8 heads sharing 2 B/C groups; bf16 activations."""
    n, h, d, hb, ds = 2, 8, 12, 2, 64
    x = torch.randn(n, 1, h, d).bfloat16()
    A_log = torch.randn(h) * 0.5
    B, C = torch.randn(2, n, 1, hb, ds).bfloat16()
    D = torch.randn(h)
    dt = torch.rand(n, 1, h) * 0.5 + 0.01  # compute_dt's softplus-and-clip result
    state = torch.randn(n, h, d, ds)
    out, state_out = launch(_ssm_kernel, device, inputs=on(device, x, A_log, B, C, D, dt, state),
                            template=[("T", x.dtype), ("U", state.dtype), ("Dh", d), ("Ds", ds),
                                      ("H", h), ("G", h // hb)],
                            grid=(32, d, h * n), threadgroup=(32, 8, 1),
                            output_shapes=[(n, 1, h, d), state.shape],
                            output_dtypes=[x.dtype, state.dtype])
    group = torch.arange(h) // (h // hb)
    x64, dt64 = x.double()[:, 0], dt.double()[:, 0]                         # (n, h, d), (n, h)
    Bg, Cg = B.double()[:, 0, group], C.double()[:, 0, group]                # (n, h, ds)
    dA = torch.exp(-torch.exp(A_log.double()) * dt64)
    new_state = dA[..., None, None] * state.double() \
        + (x64 * dt64[..., None])[..., None] * Bg[:, :, None, :]
    y = (new_state * Cg[:, :, None, :]).sum(-1) + x64 * D.double()[:, None]
    close(state_out, new_state, rtol=1e-4, atol=1e-4)
    close(out[:, 0], y, rtol=1e-2, atol=2e-2)


# --- ml-explore/mlx-lm: mlx_lm/models/rwkv7.py -------------------------------------------------

def _make_wkv7_kernel():
    source = f"""
        auto n = thread_position_in_grid.z;
        auto b_idx = n / H;
        auto h_idx = n % H;
        constexpr int n_per_t = D / 32;

        // [B, T, H, D]
        auto r_ = r + b_idx * T * H * D + h_idx * D;
        auto w_ = w + b_idx * T * H * D + h_idx * D;
        auto k_ = k + b_idx * T * H * D + h_idx * D;
        auto v_ = v + b_idx * T * H * D + h_idx * D;
        auto a_ = a + b_idx * T * H * D + h_idx * D;
        auto b_ = b + b_idx * T * H * D + h_idx * D;
        y += b_idx * T * H * D + h_idx * D;

        auto dk_idx = thread_position_in_threadgroup.x;
        auto dv_idx = thread_position_in_grid.y;

        // state_in, state_out: [B, H, D, D]
        auto i_state = state_in  + (n * D + dv_idx) * D;
        auto o_state = state_out + (n * D + dv_idx) * D;

        float state[n_per_t];
        for (int i = 0; i < n_per_t; ++i) {{
          auto s_idx = n_per_t * dk_idx + i;
          state[i] = static_cast<float>(i_state[s_idx]);
        }}

        for (int t = 0; t < T; ++t) {{
          float sa = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {{
            auto s_idx = n_per_t * dk_idx + i;
            sa += state[i] * a_[s_idx];
            state[i] = state[i] * w_[s_idx];
          }}
          sa = simd_sum(sa);

          float out = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {{
            auto s_idx = n_per_t * dk_idx + i;
            state[i] = state[i] + k_[s_idx] * v_[dv_idx] + sa * b_[s_idx];
            out += state[i] * r_[s_idx];
          }}
          out = simd_sum(out);
          if (thread_index_in_simdgroup == 0) {{
            y[dv_idx] = static_cast<InT>(out);
          }}

          // Increment data pointers to next time step
          r_ += H * D;
          w_ += H * D;
          k_ += H * D;
          v_ += H * D;
          a_ += H * D;
          b_ += H * D;
          y  += H * D;
        }}
        for (int i = 0; i < n_per_t; ++i) {{
          auto s_idx = n_per_t * dk_idx + i;
          o_state[s_idx] = static_cast<InT>(state[i]);
        }}
    """
    inputs = ["r", "w", "k", "v", "a", "b", "state_in", "T"]
    return kk.metal_kernel(
        name="wkv7_kernel",
        input_names=inputs,
        output_names=["y", "state_out"],
        source=source,
    )


_wkv7_kernel = _make_wkv7_kernel()


def test_mlx_lm_wkv7(device):
    """ml-explore/mlx-lm, mlx_lm/models/rwkv7.py: the RWKV-7 state recurrence over T steps
    (state = state * w + v k^T + (state a) b^T, y = state r), one SIMD group per state row with
    simd_sum reads; half inputs, and the state stored back as half."""
    B, T, H, D = 2, 6, 2, 64
    r, k, v = (torch.randn(3, B, T, H, D) * 0.5).half()
    w = (torch.rand(B, T, H, D) * 0.5 + 0.5).half()
    kk_ = torch.nn.functional.normalize(torch.randn(B, T, H, D), dim=-1)
    a, b = (-kk_).half(), (kk_ * torch.rand(B, T, H, D)).half()
    state = (torch.randn(B, H, D, D) * 0.1).half()
    y, state_out = launch(_wkv7_kernel, device, inputs=on(device, r, w, k, v, a, b, state) + [T],
                          template=[("InT", r.dtype), ("H", H), ("D", D)],
                          grid=(32, D, B * H), threadgroup=(32, 4, 1),
                          output_shapes=[(B, T, H, D), state.shape],
                          output_dtypes=[r.dtype, r.dtype])
    r, w, k, v, a, b, s = (t.double() for t in (r, w, k, v, a, b, state))
    ys = []
    for t in range(T):  # _wkv7_step_ops
        sab = (s @ a[:, t, ..., None]) @ b[:, t, :, None, :]
        s = s * w[:, t, :, None, :] + v[:, t, ..., None] @ k[:, t, :, None, :] + sab
        ys.append((s @ r[:, t, ..., None])[..., 0])
    close(y, torch.stack(ys, 1), rtol=5e-3, atol=5e-3)
    close(state_out, s, rtol=5e-3, atol=5e-3)


# --- ml-explore/mlx-lm: mlx_lm/models/bitlinear_layers.py --------------------------------------

def make_bitlinear_kernel():
    """
    Custom Metal kernel that performs matrix multiplication directly on
    packed weights and scales the output. This eliminates the need to
    store unpacked weights in memory.
    """
    source = """
    constexpr int M = 4;
    constexpr int BLOCK = 32;

    uint tid = thread_position_in_grid.y;
    uint in_offset = thread_position_in_grid.x;

    uint batch_idx = tid / (out_features / 4);
    uint row_idx = tid % (out_features / 4);

    float sum[4] = {0.0};

    for (uint i = in_offset * M; i < in_features; i += BLOCK * M) {
        float v[M];
        for (int j=0; j<M; j++) {
            v[j] = x[batch_idx * in_features + i + j];
        }

        for (int j=0; j<M; j++) {
            uint8_t w = packed_weights[row_idx * in_features + i + j];
            sum[0] += v[j] * ((w & 3) - 1);
            sum[1] += v[j] * (((w >> 2) & 3) - 1);
            sum[2] += v[j] * (((w >> 4) & 3) - 1);
            sum[3] += v[j] * (((w >> 6) & 3) - 1);
        }
    }

    for (int j=0; j<4; j++) {
        sum[j] = simd_sum(sum[j]);
    }

    // Apply weight scaling by diving them or multiplying them
    if (in_offset == 0) {
        float scale = invert_weight_scales ? 1 / weight_scale[0] : weight_scale[0];
        for (int i=0; i<4; i++) {
            out[batch_idx * out_features + row_idx + i * (out_features/4)] = static_cast<T>(sum[i] * scale);
        }
    }
    """

    return kk.metal_kernel(
        name="bitlinear_matmul",
        input_names=["x", "packed_weights", "weight_scale"],
        output_names=["out"],
        source=source,
    )


_bitlinear_kernel = make_bitlinear_kernel()


@pytest.mark.parametrize("dtype,invert", [(torch.float32, False), (torch.bfloat16, True)])
def test_mlx_lm_bitlinear_matmul(device, dtype, invert):
    """ml-explore/mlx-lm, mlx_lm/models/bitlinear_layers.py: BitNet's ternary matmul on packed
    weights: four 2-bit codes per byte (row r of W in byte row r % (out/4), bits 2 (r / (out/4))),
    32 lanes striding over in_features four at a time, simd_sum, then the weight scale (divided
    by, for autobitlinear checkpoints). in_features a multiple of 4: the original reads x four at a
    time from any start, past the row otherwise."""
    batch, in_features, out_features = 3, 200, 24
    codes = torch.randint(0, 3, (out_features, in_features))       # ternary weight + 1
    quarter = out_features // 4
    packed = sum(codes[i * quarter:(i + 1) * quarter] << (2 * i) for i in range(4)).to(torch.uint8)
    x = torch.randn(batch, in_features).to(dtype)
    weight_scale = torch.tensor([0.37]).to(dtype)
    out = launch(_bitlinear_kernel, device, inputs=on(device, x, packed, weight_scale),
                 template=[("T", dtype), ("invert_weight_scales", invert),
                           ("in_features", in_features), ("out_features", out_features)],
                 grid=(32, batch * out_features // 4, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(batch, out_features)], output_dtypes=[dtype])[0]
    scale = weight_scale.double()[0]
    expected = x.double() @ (codes.double() - 1).T * (1 / scale if invert else scale)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    close(out, expected, rtol=tol, atol=tol)


# --- ml-explore/mlx-lm: mlx_lm/tuner/losses.py -------------------------------------------------

def _make_kl_forward_kernel():
    source = """
    constexpr int M = 4;
    constexpr int block = 1024 * M;
    constexpr int full_blocks = V / block;
    constexpr int extra = V - full_blocks * block;

    threadgroup float shared[32 * 2];

    uint out_idx = threadgroup_position_in_grid.y;
    uint simd_lane_id = thread_index_in_simdgroup;
    uint simd_group_id = simdgroup_index_in_threadgroup;

    logits_q += out_idx * V;
    logits_p += out_idx * V;
    out += out_idx;

    float lse_q_minus_p;
    float lse_p;

    {
        float max_q = -1e30;
        float max_p = -1e30;
        float sum_exp_q = 0;
        float sum_exp_p = 0;

        int offset = thread_index_in_threadgroup * M;
        for (int i = 0; i < full_blocks; i++) {
            // Read and update q and p
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = logits_q[offset + j];
                vals_p[j] = logits_p[offset + j];
            }
            float prev_max_q = max_q;
            float prev_max_p = max_p;
            for (int j=0; j<M; j++) {
                max_q = max(max_q, vals_q[j]);
                max_p = max(max_p, vals_p[j]);
            }
            sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
            sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
            for (int j=0; j<M; j++) {
                sum_exp_q += metal::fast::exp(vals_q[j] - max_q);
                sum_exp_p += metal::fast::exp(vals_p[j] - max_p);
            }

            // Move to the next block
            offset += block;
        }
        if (extra > 0) {
            // Read and update q and p
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j < M; j++) {
                vals_q[j] = (offset + j < V) ? logits_q[offset + j] : -1e30;
                vals_p[j] = (offset + j < V) ? logits_p[offset + j] : -1e30;
            }
            float prev_max_q = max_q;
            float prev_max_p = max_p;
            for (int j=0; j<M; j++) {
                max_q = max(max_q, vals_q[j]);
                max_p = max(max_p, vals_p[j]);
            }
            sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
            sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
            for (int j=0; j<M; j++) {
                sum_exp_q += metal::fast::exp(vals_q[j] - max_q);
                sum_exp_p += metal::fast::exp(vals_p[j] - max_p);
            }
        }

        // Share the maxs across the threadgroup
        float prev_max_q = max_q;
        float prev_max_p = max_p;
        max_q = simd_max(max_q);
        max_p = simd_max(max_p);
        if (simd_lane_id == 0) {
            shared[simd_group_id * 2 + 0] = max_q;
            shared[simd_group_id * 2 + 1] = max_p;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        max_q = shared[simd_lane_id * 2 + 0];
        max_p = shared[simd_lane_id * 2 + 1];
        max_q = simd_max(max_q);
        max_p = simd_max(max_p);

        // Share the sum_exp across the threadgroup
        sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
        sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
        sum_exp_q = simd_sum(sum_exp_q);
        sum_exp_p = simd_sum(sum_exp_p);
        if (simd_lane_id == 0) {
            shared[simd_group_id * 2 + 0] = sum_exp_q;
            shared[simd_group_id * 2 + 1] = sum_exp_p;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        sum_exp_q = shared[simd_lane_id * 2 + 0];
        sum_exp_p = shared[simd_lane_id * 2 + 1];
        sum_exp_q = simd_sum(sum_exp_q);
        sum_exp_p = simd_sum(sum_exp_p);

        lse_p = max_p + metal::fast::log(sum_exp_p);
        lse_q_minus_p = max_q + metal::fast::log(sum_exp_q) - lse_p;
    }

    threadgroup_barrier(mem_flags::mem_none);

    {
        float kl = 0;

        int offset = thread_index_in_threadgroup * M;
        for (int i = 0; i < full_blocks; i++) {
            // Read and add to the kl
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = logits_q[offset + j];
                vals_p[j] = logits_p[offset + j];
            }

            for (int j=0; j<M; j++) {
                kl += metal::fast::exp(vals_p[j] - lse_p) * (vals_p[j] - vals_q[j] + lse_q_minus_p);
            }

            // Move to the next block
            offset += block;
        }
        if (extra > 0) {
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = (offset + j < V) ? logits_q[offset + j] : -1e30;
                vals_p[j] = (offset + j < V) ? logits_p[offset + j] : -1e30;
            }

            for (int j=0; j<M; j++) {
                kl += metal::fast::exp(vals_p[j] - lse_p) * (vals_p[j] - vals_q[j] + lse_q_minus_p);
            }
        }

        // Add the kl across the threadgroup
        kl = simd_sum(kl);
        if (simd_lane_id == 0) {
            shared[simd_group_id] = kl;
        }
        threadgroup_barrier(mem_flags::mem_none);
        kl = shared[simd_lane_id];
        kl = simd_sum(kl);

        if (thread_index_in_threadgroup == 0) {
            out[0] = static_cast<T>(kl);
        }
    }
    """

    return kk.metal_kernel(
        name="kl_forward",
        input_names=["logits_q", "logits_p"],
        output_names=["out"],
        source=source,
        ensure_row_contiguous=True,
    )


def _make_kl_backward_kernel():
    source = """
    constexpr int M = 4;
    constexpr int block = 1024 * M;
    constexpr int full_blocks = V / block;
    constexpr int extra = V - full_blocks * block;

    threadgroup float shared[32 * 2];

    uint out_idx = threadgroup_position_in_grid.y;
    uint simd_lane_id = thread_index_in_simdgroup;
    uint simd_group_id = simdgroup_index_in_threadgroup;

    logits_q += out_idx * V;
    logits_p += out_idx * V;
    out += out_idx * V;
    cotan += out_idx;

    float lse_q;
    float lse_p;

    {
        float max_q = -1e30;
        float max_p = -1e30;
        float sum_exp_q = 0;
        float sum_exp_p = 0;

        int offset = thread_index_in_threadgroup * M;
        for (int i = 0; i < full_blocks; i++) {
            // Read and update q and p
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = logits_q[offset + j];
                vals_p[j] = logits_p[offset + j];
            }
            float prev_max_q = max_q;
            float prev_max_p = max_p;
            for (int j=0; j<M; j++) {
                max_q = max(max_q, vals_q[j]);
                max_p = max(max_p, vals_p[j]);
            }
            sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
            sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
            for (int j=0; j<M; j++) {
                sum_exp_q += metal::fast::exp(vals_q[j] - max_q);
                sum_exp_p += metal::fast::exp(vals_p[j] - max_p);
            }

            // Move to the next block
            offset += block;
        }
        if (extra > 0) {
            // Read and update q and p
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j < M; j++) {
                vals_q[j] = (offset + j < V) ? logits_q[offset + j] : -1e30;
                vals_p[j] = (offset + j < V) ? logits_p[offset + j] : -1e30;
            }
            float prev_max_q = max_q;
            float prev_max_p = max_p;
            for (int j=0; j<M; j++) {
                max_q = max(max_q, vals_q[j]);
                max_p = max(max_p, vals_p[j]);
            }
            sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
            sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
            for (int j=0; j<M; j++) {
                sum_exp_q += metal::fast::exp(vals_q[j] - max_q);
                sum_exp_p += metal::fast::exp(vals_p[j] - max_p);
            }
        }

        // Share the maxs across the threadgroup
        float prev_max_q = max_q;
        float prev_max_p = max_p;
        max_q = simd_max(max_q);
        max_p = simd_max(max_p);
        if (simd_lane_id == 0) {
            shared[simd_group_id * 2 + 0] = max_q;
            shared[simd_group_id * 2 + 1] = max_p;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        max_q = shared[simd_lane_id * 2 + 0];
        max_p = shared[simd_lane_id * 2 + 1];
        max_q = simd_max(max_q);
        max_p = simd_max(max_p);

        // Share the sum_exp across the threadgroup
        sum_exp_q *= metal::fast::exp(prev_max_q - max_q);
        sum_exp_p *= metal::fast::exp(prev_max_p - max_p);
        sum_exp_q = simd_sum(sum_exp_q);
        sum_exp_p = simd_sum(sum_exp_p);
        if (simd_lane_id == 0) {
            shared[simd_group_id * 2 + 0] = sum_exp_q;
            shared[simd_group_id * 2 + 1] = sum_exp_p;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        sum_exp_q = shared[simd_lane_id * 2 + 0];
        sum_exp_p = shared[simd_lane_id * 2 + 1];
        sum_exp_q = simd_sum(sum_exp_q);
        sum_exp_p = simd_sum(sum_exp_p);

        lse_p = max_p + metal::fast::log(sum_exp_p);
        lse_q = max_q + metal::fast::log(sum_exp_q);
    }

    threadgroup_barrier(mem_flags::mem_none);

    {
        float kl = 0;
        float c = cotan[0];

        int offset = thread_index_in_threadgroup * M;
        for (int i = 0; i < full_blocks; i++) {
            // Read and add to the kl
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = logits_q[offset + j];
                vals_p[j] = logits_p[offset + j];
            }

            for (int j=0; j<M; j++) {
                out[offset + j] = static_cast<T>(
                    c * (metal::fast::exp(vals_q[j] - lse_q) - metal::fast::exp(vals_p[j] - lse_p)));
            }

            // Move to the next block
            offset += block;
        }
        if (extra > 0) {
            float vals_q[M];
            float vals_p[M];
            for (int j=0; j<M; j++) {
                vals_q[j] = (offset + j < V) ? logits_q[offset + j] : -1e30;
                vals_p[j] = (offset + j < V) ? logits_p[offset + j] : -1e30;
            }

            for (int j=0; j<M; j++) {
                if (offset + j < V) {
                    out[offset + j] = static_cast<T>(
                        c * (metal::fast::exp(vals_q[j] - lse_q) - metal::fast::exp(vals_p[j] - lse_p)));
                }
            }
        }
    }
    """

    return kk.metal_kernel(
        name="kl_backward",
        input_names=["logits_q", "logits_p", "cotan"],
        output_names=["out"],
        source=source,
        ensure_row_contiguous=True,
    )


_kl_forward_kernel = _make_kl_forward_kernel()
_kl_backward_kernel = _make_kl_backward_kernel()


def _kl_logits(rows, vocab):
    """Two sets of logits over a vocabulary of 5000: one full 4096-wide block of the 1024-thread
    group (4 per thread) and a partial one that the kernels pad with -1e30."""
    return torch.randn(2, rows, vocab) * 3


def test_mlx_lm_kl_div_forward(device):
    """ml-explore/mlx-lm, mlx_lm/tuner/losses.py: kl_forward, KL(p || q) per row of logits: online
    log-sum-exp of both (metal::fast::exp/log), simd_max/simd_sum across 32 SIMD groups of a
    1024-thread group through threadgroup memory, then the KL sum the same way."""
    rows, vocab = 3, 5000
    logits_q, logits_p = _kl_logits(rows, vocab)
    out = launch(_kl_forward_kernel, device, inputs=on(device, logits_q, logits_p),
                 output_shapes=[(rows,)], output_dtypes=[torch.float32],
                 template=[("T", torch.float32), ("V", vocab)],
                 grid=(1024, rows, 1), threadgroup=(1024, 1, 1))[0]
    log_q = torch.log_softmax(logits_q.double(), -1)
    log_p = torch.log_softmax(logits_p.double(), -1)
    close(out, (log_p.exp() * (log_p - log_q)).sum(-1), rtol=1e-4, atol=1e-4)


def test_mlx_lm_kl_div_backward(device):
    """ml-explore/mlx-lm, mlx_lm/tuner/losses.py: kl_backward, the gradient of KL(p || q) with
    respect to the logits of q: cotangent * (softmax(q) - softmax(p)), bf16 logits (padded as
    `(offset + j < V) ? logits_q[offset + j] : -1e30`, a bfloat and a float meeting at float)."""
    rows, vocab = 2, 5000
    logits_q, logits_p = _kl_logits(rows, vocab).bfloat16()
    cotangent = torch.randn(rows).bfloat16()
    dq = launch(_kl_backward_kernel, device, inputs=on(device, logits_q, logits_p, cotangent),
                output_shapes=[logits_q.shape], output_dtypes=[logits_q.dtype],
                template=[("T", logits_q.dtype), ("V", vocab)],
                grid=(1024, cotangent.numel(), 1), threadgroup=(1024, 1, 1))[0]
    expected = cotangent.double()[:, None] * (torch.softmax(logits_q.double(), -1)
                                              - torch.softmax(logits_p.double(), -1))
    close(dq, expected, rtol=2e-2, atol=1e-4)


# --- ml-explore/mlx-examples: encodec/encodec.py -----------------------------------------------

_lstm_kernel = kk.metal_kernel(
    name="lstm",
    input_names=["x", "h_in", "cell", "hidden_size", "time_step", "num_time_steps"],
    output_names=["hidden_state", "cell_state"],
    header="""
    template <typename T>
    T sigmoid(T x) {
        auto y = 1 / (1 + metal::exp(-metal::abs(x)));
        return (x < 0) ? 1 - y : y;
    }
    """,
    source="""
        uint b = thread_position_in_grid.x;
        uint d = hidden_size * 4;

        uint elem = b * d + thread_position_in_grid.y;
        uint index = elem;
        uint x_index = b * num_time_steps * d + time_step * d + index;

        auto i = sigmoid(h_in[index] + x[x_index]);
        index += hidden_size;
        x_index += hidden_size;
        auto f = sigmoid(h_in[index] + x[x_index]);
        index += hidden_size;
        x_index += hidden_size;
        auto g = metal::precise::tanh(h_in[index] + x[x_index]);
        index += hidden_size;
        x_index += hidden_size;
        auto o = sigmoid(h_in[index] + x[x_index]);

        cell_state[elem] = f * cell[elem] + i * g;
        hidden_state[elem] = o * metal::precise::tanh(cell_state[elem]);
    """,
)


def test_mlx_examples_encodec_lstm_step(device):
    """ml-explore/mlx-examples, encodec/encodec.py: lstm_custom, one LSTM time step (gates i, f, g,
    o from the input projection at time_step plus the hidden projection; a header template
    sigmoid, metal::precise::tanh). Batch 1: for batch b > 0 the original indexes the (B, H) cell
    and outputs at b * 4H + y, past their end."""
    B, T, H, time_step = 1, 4, 40, 2
    x = torch.randn(B, T, 4 * H)           # addmm(bias, x, Wx.T) for every time step
    h_in = torch.randn(B, 4 * H)           # hidden @ Wh.T
    cell = torch.randn(B, H)
    hidden, cell_out = launch(_lstm_kernel, device,
                              inputs=on(device, x, h_in, cell) + [cell.shape[-1], time_step, x.shape[-2]],
                              output_shapes=[cell.shape, cell.shape], output_dtypes=[h_in.dtype] * 2,
                              grid=(x.shape[0], h_in.numel() // 4, 1), threadgroup=(256, 1, 1))
    i, f, g, o = (h_in.double() + x.double()[:, time_step]).chunk(4, -1)
    c = torch.sigmoid(f) * cell.double() + torch.sigmoid(i) * torch.tanh(g)
    close(cell_out, c)
    close(hidden, torch.sigmoid(o) * torch.tanh(c))


# --- svdrecbd/mhc-mlx: mhc_mlx/kernels/*.metal, built by mhc_mlx/metal.py ----------------------
# Kernel bodies kept as .metal files (embedded by mhc_mlx/kernels_embedded.py); metal.py fills
# their {{...}} placeholders (_render_source) and builds them with ensure_row_contiguous=True.

_MAX_TPG_ALLOWED = 1024


def _format_float_literal(value: float) -> str:
    literal = f"{float(value):.8g}"
    if "e" not in literal and "." not in literal:
        literal += ".0"
    return f"{literal}f"


def _render_source(source: str, **replacements: str) -> str:
    for key, value in replacements.items():
        source = source.replace(f"{{{{{key}}}}}", value)
    return source


MHC_FUSED_METAL = r"""
// MLX Metal kernel body (not a full .metal file).
//
// This fuses:
// - stream aggregate + RMSNorm
// - stream mix: out[b,i,c] = sum_j M[i,j] * x[b,j,c]
// - final add: out += H_post[i] * y_norm[b,c]
//
// Expected row-contiguous shapes:
// - x:          [B, n, C] float32
// - M:          [n, n]    float32
// - H_pre:      [n]       float32 (activated)
// - H_post:     [n]       float32 (activated)
// - rms_weight: [C]       float32
// - out:        [B, n, C] OUT_T

typedef {{OUT_T}} OUT_T;

constexpr int MAX_N = {{MAX_N}};
constexpr int MAX_TPG = {{MAX_TPG}};
constexpr float EPS = {{EPS}};

uint lane = thread_position_in_threadgroup.x;
uint tpg = threads_per_threadgroup.x;
uint token = thread_position_in_grid.y;

int n = x_shape[1];
int C = x_shape[2];

threadgroup float P[MAX_N * MAX_N];
threadgroup float Hpre[MAX_N];
threadgroup float Hpost[MAX_N];
threadgroup float reduce_buf[MAX_TPG];

uint mn = (uint)(n * n);
for (uint idx = lane; idx < mn; idx += tpg) {
    P[idx] = M[idx];
}
for (uint idx = lane; idx < uint(n); idx += tpg) {
    Hpre[idx] = H_pre[idx];
    Hpost[idx] = H_post[idx];
}
threadgroup_barrier(mem_flags::mem_threadgroup);

uint base_token = token * uint(n) * uint(C);

float local_sum = 0.0f;
for (uint c = lane; c < uint(C); c += tpg) {
    float y_agg = 0.0f;
    for (int i = 0; i < n; ++i) {
        y_agg += Hpre[i] * float(x[base_token + uint(i) * uint(C) + c]);
    }
    local_sum += y_agg * y_agg;
}
reduce_buf[lane] = local_sum;
threadgroup_barrier(mem_flags::mem_threadgroup);

uint active = tpg;
while (active > 1) {
    uint stride = active / 2;
    if (lane < stride) {
        reduce_buf[lane] += reduce_buf[lane + stride];
    }
    if ((active & 1u) != 0u && lane == 0u) {
        reduce_buf[0] += reduce_buf[active - 1u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    active = stride + (active & 1u);
}

float mean_sq = reduce_buf[0] / float(C);
float inv_rms = metal::rsqrt(mean_sq + EPS);

bool fast_n4 = (n == 4);
if (fast_n4) {
    for (uint c = lane; c < uint(C); c += tpg) {
        float x0 = float(x[base_token + 0u * uint(C) + c]);
        float x1 = float(x[base_token + 1u * uint(C) + c]);
        float x2 = float(x[base_token + 2u * uint(C) + c]);
        float x3 = float(x[base_token + 3u * uint(C) + c]);

        float y_agg = Hpre[0] * x0 + Hpre[1] * x1 + Hpre[2] * x2 + Hpre[3] * x3;
        float y_norm = y_agg * inv_rms * float(rms_weight[c]);

        float acc0 = P[0] * x0 + P[1] * x1 + P[2] * x2 + P[3] * x3;
        float acc1 = P[4] * x0 + P[5] * x1 + P[6] * x2 + P[7] * x3;
        float acc2 = P[8] * x0 + P[9] * x1 + P[10] * x2 + P[11] * x3;
        float acc3 = P[12] * x0 + P[13] * x1 + P[14] * x2 + P[15] * x3;

        out[base_token + 0u * uint(C) + c] = (OUT_T)(acc0 + Hpost[0] * y_norm);
        out[base_token + 1u * uint(C) + c] = (OUT_T)(acc1 + Hpost[1] * y_norm);
        out[base_token + 2u * uint(C) + c] = (OUT_T)(acc2 + Hpost[2] * y_norm);
        out[base_token + 3u * uint(C) + c] = (OUT_T)(acc3 + Hpost[3] * y_norm);
    }
} else if ((C % 4) == 0) {
    // Vectorized path for generic n, aligned C
    for (uint c_vec = lane; c_vec * 4 < uint(C); c_vec += tpg) {
        uint c = c_vec * 4;
        
        // Load x columns into registers as float4
        float4 xvals[MAX_N];
        float4 y_agg_vec = 0.0f;
        
        for (int j = 0; j < n; ++j) {
            float4 xv = float4(*(const device float4*)(x + base_token + uint(j) * uint(C) + c));
            xvals[j] = xv;
            y_agg_vec += Hpre[j] * xv;
        }
        
        float4 w_vec = float4(*(const device float4*)(rms_weight + c));
        float4 y_norm_vec = y_agg_vec * inv_rms * w_vec;
        
        for (int i = 0; i < n; ++i) {
            float4 acc_vec = 0.0f;
            int row = i * n;
            for (int j = 0; j < n; ++j) {
                acc_vec += P[row + j] * xvals[j];
            }
            uint out_idx = base_token + uint(i) * uint(C) + c;
            float4 res = acc_vec + Hpost[i] * y_norm_vec;

            if (sizeof(OUT_T) == 4) {
                *(device float4*)(out + out_idx) = res;
            } else {
                out[out_idx + 0] = (OUT_T)res.x;
                out[out_idx + 1] = (OUT_T)res.y;
                out[out_idx + 2] = (OUT_T)res.z;
                out[out_idx + 3] = (OUT_T)res.w;
            }
        }
    }
} else {
    // Scalar fallback
    for (uint c = lane; c < uint(C); c += tpg) {
        float y_agg = 0.0f;
        float xvals[MAX_N];

        for (int j = 0; j < n; ++j) {
            float xv = float(x[base_token + uint(j) * uint(C) + c]);
            xvals[j] = xv;
            y_agg += Hpre[j] * xv;
        }

        float y_norm = y_agg * inv_rms * float(rms_weight[c]);

        for (int i = 0; i < n; ++i) {
            float acc = 0.0f;
            int row = i * n;
            for (int j = 0; j < n; ++j) {
                acc += P[row + j] * xvals[j];
            }
            uint out_idx = base_token + uint(i) * uint(C) + c;
            out[out_idx] = (OUT_T)(acc + Hpost[i] * y_norm);
        }
    }
}

"""

STREAM_MIX_ADD_RMS_TILE_FP16_METAL = r"""
// MLX Metal kernel body (not a full .metal file).
//
// Half2-tiled stream mix + RMS add for fixed n (TILE_N).
// Computes a [TILE_N x (TILE_C*2)] block of output per threadgroup.
//
// Expected row-contiguous shapes:
// - x:          [B, n, C] float16
// - M:          [n, n]    float32
// - H_post:     [n]       float32
// - y_agg:      [B, C]    float32
// - inv_rms:    [B]       float32
// - rms_weight: [C]       float32
// - out:        [B, n, C] float16

constexpr int TILE_N = {{TILE_N}};
constexpr int TILE_C = {{TILE_C}};

uint lane = thread_position_in_threadgroup.x;
uint tpg = threads_per_threadgroup.x;
uint gid_x = thread_position_in_grid.x;
uint b = thread_position_in_grid.y;

int B = x_shape[0];
int n = x_shape[1];
int C = x_shape[2];

if ((int)b >= B) {
    return;
}

uint tile = gid_x / tpg;
uint c2_offset = lane % TILE_C;
uint i = lane / TILE_C;

if ((int)i >= n) {
    return;
}

uint c2 = tile * (TILE_C * 2u) + c2_offset * 2u;

threadgroup float M_tile[TILE_N * TILE_N];
threadgroup float Hpost[TILE_N];
threadgroup float2 X_tile[TILE_N * TILE_C];

uint mn = uint(n * n);
for (uint idx = lane; idx < mn; idx += tpg) {
    M_tile[idx] = M[idx];
}
if (lane < uint(n)) {
    Hpost[lane] = H_post[lane];
}
threadgroup_barrier(mem_flags::mem_threadgroup);

uint base = uint(b) * uint(n) * uint(C);
uint base_bc = uint(b) * uint(C);

bool has0 = (int)c2 < C;
bool has1 = (int)(c2 + 1u) < C;

float2 xval = float2(0.0f);
if (has0) {
    uint idx = base + uint(i) * uint(C) + c2;
    if (has1) {
        if ((idx & 1u) == 0u) {
            const device packed_half2* x_ptr = (const device packed_half2*)(x + idx);
            half2 xv = half2(*x_ptr);
            xval = float2(float(xv.x), float(xv.y));
        } else {
            xval = float2(float(x[idx]), float(x[idx + 1u]));
        }
    } else {
        xval = float2(float(x[idx]), 0.0f);
    }
}
X_tile[uint(i) * TILE_C + c2_offset] = xval;
threadgroup_barrier(mem_flags::mem_threadgroup);

float2 acc = float2(0.0f);
for (int j = 0; j < n; ++j) {
    acc += M_tile[i * n + j] * X_tile[uint(j) * TILE_C + c2_offset];
}

if (has0) {
    float inv = float(inv_rms[b]);
    float y0 = float(y_agg[base_bc + c2]) * inv * float(rms_weight[c2]);
    float out0 = acc.x + Hpost[i] * y0;
    uint out_idx = base + uint(i) * uint(C) + c2;
    if (has1) {
        float y1 = float(y_agg[base_bc + c2 + 1u]) * inv * float(rms_weight[c2 + 1u]);
        float out1 = acc.y + Hpost[i] * y1;
        device packed_half2* out_ptr = (device packed_half2*)(out + out_idx);
        *out_ptr = packed_half2(half2(half(out0), half(out1)));
    } else {
        out[out_idx] = half(out0);
    }
}

"""


def _mhc_fused_source(max_n: int, eps: float, output_dtype=None) -> str:
    # mhc_mlx/metal.py, its mx dtypes as torch's
    out_t = "float"
    if output_dtype is not None:
        if output_dtype == torch.float16:
            out_t = "half"
        elif output_dtype == torch.bfloat16:
            out_t = "bfloat"

    return _render_source(
        MHC_FUSED_METAL,
        MAX_N=str(int(max_n)),
        MAX_TPG=str(int(_MAX_TPG_ALLOWED)),
        EPS=_format_float_literal(eps),
        OUT_T=out_t,
    )


def suggest_threads_per_group(C: int, max_tpg: int = _MAX_TPG_ALLOWED) -> int:
    # mhc_mlx/metal.py, its argument checks dropped
    tpg = 1 << (int(C) - 1).bit_length()
    if tpg > max_tpg:
        tpg = int(max_tpg)
    return int(tpg)


def _mhc_mix(x, M, H_post, y_norm):
    """out[b, i, c] = sum_j M[i, j] x[b, j, c] + H_post[i] y_norm[b, c], in float64."""
    return torch.einsum("ij,bjc->bic", M.double(), x.double()) + H_post.double()[:, None] * y_norm[:, None]


@pytest.mark.parametrize("n,C,out_dtype", [(3, 64, torch.bfloat16), (4, 30, torch.float32)])
def test_mhc_mlx_fused_forward(device, n, C, out_dtype):
    """svdrecbd/mhc-mlx, mhc_mlx/kernels/mhc_fused.metal (mhc_fully_fused_metal): manifold
    hyper-connections in one threadgroup per token: stream aggregate, RMS over channels (a
    threadgroup tree reduction that folds odd counts), stream mix and the add; the float4 path
    for C % 4 == 0 (bf16 out, x cast to float32 first as the op does) and the unrolled n == 4
    path. Not with half x: its float4 path reads half x through float4 pointers."""
    B, eps = 2, 1e-5
    x = torch.randn(B, n, C).to(out_dtype)
    M = torch.softmax(torch.randn(n, n), -1)
    H_pre, H_post = torch.rand(2, n)
    rms_weight = torch.rand(C) + 0.5
    threads_per_group = suggest_threads_per_group(C)
    x_in = x if x.dtype in (torch.float16, torch.float32) else x.float()  # _maybe_cast_float32
    kernel = kk.metal_kernel(name="mhc_fused", input_names=["x", "M", "H_pre", "H_post", "rms_weight"],
                             output_names=["out"], source=_mhc_fused_source(n, eps, out_dtype),
                             ensure_row_contiguous=True)
    out = launch(kernel, device, inputs=on(device, x_in, M, H_pre, H_post, rms_weight),
                 grid=(threads_per_group, B, 1), threadgroup=(threads_per_group, 1, 1),
                 output_shapes=[x_in.shape], output_dtypes=[out_dtype])[0]
    y_agg = torch.einsum("i,bic->bc", H_pre.double(), x.double())
    y_norm = y_agg * torch.rsqrt((y_agg ** 2).mean(-1, keepdim=True) + eps) * rms_weight.double()
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    close(out, _mhc_mix(x, M, H_post, y_norm), rtol=tol, atol=tol)


def test_mhc_mlx_stream_mix_add_rms_tile_fp16(device):
    """svdrecbd/mhc-mlx, mhc_mlx/kernels/stream_mix_add_rms_tile_fp16.metal (the n = 16, "1d"
    tiling of stream_mix_add_rms_metal): a 16 x 16 block of channel pairs per threadgroup, x read
    as packed_half2 where aligned (halves one by one where not), mixed in threadgroup float2
    tiles, written back as packed_half2. C odd: the last pair is a single channel."""
    B, n, C = 2, 16, 37
    tile_c, tile_channels, tpg = 8, 16, 16 * 8  # _mix_add_rms_tile_config(16, float16)
    x = torch.randn(B, n, C).half()
    M = torch.softmax(torch.randn(n, n), -1)
    H_post = torch.rand(n)
    y_agg = torch.randn(B, C)
    inv_rms = torch.rand(B) + 0.5
    rms_weight = torch.rand(C) + 0.5
    source = _render_source(STREAM_MIX_ADD_RMS_TILE_FP16_METAL, TILE_N=str(n), TILE_C=str(tile_c))
    kernel = kk.metal_kernel(name="stream_mix_add_rms_tile_fp16",
                             input_names=["x", "M", "H_post", "y_agg", "inv_rms", "rms_weight"],
                             output_names=["out"], source=source, ensure_row_contiguous=True)
    out = launch(kernel, device, inputs=on(device, x, M, H_post, y_agg, inv_rms, rms_weight),
                 grid=((C + tile_channels - 1) // tile_channels * tpg, B * n, 1),
                 threadgroup=(tpg, 1, 1), output_shapes=[x.shape], output_dtypes=[torch.float16])[0]
    y_norm = y_agg.double() * inv_rms.double()[:, None] * rms_weight.double()
    close(out, _mhc_mix(x, M, H_post, y_norm), rtol=2e-3, atol=2e-3)


# --- zakkeown/mlx-primitives: mlx_primitives/primitives/_metal/scan_kernels.py ----------------

SCAN_ADD_VECTORIZED_SOURCE = """
        // Threadgroup memory for chunk totals (max 256 chunks = 1024 elements / 4)
        threadgroup float shared[256];

        uint tid = thread_position_in_threadgroup.x;
        uint batch_idx = threadgroup_position_in_grid.y;
        uint simd_lane = thread_index_in_simdgroup;
        uint simd_group = simdgroup_index_in_threadgroup;
        uint block_size = threads_per_threadgroup.x;  // Number of chunks
        uint slen = seq_len[0];
        uint bsize = batch_size[0];
        uint num_chunks = (slen + 3) / 4;

        if (batch_idx >= bsize) return;

        uint base_offset = batch_idx * slen;

        // Each thread handles a chunk of 4 elements
        uint chunk_start = tid * 4;

        // Load 4 elements (handle boundary)
        float4 vals;
        if (chunk_start + 3 < slen) {
            // Full chunk - use vector load
            vals = float4(
                input[base_offset + chunk_start],
                input[base_offset + chunk_start + 1],
                input[base_offset + chunk_start + 2],
                input[base_offset + chunk_start + 3]
            );
        } else {
            // Partial chunk at boundary
            vals.x = (chunk_start < slen) ? input[base_offset + chunk_start] : 0.0f;
            vals.y = (chunk_start + 1 < slen) ? input[base_offset + chunk_start + 1] : 0.0f;
            vals.z = (chunk_start + 2 < slen) ? input[base_offset + chunk_start + 2] : 0.0f;
            vals.w = (chunk_start + 3 < slen) ? input[base_offset + chunk_start + 3] : 0.0f;
        }

        // Local inclusive scan within chunk
        float v0 = vals.x;
        float v1 = v0 + vals.y;
        float v2 = v1 + vals.z;
        float v3 = v2 + vals.w;

        // Store chunk total for inter-chunk scan
        float chunk_total = v3;

        // Phase 1: Intra-warp scan of chunk totals
        float warp_scan = simd_prefix_inclusive_sum(chunk_total);

        // Phase 2: Store warp totals
        uint num_warps = (block_size + 31) / 32;
        if (simd_lane == 31) {
            shared[simd_group] = warp_scan;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Phase 3: Scan warp totals (first warp only)
        if (simd_group == 0 && simd_lane < num_warps) {
            float warp_total = shared[simd_lane];
            float scanned_total = simd_prefix_exclusive_sum(warp_total);
            shared[simd_lane] = scanned_total;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Phase 4: Compute chunk prefix
        float warp_prefix = (simd_group > 0) ? shared[simd_group] : 0.0f;
        float chunk_prefix = warp_scan - chunk_total + warp_prefix;  // Exclusive prefix for this chunk

        // Apply chunk prefix to local results
        v0 += chunk_prefix;
        v1 += chunk_prefix;
        v2 += chunk_prefix;
        v3 += chunk_prefix;

        // Write output
        if (chunk_start < slen) {
            output[base_offset + chunk_start] = v0;
        }
        if (chunk_start + 1 < slen) {
            output[base_offset + chunk_start + 1] = v1;
        }
        if (chunk_start + 2 < slen) {
            output[base_offset + chunk_start + 2] = v2;
        }
        if (chunk_start + 3 < slen) {
            output[base_offset + chunk_start + 3] = v3;
        }
        """

SSM_SCAN_SIMD_SOURCE = """
        // Threadgroup memory for warp totals (max 32 warps * 2 values each)
        threadgroup float shared[64];

        uint tid = thread_position_in_threadgroup.x;
        uint dim_idx = threadgroup_position_in_grid.y;   // 3D grid: y = d_inner
        uint batch_idx = threadgroup_position_in_grid.z; // 3D grid: z = batch
        uint simd_lane = thread_index_in_simdgroup;
        uint simd_group = simdgroup_index_in_threadgroup;
        uint block_size = threads_per_threadgroup.x;
        uint slen = seq_len[0];
        uint dinn = d_inner[0];
        uint bsize = batch_size[0];

        if (batch_idx >= bsize || dim_idx >= dinn) return;

        uint base = batch_idx * slen * dinn + dim_idx;
        uint stride = dinn;

        // Load values
        float A_val = (tid < slen) ? A[base + tid * stride] : 1.0f;
        float h_val = (tid < slen) ? x[base + tid * stride] : 0.0f;

        // Phase 1: Intra-warp SSM scan using shuffle
        float A_scan = A_val;
        float h_scan = h_val;

        for (uint delta = 1; delta < 32; delta *= 2) {
            float A_other = simd_shuffle_up(A_scan, delta);
            float h_other = simd_shuffle_up(h_scan, delta);

            if (simd_lane >= delta) {
                h_scan = A_scan * h_other + h_scan;
                A_scan = A_other * A_scan;
            }
        }

        // Phase 2: Store warp totals
        uint num_warps = (block_size + 31) / 32;
        if (simd_lane == 31) {
            shared[simd_group * 2] = A_scan;
            shared[simd_group * 2 + 1] = h_scan;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Phase 3: Scan warp totals (first warp only)
        float A_prefix = 1.0f;
        float h_prefix = 0.0f;

        if (simd_group == 0 && simd_lane < num_warps) {
            float A_wt = shared[simd_lane * 2];
            float h_wt = shared[simd_lane * 2 + 1];

            float A_scan_wt = A_wt;
            float h_scan_wt = h_wt;

            for (uint delta = 1; delta < 32; delta *= 2) {
                float A_other = simd_shuffle_up(A_scan_wt, delta);
                float h_other = simd_shuffle_up(h_scan_wt, delta);

                if (simd_lane >= delta) {
                    h_scan_wt = A_scan_wt * h_other + h_scan_wt;
                    A_scan_wt = A_other * A_scan_wt;
                }
            }

            // Store exclusive prefix
            float A_exc = simd_shuffle_up(A_scan_wt, 1);
            float h_exc = simd_shuffle_up(h_scan_wt, 1);
            if (simd_lane == 0) {
                A_exc = 1.0f;
                h_exc = 0.0f;
            }

            shared[simd_lane * 2] = A_exc;
            shared[simd_lane * 2 + 1] = h_exc;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Phase 4: Apply warp prefix
        if (simd_group > 0) {
            A_prefix = shared[simd_group * 2];
            h_prefix = shared[simd_group * 2 + 1];
        }

        // Combine: (A_prefix, h_prefix) op (A_scan, h_scan)
        float h_final = A_scan * h_prefix + h_scan;

        // Write output
        if (tid < slen) {
            h[base + tid * stride] = h_final;
        }
        """


def _next_power_of_2(n: int) -> int:
    """Return the smallest power of 2 >= n."""
    if n <= 0:
        return 1
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    return n + 1


def test_mlx_primitives_scan_add_vectorized(device):
    """zakkeown/mlx-primitives, mlx_primitives/primitives/_metal/scan_kernels.py:
    associative_scan_add_vectorized, cumsum over rows of up to 1024: a float4 chunk of 4 per
    thread scanned in registers, chunk totals through simd_prefix_inclusive_sum, SIMD-group totals
    through simd_prefix_exclusive_sum in threadgroup memory (seq_len 301: a partial last chunk,
    76 chunks in a threadgroup of 128, the last SIMD groups partly idle)."""
    batch_size, seq_len = 3, 301
    x = torch.randn(batch_size, seq_len)
    kernel = kk.metal_kernel(name="associative_scan_add_vectorized",
                             input_names=["input", "seq_len", "batch_size"], output_names=["output"],
                             source=SCAN_ADD_VECTORIZED_SOURCE)
    block_size = min(_next_power_of_2((seq_len + 3) // 4), 256)
    out = launch(kernel, device, inputs=on(device, x, torch.tensor([seq_len], dtype=torch.uint32),
                                           torch.tensor([batch_size], dtype=torch.uint32)),
                 grid=(block_size, batch_size, 1), threadgroup=(block_size, 1, 1),
                 output_shapes=[(batch_size, seq_len)], output_dtypes=[torch.float32])[0]
    close(out, x.double().cumsum(-1), rtol=1e-5, atol=1e-4)


def test_mlx_primitives_ssm_scan_diagonal_simd(device):
    """zakkeown/mlx-primitives, mlx_primitives/primitives/_metal/scan_kernels.py:
    ssm_scan_diagonal_simd (metal_ssm_scan), h[t] = A[t] h[t-1] + x[t] along the sequence as a
    parallel scan of (A, h) pairs: Hillis-Steele steps with simd_shuffle_up inside SIMD groups,
    then over the SIMD-group totals in threadgroup memory; one threadgroup per (batch, channel)."""
    batch_size, seq_len, d_inner = 2, 100, 3
    A = torch.rand(batch_size, seq_len, d_inner) * 0.5 + 0.5   # exp(delta * A_diag)
    x = torch.randn(batch_size, seq_len, d_inner) * 0.1
    kernel = kk.metal_kernel(name="ssm_scan_diagonal_simd",
                             input_names=["A", "x", "seq_len", "d_inner", "batch_size"],
                             output_names=["h"], source=SSM_SCAN_SIMD_SOURCE)
    block_size = min(_next_power_of_2(seq_len), 1024)
    sizes = [torch.tensor([v], dtype=torch.uint32) for v in (seq_len, d_inner, batch_size)]
    h = launch(kernel, device, inputs=on(device, A, x, *sizes),
               grid=(block_size, d_inner, batch_size), threadgroup=(block_size, 1, 1),
               output_shapes=[(batch_size, seq_len, d_inner)], output_dtypes=[torch.float32])[0]
    expected, state = [], torch.zeros(batch_size, d_inner, dtype=torch.float64)
    for t in range(seq_len):
        state = A[:, t].double() * state + x[:, t].double()
        expected.append(state)
    close(h, torch.stack(expected, 1), rtol=1e-5, atol=1e-5)


# --- zakkeown/mlx-primitives: mlx_primitives/attention/sliding_window.py -----------------------

ATTENTION_MASK_VALUE = -1e38      # mlx_primitives/constants.py
METAL_SOFTMAX_EPSILON = 1e-6

SLIDING_WINDOW_SOURCE = """
        // Dereference scalar parameters (passed as single-element arrays)
        uint _batch_size = batch_size[0];
        uint _seq_len = seq_len[0];
        uint _num_heads = num_heads[0];
        uint _head_dim = head_dim[0];
        uint _window_size = window_size[0];
        uint _causal = causal[0];
        float _scale = scale[0];

        uint batch_idx = thread_position_in_grid.z;
        uint head_idx = thread_position_in_grid.y;
        uint q_pos = thread_position_in_grid.x;

        if (batch_idx >= _batch_size || head_idx >= _num_heads || q_pos >= _seq_len) return;

        // Compute valid KV range
        uint kv_start = (q_pos >= _window_size) ? (q_pos - _window_size) : 0;
        uint kv_end;
        if (_causal) {
            kv_end = q_pos + 1;
        } else {
            kv_end = (q_pos + _window_size + 1 < _seq_len) ? (q_pos + _window_size + 1) : _seq_len;
        }

        // Compute offsets
        uint qkv_stride = _num_heads * _head_dim;
        uint q_offset = batch_idx * _seq_len * qkv_stride + q_pos * qkv_stride + head_idx * _head_dim;
        uint kv_base = batch_idx * _seq_len * qkv_stride + head_idx * _head_dim;

        // First pass: find max score
        float max_score = MASK_VALf;
        for (uint kv_pos = kv_start; kv_pos < kv_end; kv_pos++) {
            uint k_offset = kv_base + kv_pos * qkv_stride;
            float score = 0.0f;
            for (uint d = 0; d < _head_dim; d++) {
                score += Q[q_offset + d] * K[k_offset + d];
            }
            score *= _scale;
            max_score = (score > max_score) ? score : max_score;
        }

        // Second pass: compute softmax and accumulate
        float sum_exp = 0.0f;
        float acc[128];
        for (uint d = 0; d < _head_dim; d++) acc[d] = 0.0f;

        for (uint kv_pos = kv_start; kv_pos < kv_end; kv_pos++) {
            uint k_offset = kv_base + kv_pos * qkv_stride;
            uint v_offset = kv_base + kv_pos * qkv_stride;

            float score = 0.0f;
            for (uint d = 0; d < _head_dim; d++) {
                score += Q[q_offset + d] * K[k_offset + d];
            }
            score *= _scale;

            float weight = exp(score - max_score);
            sum_exp += weight;

            for (uint d = 0; d < _head_dim; d++) {
                acc[d] += weight * V[v_offset + d];
            }
        }

        // Write normalized output
        float inv_sum = 1.0f / (sum_exp + SOFTMAX_EPSf);
        for (uint d = 0; d < _head_dim; d++) {
            O[q_offset + d] = acc[d] * inv_sum;
        }
        """.replace("MASK_VAL", str(ATTENTION_MASK_VALUE)).replace("SOFTMAX_EPS", str(METAL_SOFTMAX_EPSILON))


@pytest.mark.parametrize("causal", [True, False])
def test_mlx_primitives_sliding_window_attention(device, causal):
    """zakkeown/mlx-primitives, mlx_primitives/attention/sliding_window.py: the Metal path of
    sliding_window_attention (_metal_sliding_window_attention), one thread per (batch, head, query)
    over keys [q - window, q] (causal) or [q - window, q + window], two passes (max, then
    exp-weighted sum into a per-thread float acc[128]); scalars passed as one-element arrays."""
    batch_size, seq_len, num_heads, head_dim, window_size = 2, 40, 3, 16, 5
    q, k, v = torch.randn(3, batch_size, seq_len, num_heads, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    kernel = kk.metal_kernel(name="sliding_window_attention",
                             input_names=["Q", "K", "V", "batch_size", "seq_len", "num_heads",
                                          "head_dim", "window_size", "causal", "scale"],
                             output_names=["O"], source=SLIDING_WINDOW_SOURCE)
    scalars = [torch.tensor([value], dtype=torch.uint32) for value in
               (batch_size, seq_len, num_heads, head_dim, window_size, 1 if causal else 0)]
    out = launch(kernel, device, inputs=on(device, q, k, v, *scalars, torch.tensor([scale])),
                 grid=(seq_len, num_heads, batch_size), threadgroup=(min(seq_len, 64), 1, 1),
                 output_shapes=[(batch_size, seq_len, num_heads, head_dim)],
                 output_dtypes=[torch.float32])[0]
    pos = torch.arange(seq_len)
    offset = pos[None, :] - pos[:, None]  # key - query
    allowed = (offset >= -window_size) & (offset <= (0 if causal else window_size))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    close(out, torch.einsum("bhqk,bkhd->bqhd", weights, v.double()), rtol=1e-4, atol=1e-5)


# --- Hmbown/ZMLX: src/zmlx/kernels/*.py ----------------------------------------------------------
# The kernel factories are ZMLX's, copied as written (their @cache dropped); they build kernels
# through zmlx.metal.kernel with zmlx.msl.DEFAULT_HEADER, and launch them through
# MetalKernel.__call__, whose defaults are kept below.

DEFAULT_HEADER = r"""
#include <metal_stdlib>
using namespace metal;

template <typename T>
inline T kk_sigmoid(T x) {
    T y = T(1) / (T(1) + metal::exp(metal::abs(x)));
    return (x < T(0)) ? y : T(1) - y;
}

template <typename T>
inline T kk_silu(T x) {
    return x * kk_sigmoid(x);
}

// tanh approximation form used in many transformer implementations
template <typename T>
inline T kk_gelu_tanh(T x) {
    const T k0 = T(0.7978845608028654);   // sqrt(2/pi)
    const T k1 = T(0.044715);
    T x3 = x * x * x;
    return T(0.5) * x * (T(1) + metal::tanh(k0 * (x + k1 * x3)));
}

// erf-based GELU is also common; Metal doesn't expose erf() in all profiles,
// so we default to tanh GELU. If you need erf GELU, implement a poly approximation.

// SIMD-accelerated threadgroup sum reduction.
// Uses simd_sum for the first level (32-wide), then tree reduction for the rest.
// Requires: buf is threadgroup float[TG], tid is thread index in threadgroup.
// After the macro, buf[0] contains the total sum.
#define KK_SIMD_REDUCE_SUM(buf, val, tid, TG) \
    do { \
        float _sr = simd_sum(val); \
        if ((tid) % 32u == 0u) (buf)[(tid) / 32u] = _sr; \
        threadgroup_barrier(mem_flags::mem_threadgroup); \
        if ((TG) > 32u) { \
            for (uint _s = ((TG) / 32u) / 2u; _s > 0u; _s >>= 1u) { \
                if ((tid) < _s) (buf)[(tid)] += (buf)[(tid) + _s]; \
                threadgroup_barrier(mem_flags::mem_threadgroup); \
            } \
        } \
    } while(0)
"""


def metal_kernel(*, name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, cache=True):
    """zmlx.metal.kernel: mx.fast.metal_kernel with these arguments (its kernel cache aside)."""
    return kk.metal_kernel(name=name, input_names=input_names, output_names=output_names,
                           source=source, header=header, ensure_row_contiguous=ensure_row_contiguous,
                           atomic_outputs=atomic_outputs)


def _default_threadgroup_x(n_threads: int) -> int:
    # Prefer a warp-ish multiple; Metal SIMD-group sizes vary, but 32 is a safe default.
    # We choose the largest candidate <= n_threads.
    for c in (512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if c <= max(1, n_threads):
            return c
    return 1


def zmlx_launch(kernel, device, *inputs, template=None, grid=None, threadgroup=None,
                output_shapes=None, output_dtypes=None, init_value=None):
    """MetalKernel.__call__ (src/zmlx/metal.py): outputs default to inputs[0]'s shape and dtype,
    the grid to one thread per element of the first output, the threadgroup to the largest power
    of two up to 512 within grid.x."""
    if output_shapes is None:
        output_shapes = [tuple(inputs[0].shape) for _ in kernel.output_names]
    if output_dtypes is None:
        output_dtypes = [inputs[0].dtype for _ in kernel.output_names]
    if grid is None:
        grid = (int(torch.Size(output_shapes[0]).numel()), 1, 1)
    if threadgroup is None:
        threadgroup = (min(_default_threadgroup_x(grid[0]), grid[0]) if grid[0] > 0 else 1, 1, 1)
    extra = {} if init_value is None else {"init_value": init_value}
    return launch(kernel, device, inputs=on(device, *inputs), template=template, grid=grid,
                  threadgroup=threadgroup, output_shapes=output_shapes, output_dtypes=output_dtypes,
                  **extra)


def _validate_tg(tg: int) -> int:
    tg = int(tg)
    if tg <= 0 or tg > 1024:
        raise ValueError("threadgroup must be in (0, 1024]")
    # require power of two for the reduction loop
    if tg & (tg - 1) != 0:
        raise ValueError("threadgroup must be a power of two")
    return tg


def _add_rmsnorm_kernel(d: int, tg: int, eps: float) -> Any:
    D = int(d)
    TG = _validate_tg(tg)
    eps_f = float(eps)
    eps_str = str(eps_f).replace(".", "_").replace("-", "_")

    # Single-pass kernel: cache h = inp + residual in thread-local registers
    # during the reduction pass, then reuse for the normalization output.
    # This avoids re-reading inp and residual from global memory in a second
    # pass while still computing in float32 for precision.
    EPT = (D + TG - 1) // TG  # elements per thread
    source = f"""
        constexpr uint D = {D};
        constexpr uint TG = {TG};
        constexpr uint EPT = {EPT};
        constexpr float EPS = {eps_f}f;

        uint gid = thread_position_in_grid.x;
        uint tid = thread_position_in_threadgroup.x;
        uint row = gid / TG;
        uint base = row * D;

        threadgroup float buf[TG];

        // Cache h values in thread-local registers to avoid re-reading globals.
        float h_local[EPT];

        // Pass 1: compute h = inp + residual, store in registers, accumulate sumsq
        float sumsq = 0.0f;
        for (uint idx = 0; idx < EPT; ++idx) {{
            uint j = tid + idx * TG;
            if (j < D) {{
                float h = (float)inp[base + j] + (float)residual[base + j];
                h_local[idx] = h;
                h_out[base + j] = (T)h;
                sumsq += h * h;
            }}
        }}
        KK_SIMD_REDUCE_SUM(buf, sumsq, tid, TG);

        float inv = metal::rsqrt(buf[0] / (float)D + EPS);
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Pass 2: apply norm using cached h values (no global re-read)
        for (uint idx = 0; idx < EPT; ++idx) {{
            uint j = tid + idx * TG;
            if (j < D) {{
                float w = (float)weight[j];
                normed[base + j] = (T)(h_local[idx] * inv * w);
            }}
        }}
    """

    return metal_kernel(
        name=f"kk_add_rmsnorm_D{D}_TG{TG}_E{eps_str}",
        input_names=["inp", "residual", "weight"],
        output_names=["normed", "h_out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


def test_zmlx_add_rms_norm(device):
    """Hmbown/ZMLX, src/zmlx/kernels/norms.py: _add_rmsnorm_kernel (add_rms_norm), the fused
    residual add + RMSNorm: h = x + residual kept in registers and written out, the sum of
    squares through DEFAULT_HEADER's KK_SIMD_REDUCE_SUM (simd_sum, then a tree over SIMD-group
    totals); bf16, D = 300 over a threadgroup of 256 (two elements for some threads)."""
    rows, D, TG, eps = 4, 300, 256, 1e-6
    x, residual = torch.randn(2, rows, D).bfloat16()
    weight = (torch.rand(D) + 0.5).bfloat16()
    normed, h_out = zmlx_launch(_add_rmsnorm_kernel(D, TG, eps), device, x, residual, weight,
                                template=[("T", x.dtype)], grid=(rows * TG, 1, 1),
                                threadgroup=(TG, 1, 1), output_shapes=[x.shape, x.shape],
                                output_dtypes=[x.dtype, x.dtype])
    h = x.double() + residual.double()
    close(h_out, h, rtol=1e-2, atol=1e-2)
    close(normed, h * torch.rsqrt((h ** 2).mean(-1, keepdim=True) + eps) * weight.double(),
          rtol=2e-2, atol=2e-2)


def _paged_attention_kernel(
    h: int,
    h_kv: int,
    d: int,
    block_size: int,
    max_blocks: int,
    tg: int,
    max_context: int = 4096,
) -> Any:
    H = int(h)
    HKV = int(h_kv)
    D = int(d)
    BS = int(block_size)
    MB = int(max_blocks)
    TG = _validate_tg(tg)
    G = H // HKV
    MC = int(max_context)

    source = f"""
        constexpr uint H = {H};
        constexpr uint HKV = {HKV};
        constexpr uint D = {D};
        constexpr uint BS = {BS};
        constexpr uint MB = {MB};
        constexpr uint TG = {TG};
        constexpr uint G = {G};
        constexpr uint MC = {MC};

        uint tid = thread_position_in_threadgroup.x;
        uint batch_idx = thread_position_in_grid.y;
        uint head_idx = thread_position_in_grid.z;
        uint kv_head_idx = head_idx / G;

        uint context_len = (uint)context_lens[batch_idx];
        float scale_val = (float)scale[0];

        threadgroup float m_buf[TG];
        threadgroup float s_buf[TG];
        threadgroup float scores[MC]; // Store scores to avoid recomputing

        // 1. Compute scores
        float m = -INFINITY;
        for (uint i = tid; i < context_len; i += TG) {{
            uint block_logical_idx = i / BS;
            uint token_block_idx = i % BS;
            uint physical_block = (uint)block_table[batch_idx * MB + block_logical_idx];
            
            float score = 0.0f;
            uint q_off = (batch_idx * H + head_idx) * D;
            uint k_off = ((physical_block * BS + token_block_idx) * HKV + kv_head_idx) * D;
            
            for (uint d = 0; d < D; ++d) {{
                score += (float)q[q_off + d] * (float)k_cache[k_off + d];
            }}
            score *= scale_val;
            scores[i] = score;
            m = metal::max(m, score);
        }}

        // 2. Reduce m across threadgroup
        m_buf[tid] = m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = TG / 2; i > 0; i >>= 1) {{
            if (tid < i) m_buf[tid] = metal::max(m_buf[tid], m_buf[tid + i]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float global_m = m_buf[0];
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 3. Compute sum(exp(score - m)) and update scores to exp(score - m)
        float s = 0.0f;
        for (uint i = tid; i < context_len; i += TG) {{
            float weight = metal::exp(scores[i] - global_m);
            scores[i] = weight;
            s += weight;
        }}
        s_buf[tid] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = TG / 2; i > 0; i >>= 1) {{
            if (tid < i) s_buf[tid] += s_buf[tid + i];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}
        float global_s = s_buf[0];
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // 4. Compute weighted sum of V
        for (uint d = tid; d < D; d += TG) {{
            float acc = 0.0f;
            for (uint i = 0; i < context_len; ++i) {{
                uint block_logical_idx = i / BS;
                uint token_block_idx = i % BS;
                uint physical_block = (uint)block_table[batch_idx * MB + block_logical_idx];
                uint v_off = ((physical_block * BS + token_block_idx) * HKV + kv_head_idx) * D;
                
                acc += (scores[i] / global_s) * (float)v_cache[v_off + d];
            }}
            out[(batch_idx * H + head_idx) * D + d] = (T)acc;
        }}
    """
    return metal_kernel(
        name=f"kk_paged_attention_H{H}_HKV{HKV}_D{D}_BS{BS}_MC{MC}",
        input_names=["q", "k_cache", "v_cache", "block_table", "context_lens", "scale"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


def test_zmlx_paged_attention(device):
    """Hmbown/ZMLX, src/zmlx/kernels/attention.py: _paged_attention_kernel (paged_attention),
    decode attention over a paged KV cache: keys and values found through a block table, a
    threadgroup per (batch, head) keeping every score in threadgroup memory, max and sum through
    tree reductions; grouped-query heads, contexts ending mid-block, half activations."""
    B, H, HKV, D, BS, num_blocks, MB, tg = 2, 4, 2, 32, 8, 10, 4, 256
    q = torch.randn(B, H, D).half()
    k_cache, v_cache = torch.randn(2, num_blocks, BS, HKV, D).half()
    block_table = torch.stack([torch.randperm(num_blocks)[:MB] for _ in range(B)]).to(torch.int32)
    context_lens = torch.tensor([13, 29], dtype=torch.int32)
    scale = 1.0 / (D ** 0.5)
    out = zmlx_launch(_paged_attention_kernel(H, HKV, D, BS, MB, tg), device,
                      q, k_cache, v_cache, block_table, context_lens,
                      torch.tensor([scale], dtype=torch.float32),
                      template=[("T", q.dtype)], grid=(tg, B, H), threadgroup=(tg, 1, 1),
                      output_shapes=[q.shape], output_dtypes=[q.dtype])[0]
    for b in range(B):
        tokens = torch.arange(int(context_lens[b]))
        blocks = block_table[b, tokens // BS].long()
        keys = k_cache[blocks, tokens % BS].double().repeat_interleave(H // HKV, 1)    # (L, H, D)
        values = v_cache[blocks, tokens % BS].double().repeat_interleave(H // HKV, 1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b].double(), keys) * scale, -1)
        close(out[b], torch.einsum("hl,lhd->hd", weights, values), rtol=2e-3, atol=2e-3)


def _topk_kernel(d: int, k: int, tg: int) -> Any:
    D = int(d)
    K = int(k)
    TG = _validate_tg(tg)
    
    # Simple insertion sort in registers for small K
    source = f"""
        constexpr uint D = {D};
        constexpr uint K = {K};
        constexpr uint TG = {TG};

        uint gid = thread_position_in_grid.x;
        uint tid = thread_position_in_threadgroup.x;
        uint row = gid / TG;
        uint base = row * D;

        threadgroup float val_buf[TG * K];
        threadgroup uint idx_buf[TG * K];

        // Local top-k for this thread's chunk
        float local_vals[K];
        uint local_idxs[K];
        for (uint i = 0; i < K; ++i) local_vals[i] = -INFINITY;

        for (uint j = tid; j < D; j += TG) {{
            float v = (float)inp[base + j];
            if (v > local_vals[K-1]) {{
                // insertion
                uint p = K - 1;
                while (p > 0 && v > local_vals[p-1]) {{
                    local_vals[p] = local_vals[p-1];
                    local_idxs[p] = local_idxs[p-1];
                    p--;
                }}
                local_vals[p] = v;
                local_idxs[p] = j;
            }}
        }}
        
        // Write to threadgroup for final merge
        for (uint i = 0; i < K; ++i) {{
            val_buf[tid * K + i] = local_vals[i];
            idx_buf[tid * K + i] = local_idxs[i];
        }}
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // Binary merge tree
        for (uint st = TG/2; st > 0; st >>= 1) {{
            if (tid < st) {{
                // Merge tid and tid + st
                float v_a[K], v_b[K];
                uint i_a[K], i_b[K];
                for (uint i = 0; i < K; ++i) {{
                    v_a[i] = val_buf[tid * K + i];
                    i_a[i] = idx_buf[tid * K + i];
                    v_b[i] = val_buf[(tid + st) * K + i];
                    i_b[i] = idx_buf[(tid + st) * K + i];
                }}
                
                uint pa = 0, pb = 0;
                for (uint i = 0; i < K; ++i) {{
                    if (v_a[pa] >= v_b[pb]) {{
                        val_buf[tid * K + i] = v_a[pa];
                        idx_buf[tid * K + i] = i_a[pa];
                        pa++;
                    }} else {{
                        val_buf[tid * K + i] = v_b[pb];
                        idx_buf[tid * K + i] = i_b[pb];
                        pb++;
                    }}
                }}
            }}
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }}

        if (tid == 0) {{
            for (uint i = 0; i < K; ++i) {{
                out_vals[row * K + i] = (T)val_buf[i];
                out_idxs[row * K + i] = idx_buf[i];
            }}
        }}
    """
    return metal_kernel(
        name=f"kk_topk_D{D}_K{K}_TG{TG}",
        input_names=["inp"],
        output_names=["out_vals", "out_idxs"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


def test_zmlx_topk(device):
    """Hmbown/ZMLX, src/zmlx/kernels/reductions.py: _topk_kernel (topk_lastdim), the 5 largest
    of each row: per-thread insertion sorts in registers, merged pairwise in a threadgroup tree
    (values and uint indices in threadgroup arrays); half input, float32 values out. Distinct
    values, D >= K: the original leaves a thread's unfilled slots' indices unset."""
    rows, D, K, TG = 3, 300, 5, 256
    x = torch.randperm(rows * D).reshape(rows, D).half() / 64
    values, indices = zmlx_launch(_topk_kernel(D, K, TG), device, x, template=[("T", torch.float32)],
                                  grid=(rows * TG, 1, 1), threadgroup=(TG, 1, 1),
                                  output_shapes=[(rows, K), (rows, K)],
                                  output_dtypes=[torch.float32, torch.uint32])
    expected = torch.topk(x.double(), K, dim=-1)
    close(values, expected.values, rtol=0, atol=0)
    assert torch.equal(indices.cpu().long(), expected.indices)


def _depthwise_conv_3x3_kernel(h: int, w: int, c: int) -> Any:
    source = f"""
        constexpr uint H = {h};
        constexpr uint W = {w};
        constexpr uint C = {c};

        uint gid = thread_position_in_grid.x;
        uint channel = gid % C;
        uint x = (gid / C) % W;
        uint y = (gid / C / W) % H;
        uint b = gid / C / W / H;

        float sum = 0.0f;
        for (int dy = -1; dy <= 1; ++dy) {{
            for (int dx = -1; dx <= 1; ++dx) {{
                int iy = (int)y + dy;
                int ix = (int)x + dx;
                if (iy >= 0 && iy < (int)H && ix >= 0 && ix < (int)W) {{
                    float val = (float)inp[b * H * W * C + (iy * W + ix) * C + channel];
                    float weight = (float)weights[((dy + 1) * 3 + (dx + 1)) * C + channel];
                    sum += val * weight;
                }}
            }}
        }}
        out[gid] = (T)sum;
    """
    return metal_kernel(
        name=f"kk_dw_conv3x3_H{h}_W{w}_C{c}",
        input_names=["inp", "weights"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


def test_zmlx_depthwise_conv_3x3(device):
    """Hmbown/ZMLX, src/zmlx/kernels/image.py: _depthwise_conv_3x3_kernel (depthwise_conv_3x3),
    an NHWC 3x3 depthwise stencil with zero padding, one thread per output element (the
    wrapper's default threadgroup: 256 of the 420)."""
    N, H, W, C = 2, 5, 6, 7
    x = torch.randn(N, H, W, C)
    w = torch.randn(3, 3, C)
    out = zmlx_launch(_depthwise_conv_3x3_kernel(H, W, C), device, x, w,
                      template=[("T", torch.float32)], grid=(x.numel(), 1, 1),
                      output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
    expected = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2),
                                          w.double().permute(2, 0, 1)[:, None], padding=1, groups=C)
    close(out, expected.permute(0, 2, 3, 1))


def _dequant_affine_packed_kernel(
    *,
    bits: int,
    group_size: int,
    act_expr: str = "val",
) -> Any:
    if bits not in (2, 3, 4, 5, 6, 8):
        raise ValueError(f"Unsupported bits for affine packed dequant: {bits}")
    if group_size <= 0:
        raise ValueError("group_size must be > 0")

    elements_per_word = 32 // bits
    mask = (1 << bits) - 1
    source = f"""
        uint gid = thread_position_in_grid.x;
        uint pack_idx = gid / {elements_per_word};
        uint shift = (gid % {elements_per_word}) * {bits};
        uint q = (inp[pack_idx] >> shift) & {mask}u;
        uint group_idx = gid / {group_size};
        float scale = (float)scales[group_idx];
        float bias = (float)biases[group_idx];
        float val = (float)q * scale + bias;
        out[gid] = (T)({act_expr});
    """
    return metal_kernel(
        name=f"kk_dequant_affine_b{bits}_g{group_size}_{hash(act_expr) % 10000}",
        input_names=["inp", "scales", "biases"],
        output_names=["out"],
        source=source,
        header=DEFAULT_HEADER,
        ensure_row_contiguous=True,
        cache=True,
    )


@pytest.mark.parametrize("bits,act_expr", [(4, "val"), (2, "kk_silu(val)"), (8, "kk_gelu_tanh(val)")])
def test_zmlx_dequantize_affine_packed(device, bits, act_expr):
    """Hmbown/ZMLX, src/zmlx/kernels/quant.py: _dequant_affine_packed_kernel
    (dequantize_affine_packed and its _silu / _gelu forms): q * scale + bias per group from
    32-bit words of 32 / bits codes each, then DEFAULT_HEADER's kk_silu or kk_gelu_tanh. Bits
    2, 4, 8 only: for 3, 5 and 6 the original's 32 // bits codes per word is not MLX's packing
    (which the docstring says it mirrors), so there is no layout to check it against."""
    rows, words, group_size = 3, 16, 32
    per_word = 32 // bits
    codes = torch.randint(0, 2 ** bits, (rows, words, per_word))
    packed = (codes << (torch.arange(per_word) * bits)).sum(-1).to(torch.uint32)
    groups = rows * words * per_word // group_size
    scales = (torch.rand(groups) * 0.1 + 0.01).half()
    biases = (torch.randn(groups) * 0.1).half()
    out = zmlx_launch(_dequant_affine_packed_kernel(bits=bits, group_size=group_size, act_expr=act_expr),
                      device, packed, scales, biases, template=[("T", torch.float32)],
                      grid=(packed.numel() * per_word, 1, 1), output_shapes=[(rows, words * per_word)],
                      output_dtypes=[torch.float32])[0]
    val = (codes.reshape(-1).double() * scales.double().repeat_interleave(group_size)
           + biases.double().repeat_interleave(group_size)).reshape(rows, -1)
    if act_expr == "kk_silu(val)":
        val = val * torch.sigmoid(val)
    elif act_expr == "kk_gelu_tanh(val)":
        val = 0.5 * val * (1 + torch.tanh(math.sqrt(2 / math.pi) * (val + 0.044715 * val ** 3)))
    close(out, val, rtol=1e-5, atol=1e-6)


# --- zkeown/mlx-audio-primitives: mlx_audio_primitives/stft.py at ed6e66e1 ----------------------
# (a later commit replaced this scatter with a gather that needs no atomics)

_SCATTER_ADD_SOURCE = """
    // Thread indices
    uint batch_idx = thread_position_in_grid.z;
    uint frame_idx = thread_position_in_grid.y;
    uint sample_idx = thread_position_in_grid.x;

    // Compute output position
    uint out_pos = frame_idx * hop_length + sample_idx;

    // Bounds check
    if (out_pos >= output_length) return;
    if (batch_idx >= batch_size) return;
    if (frame_idx >= n_frames) return;
    if (sample_idx >= n_fft) return;

    // Get input index: frames[batch_idx, frame_idx, sample_idx]
    uint frame_flat_idx = batch_idx * n_frames * n_fft
                        + frame_idx * n_fft
                        + sample_idx;

    // Get output index: output[batch_idx, out_pos]
    uint out_flat_idx = batch_idx * output_length + out_pos;

    // Atomic add to output
    float val = frames[frame_flat_idx];
    atomic_fetch_add_explicit(
        (device atomic_float*)&output[out_flat_idx],
        val,
        memory_order_relaxed
    );

    // Atomic add to window_sum (only once per output position, use batch 0)
    if (batch_idx == 0) {
        float ws_val = window_sq[sample_idx];
        atomic_fetch_add_explicit(
            (device atomic_float*)&window_sum[out_pos],
            ws_val,
            memory_order_relaxed
        );
    }
"""


def test_mlx_audio_primitives_scatter_add_overlap(device):
    """zkeown/mlx-audio-primitives, mlx_audio_primitives/stft.py at commit ed6e66e1:
    _scatter_add_overlap, the overlap-add of inverse STFT frames: one thread per (sample, frame,
    batch) adding into the signal, and batch 0 adding the squared window into the envelope, through
    `(device atomic_float*)&output[i]` on atomic outputs zeroed by init_value; output_length cuts
    the last frame short."""
    batch_size, n_frames, n_fft, hop_length = 2, 9, 32, 8
    output_length = (n_frames - 1) * hop_length + n_fft - 5
    frames = torch.randn(batch_size, n_frames, n_fft)
    window_sq = torch.hann_window(n_fft) ** 2
    kernel = kk.metal_kernel(name="scatter_add_overlap", input_names=["frames", "window_sq"],
                             output_names=["output", "window_sum"], source=_SCATTER_ADD_SOURCE,
                             atomic_outputs=True)
    output, window_sum = launch(kernel, device, inputs=on(device, frames, window_sq),
                                output_shapes=[(batch_size, output_length), (output_length,)],
                                output_dtypes=[torch.float32, torch.float32],
                                grid=(n_fft, n_frames, batch_size),
                                threadgroup=(min(n_fft, 256), 1, 1),
                                template=[("hop_length", hop_length), ("output_length", output_length),
                                          ("batch_size", batch_size), ("n_frames", n_frames),
                                          ("n_fft", n_fft)],
                                init_value=0)
    expected = torch.zeros(batch_size, output_length + n_fft, dtype=torch.float64)
    envelope = torch.zeros(output_length + n_fft, dtype=torch.float64)
    for f in range(n_frames):
        expected[:, f * hop_length:f * hop_length + n_fft] += frames[:, f].double()
        envelope[f * hop_length:f * hop_length + n_fft] += window_sq.double()
    close(output, expected[:, :output_length])
    close(window_sum, envelope[:output_length])


# --- appautomaton/mlx-atomistic: src/mlx_atomistic/metal_kernels.py (bonded forces, PME) -------

_BONDED_FORCE_HEADER = r"""
struct MLXAtomisticDihedralGeometry {
    float phi;
    float3 delta_ab;
    float3 delta_bc;
    float3 delta_cd;
    float3 cross_ab_bc;
    float3 cross_bc_cd;
};

float3 mlx_atomistic_bonded_displacement(
    device const float* positions,
    int left,
    int right,
    constant const float* box
) {
    float3 displacement = float3(
        positions[3 * left + 0] - positions[3 * right + 0],
        positions[3 * left + 1] - positions[3 * right + 1],
        positions[3 * left + 2] - positions[3 * right + 2]
    );
    displacement.x -= box[0] * rint(displacement.x / box[0]);
    displacement.y -= box[1] * rint(displacement.y / box[1]);
    displacement.z -= box[2] * rint(displacement.z / box[2]);
    return displacement;
}

void mlx_atomistic_add_bonded_force(
    device atomic<float>* forces,
    int atom,
    float3 force
) {
    atomic_fetch_add_explicit(
        &forces[3 * atom + 0], force.x, memory_order_relaxed
    );
    atomic_fetch_add_explicit(
        &forces[3 * atom + 1], force.y, memory_order_relaxed
    );
    atomic_fetch_add_explicit(
        &forces[3 * atom + 2], force.z, memory_order_relaxed
    );
}

MLXAtomisticDihedralGeometry mlx_atomistic_dihedral_geometry(
    device const float* positions,
    int atom_i,
    int atom_j,
    int atom_k,
    int atom_m,
    constant const float* box
) {
    MLXAtomisticDihedralGeometry geometry;
    geometry.delta_ab = mlx_atomistic_bonded_displacement(
        positions, atom_j, atom_i, box
    );
    geometry.delta_bc = mlx_atomistic_bonded_displacement(
        positions, atom_j, atom_k, box
    );
    geometry.delta_cd = mlx_atomistic_bonded_displacement(
        positions, atom_m, atom_k, box
    );
    geometry.cross_ab_bc = cross(geometry.delta_ab, geometry.delta_bc);
    geometry.cross_bc_cd = cross(geometry.delta_bc, geometry.delta_cd);
    float norm_cross_1 = sqrt(max(
        dot(geometry.cross_ab_bc, geometry.cross_ab_bc), 1.0e-12f
    ));
    float norm_cross_2 = sqrt(max(
        dot(geometry.cross_bc_cd, geometry.cross_bc_cd), 1.0e-12f
    ));
    float cosine = clamp(
        dot(geometry.cross_ab_bc, geometry.cross_bc_cd)
            / (norm_cross_1 * norm_cross_2),
        -0.999999f,
        0.999999f
    );
    float angle = acos(cosine);
    float sign = dot(geometry.delta_ab, geometry.cross_bc_cd) < 0.0f
        ? -1.0f
        : 1.0f;
    geometry.phi = angle * sign;
    return geometry;
}

void mlx_atomistic_apply_dihedral_force(
    device atomic<float>* forces,
    int atom_i,
    int atom_j,
    int atom_k,
    int atom_m,
    MLXAtomisticDihedralGeometry geometry,
    float force_derivative
) {
    float norm_cross_1 = max(
        dot(geometry.cross_ab_bc, geometry.cross_ab_bc), 1.0e-12f
    );
    float norm_cross_2 = max(
        dot(geometry.cross_bc_cd, geometry.cross_bc_cd), 1.0e-12f
    );
    float norm_bc2 = max(dot(geometry.delta_bc, geometry.delta_bc), 1.0e-12f);
    float norm_bc = sqrt(norm_bc2);
    float3 force_i = (
        -force_derivative * norm_bc / norm_cross_1
    ) * geometry.cross_ab_bc;
    float3 force_m = (
        force_derivative * norm_bc / norm_cross_2
    ) * geometry.cross_bc_cd;
    float factor_j = dot(geometry.delta_ab, geometry.delta_bc) / norm_bc2;
    float factor_k = dot(geometry.delta_cd, geometry.delta_bc) / norm_bc2;
    float3 shared = factor_j * force_i - factor_k * force_m;
    float3 force_j = -(force_i - shared);
    float3 force_k = -(force_m + shared);
    mlx_atomistic_add_bonded_force(forces, atom_i, force_i);
    mlx_atomistic_add_bonded_force(forces, atom_j, force_j);
    mlx_atomistic_add_bonded_force(forces, atom_k, force_k);
    mlx_atomistic_add_bonded_force(forces, atom_m, force_m);
}
"""

_BONDED_FORCE_SOURCE = r"""
    uint task = thread_position_in_grid.x;
    uint bond_count = (uint)counts[0];
    uint angle_count = (uint)counts[1];
    uint dihedral_count = (uint)counts[2];
    uint improper_count = (uint)counts[3];
    uint cmap_count = (uint)counts[4];
    uint cmap_grid_size = (uint)counts[5];
    uint correction_count = (uint)counts[6];
    uint total_count = (
        bond_count + angle_count + dihedral_count + improper_count + cmap_count
            + correction_count
    );
    if (task >= total_count) {
        return;
    }

    if (task < bond_count) {
        int atom_i = bond_atoms[2 * task + 0];
        int atom_j = bond_atoms[2 * task + 1];
        float3 displacement = mlx_atomistic_bonded_displacement(
            positions, atom_i, atom_j, box
        );
        float distance = sqrt(max(dot(displacement, displacement), 1.0e-12f));
        float scalar = -bond_k[task] * (
            distance - bond_length[task]
        ) / distance;
        float3 force = scalar * displacement;
        mlx_atomistic_add_bonded_force(forces, atom_i, force);
        mlx_atomistic_add_bonded_force(forces, atom_j, -force);
        return;
    }
    task -= bond_count;

    if (task < angle_count) {
        int atom_i = angle_atoms[3 * task + 0];
        int atom_j = angle_atoms[3 * task + 1];
        int atom_k = angle_atoms[3 * task + 2];
        float3 left = mlx_atomistic_bonded_displacement(
            positions, atom_i, atom_j, box
        );
        float3 right = mlx_atomistic_bonded_displacement(
            positions, atom_k, atom_j, box
        );
        float left_norm2 = max(dot(left, left), 1.0e-12f);
        float right_norm2 = max(dot(right, right), 1.0e-12f);
        float left_norm = sqrt(left_norm2);
        float right_norm = sqrt(right_norm2);
        float cosine = clamp(
            dot(left, right) / (left_norm * right_norm),
            -0.999999f,
            0.999999f
        );
        float theta = acos(cosine);
        float sin_theta = sqrt(max(1.0f - cosine * cosine, 1.0e-12f));
        float prefactor = angle_k[task] * (
            theta - angle_target[task]
        ) / sin_theta;
        float3 left_force = prefactor * (
            right / (left_norm * right_norm) - cosine * left / left_norm2
        );
        float3 right_force = prefactor * (
            left / (left_norm * right_norm) - cosine * right / right_norm2
        );
        float3 center_force = -(left_force + right_force);
        mlx_atomistic_add_bonded_force(forces, atom_i, left_force);
        mlx_atomistic_add_bonded_force(forces, atom_j, center_force);
        mlx_atomistic_add_bonded_force(forces, atom_k, right_force);
        return;
    }
    task -= angle_count;

    if (task < dihedral_count) {
        int atom_i = dihedral_atoms[4 * task + 0];
        int atom_j = dihedral_atoms[4 * task + 1];
        int atom_k = dihedral_atoms[4 * task + 2];
        int atom_m = dihedral_atoms[4 * task + 3];
        MLXAtomisticDihedralGeometry geometry = mlx_atomistic_dihedral_geometry(
            positions, atom_i, atom_j, atom_k, atom_m, box
        );
        float periodic_angle = (
            dihedral_periodicity[task] * geometry.phi + dihedral_phase[task]
        );
        float force_derivative = (
            dihedral_k[task]
            * dihedral_periodicity[task]
            * sin(periodic_angle)
        );
        mlx_atomistic_apply_dihedral_force(
            forces,
            atom_i,
            atom_j,
            atom_k,
            atom_m,
            geometry,
            force_derivative
        );
        return;
    }
    task -= dihedral_count;

    if (task < improper_count) {
        int atom_i = improper_atoms[4 * task + 0];
        int atom_j = improper_atoms[4 * task + 1];
        int atom_k = improper_atoms[4 * task + 2];
        int atom_m = improper_atoms[4 * task + 3];
        MLXAtomisticDihedralGeometry geometry = mlx_atomistic_dihedral_geometry(
            positions, atom_i, atom_j, atom_k, atom_m, box
        );
        float periodicity = improper_periodicity[task];
        float shifted_angle = geometry.phi + improper_phase[task];
        float force_derivative;
        if (periodicity == 0.0f) {
            float harmonic_delta = atan2(sin(shifted_angle), cos(shifted_angle));
            force_derivative = -2.0f * improper_k[task] * harmonic_delta;
        } else {
            force_derivative = (
                improper_k[task]
                * periodicity
                * sin(periodicity * geometry.phi + improper_phase[task])
            );
        }
        mlx_atomistic_apply_dihedral_force(
            forces,
            atom_i,
            atom_j,
            atom_k,
            atom_m,
            geometry,
            force_derivative
        );
        return;
    }
    task -= improper_count;

    if (task < cmap_count) {
        int atom_i = cmap_atoms[8 * task + 0];
        int atom_j = cmap_atoms[8 * task + 1];
        int atom_k = cmap_atoms[8 * task + 2];
        int atom_m = cmap_atoms[8 * task + 3];
        int atom_n = cmap_atoms[8 * task + 4];
        int atom_o = cmap_atoms[8 * task + 5];
        int atom_p = cmap_atoms[8 * task + 6];
        int atom_q = cmap_atoms[8 * task + 7];
        MLXAtomisticDihedralGeometry phi_geometry = mlx_atomistic_dihedral_geometry(
            positions, atom_i, atom_j, atom_k, atom_m, box
        );
        MLXAtomisticDihedralGeometry psi_geometry = mlx_atomistic_dihedral_geometry(
            positions, atom_n, atom_o, atom_p, atom_q, box
        );

        float scale = (float)cmap_grid_size / (2.0f * M_PI_F);
        float phi_scaled = -phi_geometry.phi * scale;
        float psi_scaled = -psi_geometry.phi * scale;
        phi_scaled -= floor(phi_scaled / (float)cmap_grid_size) * cmap_grid_size;
        psi_scaled -= floor(psi_scaled / (float)cmap_grid_size) * cmap_grid_size;
        float phi_floor = floor(phi_scaled);
        float psi_floor = floor(psi_scaled);
        uint phi_index = (uint)phi_floor;
        uint psi_index = (uint)psi_floor;
        float phi_t = phi_scaled - phi_floor;
        float psi_t = psi_scaled - psi_floor;
        float phi_t2 = phi_t * phi_t;
        float psi_t2 = psi_t * psi_t;
        float phi_powers[4] = {1.0f, phi_t, phi_t2, phi_t2 * phi_t};
        float psi_powers[4] = {1.0f, psi_t, psi_t2, psi_t2 * psi_t};
        float phi_derivatives[4] = {0.0f, 1.0f, 2.0f * phi_t, 3.0f * phi_t2};
        float psi_derivatives[4] = {0.0f, 1.0f, 2.0f * psi_t, 3.0f * psi_t2};
        uint coefficient_base = 16u * (
            ((uint)cmap_indices[task] * cmap_grid_size + phi_index)
                * cmap_grid_size
            + psi_index
        );
        float derivative_phi_t = 0.0f;
        float derivative_psi_t = 0.0f;
        for (uint row = 0; row < 4; ++row) {
            for (uint column = 0; column < 4; ++column) {
                float coefficient = cmap_coefficients[
                    coefficient_base + 4u * row + column
                ];
                derivative_phi_t += (
                    coefficient * phi_derivatives[row] * psi_powers[column]
                );
                derivative_psi_t += (
                    coefficient * phi_powers[row] * psi_derivatives[column]
                );
            }
        }
        // This helper accepts -dE/d(angle).  The CMAP lookup coordinate is
        // -angle*scale, so the two signs cancel.
        mlx_atomistic_apply_dihedral_force(
            forces,
            atom_i,
            atom_j,
            atom_k,
            atom_m,
            phi_geometry,
            scale * derivative_phi_t
        );
        mlx_atomistic_apply_dihedral_force(
            forces,
            atom_n,
            atom_o,
            atom_p,
            atom_q,
            psi_geometry,
            scale * derivative_psi_t
        );
        return;
    }
    task -= cmap_count;

    if (task < correction_count) {
        int atom_i = correction_atoms[2 * task + 0];
        int atom_j = correction_atoms[2 * task + 1];
        float3 displacement = mlx_atomistic_bonded_displacement(
            positions, atom_i, atom_j, box
        );
        float r2 = dot(displacement, displacement);
        if (r2 <= 0.0f) {
            return;
        }
        float inv_distance = rsqrt(r2);
        float inv_r2 = inv_distance * inv_distance;
        float scalar = correction_coulomb[0] * correction_charge_products[task]
            * inv_r2 * inv_distance;
        float epsilon = correction_lj_epsilon[task];
        if (epsilon > 0.0f) {
            float sigma = correction_lj_sigma[task];
            float sigma2_over_r2 = sigma * sigma * inv_r2;
            float inv_r6 = sigma2_over_r2 * sigma2_over_r2 * sigma2_over_r2;
            float inv_r12 = inv_r6 * inv_r6;
            scalar += 24.0f * epsilon * (2.0f * inv_r12 - inv_r6) * inv_r2;
        }
        float3 force = scalar * displacement;
        mlx_atomistic_add_bonded_force(forces, atom_i, force);
        mlx_atomistic_add_bonded_force(forces, atom_j, -force);
    }
"""

_PME_ORDER5_HEADER = r"""
inline void mlx_atomistic_pme_order5_weights(
    float3 fraction,
    thread float3* weights,
    thread float3* derivatives
) {
    weights[4] = float3(0.0f);
    weights[1] = fraction;
    weights[0] = float3(1.0f) - fraction;
    for (int j = 3; j < 5; j++) {
        float divisor = 1.0f / (float)(j - 1);
        weights[j - 1] = divisor * fraction * weights[j - 2];
        for (int k = 1; k < (j - 1); k++) {
            weights[j - k - 1] = divisor * (
                (fraction + float3((float)k)) * weights[j - k - 2]
                + (float3((float)(j - k)) - fraction)
                * weights[j - k - 1]
            );
        }
        weights[0] =
            divisor * (float3(1.0f) - fraction) * weights[0];
    }

    derivatives[0] = -weights[0];
    for (int j = 1; j < 5; j++) {
        derivatives[j] = weights[j - 1] - weights[j];
    }

    const float scale = 0.25f;
    weights[4] = scale * fraction * weights[3];
    for (int j = 1; j < 4; j++) {
        weights[4 - j] = scale * (
            (fraction + float3((float)j)) * weights[3 - j]
            + (float3((float)(5 - j)) - fraction) * weights[4 - j]
        );
    }
    weights[0] =
        scale * (float3(1.0f) - fraction) * weights[0];
}
"""

_PME_ORDER5_SPREAD_SOURCE = r"""
    uint lane = thread_position_in_grid.x;
    uint atom_count = (uint)counts[0];
    if (lane >= atom_count * 5u) {
        return;
    }
    uint atom = lane / 5u;
    int z_offset = (int)(lane - atom * 5u);

    float3 scaled;
    scaled.x = (
        positions[3 * atom + 0]
        - floor(positions[3 * atom + 0] / cell[0]) * cell[0]
    ) / cell[0] * (float)mesh[0];
    scaled.y = (
        positions[3 * atom + 1]
        - floor(positions[3 * atom + 1] / cell[1]) * cell[1]
    ) / cell[1] * (float)mesh[1];
    scaled.z = (
        positions[3 * atom + 2]
        - floor(positions[3 * atom + 2] / cell[2]) * cell[2]
    ) / cell[2] * (float)mesh[2];
    int3 anchor = int3(
        (int)floor(scaled.x) - 2,
        (int)floor(scaled.y) - 2,
        (int)floor(scaled.z) - 2
    );
    float3 fraction = scaled - floor(scaled);
    float3 weights[5];
    float3 derivatives[5];
    mlx_atomistic_pme_order5_weights(
        fraction,
        weights,
        derivatives
    );

    int nz = mesh[2];
    int ny = mesh[1];
    int z = (anchor.z + z_offset + nz) % nz;
    float qz = charges[atom] * weights[z_offset].z;
    for (int x_offset = 0; x_offset < 5; x_offset++) {
        int x = (anchor.x + x_offset + mesh[0]) % mesh[0];
        float qzx = qz * weights[x_offset].x;
        for (int y_offset = 0; y_offset < 5; y_offset++) {
            int y = (anchor.y + y_offset + ny) % ny;
            int index = (x * ny + y) * nz + z;
            float value = qzx * weights[y_offset].y;
            atomic_fetch_add_explicit(
                &charge_grid[index],
                value,
                memory_order_relaxed
            );
        }
    }
"""


def _minimum_image(d, box):
    return d - box * torch.round(d / box)  # rint: half to even, as torch.round


def _chain(n, box):
    """n atoms a random walk of ~1.0 steps (turning 40-140 degrees each step), wrapped into a
    periodic box of `box` (the walk crosses its faces), float64."""
    steps = [torch.nn.functional.normalize(torch.randn(3, dtype=torch.float64), dim=0)]
    while len(steps) < n - 1:
        d = torch.nn.functional.normalize(torch.randn(3, dtype=torch.float64), dim=0)
        if 40 < math.degrees(math.acos(float(-steps[-1] @ d))) < 140:
            steps.append(d)
    walk = torch.cumsum(torch.stack(steps) * (1 + 0.1 * torch.rand(n - 1, 1, dtype=torch.float64)), 0)
    positions = torch.cat([torch.zeros(1, 3, dtype=torch.float64), walk]) + box / 2
    return positions - box * torch.floor(positions / box)


def _dihedral_angle(r, box, i, j, k, m):
    """The kernel's phi (mlx_atomistic_dihedral_geometry): the angle between the planes' normals,
    negative where the first bond points against the second normal."""
    ab, bc, cd = (_minimum_image(r[a] - r[b], box) for a, b in ((j, i), (j, k), (m, k)))
    n1, n2 = torch.cross(ab, bc, dim=-1), torch.cross(bc, cd, dim=-1)
    cosine = (n1 * n2).sum(-1) / (n1.norm(dim=-1) * n2.norm(dim=-1))
    return torch.acos(cosine) * torch.where((ab * n2).sum(-1) < 0, -1.0, 1.0)


def test_mlx_atomistic_fused_bonded_forces(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: fused_bonded_force_only
    (_fused_bonded_force_only), one thread per bonded term: harmonic bonds and angles, periodic
    dihedrals, harmonic impropers and Coulomb + Lennard-Jones exception pairs, each adding its
    forces to atomic outputs (float3 math, cross, acos, atan2, rint minimum images through
    `constant` box pointers); no CMAP terms (their arrays empty). Checked against -grad of the
    energies the kernel's force laws derive from, along a chain that crosses the box's faces."""
    n, box = 20, torch.full((3,), 6.0, dtype=torch.float64)
    r = _chain(n, box)
    idx = torch.arange(n)
    bonds, angles = torch.stack([idx[:-1], idx[1:]], 1), torch.stack([idx[:-2], idx[1:-1], idx[2:]], 1)
    dihedrals = torch.stack([idx[:-3], idx[1:-2], idx[2:-1], idx[3:]], 1)
    impropers, corrections = dihedrals[::4], torch.stack([idx[:-3:3], idx[3::3]], 1)
    bond_k, bond_length = torch.rand(len(bonds)) * 50 + 50, torch.rand(len(bonds)) * 0.2 + 0.95
    angle_k, angle_target = torch.rand(len(angles)) * 20 + 10, torch.rand(len(angles)) * 0.5 + 1.6
    dihedral_k, dihedral_phase = torch.rand(len(dihedrals)) * 3, torch.rand(len(dihedrals)) * 6 - 3
    dihedral_periodicity = torch.randint(1, 4, (len(dihedrals),)).float()
    improper_k, improper_phase = torch.rand(len(impropers)) * 10, torch.rand(len(impropers)) * 2 - 1
    improper_periodicity = torch.zeros(len(impropers))  # harmonic
    charge_products = torch.randn(len(corrections))
    lj_sigma, lj_epsilon = torch.rand(len(corrections)) * 0.3 + 0.8, torch.rand(len(corrections))
    coulomb = 1.4
    counts = [len(bonds), len(angles), len(dihedrals), len(impropers), 0, 2, len(corrections)]
    i32 = lambda t: t.reshape(-1).to(torch.int32)
    kernel = kk.metal_kernel(
        name="fused_bonded_force_only",
        input_names=["positions", "box", "bond_atoms", "bond_k", "bond_length", "angle_atoms",
                     "angle_k", "angle_target", "dihedral_atoms", "dihedral_k",
                     "dihedral_periodicity", "dihedral_phase", "improper_atoms", "improper_k",
                     "improper_periodicity", "improper_phase", "cmap_atoms", "cmap_indices",
                     "cmap_coefficients", "correction_atoms", "correction_charge_products",
                     "correction_lj_sigma", "correction_lj_epsilon", "correction_coulomb", "counts"],
        output_names=["forces"], source=_BONDED_FORCE_SOURCE, header=_BONDED_FORCE_HEADER,
        atomic_outputs=True)
    inputs = [r.float(), box.float(), i32(bonds), bond_k, bond_length, i32(angles), angle_k,
              angle_target, i32(dihedrals), dihedral_k, dihedral_periodicity, dihedral_phase,
              i32(impropers), improper_k, improper_periodicity, improper_phase,
              torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
              torch.zeros(1 * 2 * 2 * 4 * 4), i32(corrections), charge_products, lj_sigma,
              lj_epsilon, torch.tensor([coulomb]), torch.tensor(counts, dtype=torch.int32)]
    total = sum(counts) - counts[5]
    (forces,) = launch(kernel, device, inputs=on(device, *inputs), output_shapes=[r.shape],
                       output_dtypes=[torch.float32], grid=(total, 1, 1),
                       threadgroup=(min(256, total), 1, 1), init_value=0.0)

    x = r.float().double().requires_grad_()
    disp = lambda a, b: _minimum_image(x[a] - x[b], box)
    bond_d = disp(bonds[:, 0], bonds[:, 1]).norm(dim=-1)
    left, right = disp(angles[:, 0], angles[:, 1]), disp(angles[:, 2], angles[:, 1])
    theta = torch.acos((left * right).sum(-1) / (left.norm(dim=-1) * right.norm(dim=-1)))
    phi = _dihedral_angle(x, box, *dihedrals.T)
    shifted = _dihedral_angle(x, box, *impropers.T) + improper_phase.double()
    improper_delta = torch.atan2(torch.sin(shifted), torch.cos(shifted))
    pair_r = disp(corrections[:, 0], corrections[:, 1]).norm(dim=-1)
    sr6 = (lj_sigma.double() / pair_r) ** 6
    energy = (0.5 * bond_k.double() * (bond_d - bond_length.double()) ** 2).sum() \
        + (0.5 * angle_k.double() * (theta - angle_target.double()) ** 2).sum() \
        + (dihedral_k.double() * (1 + torch.cos(dihedral_periodicity.double() * phi
                                                + dihedral_phase.double()))).sum() \
        + (improper_k.double() * improper_delta ** 2).sum() \
        + (coulomb * charge_products.double() / pair_r + 4 * lj_epsilon.double() * (sr6 ** 2 - sr6)).sum()
    (grad,) = torch.autograd.grad(energy, x)
    close(forces, -grad, rtol=1e-3, atol=2e-3)


def _bspline5(x):
    """The cardinal B-spline M_5 (support [0, 5]), by its recursion from M_2."""
    def m(order, x):
        if order == 2:
            return torch.clamp(1 - (x - 1).abs(), min=0)
        return (x * m(order - 1, x) + (order - x) * m(order - 1, x - 1)) / (order - 1)
    return m(5, x)


def test_mlx_atomistic_pme_order5_spread(device):
    """appautomaton/mlx-atomistic, src/mlx_atomistic/metal_kernels.py: pme_order5_spread, smooth
    PME charge spreading: five threads per atom (one per z offset), each adding 25 weighted
    charges into the periodic mesh through atomic outputs; the order-five B-spline weights from
    a float3 recurrence in the header. The grid point floor(u) - 2 + j gets M_5(frac(u) + 4 - j)
    of the charge (the kernel's anchor, u the scaled fractional coordinate)."""
    n = 13
    cell, mesh = torch.tensor([3.0, 2.5, 2.8]), (8, 6, 7)
    positions = torch.rand(n, 3) * cell * 1.4 - 0.2 * cell   # some outside the cell
    charges = torch.randn(n)
    kernel = kk.metal_kernel(name="pme_order5_spread",
                             input_names=["positions", "charges", "cell", "mesh", "counts"],
                             output_names=["charge_grid"], source=_PME_ORDER5_SPREAD_SOURCE,
                             header=_PME_ORDER5_HEADER, atomic_outputs=True)
    (grid,) = launch(kernel, device, inputs=on(device, positions, charges, cell,
                                               torch.tensor(mesh, dtype=torch.int32),
                                               torch.tensor([n], dtype=torch.int32)),
                     output_shapes=[(math.prod(mesh),)], output_dtypes=[torch.float32],
                     grid=(n * 5, 1, 1), threadgroup=(min(256, n * 5), 1, 1), init_value=0.0)
    p, c = positions.double(), cell.double()
    u = (p - torch.floor(p / c) * c) / c * torch.tensor(mesh, dtype=torch.float64)
    expected = torch.zeros(mesh, dtype=torch.float64)
    j = torch.arange(5)
    for a in range(n):
        points = [(torch.floor(u[a, d]).long() - 2 + j) % mesh[d] for d in range(3)]
        w = [_bspline5(u[a, d] - torch.floor(u[a, d]) + 4 - j) for d in range(3)]
        expected.index_put_(torch.meshgrid(*points, indexing="ij"),
                            charges[a].double() * w[0][:, None, None] * w[1][None, :, None] * w[2],
                            accumulate=True)
    close(grid.reshape(mesh), expected, rtol=1e-4, atol=1e-5)
