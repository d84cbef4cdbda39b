"""The MSL subset of SPEC §4, item by item, on every backend (the `device` fixture).

Each test runs real kernel bodies written as one would for Metal and checks them against a
model in Python or torch: exactly on integer data (and on floats where the result is exact),
within a few ulps where a math library is involved. Several checks share one kernel, one
column of the output each, to keep the number of compiled kernels small.
"""

import math

import pytest
import torch

import kernelkit as kk


def launch(kernel, device, inputs, shapes, dtypes, grid, group, **kw):
    return kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                  threadgroup=group, stream=device, **kw)


def columns_body(prelude, out, columns, ctype="int64_t"):
    """A body writing column c of row i of `out` from the expression columns[c]."""
    lines = [prelude, f"    device {ctype}* row_ = {out} + i * {len(columns)};"]
    lines += [f"    row_[{c}] = {ctype}({expr});" for c, expr in enumerate(columns)]
    return "\n".join(lines) + "\n"


def rand_int(lo, hi, n, device):
    return torch.randint(lo, hi, (n,), dtype=torch.int32, device=device)


def u32(v):
    return int(v) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Address spaces


def test_address_spaces(device):
    header = """
inline float load(const device float* src, uint j) { return src[j]; }
inline void store(device float* dst, uint j, float v) { dst[j] = v; }
inline float neighbour(threadgroup const float* buf, uint j) { return buf[j]; }
inline void accumulate(thread float& acc, float x) { acc += x; }
inline float first(const thread float* p) { return p[0]; }
inline float times(const constant float& r, float x) { return r * x; }
"""
    body = """
    uint i = thread_position_in_grid.x;
    uint t = thread_index_in_threadgroup;
    uint n = threads_per_threadgroup.x;
    threadgroup float tile[64];          // shared by the threadgroup, one per group
    threadgroup float pair[2][64];
    threadgroup float* tp = tile;
    tile[t] = load(inp, i);
    pair[t % 2][t] = float(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    thread float acc = 0.0f;
    accumulate(acc, neighbour(tp, (t + 1) % n));
    thread float& ref = acc;
    ref += times(s, tile[t]);            // the scalar input is a `const constant float&`
    float local[2] = {acc, float(n)};
    device float* o = out + i * 4;
    store(o, 0, first(local));
    store(o, 1, local[1]);
    o[2] = tp[(t + n - 1) % n];
    o[3] = pair[t % 2][t];
"""
    k = kk.metal_kernel(name="address_spaces", input_names=["inp", "s"], output_names=["out"],
                        source=body, header=header)
    n, group = 64 * 3 + 40, 64  # a partial last group of 40
    x = torch.randint(-100, 100, (n,), device=device).float()
    s = 0.5
    out = launch(k, device, [x, s], [(n, 4)], [torch.float32], (n, 1, 1), (group, 1, 1))[0].cpu()
    x = x.cpu()
    ref = torch.empty(n, 4)
    for i in range(n):
        g0, t = i - i % group, i % group
        size = min(group, n - g0)
        ref[i] = torch.tensor([x[g0 + (t + 1) % size] + s * x[i], size, x[g0 + (t - 1) % size], t])
    assert torch.equal(out, ref)


CONSTANT_FORMS = {
    "array": ("constant float kTable[4] = {0.5f, 1.0f, 2.0f, 4.0f};", "kTable[i % 4]",
              lambda i: [0.5, 1.0, 2.0, 4.0][i % 4]),
    "scalar": ("constant int kBias = 3;", "float(kBias)", lambda i: 3.0),
    "vector": ("constant float2 kOff = float2(0.25f, -0.5f);", "kOff.x + kOff.y", lambda i: -0.25),
    "constexpr": ("static constant constexpr const int kN = 7;", "float(kN)", lambda i: 7.0),
    "mlx_macro": ("#define MLX_MTL_CONST static constant constexpr const\nMLX_MTL_CONST int SIMD_SIZE = 32;",
                  "float(SIMD_SIZE)", lambda i: 32.0),
    "reference_param": ("constant float kScale[2] = {3.0f, 5.0f};\n"
                        "inline float scaled(constant float& r, float x) { return r * x; }",
                        "scaled(kScale[i % 2], 2.0f)", lambda i: [6.0, 10.0][i % 2]),
    "pointer_param": ("constant float kW[3] = {1.0f, 2.0f, 3.0f};\n"
                      "inline float sum3(constant float* w) { return w[0] + w[1] + w[2]; }",
                      "sum3(kW)", lambda i: 6.0),
}


@pytest.mark.parametrize("form", list(CONSTANT_FORMS))
def test_program_scope_constant(device, form):
    header, expr, model = CONSTANT_FORMS[form]
    body = f"uint i = thread_position_in_grid.x;\nout[i] = {expr} + inp[i];\n"
    k = kk.metal_kernel(name=f"constant_{form}", input_names=["inp"], output_names=["out"],
                        source=body, header=header)
    x = torch.randint(-50, 50, (37,), device=device).float()
    out = launch(k, device, [x], [(37,)], [torch.float32], (37, 1, 1), (16, 1, 1))[0].cpu()
    ref = x.cpu() + torch.tensor([model(i) for i in range(37)])
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------
# Scalar types


def test_scalar_types_promotion_and_conversions(device):
    body = """
    uint i = thread_position_in_grid.x;
    half x = h[i];
    bfloat bx = b[i];
    float16_t hy = float16_t(f[i]);      // float -> half, to nearest even
    bfloat16_t by = bfloat16_t(f[i]);    // float -> bfloat, to nearest even
    static_assert(is_same<decltype(x * x), half>::value, "half * half is half");
    static_assert(is_same<decltype(x * 2.0f), float>::value, "half * float is float");
    static_assert(is_same<decltype(x + 1), half>::value, "half + int is half");
    static_assert(is_same<decltype(bx * bx), bfloat>::value, "bfloat * bfloat is bfloat");
    static_assert(is_same<decltype(bx * 1.0f), float>::value, "bfloat * float is float");
    static_assert(is_same<float16_t, half>::value && is_same<bfloat16_t, bfloat>::value, "aliases");
    static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2 && sizeof(ushort) == 2 &&
                  sizeof(uchar) == 1 && sizeof(uint) == 4 && sizeof(int64_t) == 8 &&
                  sizeof(size_t) == 8, "sizes");
    oh[i * 4 + 0] = x * x;
    oh[i * 4 + 1] = hy;
    oh[i * 4 + 2] = x + 1;
    oh[i * 4 + 3] = half(s[i]) * half(3);
    ob[i * 2 + 0] = bx * bx;
    ob[i * 2 + 1] = by;
    of[i * 4 + 0] = x * f[i];
    of[i * 4 + 1] = bx * 0.5f;
    of[i * 4 + 2] = float(x) + float(bx);
    of[i * 4 + 3] = float(hy) - f[i];
    uint u = as_type<uint>(w[i]);
    ushort us = ushort(u);
    us += ushort(40000);
    uchar uc = uchar(u);
    uc = uchar(uc + 200);
    int64_t big = int64_t(w[i]) * 3000000000L + s[i];
    size_t sz = size_t(u) * 8 + sizeof(float4);
    device int64_t* o = oi + i * 10;
    o[0] = u * 2654435761u;
    o[1] = uint(0) - u;
    o[2] = us;
    o[3] = uc;
    o[4] = big;
    o[5] = int64_t(sz);
    o[6] = int(f[i] * 10.5f);
    o[7] = int(x);
    o[8] = uint(s[i]);
    o[9] = ushort(s[i]);
"""
    k = kk.metal_kernel(name="scalar_types", input_names=["h", "b", "f", "w", "s"],
                        output_names=["oh", "ob", "of", "oi"], source=body)
    n = 300
    f = torch.randn(n, device=device) * 8
    h = (torch.randn(n, device=device) * 8).half()
    b = (torch.randn(n, device=device) * 8).bfloat16()
    w = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)
    s = rand_int(-40000, 40000, n, device)
    oh, ob, of, oi = launch(k, device, [h, b, f, w, s], [(n, 4), (n, 2), (n, 4), (n, 10)],
                            [torch.float16, torch.bfloat16, torch.float32, torch.int64],
                            (n, 1, 1), (64, 1, 1))
    h, b, f, w, s = (t.cpu() for t in (h, b, f, w, s))
    hf, bf = h.float(), b.float()
    ref_h = torch.stack([(hf * hf).half(), f.half(), (hf + 1).half(),
                         (s.half().float() * 3).half()], 1)
    ref_b = torch.stack([(bf * bf).bfloat16(), f.bfloat16()], 1)
    ref_f = torch.stack([hf * f, bf * 0.5, hf + bf, f.half().float() - f], 1)
    assert torch.equal(oh.cpu(), ref_h)
    assert torch.equal(ob.cpu(), ref_b)
    assert torch.equal(of.cpu(), ref_f)
    rows = []
    for wi, si, fi, hi in zip(w.tolist(), s.tolist(), f.tolist(), h.float().tolist()):
        u = u32(wi)
        rows.append([(u * 2654435761) & 0xFFFFFFFF, (-u) & 0xFFFFFFFF, (u + 40000) & 0xFFFF,
                     ((u & 0xFF) + 200) & 0xFF, wi * 3000000000 + si, u * 8 + 16,
                     math.trunc(float(torch.tensor(fi) * torch.tensor(10.5))), math.trunc(hi),
                     u32(si), si & 0xFFFF])
    assert oi.cpu().tolist() == rows


# ---------------------------------------------------------------------------------------------
# Vector types

VEC_FLOAT = [
    "p.x", "p.y", "q.z", "c.g", "bgr.x", "v.r", "v.a", "m.y", "m.z", "m.w",
    "(bc + b3).y", "sw.x", "sw.w", "dup.y", "dup.z", "f3.z", "f4.w", "v5.x", "v5[2]", "ar.y",
    "dot(v.xy, w.xy)", "float(hh.y)", "float(h3.z)", "fv.w", "sel.x", "sel.w", "v.bgr.z",
    "length_squared(w.xy)",
]
VEC_INT = [
    "r.x", "r.y", "r.z", "r.w", "r2.x", "r2.y", "sh.z", "uv.w", "u2.y", "u3.y",
    "all(gt)", "any(gt)", "gt.y", "b2v.x + 2 * b2v.y", "eq.x + 2 * eq.y + 4 * eq.z", "ng.w",
    "both.z", "int(iv.wzyx.x)", "int(b4.a) + 2 * int(b4.r)",
]


def test_compound_assignment_of_half_and_bfloat_to_builtins(device):
    """`float s; s += h;` (and -=, *=, /=, and on ints) with a half or bfloat right operand, as
    MLX's quantized kernels accumulate: s = s op h in Metal's promotion, converted back to s's
    type (a real-world kernel failed to compile: mlx-vlm's qwen3_5 verify kernel)."""
    body = """
    uint i = thread_position_in_grid.x;
    float s = f[i];
    s += h[i]; s *= b[i]; s -= h[i]; s /= b[i];
    int n = int(f[i]);
    n += h[i]; n *= b[i];
    out[i * 2 + 0] = s;
    out[i * 2 + 1] = float(n);
"""
    k = kk.metal_kernel(name="compound_f16", input_names=["f", "h", "b"], output_names=["out"], source=body)
    n = 64
    f = torch.randn(n, device=device) * 8
    h = (torch.rand(n, device=device) + 0.5).half()
    b = (torch.rand(n, device=device) + 0.5).bfloat16()
    out = launch(k, device, [f, h, b], [(n, 2)], [torch.float32], (n, 1, 1), (32, 1, 1))[0]
    s = f.clone()
    s = s + h.float(); s = s * b.float(); s = s - h.float(); s = s / b.float()
    m = f.to(torch.int32)
    m = (m + h).to(torch.int32)  # int op half is half, int op bfloat bfloat: torch promotes alike
    m = (m * b).to(torch.int32)
    torch.testing.assert_close(out[:, 0], s, rtol=1e-6, atol=1e-6)
    assert torch.equal(out[:, 1], m.float())


def test_conditional_of_half_or_bfloat_and_another_type(device):
    """`c ? h : 0.0f`: a half or bfloat operand and another arithmetic one meet at their usual
    arithmetic type, as in MSL (C++ finds each convertible to the other and refuses: mlx-lm's
    KL-divergence kernels, `(offset + j < V) ? logits_q[offset + j] : -1e30` on bf16 logits, failed
    to compile). Same-typed operands keep their value category; chains and nesting work."""
    body = """
    uint i = thread_position_in_grid.x;
    static_assert(is_same<decltype(i ? h[0] : 1.0f), float>::value, "half : float is float");
    static_assert(is_same<decltype(i ? h[0] : b[0]), float>::value, "half : bfloat is float");
    static_assert(is_same<remove_cv_t<decltype(i ? b[0] : 2)>, bfloat>::value, "bfloat : int");
    static_assert(is_same<decltype(i ? h[0] : h[1]), const half&>::value, "an lvalue stays one");
    float lo = (i % 2) ? h[i] : -1e30;
    float mixed = (i % 3) ? 0.5f : b[i];
    half whole = (i % 2) ? h[i] : 2;
    float chain = i % 4 == 0 ? h[i] : i % 4 == 1 ? b[i] : i % 4 == 2 ? 0.25f : f[i];
    float x = 0, y = 0;
    (i % 2 ? x : y) = max(i % 5 ? h[i] : 1.5f, i % 7 ? b[i] : -2.0f);
    out[i * 5 + 0] = lo;
    out[i * 5 + 1] = mixed;
    out[i * 5 + 2] = whole;
    out[i * 5 + 3] = chain;
    out[i * 5 + 4] = x - y;
"""
    k = kk.metal_kernel(name="conditional_f16", input_names=["f", "h", "b"], output_names=["out"],
                        source=body)
    n = 64
    f = torch.randn(n, device=device)
    h = torch.randn(n, device=device).half()
    b = torch.randn(n, device=device).bfloat16()
    out = launch(k, device, [f, h, b], [(n, 5)], [torch.float32], (n, 1, 1), (32, 1, 1))[0]
    i = torch.arange(n, device=device)
    hf, bf = h.float(), b.float()
    chain = torch.where(i % 4 == 0, hf, torch.where(i % 4 == 1, bf, torch.where(i % 4 == 2, 0.25, f)))
    picked = torch.maximum(torch.where(i % 5 > 0, hf, 1.5), torch.where(i % 7 > 0, bf, -2.0))
    expected = torch.stack([torch.where(i % 2 > 0, hf, -1e30), torch.where(i % 3 > 0, 0.5, bf),
                            torch.where(i % 2 > 0, hf, 2.0), chain,
                            torch.where(i % 2 > 0, picked, -picked)], 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_vector_types(device):
    body = """
    uint i = thread_position_in_grid.x;
    const device float4* a4 = (const device float4*)(a);
    float4 v = a4[i];
    float4 w = reinterpret_cast<const device float4*>(bq)[i];
    float2 p = v.xy + v.zw;
    float3 q = v.xyz * 2.0f;
    float3 c = v.rgb;
    float3 bgr = v.bgr;
    float4 m = float4(v.xy, 1, 2);
    float4 bc = float4(0.5f);
    float4 b3 = 3.0f;
    float4 sw = v.wzyx * w;
    float4 dup = v.xxyy;
    float3 f3 = float3(v.x, v.yz);
    float4 f4 = float4(v.xyz, 0);
    float4 v5 = v;
    v5.x = 5.0f;
    float4 ar = (v - w) / 2.0f + -w;
    half4 hv = half4(w);
    half2 hh = hv.xy * hv.zw;
    half3 h3 = hv.xyz + half3(1);
    float4 fv = float4(hv);
    bool4 gt = w > 0.0f;
    float4 sel = select(w, -w, gt);
    int4 iv = reinterpret_cast<const device int4*>(iq)[i];
    int4 r = iv * 3 - int4(1, 2, 3, 4);
    int2 r2 = iv.xy % 5;
    int3 sh = iv.xyz >> 1;
    uint4 uv = uint4(iv) + 1u;
    uint2 u2 = uv.xy & uint2(0xff, 0xf0f0);
    uint3 u3 = uint3(7, 8, 9) * uv.xyz;
    bool2 b2v = bool2(true, false);
    bool3 eq = iv.xyz == int3(0, 1, 2);
    bool4 ng = !gt;
    bool4 both = gt && (w < 1.0f);
    bool4 b4 = bool4(iv > 0);
""" + "".join(f"    of[i * {len(VEC_FLOAT)} + {c}] = {e};\n" for c, e in enumerate(VEC_FLOAT)) \
        + "".join(f"    oi[i * {len(VEC_INT)} + {c}] = int64_t({e});\n" for c, e in enumerate(VEC_INT))
    k = kk.metal_kernel(name="vector_types", input_names=["a", "bq", "iq"], output_names=["of", "oi"],
                        source=body)
    n = 150
    a = torch.randn(n, 4, device=device)
    bq = torch.randn(n, 4, device=device)
    iq = torch.randint(-1000, 1000, (n, 4), dtype=torch.int32, device=device)
    iq[::7, :3] = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)  # some equal to int3(0,1,2)
    of, oi = launch(k, device, [a, bq, iq], [(n, len(VEC_FLOAT)), (n, len(VEC_INT))],
                    [torch.float32, torch.int64], (n, 1, 1), (32, 1, 1))
    v, w, iv = a.cpu(), bq.cpu(), iq.cpu().long()
    hw = w.half().float()
    gt = w > 0
    cols_f = {
        "p.x": v[:, 0] + v[:, 2], "p.y": v[:, 1] + v[:, 3], "q.z": v[:, 2] * 2, "c.g": v[:, 1],
        "bgr.x": v[:, 2], "v.r": v[:, 0], "v.a": v[:, 3], "m.y": v[:, 1], "m.z": 1.0, "m.w": 2.0,
        "(bc + b3).y": 3.5, "sw.x": v[:, 3] * w[:, 0], "sw.w": v[:, 0] * w[:, 3], "dup.y": v[:, 0],
        "dup.z": v[:, 1], "f3.z": v[:, 2], "f4.w": 0.0, "v5.x": 5.0, "v5[2]": v[:, 2],
        "ar.y": (v[:, 1] - w[:, 1]) / 2 - w[:, 1],
        "dot(v.xy, w.xy)": v[:, 0].double() * w[:, 0] + v[:, 1].double() * w[:, 1],
        "float(hh.y)": (hw[:, 1] * hw[:, 3]).half().float(), "float(h3.z)": (hw[:, 2] + 1).half().float(),
        "fv.w": hw[:, 3], "sel.x": torch.where(gt[:, 0], -w[:, 0], w[:, 0]),
        "sel.w": torch.where(gt[:, 3], -w[:, 3], w[:, 3]), "v.bgr.z": v[:, 0],
        "length_squared(w.xy)": w[:, 0].double() ** 2 + w[:, 1].double() ** 2,
    }
    ref_f = torch.stack([torch.as_tensor(cols_f[e], dtype=torch.float64).expand(n) for e in VEC_FLOAT], 1)
    torch.testing.assert_close(of.cpu().double(), ref_f, rtol=1e-6, atol=1e-6)
    uv = (iv + 1) & 0xFFFFFFFF
    eq = (iv[:, :3] == torch.tensor([0, 1, 2])).long()
    cols_i = {
        "r.x": iv[:, 0] * 3 - 1, "r.y": iv[:, 1] * 3 - 2, "r.z": iv[:, 2] * 3 - 3, "r.w": iv[:, 3] * 3 - 4,
        "r2.x": torch.fmod(iv[:, 0], 5), "r2.y": torch.fmod(iv[:, 1], 5), "sh.z": iv[:, 2] >> 1,
        "uv.w": uv[:, 3], "u2.y": uv[:, 1] & 0xF0F0, "u3.y": (8 * uv[:, 1]) & 0xFFFFFFFF,
        "all(gt)": gt.all(1).long(), "any(gt)": gt.any(1).long(), "gt.y": gt[:, 1].long(),
        "b2v.x + 2 * b2v.y": 1, "eq.x + 2 * eq.y + 4 * eq.z": eq[:, 0] + 2 * eq[:, 1] + 4 * eq[:, 2],
        "ng.w": (~gt[:, 3]).long(), "both.z": (gt[:, 2] & (w[:, 2] < 1)).long(),
        "int(iv.wzyx.x)": iv[:, 3], "int(b4.a) + 2 * int(b4.r)": (iv[:, 3] > 0).long() + 2 * (iv[:, 0] > 0).long(),
    }
    ref_i = torch.stack([torch.as_tensor(cols_i[e], dtype=torch.int64).expand(n) for e in VEC_INT], 1)
    assert torch.equal(oi.cpu(), ref_i)


ARRAY_HEADER = """
#include <metal_array>
using namespace metal;

// value semantics: passed, returned and assigned whole
array<float, 4> reversed(array<float, 4> v) {
    array<float, 4> r;
    for (size_t j = 0; j < v.size(); ++j) r[j] = v[v.size() - 1 - j];
    return r;
}
float total(array_ref<float> xs) {
    float s = 0.0f;
    for (float x : xs) s += x;
    return s;
}
constant array<int, 3> weights = {1, 10, 100};
"""


ADDRESS_SPACE_OVERLOADS = """
inline float total(device const float4& v) { return v.x + v.y + v.z + v.w; }
inline float total(thread const float4& v) { return v.x + v.y + v.z + v.w; }
template <typename T> T first(const device T* p) { return p[0]; }
template <typename T> T first(const threadgroup T* p) { return p[0]; }
struct Sum {
  float s = 0;
  METAL_FUNC void add(const device float* p, int n) { for (int i = 0; i < n; ++i) s += p[i]; }
  METAL_FUNC void add(const threadgroup float* p, int n) { for (int i = 0; i < n; ++i) s += p[i]; }
};
"""


def test_overloads_on_address_spaces_alone(device):
    """MSL overloads on address spaces (a function for device memory, one for threadgroup memory);
    with one flat address space they are one definition twice: the later, the same token for
    token once the address spaces are gone, is dropped, its lines kept (errors after it still
    name their lines)."""
    body = """
    uint i = thread_position_in_grid.x;
    threadgroup float tg[64];
    tg[i % 64] = a[4 * i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float4 t = float4(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
    Sum s;
    s.add(a + 4 * i, 4);
    s.add(tg, 2);
    out[2 * i] = total(reinterpret_cast<device const float4*>(a)[i]) + 10.0f * total(t);
    out[2 * i + 1] = first(a + 4 * i) + 10.0f * first(tg + 1) + 100.0f * s.s;
"""
    k = kk.metal_kernel(name="address_space_overloads", input_names=["a"], output_names=["out"], source=body,
                        header=ADDRESS_SPACE_OVERLOADS)
    n = 64
    a = torch.randn(n, 4, device=device)
    (out,) = launch(k, device, [a], [(n, 2)], [torch.float32], (n, 1, 1), (64, 1, 1))
    v = a.cpu().double()
    ref = torch.stack([11 * v.sum(1), v[:, 0] + 10 * v[1, 0] + 100 * (v.sum(1) + v[0, 0] + v[1, 0])], 1)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-5, atol=1e-4)

    # #if / #else alternatives stay, whichever branch is taken
    branches = "#if KK_BRANCH\ninline float two(device const float* p) { return p[0] + p[1]; }\n#else\n" \
               "inline float two(thread const float* p) { return p[0] + p[1]; }\n#endif\n"
    for flag, src in ((1, "out[0] = two(a);"), (0, "float v[2] = {a[0], a[1]}; out[0] = two(v);")):
        k = kk.metal_kernel(name=f"branch{flag}", input_names=["a"], output_names=["out"],
                            header=f"#define KK_BRANCH {flag}\n" + branches, source=src)
        (out,) = launch(k, device, [a], [(1,)], [torch.float32], (1, 1, 1), (1, 1, 1))
        torch.testing.assert_close(out.cpu().double(), (v[0, 0] + v[0, 1]).reshape(1), rtol=1e-5, atol=1e-5)

    # Two definitions the same as written are a redefinition in MSL too; a later error keeps its line.
    twice = "inline float one() { return 1.0f; }\ninline float one() { return 1.0f; }\n"
    with pytest.raises(kk.CompileError, match="redefinition"):
        launch(kk.metal_kernel(name="twice", input_names=["a"], output_names=["out"], header=twice,
                               source="out[0] = one();"), device, [a], [(1,)], [torch.float32], (1, 1, 1), (1, 1, 1))
    with pytest.raises(kk.CompileError, match="header line 11"):
        launch(kk.metal_kernel(name="after_overloads", input_names=["a"], output_names=["out"],
                               header=ADDRESS_SPACE_OVERLOADS + "inline float broken() { return undeclared_name; }\n",
                               source="out[0] = a[0];"), device, [a], [(1,)], [torch.float32], (1, 1, 1), (1, 1, 1))


def test_metal_array_and_array_ref(device):
    body = """
    uint i = thread_position_in_grid.x;
    array<float, 4> v = {a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]};
    array<float, 4> r = reversed(v);
    array<float, 4> c = r;
    c[0] = 7.0f;  // a copy: r is unchanged
    float plain[3] = {v[0], v[1], 2.0f};
    array<int, 2> z = {};
    const device array<float, 4>* rows = (const device array<float, 4>*)(a);
    out[8 * i + 0] = r[0] + 10.0f * r.back();
    out[8 * i + 1] = c[0] + r.front();
    out[8 * i + 2] = total(v);
    out[8 * i + 3] = total(make_array_ref(plain));
    out[8 * i + 4] = total(array_ref<float>(v.data() + 1, 2)) + float(v.empty()) + float(v.size());
    out[8 * i + 5] = float(weights[0] + weights[1] + weights[2] + z[0] + z[1]);
    out[8 * i + 6] = rows[i][2];
    out[8 * i + 7] = total(make_array_ref(c.begin(), c.end()));
"""
    k = kk.metal_kernel(name="metal_array", input_names=["a"], output_names=["out"], source=body,
                        header=ARRAY_HEADER)
    n = 70
    a = torch.randn(n, 4, device=device)
    (out,) = launch(k, device, [a], [(n, 8)], [torch.float32], (n, 1, 1), (32, 1, 1))
    v = a.cpu().double()
    c = v.flip(1).clone()
    c[:, 0] = 7
    ref = torch.stack([v[:, 3] + 10 * v[:, 0], 7 + v[:, 3], v.sum(1), v[:, 0] + v[:, 1] + 2,
                       v[:, 1] + v[:, 2] + 4, torch.full((n,), 111.0, dtype=torch.float64), v[:, 2],
                       c.sum(1)], 1)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-6, atol=1e-6)


PACK_COLUMNS = [
    "pack_float_to_unorm4x8(v)", "pack_float_to_snorm4x8(v * 2.0f - 1.0f)", "pack_float_to_unorm2x16(v.xy)",
    "pack_float_to_snorm2x16(v.zw * 2.0f - 1.0f)", "pack_float_to_unorm10a2(v)", "uint(pack_float_to_unorm565(v.xyz))",
    "pack_float_to_srgb_unorm4x8(v)", "pack_half_to_unorm4x8(half4(v))",
]
UNPACK_COLUMNS = [
    "unpack_unorm4x8_to_float(w).y", "unpack_snorm4x8_to_float(w).w", "unpack_unorm2x16_to_float(w).x",
    "unpack_snorm2x16_to_float(w).y", "unpack_unorm10a2_to_float(w).z", "unpack_unorm10a2_to_float(w).w",
    "unpack_unorm565_to_float(ushort(w)).y", "unpack_unorm4x8_srgb_to_float(w).x", "float(unpack_snorm4x8_to_half(w).x)",
]


def test_pack_and_unpack(device):
    """<metal_pack>: fields packed with the first component lowest, MSL's normalized-integer
    conversions (round to nearest even, clamped; snorm's -128 reads as -1), sRGB on colour only."""
    body = """
    uint i = thread_position_in_grid.x;
    float4 v = ((const device float4*)a)[i];
    uint w = words[i];
""" + "".join(f"    packed[i * {len(PACK_COLUMNS)} + {c}] = {e};\n" for c, e in enumerate(PACK_COLUMNS)) \
        + "".join(f"    unpacked[i * {len(UNPACK_COLUMNS)} + {c}] = {e};\n" for c, e in enumerate(UNPACK_COLUMNS))
    k = kk.metal_kernel(name="pack_unpack", input_names=["a", "words"], output_names=["packed", "unpacked"],
                        source=body, header="#include <metal_pack>\n")
    n = 300
    a = torch.rand(n, 4, device=device) * 1.2 - 0.1  # some past [0, 1]: clamped
    a[:5] = torch.tensor([[0.5 / 255, 1.5 / 255, 2.5 / 255, 0.0], [1.0, 0.0, 0.25, 0.75], [0.0031308, 0.04, 0.5, 1.0],
                          [float("nan"), 0.5, 0.5, 0.5], [-0.2, 1.3, 0.999, 0.001]], device=device)
    words = torch.randint(0, 2**32, (n,), dtype=torch.int64, device=device).to(torch.uint32)
    words[:3] = torch.tensor([0x80808080, 0x8000_0001, 0xFFFF_FFFF], dtype=torch.int64, device=device).to(torch.uint32)
    packed, unpacked = launch(k, device, [a, words],
                              [(n, len(PACK_COLUMNS)), (n, len(UNPACK_COLUMNS))], [torch.uint32, torch.float32],
                              (n, 1, 1), (64, 1, 1))
    v = a.cpu()  # float32: the products are the kernel's, so that a half-way one rounds as there

    def unorm(x, bits):
        x = torch.nan_to_num(x.float(), nan=0.0).clamp(0, 1)
        return torch.round(x * (2**bits - 1)).long()  # torch.round: halves to even, as rint

    def snorm(x, bits):
        q = torch.round(torch.nan_to_num(x.float(), nan=0.0).clamp(-1, 1) * (2 ** (bits - 1) - 1)).long()
        return q & (2**bits - 1)

    def srgb(c):
        c = torch.nan_to_num(c.double(), nan=0.0).clamp(0, 1)
        return torch.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)

    def fields(parts):
        out = torch.zeros(n, dtype=torch.long)
        for val, shift in parts:
            out |= val << shift
        return out

    x, y, z, w_ = v.unbind(1)
    hv = v.half().float()
    ref_packed = torch.stack([
        fields([(unorm(x, 8), 0), (unorm(y, 8), 8), (unorm(z, 8), 16), (unorm(w_, 8), 24)]),
        fields([(snorm(c * 2 - 1, 8), 8 * j) for j, c in enumerate((x, y, z, w_))]),
        fields([(unorm(x, 16), 0), (unorm(y, 16), 16)]),
        fields([(snorm(z * 2 - 1, 16), 0), (snorm(w_ * 2 - 1, 16), 16)]),
        fields([(unorm(x, 10), 0), (unorm(y, 10), 10), (unorm(z, 10), 20), (unorm(w_, 2), 30)]),
        fields([(unorm(x, 5), 0), (unorm(y, 6), 5), (unorm(z, 5), 11)]),
        fields([(unorm(srgb(x), 8), 0), (unorm(srgb(y), 8), 8), (unorm(srgb(z), 8), 16), (unorm(w_, 8), 24)]),
        fields([(unorm(c, 8), 8 * j) for j, c in enumerate(hv.unbind(1))]),
    ], 1)
    got = packed.cpu().to(torch.int64) & 0xFFFFFFFF
    # the sRGB column (a pow in float32 against float64's) may land a step off at a half-way value
    exact = [c for c in range(len(PACK_COLUMNS)) if c != 6]
    assert torch.equal(got[:, exact], ref_packed[:, exact])
    srgb_diff = torch.stack([((got[:, 6] >> s) & 255) - ((ref_packed[:, 6] >> s) & 255) for s in (0, 8, 16, 24)])
    assert srgb_diff.abs().max() <= 1

    u = words.cpu().to(torch.int64)

    def field(shift, bits):
        return (u >> shift) & (2**bits - 1)

    def signed(f, bits):
        return torch.where(f >= 2 ** (bits - 1), f - 2**bits, f).double()

    def lin(c):
        return torch.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)

    ref_unpacked = torch.stack([
        field(8, 8) / 255.0, (signed(field(24, 8), 8) / 127).clamp(min=-1), field(0, 16) / 65535.0,
        (signed(field(16, 16), 16) / 32767).clamp(min=-1), field(20, 10) / 1023.0, field(30, 2) / 3.0,
        field(5, 6) / 63.0, lin(field(0, 8) / 255.0), (signed(field(0, 8), 8) / 127).clamp(min=-1).half().double(),
    ], 1)
    torch.testing.assert_close(unpacked.cpu().double(), ref_unpacked, rtol=2e-6, atol=1e-6)


def test_every_metal_header_is_includable(device):
    """Each Metal header name kernelkit's include directory answers (the prelude holds their
    contents: including one adds nothing), in a header as Metal code writes them."""
    from kernelkit.backends.cuda import INCLUDE
    names = sorted(p.name for p in INCLUDE.iterdir() if p.is_file() and p.name.startswith("metal_"))
    assert {"metal_stdlib", "metal_array", "metal_pack", "metal_limits", "metal_quadgroup"} <= set(names)
    header = "".join(f"#include <{n}>\n" for n in names) + "using namespace metal;\n"
    k = kk.metal_kernel(name="every_header", input_names=["a"], output_names=["out"], header=header,
                        source="out[thread_position_in_grid.x] = numeric_limits<float>::max() > a[0] ? 1 : 0;")
    (out,) = launch(k, device, [torch.zeros(1, device=device)], [(4,)], [torch.int32], (4, 1, 1), (4, 1, 1))
    assert out.tolist() == [1, 1, 1, 1]


def test_swizzles_written_and_float16_literals(device):
    """MSL §2.2.1: a swizzle on the left of `=` or a compound assignment writes its components (each
    once; a repeated one is a compile error); §2.1: 0.5h / 0.5H half and 0.5bf / 0.5BF bfloat literals
    (0xbf stays an int)."""
    body = """
    uint i = thread_position_in_grid.x;
    float4 v = float4(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
    v.xy = float2(v.w, 9.0f);
    v.wx += 1.0f;
    v.zw *= float2(2, 3);
    packed_float3 p = packed_float3(v.x, v.y, v.z);
    p.zx = p.xy;
    int4 m = int4(i);
    m.yw <<= 2;
    m.zy ^= int2(1, 2);
    half h = 0.5h + 1.25H;
    bfloat b = 2bf * 0.5BF;
    float4 r = float4(v.xyz, v.w);
    out[8 * i] = r.x; out[8 * i + 1] = r.y; out[8 * i + 2] = r.z; out[8 * i + 3] = r.w;
    out[8 * i + 4] = p.z + 10.0f * p.x;
    out[8 * i + 5] = float(m.y + m.z * 1000 + m.w * 100000);
    out[8 * i + 6] = float(h) + float(b);
    out[8 * i + 7] = float(0xbf);
"""
    k = kk.metal_kernel(name="swizzle_writes", input_names=["a"], output_names=["out"], source=body)
    n = 40
    a = torch.randint(-50, 50, (n, 4), device=device).float()
    out = launch(k, device, [a], [(n, 8)], [torch.float32], (n, 1, 1), (32, 1, 1))[0].cpu().double()
    x, y, z, w = a.cpu().double().unbind(1)
    vx, vy, vz, vw = w + 1, torch.full_like(x, 9.0), z * 2, (w + 1) * 3   # v.xy = (w, 9); v.wx += 1; v.zw *= (2, 3)
    i = torch.arange(n)
    my, mz, mw = ((4 * i) ^ 2).double(), (i ^ 1).double(), (4 * i).double()  # m.yw <<= 2; m.zy ^= (1, 2)
    ref = torch.stack([vx, vy, vz, vw, vx + 10 * vy, my + mz * 1000 + mw * 100000,
                       torch.full_like(x, 2.75), torch.full_like(x, 191.0)], 1)
    torch.testing.assert_close(out, ref)
    repeated = kk.metal_kernel(name="swizzle_repeated", input_names=["a"], output_names=["out"],
                               source="float4 v = 0; v.xx = float2(1, 2); out[0] = v.x;")
    with pytest.raises(kk.CompileError, match="each component once"):
        launch(repeated, device, [a], [(1,)], [torch.float32], (1, 1, 1), (1, 1, 1))


# ---------------------------------------------------------------------------------------------
# Math

PRECISE = dict(rtol=4e-7, atol=1e-12)  # ~3 ulp: metal::precise:: is accurate whatever the math mode
MIX = dict(rtol=1e-6, atol=1e-6)       # x + (y - x) * a may cancel
FAST = dict(rtol=5e-5, atol=2e-5)
EXACT = dict(rtol=0, atol=0)

# (expression, torch reference on float64 x in [0.1, 3], y in [-3, 3], ix in [-20, 20], tolerance)
MATH = [
    ("metal::exp(y)", lambda x, y, ix: y.exp(), FAST),
    ("metal::log(x)", lambda x, y, ix: x.log(), FAST),
    ("metal::sin(y)", lambda x, y, ix: y.sin(), FAST),
    ("metal::cos(y)", lambda x, y, ix: y.cos(), FAST),
    ("metal::tanh(y)", lambda x, y, ix: y.tanh(), FAST),
    ("metal::sqrt(x)", lambda x, y, ix: x.sqrt(), FAST),
    ("metal::rsqrt(x)", lambda x, y, ix: x.rsqrt(), FAST),
    ("metal::pow(x, y)", lambda x, y, ix: x.pow(y), FAST),
    ("metal::exp2(y)", lambda x, y, ix: y.exp2(), FAST),
    ("metal::log2(x)", lambda x, y, ix: x.log2(), FAST),
    ("metal::atan2(y, x)", lambda x, y, ix: torch.atan2(y, x), FAST),
    ("metal::precise::exp(y)", lambda x, y, ix: y.exp(), PRECISE),
    ("metal::precise::log(x)", lambda x, y, ix: x.log(), PRECISE),
    ("metal::precise::sin(y)", lambda x, y, ix: y.sin(), PRECISE),
    ("metal::precise::cos(y)", lambda x, y, ix: y.cos(), PRECISE),
    ("metal::precise::sqrt(x)", lambda x, y, ix: x.sqrt(), PRECISE),
    ("metal::precise::rsqrt(x)", lambda x, y, ix: x.rsqrt(), PRECISE),
    ("metal::precise::pow(x, y)", lambda x, y, ix: x.pow(y), PRECISE),
    ("metal::precise::tanh(y)", lambda x, y, ix: y.tanh(), PRECISE),
    ("metal::fast::exp(y)", lambda x, y, ix: y.exp(), FAST),
    ("metal::fast::log(x)", lambda x, y, ix: x.log(), FAST),
    ("metal::fast::sin(y)", lambda x, y, ix: y.sin(), FAST),
    ("metal::fast::cos(y)", lambda x, y, ix: y.cos(), FAST),
    ("metal::fast::rsqrt(x)", lambda x, y, ix: x.rsqrt(), FAST),
    ("exp(y)", lambda x, y, ix: y.exp(), FAST),
    ("sqrt(x)", lambda x, y, ix: x.sqrt(), FAST),
    ("log(x)", lambda x, y, ix: x.log(), FAST),
    ("floor(y)", lambda x, y, ix: y.floor(), EXACT),
    ("ceil(y)", lambda x, y, ix: y.ceil(), EXACT),
    ("trunc(y)", lambda x, y, ix: y.trunc(), EXACT),
    ("fabs(y)", lambda x, y, ix: y.abs(), EXACT),
    ("abs(y)", lambda x, y, ix: y.abs(), EXACT),
    ("float(ix_nw)", lambda x, y, ix: (((y.float() + 1) / 2) * 15).floor(), EXACT),
    ("max(x, y)", lambda x, y, ix: torch.maximum(x, y), EXACT),
    ("min(x, y)", lambda x, y, ix: torch.minimum(x, y), EXACT),
    ("float(max(ix, 3))", lambda x, y, ix: ix.clamp(min=3), EXACT),
    ("float(min(ix, -3))", lambda x, y, ix: ix.clamp(max=-3), EXACT),
    ("fmax(x, y)", lambda x, y, ix: torch.maximum(x, y), EXACT),
    ("clamp(y, -1.0f, 1.0f)", lambda x, y, ix: y.clamp(-1, 1), EXACT),
    ("float(clamp(ix, -5, 5))", lambda x, y, ix: ix.clamp(-5, 5), EXACT),
    ("mix(x, y, 0.25f)", lambda x, y, ix: x + (y - x) * 0.25, MIX),
    ("select(x, y, y > 0.0f)", lambda x, y, ix: torch.where(y > 0, y, x), EXACT),
    ("select(-1.0f, 1.0f, ix > 0)", lambda x, y, ix: torch.where(ix > 0, 1.0, -1.0), EXACT),
    ("fma(x, y, z)", lambda x, y, ix: None, PRECISE),  # reference built below
    ("float(metal::exp(half(y)))", lambda x, y, ix: y.float().half().double().exp(), dict(rtol=2e-3, atol=1e-3)),
    ("metal::sqrt(float2(x, 4.0f * x)).y", lambda x, y, ix: (4 * x).sqrt(), FAST),
    ("metal::precise::exp(float4(y)).z", lambda x, y, ix: y.exp(), PRECISE),
    ("metal::floor(float3(y, x, 0.0f)).x", lambda x, y, ix: y.floor(), EXACT),
    ("float(select(int2(1, 2), int2(3, 4), bool2(y > 0.0f, x > 1.0f)).y)",
     lambda x, y, ix: torch.where(x > 1, 4.0, 2.0), EXACT),
    ("clamp(float2(y), float2(0.0f), float2(1.0f)).y", lambda x, y, ix: y.clamp(0, 1), EXACT),
    ("mix(float2(x), float2(y), float2(0.5f)).x", lambda x, y, ix: (x + y) / 2, MIX),
]


def test_math_functions(device):
    body = """
    uint i = thread_position_in_grid.x;
    float x = xs[i], y = ys[i], z = zs[i];
    int ix = ixs[i];
    float fx = ((y + 1) / 2) * (16 - 1);
    int ix_nw = floor(fx);              // as MLX's grid_sample writes it
""" + "".join(f"    out[i * {len(MATH)} + {c}] = {e};\n" for c, (e, _, _) in enumerate(MATH))
    k = kk.metal_kernel(name="math_functions", input_names=["xs", "ys", "zs", "ixs"],
                        output_names=["out"], source=body)
    n = 256
    x = torch.rand(n, device=device) * 2.9 + 0.1
    y = torch.rand(n, device=device) * 6 - 3
    z = torch.randn(n, device=device)
    # row 0: fma must be fused: (1 + 2^-13)^2 - (1 + 2^-12) = 2^-26, which x*y+z rounds to 0
    x[0], y[0], z[0] = 1 + 2**-13, 1 + 2**-13, -(1 + 2**-12)
    ix = rand_int(-20, 21, n, device)
    out = launch(k, device, [x, y, z, ix], [(n, len(MATH))], [torch.float32], (n, 1, 1),
                 (64, 1, 1))[0].cpu().double()
    xd, yd, zd, ixd = (t.cpu().double() for t in (x, y, z, ix))
    failures = []  # every column checked, all failures reported together
    for c, (expr, ref_fn, tol) in enumerate(MATH):
        if expr == "fma(x, y, z)":
            ref = (xd * yd + zd).float().double()  # the product of two floats is exact in double
            if out[0, c] != 2**-26:
                failures.append(f"fma(x, y, z) is not fused: {out[0, c].item()!r} instead of 2**-26")
        else:
            ref = torch.as_tensor(ref_fn(xd, yd, ixd), dtype=torch.float64).expand(n)
        close = torch.isclose(out[:, c], ref, rtol=tol["rtol"], atol=tol["atol"])
        if not close.all():
            rel = ((out[:, c] - ref).abs() / ref.abs().clamp(min=1e-30)).max().item()
            failures.append(f"{expr}: {int((~close).sum())}/{n} off, max relative error {rel:.3g} "
                            f"(rtol {tol['rtol']}, atol {tol['atol']})")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("math_mode", ["safe", None], ids=["safe", "default-fast"])
def test_isnan_isinf(device, math_mode):
    # The backends promise isnan/isinf keep working in the default fast mode (no finite-math
    # assumption, as on Metal), so the same checks run in both modes.
    body = """
    uint i = thread_position_in_grid.x;
    float v = vs[i];
    half hv = half(v);
    float4 v4 = float4(v, 1.0f, 2.0f, 3.0f);
    device int* o = out + i * 8;
    o[0] = isnan(v);
    o[1] = isinf(v);
    o[2] = isfinite(v);
    o[3] = isnan(hv);
    o[4] = isinf(hv);
    o[5] = any(isnan(v4));
    o[6] = metal::isinf(v4).x;
    o[7] = isnan(metal::numeric_limits<float>::quiet_NaN()) + 2 * isinf(metal::numeric_limits<float>::infinity());
    fixed[i] = select(v, 0.0f, isnan(v) || isinf(v));
"""
    k = kk.metal_kernel(name="isnan_isinf", input_names=["vs"], output_names=["out", "fixed"],
                        source=body, compile_options=math_mode and {"math_mode": math_mode})
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.5, 1e38, -1e-40,
                            65504.0, 70000.0, -float("nan")])
    v = torch.cat([special, torch.randn(53)]).to(device)
    n = v.numel()
    out, fixed = launch(k, device, [v], [(n, 8), (n,)], [torch.int32, torch.float32], (n, 1, 1),
                        (32, 1, 1))
    out, v = out.cpu(), v.cpu()
    h = v.half()
    ref = torch.stack([v.isnan(), v.isinf(), v.isfinite(), h.isnan(), h.isinf(), v.isnan(), v.isinf(),
                       torch.full((n,), 3)], 1).int()
    assert torch.equal(out, ref)
    assert torch.equal(fixed.cpu(), torch.where(v.isfinite(), v, 0.0))


def _without_nan(vals):
    return [v for v in vals if not math.isnan(v)]


def _median3_choices(vals):
    """What MSL allows fmedian3 to return: NaNs are missing data; with one NaN, either other value."""
    keep = _without_nan(vals)
    return {sorted(keep)[1]} if len(keep) == 3 else set(keep) if keep else {"nan"}


def test_fmax3_fmin3_fmedian3(device):
    cols = ["fmax3(x, y, z)", "fmin3(x, y, z)", "fmedian3(x, y, z)", "float(fmax3(hx, hy, hz))",
            "float(metal::fmin3(bx, by, bz))", "float(precise::fmedian3(hx, hy, hz))",
            "fmedian3(float3(y), float3(z), float3(x)).y",
            "float(fmax3(half2(hx, hy), half2(hy, hz), half2(hz, hx)).y)",
            "fmin3(x, 1, z)"]
    body = """
    uint i = thread_position_in_grid.x;
    float x = xs[i], y = ys[i], z = zs[i];
    half hx = half(x), hy = half(y), hz = half(z);
    bfloat bx = bfloat(x), by = bfloat(y), bz = bfloat(z);
""" + "".join(f"    out[i * {len(cols)} + {c}] = {e};\n" for c, e in enumerate(cols))
    k = kk.metal_kernel(name="fmax3_fmin3_fmedian3", input_names=["xs", "ys", "zs"], output_names=["out"],
                        source=body)
    n = 64
    xyz = torch.randn(3, n) * 4
    xyz[:, :3] = torch.tensor([[1.0, 3.0, 2.0], [2.0, 1.0, 3.0], [3.0, 2.0, 1.0]]).t()  # the median in x, y, z
    for r in range(8, n):  # NaNs in every pattern: bit j of r % 8 puts one in x, y or z
        for j in range(3):
            if (r % 8) >> j & 1:
                xyz[j, r] = float("nan")
    xyz[0, 16], xyz[1, 17] = float("inf"), -float("inf")
    x, y, z = (t.to(device) for t in xyz)
    out = launch(k, device, [x, y, z], [(n, len(cols))], [torch.float32], (n, 1, 1), (32, 1, 1))[0].cpu()
    f32 = xyz.tolist()
    f16 = xyz.half().double().tolist()
    b16 = xyz.bfloat16().double().tolist()
    for i in range(n):
        v, h, b = [t[i] for t in f32], [t[i] for t in f16], [t[i] for t in b16]

        def nan_or(op, vals):
            keep = _without_nan(vals)
            return {op(keep)} if keep else {"nan"}

        expected = [nan_or(max, v), nan_or(min, v), _median3_choices(v), nan_or(max, h), nan_or(min, b),
                    _median3_choices(h), _median3_choices([v[1], v[2], v[0]]), nan_or(max, [h[1], h[2], h[0]]),
                    nan_or(min, [v[0], 1.0, v[2]])]
        for c, (g, allowed) in enumerate(zip(out[i].tolist(), expected)):
            assert ("nan" if math.isnan(g) else g) in allowed, f"row {i}: {cols[c]} = {g}, expected {allowed}"


def _neighbours(dtype):
    """Every value of a 16-bit float type but NaN and -0, ascending: [(value, bits)]."""
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    vals = bits.view(dtype).double()
    keep = ~vals.isnan() & (bits != -2**15)
    pairs = sorted(zip(vals[keep].tolist(), bits[keep].tolist()))
    return [v for v, _ in pairs], [b & 0xFFFF for _, b in pairs]


def _nextafter_ref(x_bits, y_bits, dtype, table):
    """C's nextafter on a 16-bit float type (bits in, bits out; None for NaN), from the sorted values."""
    values, bits = table
    x, y = (torch.tensor([b], dtype=torch.int32).to(torch.int16).view(dtype).item() for b in (x_bits, y_bits))
    if math.isnan(x) or math.isnan(y):
        return None
    if x == y:
        return y_bits
    step = values.index(x) + (1 if y > x else -1)
    if values[step] == 0:  # stepping to zero from a subnormal keeps x's sign
        return 0x8000 if x < 0 else 0
    return bits[step]


def test_nextafter_half_bfloat(device):
    body = """
    uint i = thread_position_in_grid.x;
    half hx = as_type<half>(xs[i]), hy = as_type<half>(ys[i]);
    bfloat bx = as_type<bfloat>(xs[i]), by = as_type<bfloat>(ys[i]);
    out[i * 3 + 0] = as_type<int16_t>(nextafter(hx, hy));
    out[i * 3 + 1] = as_type<int16_t>(metal::nextafter(bx, by));
    out[i * 3 + 2] = as_type<int16_t>(nextafter(half2(hy, hx), half2(hx, hy)).y);
"""
    k = kk.metal_kernel(name="nextafter16", input_names=["xs", "ys"], output_names=["out"], source=body)
    # bit patterns, each read as half and as bfloat: +-0, the smallest subnormals, then half's +-1, 2,
    # largest finite, +-infinity, NaN, then bfloat's; then random ones, half of them a few steps apart
    special = [0x0000, 0x8000, 0x0001, 0x8001, 0x3C00, 0xBC00, 0x4000, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
               0x3F80, 0xBF80, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0]
    pairs = [(a, b) for a in special for b in special[:10]]
    n = len(pairs) + 100
    rand = torch.randint(0, 2**16, (2, 100))
    rand[1, :50] = (rand[0, :50] + torch.randint(-3, 4, (50,))) % 2**16
    xy = torch.tensor(pairs).t().tolist()
    xs = torch.tensor(xy[0] + rand[0].tolist(), dtype=torch.int32).to(torch.int16)
    ys = torch.tensor(xy[1] + rand[1].tolist(), dtype=torch.int32).to(torch.int16)
    out = launch(k, device, [xs.to(device), ys.to(device)], [(n, 3)], [torch.int16], (n, 1, 1),
                 (64, 1, 1))[0].cpu().int() & 0xFFFF
    tables = {torch.float16: _neighbours(torch.float16), torch.bfloat16: _neighbours(torch.bfloat16)}
    for i, (xb, yb) in enumerate(zip((xs.int() & 0xFFFF).tolist(), (ys.int() & 0xFFFF).tolist())):
        for c, dtype in enumerate([torch.float16, torch.bfloat16, torch.float16]):
            want = _nextafter_ref(xb, yb, dtype, tables[dtype])
            got = out[i, c].item()
            if want is None:
                got_value = torch.tensor([got], dtype=torch.int32).to(torch.int16).view(dtype).item()
                assert math.isnan(got_value), f"row {i} col {c}: {xb:#06x} {yb:#06x} -> {got:#06x}, expected NaN"
            else:
                assert got == want, \
                    f"row {i} col {c}: nextafter({xb:#06x}, {yb:#06x}) = {got:#06x}, expected {want:#06x}"


@pytest.mark.parametrize("math_mode", ["safe", "fast"])
def test_geometric_precise_and_fast(device, math_mode):
    # plain length/distance/normalize are fast::'s under "fast", precise::'s otherwise
    cols = [("length(a)", FAST), ("fast::length(a)", FAST), ("precise::length(a)", PRECISE),
            ("distance(a, b)", FAST), ("metal::fast::distance(a, b)", FAST), ("precise::distance(a, b)", PRECISE),
            ("normalize(a).x", FAST), ("fast::normalize(a).y", FAST), ("metal::precise::normalize(a).z", PRECISE),
            ("fast::length(float4(a, 2.0f))", FAST),
            ("float(precise::length(half2(a.xy)))", dict(rtol=2e-3, atol=1e-3)),
            ("float(fast::normalize(half3(a)).z)", dict(rtol=4e-3, atol=2e-3))]
    body = """
    uint i = thread_position_in_grid.x;
    float3 a = float3(xs[3 * i], xs[3 * i + 1], xs[3 * i + 2]), b = float3(ys[3 * i], ys[3 * i + 1], ys[3 * i + 2]);
""" + "".join(f"    out[i * {len(cols)} + {c}] = {e};\n" for c, (e, _) in enumerate(cols))
    k = kk.metal_kernel(name="geometric_modes", input_names=["xs", "ys"], output_names=["out"], source=body,
                        compile_options={"math_mode": math_mode})
    n = 64
    a, b = torch.randn(n, 3) * 3, torch.randn(n, 3) * 3
    out = launch(k, device, [a.flatten().to(device), b.flatten().to(device)], [(n, len(cols))],
                 [torch.float32], (n, 1, 1), (32, 1, 1))[0].cpu().double()
    ad, bd = a.double(), b.double()
    ah = a.half().double()
    length = ad.norm(dim=1)
    refs = [length, length, length, (ad - bd).norm(dim=1), (ad - bd).norm(dim=1), (ad - bd).norm(dim=1),
            ad[:, 0] / length, ad[:, 1] / length, ad[:, 2] / length, (length**2 + 4).sqrt(),
            ah[:, :2].norm(dim=1), ah[:, 2] / ah.norm(dim=1)]
    for c, ((expr, tol), ref) in enumerate(zip(cols, refs)):
        torch.testing.assert_close(out[:, c], ref, rtol=tol["rtol"], atol=tol["atol"], msg=expr)


def F32(v):
    """v rounded to float32, as a float literal `vf` is."""
    return torch.tensor(v, dtype=torch.float32).item()


def _frexp(v):
    return [math.frexp(t) for t in v.tolist()]


# (expression, float64 reference of x in [0.1, 3], y in [-3, 3], tolerance): every MSL math, common
# and relational name the MATH table leaves out, in each namespace, and the calls that mix a vector
# or a half with scalars (the forwarding path) in fast::, where metal::'s names are the other mode's.
ULP8 = dict(rtol=1e-6, atol=1e-12)  # CUDA's acoshf is within 4 ulp, its other inverse and hyperbolic 2-3
MATH_MORE = [
    ("precise::exp10(y)", lambda x, y: 10**y, PRECISE),
    ("fast::exp10(y)", lambda x, y: 10**y, FAST),
    ("precise::log10(x)", lambda x, y: x.log10(), PRECISE),
    ("fast::log10(x)", lambda x, y: x.log10(), FAST),
    ("precise::sinpi(y)", lambda x, y: (math.pi * y).sin(), PRECISE),
    ("cospi(y)", lambda x, y: (math.pi * y).cos(), PRECISE),
    ("fast::tanpi(x * 0.1f)", lambda x, y: (math.pi * (x * F32(0.1)).float().double()).tan(), ULP8),
    ("asin(y / 3.0f)", lambda x, y: (y / 3).float().double().asin(), ULP8),
    ("fast::acos(y / 3.0f)", lambda x, y: (y / 3).float().double().acos(), ULP8),
    ("atan(y)", lambda x, y: y.atan(), ULP8),
    ("precise::sinh(y)", lambda x, y: y.sinh(), ULP8),
    ("cosh(y)", lambda x, y: y.cosh(), ULP8),
    ("asinh(y)", lambda x, y: y.asinh(), ULP8),
    ("acosh(x + 1.0f)", lambda x, y: (x + 1).float().double().acosh(), ULP8),
    ("fast::atanh(y / 3.5f)", lambda x, y: (y / 3.5).float().double().atanh(), ULP8),
    ("fast::tan(x * 0.4f)", lambda x, y: (x * F32(0.4)).float().double().tan(), FAST),
    ("precise::powr(x, y)", lambda x, y: x.pow(y), PRECISE),
    ("fast::powr(x, y)", lambda x, y: x.pow(y), FAST),
    ("precise::divide(y, x)", lambda x, y: y / x, PRECISE),
    ("fast::divide(y, x)", lambda x, y: y / x, FAST),
    ("fmod(y, x)", lambda x, y: torch.fmod(y, x), EXACT),
    ("copysign(x, y)", lambda x, y: torch.copysign(x, y), EXACT),
    ("fdim(x, y)", lambda x, y: (x - y).clamp(min=0).float(), EXACT),
    ("fract(y)", lambda x, y: y - y.floor(), EXACT),
    ("logb(x)", lambda x, y: x.log2().floor(), EXACT),
    ("float(ilogb(x))", lambda x, y: x.log2().floor(), EXACT),
    ("fm", lambda x, y: torch.tensor([m for m, _ in _frexp(y)], dtype=torch.float64), EXACT),
    ("float(fe)", lambda x, y: torch.tensor([e for _, e in _frexp(y)], dtype=torch.float64), EXACT),
    ("ldexp(y, 3)", lambda x, y: y * 8, EXACT),
    ("ldexp(float2(y), int2(-2)).y", lambda x, y: y / 4, EXACT),
    ("frac", lambda x, y: y - y.trunc(), EXACT),
    ("whole", lambda x, y: y.trunc(), EXACT),
    ("s1", lambda x, y: y.sin(), PRECISE),
    ("c1", lambda x, y: y.cos(), PRECISE),
    ("s4.w", lambda x, y: y.sin(), FAST),
    ("c4.w", lambda x, y: y.cos(), FAST),
    ("step(0.5f, y)", lambda x, y: (y >= 0.5).double(), EXACT),
    ("step(float2(0.5f), float2(y)).y", lambda x, y: (y >= 0.5).double(), EXACT),
    ("smoothstep(-1.0f, 2.0f, y)", lambda x, y: (lambda t: t * t * (3 - 2 * t))(((y + 1) / 3).clamp(0, 1)), MIX),
    ("saturate(y)", lambda x, y: y.clamp(0, 1), EXACT),
    ("sign(y)", lambda x, y: y.sign(), EXACT),
    ("fmin(float2(y), 0.5f).x", lambda x, y: y.clamp(max=0.5), EXACT),
    ("fast::pow(float4(x), 2.0f).z", lambda x, y: x * x, FAST),
    ("fast::powr(float2(x), 0.5f).y", lambda x, y: x.sqrt(), FAST),
    ("fast::divide(float3(y), 2.0f).x", lambda x, y: y / 2, FAST),
    ("float(fast::pow(half(x), 2))", lambda x, y: x.half().double() ** 2, dict(rtol=2e-3, atol=1e-3)),
    ("precise::pow(float2(x), 3).x", lambda x, y: x**3, PRECISE),
    ("fast::exp(float2(y)).y + fast::exp(half2(half(y))).x",
     lambda x, y: y.exp() + y.half().double().exp(), dict(rtol=2e-3, atol=1e-3)),
]


def test_math_every_function_and_mode(device):
    body = """
    uint i = thread_position_in_grid.x;
    float x = xs[i], y = ys[i];
    int fe;
    float fm = frexp(y, fe), whole, frac = modf(y, whole), c1, s1 = precise::sincos(y, c1);
    float4 c4, s4 = metal::fast::sincos(float4(y), c4);
""" + "".join(f"    out[i * {len(MATH_MORE)} + {c}] = {e};\n" for c, (e, _, _) in enumerate(MATH_MORE))
    k = kk.metal_kernel(name="math_every_function", input_names=["xs", "ys"], output_names=["out"], source=body)
    n = 256
    x = torch.rand(n, device=device) * 2.9 + 0.1
    y = torch.rand(n, device=device) * 6 - 3
    y[:6] = torch.tensor([0.0, -0.5, 0.5, 1.0, -2.0, 2.5])  # exact zeros and halves of sinpi, cospi, step...
    out = launch(k, device, [x, y], [(n, len(MATH_MORE))], [torch.float32], (n, 1, 1), (64, 1, 1))[0].cpu().double()
    xd, yd = x.cpu().double(), y.cpu().double()
    failures = []
    for c, (expr, ref_fn, tol) in enumerate(MATH_MORE):
        ref = torch.as_tensor(ref_fn(xd, yd), dtype=torch.float64).expand(n)
        close = torch.isclose(out[:, c], ref, rtol=tol["rtol"], atol=tol["atol"])
        if not close.all():
            j = int((~close).nonzero()[0])
            failures.append(f"{expr}: {int((~close).sum())}/{n} off, e.g. y={yd[j].item()!r}: "
                            f"{out[j, c].item()!r} vs {ref[j].item()!r}")
    assert not failures, "\n".join(failures)


def test_relational_and_geometric_functions(device):
    # relational functions on scalars and vectors (bool vectors back), with NaNs, zeros, subnormals;
    # the geometric functions the other tests leave out, on float3 and half3
    flags = ["isordered(x, y)", "isunordered(x, y)", "isordered(float2(x, y), float2(y, 1.0f)).x",
             "isunordered(half2(half(y), half(x)), half2(half(0))).y", "precise::isunordered(x, x)",
             "isnormal(x)", "isnormal(half(x))", "isnormal(float3(x)).z", "isfinite(x)", "signbit(x)",
             "signbit(half(x))", "signbit(float4(x)).w", "all(float3(x, y, 1.0f) > 0.0f)",
             "any(float2(x, y) > 0.0f)", "select(int3(1, 2, 3), int3(4, 5, 6), bool3(x > y, x < y, true)).x",
             "select(7, 8, x == y)"]
    geo = ["length_squared(a)", "distance_squared(a, b)", "dot(a, b)", "cross(a, b).x", "cross(a, b).y",
           "cross(a, b).z", "reflect(a, nb).x", "reflect(a, nb).z", "refract(a, na, 0.75f).y",
           "refract(na, nb, 1.5f).z", "faceforward(a, b, na).x", "float(cross(half3(a), half3(b)).z)",
           "float(length_squared(half3(a)))"]
    body = """
    uint i = thread_position_in_grid.x;
    float x = xs[i], y = ys[i];
    float3 a = float3(ps[3 * i], ps[3 * i + 1], ps[3 * i + 2]), b = float3(qs[3 * i], qs[3 * i + 1], qs[3 * i + 2]);
    float3 na = precise::normalize(a), nb = precise::normalize(b);
""" + "".join(f"    flags[i * {len(flags)} + {c}] = {e};\n" for c, e in enumerate(flags)) \
        + "".join(f"    geo[i * {len(geo)} + {c}] = {e};\n" for c, e in enumerate(geo))
    k = kk.metal_kernel(name="relational_geometric", input_names=["xs", "ys", "ps", "qs"],
                        output_names=["flags", "geo"], source=body)
    inf, nan = float("inf"), float("nan")
    special = [0.0, -0.0, 1e-40, -1e-40, 1e-5, 1.0, -2.5, inf, -inf, nan, -nan, 3e38, 6e-5, 7e4]
    xs = torch.tensor([v for v in special for _ in special] + torch.randn(60).tolist())
    ys = torch.tensor([v for _ in special for v in special] + torch.randn(60).tolist())
    n = len(xs)
    p, q = torch.randn(n, 3) * 2, torch.randn(n, 3) * 2
    fl, go = launch(k, device, [xs.to(device), ys.to(device), p.flatten().to(device), q.flatten().to(device)],
                    [(n, len(flags)), (n, len(geo))], [torch.int32, torch.float32], (n, 1, 1), (64, 1, 1))
    fl, go = fl.cpu(), go.cpu().double()

    def normal(v, dtype):
        return v.isfinite() & (v.abs() >= torch.finfo(dtype).tiny)

    h = xs.half()
    sign = xs.view(torch.int32) < 0
    # a NaN's sign after a conversion is unspecified (IEEE 754): CUDA's makes the canonical,
    # positive NaN, the CPU keeps the sign
    half_sign = torch.where(xs.isnan(), fl[:, flags.index("signbit(half(x))")].bool(), h.view(torch.int16) < 0)
    ref = torch.stack([c.int() for c in [
        ~xs.isnan() & ~ys.isnan(), xs.isnan() | ys.isnan(), ~xs.isnan() & ~ys.isnan(), h.isnan(), xs.isnan(),
        normal(xs, torch.float32), normal(h.float(), torch.float16), normal(xs, torch.float32), xs.isfinite(),
        sign, half_sign, sign, (xs > 0) & (ys > 0), (xs > 0) | (ys > 0),
        torch.where(xs > ys, 4, 1), torch.where(xs == ys, 8, 7)]], 1)
    assert torch.equal(fl, ref), [flags[c] for c in range(len(flags)) if not torch.equal(fl[:, c], ref[:, c])]

    a, b = p.double(), q.double()
    af, bf = p.float().double(), q.float().double()
    na, nb = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)

    def refract(i, nrm, eta):
        d = (nrm * i).sum(1, keepdim=True)
        k = 1 - eta * eta * (1 - d * d)
        r = eta * i - (eta * d + k.clamp(min=0).sqrt()) * nrm
        return torch.where(k < 0, torch.zeros_like(r), r)

    cross = torch.linalg.cross(a, b)
    reflect = a - 2 * (nb * a).sum(1, keepdim=True) * nb
    ah, bh = a.half().double(), b.half().double()
    refs = [(a * a).sum(1), ((a - b) ** 2).sum(1), (a * b).sum(1), cross[:, 0], cross[:, 1], cross[:, 2],
            reflect[:, 0], reflect[:, 2], refract(a, na, 0.75)[:, 1], refract(na, nb, 1.5)[:, 2],
            torch.where((na * b).sum(1) < 0, a[:, 0], -a[:, 0]), torch.linalg.cross(ah, bh)[:, 2],
            (ah * ah).sum(1)]
    for c, (expr, r) in enumerate(zip(geo, refs)):
        tol = dict(rtol=1e-2, atol=5e-2) if "half" in expr else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(go[:, c], r, **tol, msg=expr)


def test_as_type(device):
    body = """
    uint i = thread_position_in_grid.x;
    float f = fs[i];
    half2 hp = half2(hs[2 * i], hs[2 * i + 1]);
    uint bits = as_type<uint>(ws[i]);
    device int64_t* o = oi + i * 4;
    o[0] = as_type<uint>(f);
    o[1] = as_type<int>(f);
    o[2] = as_type<uint>(hp);
    o[3] = as_type<ushort>(hp.y);
    of[i] = as_type<float>(bits);
    half2 back = as_type<half2>(as_type<uint>(hp));
    oh[2 * i] = back.y;
    oh[2 * i + 1] = back.x;
"""
    k = kk.metal_kernel(name="as_type", input_names=["fs", "hs", "ws"], output_names=["oi", "of", "oh"],
                        source=body)
    n = 100
    f = torch.randn(n, device=device) * 1000
    hs = torch.randn(2 * n, device=device).half()
    ws = (torch.randn(n, device=device) * 3).view(torch.int32)  # bit patterns of ordinary floats
    oi, of, oh = launch(k, device, [f, hs, ws], [(n, 4), (n,), (2 * n,)],
                        [torch.int64, torch.float32, torch.float16], (n, 1, 1), (32, 1, 1))
    f, hs, ws = f.cpu(), hs.cpu(), ws.cpu()
    fbits = f.view(torch.int32).long()
    hbits = hs.view(torch.int16).long() & 0xFFFF
    ref = torch.stack([fbits & 0xFFFFFFFF, fbits, hbits[0::2] | (hbits[1::2] << 16), hbits[1::2]], 1)
    assert torch.equal(oi.cpu(), ref)
    assert torch.equal(of.cpu().view(torch.int32), ws)
    assert torch.equal(oh.cpu(), hs.view(n, 2).flip(1).reshape(-1))


def test_integer_functions(device):
    cols = ["clz(u)", "popcount(u)", "clz(s)", "popcount(s)", "clz(us)", "popcount(us)", "clz(uc)",
            "popcount(uc)", "clz(ul)", "popcount(ul)", "ctz(u)", "clz(0u)", "popcount(~0u)"]
    body = columns_body("""
    uint i = thread_position_in_grid.x;
    int s = ws[i];
    uint u = as_type<uint>(s);
    ushort us = ushort(u >> 3);
    uchar uc = uchar(u >> 11);
    uint64_t ul = as_type<uint64_t>(ls[i]);
""", "out", cols)
    k = kk.metal_kernel(name="integer_functions", input_names=["ws", "ls"], output_names=["out"],
                        source=body)
    n = 200
    ws = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)
    ws = ws >> torch.randint(0, 32, (n,), dtype=torch.int32, device=device)  # all bit lengths
    ws[:4] = torch.tensor([0, 1, -1, -2**31], dtype=torch.int32)
    ls = torch.randint(-2**62, 2**62, (n,), dtype=torch.int64, device=device)
    ls = ls >> torch.randint(0, 64, (n,), device=device)
    ls[:2] = torch.tensor([0, -1])
    out = launch(k, device, [ws, ls], [(n, len(cols))], [torch.int64], (n, 1, 1), (64, 1, 1))[0]

    def clz(v, bits):
        return bits - v.bit_length()

    def ctz(v, bits):
        return bits if v == 0 else (v & -v).bit_length() - 1

    rows = []
    for w, l in zip(ws.tolist(), ls.tolist()):
        u, us, uc, ul = u32(w), (u32(w) >> 3) & 0xFFFF, (u32(w) >> 11) & 0xFF, l & (2**64 - 1)
        rows.append([clz(u, 32), bin(u).count("1"), clz(u, 32), bin(u).count("1"), clz(us, 16),
                     bin(us).count("1"), clz(uc, 8), bin(uc).count("1"), clz(ul, 64), bin(ul).count("1"),
                     ctz(u, 32), 32, 32])
    assert out.cpu().tolist() == rows


INT_TYPES = {"int8_t": (8, True), "uchar": (8, False), "short": (16, True), "ushort": (16, False),
             "int": (32, True), "uint": (32, False), "long": (64, True), "ulong": (64, False)}


def wrap(v, bits, signed):
    """v as a `bits`-wide integer, two's complement when signed (C's conversion)."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


def extract_bits_ref(x, offset, bits, signed):
    if bits == 0:
        return 0
    return wrap(x >> offset, bits, signed)


def test_madsat_absdiff_and_vector_bit_functions(device):
    # madsat saturates the exact a*b+c once; absdiff returns the unsigned type (MSL's Tu), exact at
    # the extremes; extract_bits / insert_bits take vectors too.
    cols = [f"madsat({t}(a), {t}(b), {t}(c))" for t in INT_TYPES] + [
        f"absdiff({t}(a), {t}(b))" for t in INT_TYPES] + [
        "madsat(int2(a, c), int2(b, b), int2(c, a)).x", "madsat(ulong3(c, b, a), ulong3(b), ulong3(a, c, c)).z",
        "absdiff(short2(a, b), short2(b, a)).y", "absdiff(long4(a), long4(b)).w",
        "extract_bits(int2(a, b), off, nb).y", "extract_bits(uint3(a, b, c), off, nb).z",
        "insert_bits(uint2(a, b), uint2(c), off, nb).y", "insert_bits(int4(c, a, b, a), int4(b), off, nb).x",
        "extract_bits(int(a), off, nb)"]
    body = columns_body("""
    uint i = thread_position_in_grid.x;
    int64_t a = as[i], b = bs[i], c = cs[i];
    uint off = uint(offs[i]), nb = uint(nbs[i]);
    static_assert(is_same_v<decltype(absdiff(1, 2)), uint>, "absdiff(int, int) is uint");
    static_assert(is_same_v<decltype(absdiff(int8_t(1), int8_t(2))), uchar>, "absdiff(int8_t, int8_t) is uchar");
    static_assert(is_same_v<decltype(absdiff(long(1), long(2))), ulong>, "absdiff(long, long) is ulong");
    static_assert(is_same_v<decltype(absdiff(int2(1), int2(2))), uint2>, "absdiff(int2, int2) is uint2");
""", "out", cols)
    k = kk.metal_kernel(name="madsat_absdiff", input_names=["as", "bs", "cs", "offs", "nbs"],
                        output_names=["out"], source=body)
    edge = [(-0x10000, 0x10000, 1), (-0x10000, -0x10000, -5), (0x10000, 0x10000, 0),
            (2**62, 2, -1), (-2**62, 2, 0), (-2**62, 2, -1), (-2**63, -1, 0), (-2**63, 1, -1),
            (2**32 - 1, 2**32 + 1, 0), (2**32 - 1, 2**32 + 1, 1), (2**32, 2**32, -1), (-1, -1, -1),
            (-128, 127, 0), (-2**15, 2**15 - 1, 0), (-2**31, 2**31 - 1, 0), (-2**63, 2**63 - 1, 5)]
    n = 256
    abc = torch.randint(-2**62, 2**62, (3, n), dtype=torch.int64) * 2
    abc = abc >> torch.randint(0, 64, (3, n))  # all bit lengths
    abc[:, :len(edge)] = torch.tensor(edge).t()
    off = torch.randint(0, 32, (n,), dtype=torch.int32)
    nb = (torch.rand(n) * (33 - off)).int().clamp(max=32 - off)
    a, b, c = (t.to(device) for t in abc)
    out = launch(k, device, [a, b, c, off.to(device), nb.to(device)], [(n, len(cols))], [torch.int64],
                 (n, 1, 1), (64, 1, 1))[0]
    rows = []
    for (av, bv, cv), o, w in zip(abc.t().tolist(), off.tolist(), nb.tolist()):
        row = []
        for bits, signed in INT_TYPES.values():
            x, y, z = (wrap(v, bits, signed) for v in (av, bv, cv))
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            row.append(wrap(min(max(x * y + z, lo), hi), 64, True))
        for bits, signed in INT_TYPES.values():
            x, y = wrap(av, bits, signed), wrap(bv, bits, signed)
            row.append(wrap(abs(x - y), 64, True))
        ai, bi, ci = (wrap(v, 32, True) for v in (av, bv, cv))
        ua, ub, uc = (wrap(v, 32, False) for v in (av, bv, cv))
        mask = ((1 << w) - 1) << o
        row += [min(max(ai * bi + ci, -2**31), 2**31 - 1),
                wrap(min(wrap(av, 64, False) * wrap(bv, 64, False) + wrap(cv, 64, False), 2**64 - 1), 64, True),
                abs(wrap(bv, 16, True) - wrap(av, 16, True)),
                wrap(abs(av - bv), 64, True),
                extract_bits_ref(bi, o, w, True), extract_bits_ref(uc, o, w, False),
                (ub & ~mask) | ((uc << o) & mask) & 0xFFFFFFFF,
                wrap((wrap(ci, 32, False) & ~mask) | ((wrap(bi, 32, False) << o) & mask), 32, True),
                extract_bits_ref(ai, o, w, True)]
        rows.append(row)
    got = out.cpu().tolist()
    for i, (g, r) in enumerate(zip(got, rows)):
        assert g == r, [(cols[j], g[j], r[j]) for j in range(len(cols)) if g[j] != r[j]][:4] + [i]


def reverse_bits_ref(x, bits):
    return int(format(x & ((1 << bits) - 1), f"0{bits}b")[::-1], 2)


def rotate_ref(x, s, bits):
    x &= (1 << bits) - 1
    s %= bits
    return ((x << s) | (x >> (bits - s))) & ((1 << bits) - 1)


def test_integer_arithmetic_functions_every_type(device):
    # addsat, subsat, hadd, rhadd, mulhi, mul24, mad24, madhi, rotate, reverse_bits, ctz, abs on each
    # integer type, exactly; abs of the most negative value wraps to itself, as on the GPU
    fns = ["addsat(x, y)", "subsat(x, y)", "hadd(x, y)", "rhadd(x, y)", "mulhi(x, y)", "mul24(s, t)",
           "mad24(s, t, x)", "madhi(x, y, z)", "rotate(x, y)", "reverse_bits(x)", "ctz(x)", "abs(x)",
           "clz(x)", "popcount(x)"]
    cols = [f"{{ {t} x = {t}(a), y = {t}(b), z = {t}(c), s = {t}(a % 1000), t = {t}(b % 1000); "
            f"row_[{j}] = int64_t({f}); }}" for j, (t, f) in enumerate((t, f) for t in INT_TYPES for f in fns)]
    cols += ["{ vec<int, 3> x = int3(int(a)), y = int3(int(b)); row_[%d] = int64_t(addsat(x, y).z) + hadd(x, y).y; }"
             % len(cols),
             "{ ushort4 x = ushort4(ushort(a)), y = ushort4(ushort(b)); row_[%d] = int64_t(mulhi(x, y).w); }"
             % (len(cols) + 1)]
    body = """
    uint i = thread_position_in_grid.x;
    int64_t a = as[i], b = bs[i], c = cs[i];
    device int64_t* row_ = out + i * %d;
""" % len(cols) + "".join(f"    {e}\n" for e in cols)
    k = kk.metal_kernel(name="integer_arithmetic", input_names=["as", "bs", "cs"], output_names=["out"],
                        source=body)
    edge = [(-2**63, -1, 0), (-2**63, 1, -1), (2**63 - 1, 1, 5), (-128, -128, 0), (127, 127, -1),
            (-2**15, 2**15 - 1, 3), (-2**31, -2**31, -2**31), (2**31 - 1, 2**31 - 1, 2**31 - 1), (0, 0, 0),
            (-1, -1, -1), (255, 1, 0), (65535, 65535, 65535), (2**32 - 1, 2**32 - 1, 1)]
    n = 200
    abc = torch.randint(-2**62, 2**62, (3, n), dtype=torch.int64) * 2
    abc = abc >> torch.randint(0, 64, (3, n))
    abc[:, :len(edge)] = torch.tensor(edge).t()
    out = launch(k, device, [t.to(device) for t in abc], [(n, len(cols))], [torch.int64], (n, 1, 1),
                 (64, 1, 1))[0].cpu().tolist()
    for r, (av, bv, cv) in enumerate(abc.t().tolist()):
        want = []
        for bits, signed in INT_TYPES.values():
            x, y, z = (wrap(v, bits, signed) for v in (av, bv, cv))
            s, t = (wrap(int(math.copysign(abs(v) % 1000, v)), bits, signed) for v in (av, bv))  # C's %
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            u = x & ((1 << bits) - 1)
            vals = [min(max(x + y, lo), hi), min(max(x - y, lo), hi), (x + y) >> 1, (x + y + 1) >> 1,
                    (x * y) >> bits, s * t, s * t + x, ((x * y) >> bits) + z, rotate_ref(x, y, bits),
                    reverse_bits_ref(x, bits), bits if u == 0 else (u & -u).bit_length() - 1, abs(x),
                    bits - u.bit_length(), bin(u).count("1")]
            want += [wrap(wrap(v, bits, signed), 64, True) for v in vals]
        x, y = wrap(av, 32, True), wrap(bv, 32, True)
        want.append(min(max(x + y, -2**31), 2**31 - 1) + ((x + y) >> 1))
        want.append((wrap(av, 16, False) * wrap(bv, 16, False)) >> 16)
        bad = [(cols[j], out[r][j], want[j]) for j in range(len(cols)) if out[r][j] != want[j]]
        assert not bad, (r, (av, bv, cv), bad[:4])


def test_numeric_limits(device):
    body = """
    of[0] = metal::numeric_limits<float>::max();
    of[1] = metal::numeric_limits<float>::min();
    of[2] = metal::numeric_limits<float>::lowest();
    of[3] = metal::numeric_limits<float>::epsilon();
    of[4] = metal::numeric_limits<float>::infinity();
    of[5] = -numeric_limits<float>::infinity();
    oh[0] = numeric_limits<half>::max();
    oh[1] = numeric_limits<half>::min();
    oh[2] = numeric_limits<half>::lowest();
    oh[3] = numeric_limits<half>::epsilon();
    oh[4] = numeric_limits<half>::infinity();
    oi[0] = metal::numeric_limits<int>::max();
    oi[1] = metal::numeric_limits<int>::min();
    oi[2] = metal::numeric_limits<int>::lowest();
    oi[3] = metal::numeric_limits<int>::epsilon();
    oi[4] = numeric_limits<uint>::max();
    oi[5] = numeric_limits<uint>::min();
    oi[6] = numeric_limits<uint>::lowest();
    oi[7] = numeric_limits<int64_t>::max();
    ob[0] = numeric_limits<bfloat>::max();
    ob[1] = numeric_limits<bfloat>::epsilon();
    constexpr float kInf = numeric_limits<float>::infinity();   // usable in constant expressions
    of[6] = kInf;
"""
    k = kk.metal_kernel(name="numeric_limits", input_names=[], output_names=["of", "oh", "oi", "ob"],
                        source=body)
    of, oh, oi, ob = launch(k, device, [], [(7,), (5,), (8,), (2,)],
                            [torch.float32, torch.float16, torch.int64, torch.bfloat16], (1, 1, 1), (1, 1, 1))
    fi, hi, bi = torch.finfo(torch.float32), torch.finfo(torch.float16), torch.finfo(torch.bfloat16)
    inf = float("inf")
    assert of.cpu().tolist() == [fi.max, fi.tiny, -fi.max, fi.eps, inf, -inf, inf]
    assert oh.cpu().tolist() == [hi.max, hi.tiny, -hi.max, hi.eps, inf]
    assert oi.cpu().tolist() == [2**31 - 1, -2**31, -2**31, 0, 2**32 - 1, 0, 0, 2**63 - 1]
    assert ob.cpu().tolist() == [bi.max, bi.eps]


LIMIT_MEMBERS = ["radix", "digits", "digits10", "max_digits10", "min_exponent", "min_exponent10",
                 "max_exponent", "max_exponent10", "is_iec559", "is_exact", "is_modulo", "is_bounded",
                 "has_signaling_NaN", "has_denorm", "round_style"]
LIMIT_TYPES = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16,
               "double": torch.float64, "int": torch.int32, "uint": torch.uint32, "short": torch.int16,
               "uchar": torch.uint8, "long": torch.int64, "ulong": torch.uint64, "bool": torch.bool}


def std_limits(dtype):
    """std::numeric_limits' members for a torch dtype, from finfo/iinfo and <float.h>'s definitions."""
    log2 = math.log10(2)
    if dtype == torch.bool:
        return dict(radix=2, digits=1, digits10=0, max_digits10=0, min_exponent=0, min_exponent10=0,
                    max_exponent=0, max_exponent10=0, is_iec559=0, is_exact=1, is_modulo=0,
                    is_bounded=1, has_signaling_NaN=0, has_denorm=0, round_style=0)
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        digits = round(1 - math.log2(fi.eps))
        return dict(radix=2, digits=digits, digits10=math.floor((digits - 1) * log2),
                    max_digits10=math.ceil(1 + digits * log2), min_exponent=math.frexp(fi.tiny)[1],
                    min_exponent10=math.ceil(math.log10(fi.tiny)), max_exponent=math.frexp(fi.max)[1],
                    max_exponent10=math.floor(math.log10(fi.max)), is_iec559=1, is_exact=0, is_modulo=0,
                    is_bounded=1, has_signaling_NaN=1, has_denorm=1, round_style=1)
    ii = torch.iinfo(dtype)
    digits = ii.bits - (ii.min < 0)
    return dict(radix=2, digits=digits, digits10=math.floor(digits * log2), max_digits10=0, min_exponent=0,
                min_exponent10=0, max_exponent=0, max_exponent10=0, is_iec559=0, is_exact=1,
                is_modulo=int(ii.min == 0), is_bounded=1, has_signaling_NaN=0, has_denorm=0, round_style=0)


BF_CONSTANTS = {"MAXBFLOAT": torch.finfo(torch.bfloat16).max, "HUGE_VALBF": math.inf, "M_E_BF": math.e,
                "M_LOG2E_BF": math.log2(math.e), "M_LOG10E_BF": math.log10(math.e), "M_LN2_BF": math.log(2),
                "M_LN10_BF": math.log(10), "M_PI_BF": math.pi, "M_PI_2_BF": math.pi / 2, "M_PI_4_BF": math.pi / 4,
                "M_1_PI_BF": 1 / math.pi, "M_2_PI_BF": 2 / math.pi, "M_2_SQRTPI_BF": 2 / math.sqrt(math.pi),
                "M_SQRT2_BF": math.sqrt(2), "M_SQRT1_2_BF": math.sqrt(0.5)}


def test_numeric_limits_members_bfloat_constants_and_bool(device):
    header = "inline int takes_bool(bool b) { return b ? 1 : 0; }\n"
    limits = [f"numeric_limits<{t}>::{m}" for t in LIMIT_TYPES for m in LIMIT_MEMBERS]
    bools = ["b0", "b1", "b2", "b3", "b4", "takes_bool(hh)", "takes_bool(bz)"]  # half/bfloat -> bool implicitly
    body = """
    static_assert(numeric_limits<half>::max_exponent == 16, "usable in constant expressions");
    half hz = half(0.0f), hn = -hz, hh = half(0.5f), hnan = half(NAN);
    bfloat bb = bfloat(-2.0f), bz = bfloat(0.0f);
    bool b0 = hz, b1 = hn, b2 = hh, b3 = hnan, b4 = bb;  // as from float
""" + "".join(f"    oi[{c}] = {e};\n" for c, e in enumerate(bools)) \
        + "".join(f"    oi[{len(bools) + c}] = {e};\n" for c, e in enumerate(limits)) \
        + "".join(f"    ob[{c}] = {e};\n" for c, e in enumerate(BF_CONSTANTS))
    k = kk.metal_kernel(name="limits_members", input_names=[], output_names=["oi", "ob"], source=body,
                        header=header)
    oi, ob = launch(k, device, [], [(len(bools) + len(limits),), (len(BF_CONSTANTS),)],
                    [torch.int64, torch.bfloat16], (1, 1, 1), (1, 1, 1))
    oi = oi.cpu().tolist()
    assert oi[:len(bools)] == [0, 0, 1, 1, 1, 1, 0]
    expected = [std_limits(d)[m] for d in LIMIT_TYPES.values() for m in LIMIT_MEMBERS]
    wrong = [(e, g, w) for e, g, w in zip(limits, oi[len(bools):], expected) if g != w]
    assert not wrong, wrong
    ref = torch.tensor(list(BF_CONSTANTS.values()), dtype=torch.float64).bfloat16()
    assert torch.equal(ob.cpu(), ref)


INT_LIMITS = {"CHAR_BIT": 8, "SCHAR_MAX": 127, "SCHAR_MIN": -128, "UCHAR_MAX": 255, "CHAR_MAX": 127,
              "CHAR_MIN": -128, "SHRT_MAX": 2**15 - 1, "SHRT_MIN": -2**15, "USHRT_MAX": 2**16 - 1,
              "INT_MAX": 2**31 - 1, "INT_MIN": -2**31, "UINT_MAX": 2**32 - 1, "LONG_MAX": 2**63 - 1,
              "LONG_MIN": -2**63}


INT_LIMITS_BODY = "".join(f"    out[{c}] = int64_t({m});\n" for c, m in enumerate(INT_LIMITS)) + \
    f"    out[{len(INT_LIMITS)}] = int64_t(ULONG_MAX == 18446744073709551615UL);\n"


def test_integer_limit_macros(device):
    """The C library's integer limits, as Metal's SDK defines them (long: 64 bits)."""
    k = kk.metal_kernel(name="int_limits", input_names=[], output_names=["out"], source=INT_LIMITS_BODY)
    out = launch(k, device, [], [(len(INT_LIMITS) + 1,)], [torch.int64], (1, 1, 1), (1, 1, 1))[0]
    assert out.cpu().tolist() == [*INT_LIMITS.values(), 1]


FLOAT_CONSTANTS = {
    "FLT_DIG": 6, "FLT_MANT_DIG": 24, "FLT_MAX_10_EXP": 38, "FLT_MAX_EXP": 128, "FLT_MIN_10_EXP": -37,
    "FLT_MIN_EXP": -125, "FLT_RADIX": 2, "FLT_MAX": torch.finfo(torch.float32).max,
    "FLT_MIN": torch.finfo(torch.float32).tiny, "FLT_EPSILON": torch.finfo(torch.float32).eps,
    "MAXFLOAT": torch.finfo(torch.float32).max, "HUGE_VALF": math.inf, "INFINITY": math.inf,
    "HALF_DIG": 3, "HALF_MANT_DIG": 11, "HALF_MAX_10_EXP": 4, "HALF_MAX_EXP": 16, "HALF_MIN_10_EXP": -4,
    "HALF_MIN_EXP": -13, "HALF_RADIX": 2, "HALF_MAX": 65504.0, "HALF_MIN": 2.0**-14, "HALF_EPSILON": 2.0**-10,
    "MAXHALF": 65504.0, "HUGE_VALH": math.inf}
MATH_CONSTANTS = {"E": math.e, "LOG2E": math.log2(math.e), "LOG10E": math.log10(math.e), "LN2": math.log(2),
                  "LN10": math.log(10), "PI": math.pi, "PI_2": math.pi / 2, "PI_4": math.pi / 4,
                  "1_PI": 1 / math.pi, "2_PI": 2 / math.pi, "2_SQRTPI": 2 / math.sqrt(math.pi),
                  "SQRT2": math.sqrt(2), "SQRT1_2": math.sqrt(0.5)}


def test_float_and_half_limits_and_constants(device):
    # MSL's implementation limits (FLT_*, HALF_*) and its M_*_F / M_*_H constants: each the float or
    # half nearest the exact value
    names = list(FLOAT_CONSTANTS) + [f"M_{c}_F" for c in MATH_CONSTANTS] + [f"M_{c}_H" for c in MATH_CONSTANTS]
    body = """
    static_assert(FLT_MANT_DIG == numeric_limits<float>::digits && HALF_MIN_EXP == numeric_limits<half>::min_exponent
                  && HALF_DIG == numeric_limits<half>::digits10 && FLT_MIN_10_EXP == numeric_limits<float>::min_exponent10,
                  "the macros agree with numeric_limits");
    static_assert(is_same_v<decltype(M_PI_H), half> && is_same_v<decltype(M_PI_F), float>, "types");
    float nan_ = NAN;
    out[0] = isnan(nan_);
""" + "".join(f"    out[{c + 1}] = {e};\n" for c, e in enumerate(names))
    k = kk.metal_kernel(name="float_constants", input_names=[], output_names=["out"], source=body)
    out = launch(k, device, [], [(len(names) + 1,)], [torch.float64], (1, 1, 1), (1, 1, 1))[0].cpu().tolist()
    want = [1.0] + list(FLOAT_CONSTANTS.values())
    want += [torch.tensor(v).float().item() for v in MATH_CONSTANTS.values()]
    want += [torch.tensor(v).half().item() for v in MATH_CONSTANTS.values()]
    bad = [(e, g, w) for e, g, w in zip(["isnan(NAN)"] + names, out, want) if g != w]
    assert not bad, bad


@pytest.mark.host_only
def test_integer_limit_macros_beside_climits():
    k = kk.metal_kernel(name="int_limits", input_names=[], output_names=["out"], source=INT_LIMITS_BODY,
                        header="#include <climits>\n")
    out = launch(k, torch.device("cpu"), [], [(len(INT_LIMITS) + 1,)], [torch.int64], (1, 1, 1), (1, 1, 1))[0]
    assert out.tolist() == [*INT_LIMITS.values(), 1]


# ---------------------------------------------------------------------------------------------
# Atomics

ATOMIC_BODY = """
    uint i = thread_position_in_grid.x;
    int v = vals[i];
    uint w = as_type<uint>(words[i]);
    // int: every read-modify-write, each result independent of the order
    atomic_fetch_add_explicit(&ai[0], v, memory_order_relaxed);
    atomic_fetch_sub_explicit(&ai[1], v, memory_order_relaxed);
    atomic_fetch_min_explicit(&ai[2], v, memory_order_relaxed);
    atomic_fetch_max_explicit(&ai[3], v, memory_order_relaxed);
    if (i % 97 == 0) atomic_fetch_and_explicit(&ai[4], andw[i], memory_order_relaxed);
    if (i % 89 == 0) atomic_fetch_or_explicit(&ai[5], orw[i], memory_order_relaxed);
    atomic_fetch_xor_explicit(&ai[6], words[i], memory_order_relaxed);
    int old = atomic_exchange_explicit(&ai[7], int(i) + 1, memory_order_relaxed);
    atomic_store_explicit(&olds[i], old, memory_order_relaxed);
    int expected = atomic_load_explicit(&ai[8], memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&ai[8], &expected, expected + v,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    int ticket = atomic_fetch_add_explicit(&ai[9], 1, memory_order_relaxed);
    atomic_store_explicit(&tickets[i], ticket, memory_order_relaxed);
    atomic_store_explicit(&loads[i], atomic_load_explicit(&ai[10], memory_order_relaxed),
                          memory_order_relaxed);
    // uint: unsigned order, wrap-around
    device atomic_uint* au = aus;
    atomic_fetch_add_explicit(&au[0], w, memory_order_relaxed);
    atomic_fetch_sub_explicit(&au[1], w, memory_order_relaxed);
    atomic_fetch_min_explicit(&au[2], w, memory_order_relaxed);
    atomic_fetch_max_explicit(&au[3], w, memory_order_relaxed);
    if (i % 97 == 0) atomic_fetch_and_explicit(&au[4], as_type<uint>(andw[i]), memory_order_relaxed);
    if (i % 89 == 0) atomic_fetch_or_explicit(&au[5], as_type<uint>(orw[i]), memory_order_relaxed);
    atomic_fetch_xor_explicit(&au[6], w, memory_order_relaxed);
    uint ue = atomic_load_explicit(&au[7], memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&au[7], &ue, max(ue, w),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    // float: integer-valued and half-integer-valued sums are exact in any order
    device atomic_float* af = afs;
    atomic_fetch_add_explicit(&af[0], float(v), memory_order_relaxed);
    atomic_fetch_sub_explicit(&af[1], float(v), memory_order_relaxed);
    float fe = atomic_load_explicit(&af[2], memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&af[2], &fe, fe + 0.5f * float(v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    atomic_exchange_explicit(&af[3], float(i), memory_order_relaxed);
"""


@pytest.mark.parametrize("init", [0, -1])
def test_device_atomics(device, init):
    k = kk.metal_kernel(name="device_atomics", input_names=["vals", "words", "andw", "orw"],
                        output_names=["ai", "olds", "tickets", "loads", "aus", "afs"],
                        source=ATOMIC_BODY, atomic_outputs=True)
    n = 4096 + 77
    vals = rand_int(-1000, 1001, n, device)
    words = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)

    def rand_words():
        return torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)

    andw = rand_words() | rand_words() | rand_words()   # bits set with p = 7/8
    orw = rand_words() & rand_words() & rand_words()    # bits set with p = 1/8
    ai, olds, tickets, loads, au, af = launch(
        k, device, [vals, words, andw, orw], [(11,), (n,), (n,), (n,), (8,), (4,)],
        [torch.int32, torch.int32, torch.int32, torch.int32, torch.uint32, torch.float32],
        (n, 1, 1), (256, 1, 1), init_value=init)
    v = vals.cpu().tolist()
    w = [u32(x) for x in words.cpu().tolist()]
    a = andw.cpu().tolist()
    o = orw.cpu().tolist()

    def wrap32(x):
        x &= 0xFFFFFFFF
        return x - 2**32 if x >= 2**31 else x

    and_i, or_i, xor_i = init, init, init
    for i in range(n):
        if i % 97 == 0:
            and_i &= a[i]
        if i % 89 == 0:
            or_i |= o[i]
        xor_i ^= wrap32(w[i])
    ai = ai.cpu().tolist()
    assert ai[0] == init + sum(v)
    assert ai[1] == init - sum(v)
    assert ai[2] == min([init] + v)
    assert ai[3] == max([init] + v)
    assert ai[4] == wrap32(and_i)
    assert ai[5] == wrap32(or_i)
    assert ai[6] == wrap32(xor_i)
    # exchange: the values handed back plus the final one are the initial one and every thread's
    assert sorted(olds.cpu().tolist() + [ai[7]]) == sorted([init] + [i + 1 for i in range(n)])
    assert ai[8] == init + sum(v)
    assert ai[9] == init + n and sorted(tickets.cpu().tolist()) == list(range(init, init + n))
    assert ai[10] == init and (loads.cpu() == init).all()

    ui = u32(init)
    and_u, or_u, xor_u = ui, ui, ui
    for i in range(n):
        if i % 97 == 0:
            and_u &= u32(a[i])
        if i % 89 == 0:
            or_u |= u32(o[i])
        xor_u ^= w[i]
    au = au.cpu().to(torch.int64).tolist()
    assert au == [(ui + sum(w)) & 0xFFFFFFFF, (ui - sum(w)) & 0xFFFFFFFF, min([ui] + w), max([ui] + w),
                  and_u, or_u, xor_u, max([ui] + w)]
    af = af.cpu().tolist()
    assert af[0] == init + sum(v)
    assert af[1] == init - sum(v)
    assert af[2] == init + 0.5 * sum(v)
    assert af[3] == int(af[3]) and 0 <= af[3] < n


def test_threadgroup_atomics(device):
    header = """
inline void bump(threadgroup atomic_int* counter, int v) {
    atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
}
"""
    body = """
    uint i = thread_position_in_grid.x;
    uint tid = thread_index_in_threadgroup;
    uint g = threadgroup_position_in_grid.x;
    uint G = dispatch_threads_per_threadgroup.x;
    threadgroup atomic_int tsum;
    threadgroup atomic<int> tmin;
    threadgroup atomic_int tmax;
    threadgroup atomic_uint tbits;
    threadgroup atomic_uint tand;
    threadgroup atomic_uint txor;
    threadgroup atomic_uint ticket;
    threadgroup atomic_int tcas;
    threadgroup atomic_int txch;
    threadgroup atomic_float fsum;
    threadgroup atomic_uint hist[8];
    if (tid == 0) {
        atomic_store_explicit(&tsum, 0, memory_order_relaxed);
        atomic_store_explicit(&tmin, 1 << 30, memory_order_relaxed);
        atomic_store_explicit(&tmax, -(1 << 30), memory_order_relaxed);
        atomic_store_explicit(&tbits, 0u, memory_order_relaxed);
        atomic_store_explicit(&tand, ~0u, memory_order_relaxed);
        atomic_store_explicit(&txor, 0u, memory_order_relaxed);
        atomic_store_explicit(&ticket, 0u, memory_order_relaxed);
        atomic_store_explicit(&tcas, 0, memory_order_relaxed);
        atomic_store_explicit(&txch, 0, memory_order_relaxed);
        atomic_store_explicit(&fsum, 0.0f, memory_order_relaxed);
    }
    if (tid < 8) atomic_store_explicit(&hist[tid], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int v = vals[i];
    uint w = as_type<uint>(words[i]);
    bump(&tsum, v);
    atomic_fetch_sub_explicit(&tsum, 1, memory_order_relaxed);
    atomic_fetch_min_explicit(&tmin, v, memory_order_relaxed);
    atomic_fetch_max_explicit(&tmax, v, memory_order_relaxed);
    atomic_fetch_or_explicit(&tbits, 1u << (uint(v) & 31u), memory_order_relaxed);
    atomic_fetch_and_explicit(&tand, ~(1u << (tid % 29)), memory_order_relaxed);
    atomic_fetch_xor_explicit(&txor, w, memory_order_relaxed);
    atomic_fetch_add_explicit(&hist[uint(v) & 7u], 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&fsum, float(v), memory_order_relaxed);
    int e = atomic_load_explicit(&tcas, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&tcas, &e, e + v, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    xold[i] = atomic_exchange_explicit(&txch, int(tid) + 1, memory_order_relaxed);
    uint t = atomic_fetch_add_explicit(&ticket, 1u, memory_order_relaxed);
    order[g * G + t] = tid;     // every ticket taken once: a permutation of the group's threads
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        device int64_t* r = res + g * 10;
        r[0] = atomic_load_explicit(&tsum, memory_order_relaxed);
        r[1] = atomic_load_explicit(&tmin, memory_order_relaxed);
        r[2] = atomic_load_explicit(&tmax, memory_order_relaxed);
        r[3] = atomic_load_explicit(&tbits, memory_order_relaxed);
        r[4] = atomic_load_explicit(&tand, memory_order_relaxed);
        r[5] = atomic_load_explicit(&txor, memory_order_relaxed);
        r[6] = atomic_load_explicit(&ticket, memory_order_relaxed);
        r[7] = atomic_load_explicit(&tcas, memory_order_relaxed);
        r[8] = atomic_load_explicit(&txch, memory_order_relaxed);
        r[9] = int64_t(atomic_load_explicit(&fsum, memory_order_relaxed));
    }
    if (tid < 8) hist_out[g * 8 + tid] = atomic_load_explicit(&hist[tid], memory_order_relaxed);
"""
    k = kk.metal_kernel(name="threadgroup_atomics", input_names=["vals", "words"],
                        output_names=["res", "hist_out", "xold", "order"], source=body, header=header)
    G, n = 128, 128 * 5 + 50  # a partial last group of 50
    groups = -(-n // G)
    vals = rand_int(-1000, 1001, n, device)
    words = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)
    res, hist, xold, order = launch(k, device, [vals, words], [(groups, 10), (groups, 8), (n,), (n,)],
                                    [torch.int64, torch.int32, torch.int32, torch.int32],
                                    (n, 1, 1), (G, 1, 1))
    res, hist, xold, order = res.cpu().tolist(), hist.cpu().tolist(), xold.cpu().tolist(), order.cpu().tolist()
    v_all, w_all = vals.cpu().tolist(), [u32(x) for x in words.cpu().tolist()]
    for g in range(groups):
        lo, hi = g * G, min(n, (g + 1) * G)
        v, w, size = v_all[lo:hi], w_all[lo:hi], hi - lo
        bits, band, bxor = 0, 0xFFFFFFFF, 0
        for t in range(size):
            bits |= 1 << (u32(v[t]) & 31)
            band &= ~(1 << (t % 29)) & 0xFFFFFFFF
            bxor ^= w[t]
        r = res[g]
        assert r[:8] == [sum(v) - size, min(v), max(v), bits, band, bxor, size, sum(v)], g
        assert sorted(xold[lo:hi] + [r[8]]) == list(range(size + 1)), g
        assert r[9] == sum(v), g
        assert hist[g] == [sum(1 for x in v if u32(x) & 7 == b) for b in range(8)], g
        assert sorted(order[lo:hi]) == list(range(size)), g


def test_atomic_fence_64bit_min_max_and_implicit_forms(device):
    # atomic_thread_fence in the last-group pattern (each group publishes a partial sum, fences,
    # takes a ticket; the last group's fence lets it read every partial); Metal's void 64-bit
    # atomic_max_explicit / atomic_min_explicit; the forms without _explicit; atomic_bool; float min/max
    body = """
    uint i = thread_position_in_grid.x;
    uint tid = thread_index_in_threadgroup;
    uint g = threadgroup_position_in_grid.x, groups = threadgroups_per_grid.x;
    threadgroup bool last;
    threadgroup atomic_bool flag;
    if (tid == 0) atomic_store_explicit(&flag, false, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float s = 0.0f;
        for (uint j = 0; j < threads_per_threadgroup.x; ++j) s += vals[g * threads_per_threadgroup.x + j];
        parts[g] = s;
        atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device);
        uint ticket = atomic_fetch_add_explicit((device atomic_uint*)counter, 1u, memory_order_relaxed);
        last = ticket == groups - 1;
        if (last) {
            atomic_thread_fence(mem_flags::mem_device, memory_order_acq_rel);
            float t = 0.0f;
            for (uint j = 0; j < groups; ++j) t += parts[j];
            total[0] = t;
        }
    }
    atomic_thread_fence(mem_flags::mem_threadgroup, memory_order_relaxed, thread_scope_threadgroup);
    atomic_thread_fence(mem_flags::mem_threadgroup | mem_flags::mem_device, memory_order_release,
                        thread_scope_simdgroup);
    ulong w = ulong(keys[i]);
    atomic_max_explicit((device atomic_ulong*)umax, w, memory_order_relaxed);
    atomic_min_explicit((device atomic_ulong*)umin, w, memory_order_relaxed);
    device atomic_int* ai = (device atomic_int*)ints;
    atomic_fetch_add(&ai[0], 2);
    atomic_fetch_sub(&ai[1], 1);
    atomic_fetch_max(&ai[2], int(i));
    atomic_fetch_min(&ai[3], -int(i));
    atomic_fetch_or(&ai[4], 1 << (i % 31));
    atomic_fetch_xor(&ai[5], int(i));
    atomic_fetch_and((device atomic_int*)ands, ~(1 << (i % 7)));
    olds[i] = atomic_exchange(&ai[7], int(i));
    int e = atomic_load(&ai[8]);
    while (!atomic_compare_exchange_weak(&ai[8], &e, e + 3)) {
    }
    if (i == 0) atomic_store(&ai[9], 42);
    bool expected = false;
    if (atomic_compare_exchange_strong_explicit(&flag, &expected, true, memory_order_relaxed, memory_order_relaxed))
        atomic_fetch_add_explicit(&ai[10], 1, memory_order_relaxed);  // once per group
    atomic_fetch_max_explicit((device atomic_float*)fmax_, vals[i], memory_order_relaxed);
    atomic_fetch_min_explicit((device atomic_float*)fmin_, vals[i], memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) flags[g] = atomic_exchange_explicit(&flag, false, memory_order_relaxed);
"""
    k = kk.metal_kernel(name="atomic_fence_forms", input_names=["vals", "keys"],
                        output_names=["parts", "counter", "total", "umax", "umin", "ints", "ands", "olds",
                                      "fmax_", "fmin_", "flags"],
                        source=body)
    G, groups = 64, 37
    n = G * groups
    vals = torch.randint(-50, 50, (n,), device=device).float()
    keys = torch.randint(1, 2**62, (n,), dtype=torch.int64, device=device) * torch.randint(1, 3, (n,), device=device)
    i32, f32 = torch.int32, torch.float32
    parts, counter, total, umax, umin, ints, ands, olds, fmax, fmin, flags = launch(
        k, device, [vals, keys], [(groups,), (1,), (1,), (1,), (1,), (11,), (1,), (n,), (1,), (1,), (groups,)],
        [f32, i32, f32, torch.int64, torch.int64, i32, i32, i32, f32, f32, i32], (n, 1, 1), (G, 1, 1),
        init_value=[0, 0, 0, 0, -1, 0, -1, 0, -1e9, 1e9, 0])
    v = vals.cpu()
    assert counter.item() == groups and torch.equal(parts.cpu(), v.view(groups, G).sum(1))
    assert total.item() == v.sum().item()  # integers: exact in any order
    u = [k_ & (2**64 - 1) for k_ in keys.cpu().tolist()]
    assert [umax.item() & (2**64 - 1), umin.item() & (2**64 - 1)] == [max(u), min(u)]
    or_mask = 0
    xor = 0
    for i in range(n):
        or_mask |= 1 << (i % 31)
        xor ^= i
    ints = ints.cpu().tolist()
    assert ints[:6] == [2 * n, -n, n - 1, -(n - 1), or_mask, xor] and ands.item() == ~0x7f
    assert sorted(olds.cpu().tolist() + [ints[7]]) == [0] + list(range(n)) and ints[8:] == [3 * n, 42, groups]
    assert [fmax.item(), fmin.item()] == [v.max().item(), v.min().item()]
    assert flags.cpu().tolist() == [1] * groups


# ---------------------------------------------------------------------------------------------
# Barriers


def test_barriers(device):
    body = """
    uint i = thread_position_in_grid.x;
    uint tid = thread_index_in_threadgroup;
    uint n = threads_per_threadgroup.x;
    uint g0 = threadgroup_position_in_grid.x * dispatch_threads_per_threadgroup.x;
    uint lane = thread_index_in_simdgroup;
    threadgroup int buf[2][128];
    threadgroup int sbuf[128];
    int v = inp[i];
    // rounds of a ring rotation through threadgroup memory, double-buffered
    buf[0][tid] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int r = 0; r < 5; ++r) {
        buf[(r + 1) & 1][tid] = buf[r & 1][(tid + 1) % n] * 2 + 1;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    ring[i] = buf[1][tid];
    // device memory written by one thread, read by another after a mem_device barrier
    scratch[i] = v * 3;
    threadgroup_barrier(mem_flags::mem_device);
    dev[i] = scratch[g0 + (tid + 7) % n];
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    // a SIMD-group exchanging through threadgroup memory
    sbuf[tid] = v + 1;
    simdgroup_barrier(mem_flags::mem_threadgroup);
    uint base = tid - lane;
    uint size = min(32u, n - base);
    int got = sbuf[base + (lane + 1) % size];
    simdgroup_barrier(mem_flags::mem_none);
    sg[i] = got;
"""
    k = kk.metal_kernel(name="barriers", input_names=["inp"],
                        output_names=["ring", "scratch", "dev", "sg"], source=body)
    G, n = 128, 128 * 3 + 45
    x = rand_int(-1000, 1001, n, device)
    ring, scratch, dev, sg = launch(k, device, [x], [(n,)] * 4, [torch.int32] * 4, (n, 1, 1), (G, 1, 1))
    x = x.cpu().tolist()
    ref_ring, ref_dev, ref_sg = [], [], []
    for i in range(n):
        g0, t = i - i % G, i % G
        size = min(G, n - g0)
        vals = x[g0:g0 + size]
        for _ in range(5):
            vals = [vals[(j + 1) % size] * 2 + 1 for j in range(size)]
        ref_ring.append(vals[t])
        ref_dev.append(3 * x[g0 + (t + 7) % size])
        base = t - t % 32
        ssize = min(32, size - base)
        ref_sg.append(x[g0 + base + (t % 32 + 1) % ssize] + 1)
    assert ring.cpu().tolist() == ref_ring
    assert scratch.cpu().tolist() == [3 * v for v in x]
    assert dev.cpu().tolist() == ref_dev
    assert sg.cpu().tolist() == ref_sg


def test_simdgroup_barrier_and_index_are_no_tensor_ops(nvrtc):
    """simdgroup_barrier and simdgroup_index_in_threadgroup are plain MSL: a kernel naming them is
    compiled for sm_90 as any other, not as a tensor-op kernel (sm_90a, their headers)."""
    plain = kk.metal_kernel(name="sg_plain", input_names=["x"], output_names=["y"], source="""
        simdgroup_barrier(mem_flags::mem_none);
        y[thread_position_in_grid.x] = x[thread_position_in_grid.x] + simdgroup_index_in_threadgroup;
    """)
    matrix = kk.metal_kernel(name="sg_matrix", input_names=["x"], output_names=["y"], source="""
        simdgroup_matrix<float, 8, 8> m = make_filled_simdgroup_matrix<float, 8, 8>(x[0]);
        simdgroup_store(m, y, 8);
    """)
    x = torch.empty(64, device="meta")
    args = dict(inputs=[x], output_dtypes=[torch.float32])
    assert kk.compile_for(plain, "sm_90", **args).arch == "sm_90"
    assert kk.compile_for(matrix, "sm_90", **args).arch == "sm_90a"


# ---------------------------------------------------------------------------------------------
# SIMD-group and quad-group functions: a Python model of Metal's semantics


class Lanes:
    """The active lanes of one SIMD-group (width 32) or quad (width 4), seen from one lane.

    `members` maps each active lane (0..width-1) to its thread's global index; `data` maps an
    input name to its values (indexed by global index).
    """

    def __init__(self, data, members, lane):
        self.data, self.members, self.lane = data, members, lane
        self.active = sorted(members)

    def at(self, name, lane):
        """`name` of that lane; None (undefined in Metal) when the lane is not active."""
        return self.data[name][self.members[lane]] if lane in self.members else None

    def own(self, name):
        return self.at(name, self.lane)

    def values(self, name, upto=None, inclusive=True):
        lanes = self.active if upto is None else [
            a for a in self.active if a < upto or (inclusive and a == upto)]
        return [self.at(name, a) for a in lanes]

    def ballot(self, pred):
        return sum(1 << a for a in self.active if pred(self.at("x", a)))


def reduce_(op, xs, empty):
    r = empty
    for v in xs:
        r = op(r, v)
    return r


def group_model(data, windows, columns, n):
    """Expected rows (n x columns): None where Metal leaves the value undefined; rows of threads
    that are in no window (returned early) are None."""
    expected = [[None] * len(columns) for _ in range(n)]
    for members in windows:
        for lane, i in members.items():
            lanes = Lanes(data, members, lane)
            expected[i] = [model(lanes) for _, model in columns]
    return expected


def windows_1d(n, group, width, keep=lambda i, lane: True):
    """The SIMD-groups (width 32) or quads (width 4) of a 1-D launch: {lane: global index} of the
    threads that exist and are kept, for every group of `width` lanes."""
    windows = []
    for g0 in range(0, n, group):
        size = min(group, n - g0)
        for w0 in range(0, size, width):
            members = {t - w0: g0 + t for t in range(w0, min(size, w0 + width))
                       if keep(g0 + t, t % 32)}
            if members:
                windows.append(members)
    return windows


def check_rows(out, expected, columns):
    out = out.cpu().tolist()
    for i, (got, want) in enumerate(zip(out, expected)):
        for c, (g, w) in enumerate(zip(got, want)):
            if w is not None:
                assert g == w, f"row {i} (thread {i}), {columns[c][0]}: got {g}, expected {w}"


def _prod(xs):
    return reduce_(lambda a, b: a * b, xs, 1)


def _and(xs):
    return reduce_(lambda a, b: a & b, xs, 0xFFFFFFFF)


def _or(xs):
    return reduce_(lambda a, b: a | b, xs, 0)


def _xor(xs):
    return reduce_(lambda a, b: a ^ b, xs, 0)


def _src(width, fn):
    return lambda L: L.at("x", fn(L.lane, width))


def _fill(delta, modulo, fill, up):
    """*_shuffle_and_fill_{up,down}: in windows of `modulo` lanes, lane i reads x of lane i -/+ delta,
    or, where that falls outside the window, fill(x) of the lane as far in from the other end."""
    def model(L):
        li = L.lane % modulo
        src = L.lane - li + ((li - delta) if up else (li + delta)) % modulo
        own = li >= delta if up else li + delta < modulo
        v = L.at("x", src)
        return None if v is None else v if own else fill(v)
    return model


SIMD_INT = [
    ("simd_sum(x)", lambda L: sum(L.values("x"))),
    ("simd_product(p)", lambda L: _prod(L.values("p"))),
    ("simd_min(x)", lambda L: min(L.values("x"))),
    ("simd_max(x)", lambda L: max(L.values("x"))),
    ("simd_and(u)", lambda L: _and(L.values("u"))),
    ("simd_or(u)", lambda L: _or(L.values("u"))),
    ("simd_xor(u)", lambda L: _xor(L.values("u"))),
    ("simd_prefix_inclusive_sum(x)", lambda L: sum(L.values("x", L.lane))),
    ("simd_prefix_exclusive_sum(x)", lambda L: sum(L.values("x", L.lane, False))),
    ("simd_prefix_inclusive_product(p)", lambda L: _prod(L.values("p", L.lane))),
    ("simd_prefix_exclusive_product(p)", lambda L: _prod(L.values("p", L.lane, False))),
    ("simd_shuffle(x, (lane * 7 + 3) % sg_size)", lambda L: L.at("x", (L.lane * 7 + 3) % len(L.active))),
    ("simd_shuffle(x, lane)", lambda L: L.own("x")),
    ("simd_shuffle_up(x, 3)", _src(32, lambda i, w: i - 3 if i >= 3 else i)),
    ("simd_shuffle_down(x, 5)", _src(32, lambda i, w: i + 5 if i + 5 < 32 else i)),
    ("simd_shuffle_xor(x, 6)", _src(32, lambda i, w: i ^ 6)),
    ("simd_shuffle_rotate_up(x, 3)", _src(32, lambda i, w: (i - 3) % 32)),
    ("simd_shuffle_rotate_down(x, 7)", _src(32, lambda i, w: (i + 7) % 32)),
    ("simd_broadcast(x, 2)", lambda L: L.at("x", 2)),
    ("simd_shuffle_and_fill_up(x, x + 1000, 3)", _fill(3, 32, lambda v: v + 1000, True)),
    ("simd_shuffle_and_fill_down(x, -x, 5, 8)", _fill(5, 8, lambda v: -v, False)),
    ("simd_broadcast_first(x)", lambda L: L.at("x", L.active[0])),
    ("static_cast<uint64_t>(simd_ballot(x > 0))", lambda L: L.ballot(lambda x: x > 0)),
    ("simd_ballot(x > -45).all()", lambda L: int(all(x > -45 for x in L.values("x")))),
    ("simd_ballot(x > 45).any()", lambda L: int(any(x > 45 for x in L.values("x")))),
    ("simd_all(x > -45)", lambda L: int(all(x > -45 for x in L.values("x")))),
    ("simd_any(x > 45)", lambda L: int(any(x > 45 for x in L.values("x")))),
    ("simd_is_first()", lambda L: int(L.lane == L.active[0])),
    ("thread_index_in_simdgroup", lambda L: L.lane),
]
SIMD_FLOAT = [
    ("simd_sum(fx)", lambda L: float(sum(L.values("x")))),
    ("simd_max(fy)", lambda L: max(L.values("y"))),
    ("simd_min(fy)", lambda L: min(L.values("y"))),
    ("simd_prefix_inclusive_sum(fx)", lambda L: float(sum(L.values("x", L.lane)))),
    ("simd_prefix_exclusive_sum(fx)", lambda L: float(sum(L.values("x", L.lane, False)))),
    ("simd_product(float(p))", lambda L: float(_prod(L.values("p")))),
    ("simd_shuffle(fy, (lane * 5 + 1) % sg_size)", lambda L: L.at("y", (L.lane * 5 + 1) % len(L.active))),
    ("simd_shuffle_xor(fy, 1)", lambda L: L.at("y", L.lane ^ 1)),
    ("float(simd_sum(half(x)))", lambda L: float(sum(L.values("x")))),
    ("simd_sum(float2(fx, 2.0f * fx)).y", lambda L: float(2 * sum(L.values("x")))),
    ("simd_broadcast(float4(fx, fy, 0.0f, 1.0f), 1).y", lambda L: L.at("y", 1)),
    ("simd_shuffle_down(float2(fy, -fy), 1).y",
     lambda L: None if L.at("y", L.lane + 1 if L.lane < 31 else L.lane) is None
     else -L.at("y", L.lane + 1 if L.lane < 31 else L.lane)),
    ("simd_max(int3(x, -x, 0)).y", lambda L: float(max(-x for x in L.values("x")))),
]


def simd_inputs(n, device):
    x = rand_int(-50, 51, n, device)
    u = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device=device)
    # products of up to 32 lanes stay small: +-2 on every 8th thread, +-1 elsewhere
    sign = rand_int(0, 2, n, device) * 2 - 1
    p = sign * torch.where(torch.arange(n, device=device) % 8 == 0, 2, 1).int()
    y = torch.randn(n, device=device)
    data = {"x": x.cpu().tolist(), "u": [u32(v) for v in u.cpu().tolist()], "p": p.cpu().tolist(),
            "y": y.cpu().tolist()}
    return [x, u, p, y], data


SIMD_PRELUDE = """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    uint sg_size = min(32u, threads_per_threadgroup.x - simdgroup_index_in_threadgroup * 32u);
    int x = xs[i];
    uint u = as_type<uint>(us[i]);
    int p = ps[i];
    float fx = float(x);
    float fy = ys[i];
"""


@pytest.mark.parametrize("n,group", [(256, 128), (200, 80), (45, 64)],
                         ids=["full", "partial-simdgroups", "one-partial-group"])
def test_simd_functions(device, n, group, lane_order):
    body = columns_body(SIMD_PRELUDE, "oi", [e for e, _ in SIMD_INT]) + "".join(
        f"    of[i * {len(SIMD_FLOAT)} + {c}] = float({e});\n" for c, (e, _) in enumerate(SIMD_FLOAT))
    k = kk.metal_kernel(name="simd_functions", input_names=["xs", "us", "ps", "ys"],
                        output_names=["oi", "of"], source=body, header=lane_order)
    inputs, data = simd_inputs(n, device)
    oi, of = launch(k, device, inputs, [(n, len(SIMD_INT)), (n, len(SIMD_FLOAT))],
                    [torch.int64, torch.float32], (n, 1, 1), (group, 1, 1))
    windows = windows_1d(n, group, 32)
    check_rows(oi, group_model(data, windows, SIMD_INT, n), SIMD_INT)
    check_rows(of, group_model(data, windows, SIMD_FLOAT, n), SIMD_FLOAT)


QUAD_INT = [
    ("quad_sum(x)", lambda L: sum(L.values("x"))),
    ("quad_product(p)", lambda L: _prod(L.values("p"))),
    ("quad_min(x)", lambda L: min(L.values("x"))),
    ("quad_max(x)", lambda L: max(L.values("x"))),
    ("quad_and(u)", lambda L: _and(L.values("u"))),
    ("quad_or(u)", lambda L: _or(L.values("u"))),
    ("quad_xor(u)", lambda L: _xor(L.values("u"))),
    ("quad_prefix_inclusive_sum(x)", lambda L: sum(L.values("x", L.lane))),
    ("quad_prefix_exclusive_sum(x)", lambda L: sum(L.values("x", L.lane, False))),
    ("quad_prefix_inclusive_product(p)", lambda L: _prod(L.values("p", L.lane))),
    ("quad_prefix_exclusive_product(p)", lambda L: _prod(L.values("p", L.lane, False))),
    ("quad_shuffle(x, (qlane + 1) % q_size)", lambda L: L.at("x", (L.lane + 1) % len(L.active))),
    ("quad_shuffle_up(x, 1)", _src(4, lambda i, w: i - 1 if i >= 1 else i)),
    ("quad_shuffle_down(x, 2)", _src(4, lambda i, w: i + 2 if i + 2 < 4 else i)),
    ("quad_shuffle_xor(x, 1)", _src(4, lambda i, w: i ^ 1)),
    ("quad_shuffle_rotate_up(x, 1)", _src(4, lambda i, w: (i - 1) % 4)),
    ("quad_shuffle_rotate_down(x, 3)", _src(4, lambda i, w: (i + 3) % 4)),
    ("quad_broadcast(x, 1)", lambda L: L.at("x", 1)),
    ("quad_shuffle_and_fill_down(x, x + 1000, 3)", _fill(3, 4, lambda v: v + 1000, False)),
    ("quad_shuffle_and_fill_down(x, x + 1000, ushort(1), ushort(2))", _fill(1, 2, lambda v: v + 1000, False)),
    ("quad_shuffle_and_fill_up(x, -x, 1u, 2u)", _fill(1, 2, lambda v: -v, True)),
    ("quad_broadcast_first(x)", lambda L: L.at("x", L.active[0])),
    ("static_cast<ushort>(quad_ballot(x > 0))", lambda L: L.ballot(lambda x: x > 0)),
    ("quad_all(x > -30)", lambda L: int(all(x > -30 for x in L.values("x")))),
    ("quad_any(x > 30)", lambda L: int(any(x > 30 for x in L.values("x")))),
    ("quad_is_first()", lambda L: int(L.lane == L.active[0])),
    ("thread_index_in_quadgroup", lambda L: L.lane),
    ("float(quad_sum(fx))", lambda L: sum(L.values("x"))),
    ("quad_sum(int2(x, 1)).y", lambda L: len(L.active)),
]


@pytest.mark.parametrize("n,group", [(128, 64), (173, 30)], ids=["full", "partial-quads"])
def test_quad_functions(device, n, group, lane_order):
    prelude = SIMD_PRELUDE + """
    uint qlane = thread_index_in_quadgroup;
    uint q_size = min(4u, threads_per_threadgroup.x - quadgroup_index_in_threadgroup * 4u);
"""
    body = columns_body(prelude, "oi", [e for e, _ in QUAD_INT])
    k = kk.metal_kernel(name="quad_functions", input_names=["xs", "us", "ps", "ys"],
                        output_names=["oi"], source=body, header=lane_order)
    inputs, data = simd_inputs(n, device)
    oi = launch(k, device, inputs, [(n, len(QUAD_INT))], [torch.int64], (n, 1, 1), (group, 1, 1))[0]
    check_rows(oi, group_model(data, windows_1d(n, group, 4), QUAD_INT, n), QUAD_INT)


EARLY = [
    ("simd_sum(x)", lambda L: sum(L.values("x"))),
    ("simd_is_first()", lambda L: int(L.lane == L.active[0])),
    ("static_cast<uint64_t>(simd_ballot(x > 0))", lambda L: L.ballot(lambda x: x > 0)),
    ("static_cast<uint64_t>(simd_active_threads_mask())", lambda L: L.ballot(lambda x: True)),
    ("simd_broadcast_first(x)", lambda L: L.at("x", L.active[0])),
    ("simd_prefix_exclusive_sum(x)", lambda L: sum(L.values("x", L.lane, False))),
    ("simd_prefix_inclusive_sum(x)", lambda L: sum(L.values("x", L.lane))),
    ("simd_min(x)", lambda L: min(L.values("x"))),
    ("simd_max(x)", lambda L: max(L.values("x"))),
    ("simd_product(p)", lambda L: _prod(L.values("p"))),
    ("simd_all(x > -45)", lambda L: int(all(x > -45 for x in L.values("x")))),
    ("simd_any(x > 40)", lambda L: int(any(x > 40 for x in L.values("x")))),
    ("simd_ballot(x != 0).all()", lambda L: int(all(x != 0 for x in L.values("x")))),
]
QUAD_EARLY = [
    ("quad_sum(x)", lambda L: sum(L.values("x"))),
    ("quad_is_first()", lambda L: int(L.lane == L.active[0])),
    ("quad_broadcast_first(x)", lambda L: L.at("x", L.active[0])),
    ("static_cast<ushort>(quad_ballot(x > 0))", lambda L: L.ballot(lambda x: x > 0)),
]
KEEP = {
    0: lambda x, lane: lane < 20,
    1: lambda x, lane: lane >= 5 and lane % 3 != 1,
    2: lambda x, lane: x % 2 == 0,               # data-dependent
}


@pytest.mark.parametrize("mode", list(KEEP), ids=["lanes-below-20", "holes", "odd-values-return"])
def test_simd_active_lanes_after_early_return(device, mode, lane_order):
    cols = EARLY + QUAD_EARLY
    prelude = SIMD_PRELUDE + f"""
    for (int c = 0; c < {len(cols)}; ++c) oi[i * {len(cols)} + c] = -7;
    bool keep = mode == 0 ? lane < 20 : mode == 1 ? (lane >= 5 && lane % 3 != 1) : (x % 2 == 0);
    if (!keep) return;
"""
    body = columns_body(prelude, "oi", [e for e, _ in cols])
    k = kk.metal_kernel(name="simd_early_return", input_names=["xs", "us", "ps", "ys", "mode"],
                        output_names=["oi"], source=body, header=lane_order)
    n, group = 200, 96  # partial groups too: 96 = 32 * 3, last group of 8
    inputs, data = simd_inputs(n, device)
    oi = launch(k, device, inputs + [mode], [(n, len(cols))], [torch.int64], (n, 1, 1), (group, 1, 1))[0]

    def keep(i, lane):
        return KEEP[mode](data["x"][i], lane)

    simd = group_model(data, windows_1d(n, group, 32, keep), EARLY, n)
    quad = group_model(data, windows_1d(n, group, 4, keep), QUAD_EARLY, n)
    expected = []
    for i in range(n):
        lane = (i % group) % 32
        expected.append(simd[i] + quad[i] if keep(i, lane) else [-7] * len(cols))
    check_rows(oi, expected, cols)


# ---------------------------------------------------------------------------------------------
# elem_to_loc and ceildiv


def _strided(layout, device):
    if layout == "2d-transposed":
        return torch.randn(9, 7, device=device).t()
    if layout == "3d-permuted":
        return torch.randn(4, 5, 6, device=device).permute(2, 0, 1)
    if layout == "4d-sliced":
        return torch.randn(3, 5, 8, 12, device=device)[:, 1:, ::2, 3:11:2].permute(0, 2, 1, 3)
    if layout == "3d-broadcast":
        return torch.randn(5, 1, 7, device=device).expand(5, 4, 7)
    raise ValueError(layout)


@pytest.mark.parametrize("layout", ["2d-transposed", "3d-permuted", "4d-sliced", "3d-broadcast"])
def test_elem_to_loc(device, layout):
    body = """
    uint3 p = thread_position_in_grid;
    uint3 grid = threads_per_grid;
    uint elem = (p.z * grid.y + p.y) * grid.x + p.x;
    // the element-index overloads
    o_uint[elem] = inp[elem_to_loc(elem, inp_shape, inp_strides, inp_ndim)];
    int64_t elem64 = elem;
    o_int64[elem] = inp[elem_to_loc(elem64, inp_shape, inp_strides, inp_ndim)];
    // the thread-position overload: x, y index the last two dims, z the others
    o_pos[elem] = inp[elem_to_loc(p, inp_shape, inp_strides, inp_ndim)];
    // fixed-dimension helpers
    if (NDIM == 2) {
        o_fixed[elem] = inp[elem_to_loc_2(p.xy, inp_strides)];
    } else if (NDIM == 3) {
        o_fixed[elem] = inp[elem_to_loc_3(p, inp_strides)];
    } else {
        o_fixed[elem] = inp[elem_to_loc(p, inp_shape, inp_strides, inp_ndim)];
    }
    // two arrays of one shape, one walk
    auto loc = elem_to_loc_2_nd(p, inp_shape, inp_strides, other_strides, inp_ndim);
    o_pair[elem] = inp[loc.x] + 10.0f * other[loc.y];
"""
    k = kk.metal_kernel(name="elem_to_loc", input_names=["inp", "other"],
                        output_names=["o_uint", "o_int64", "o_pos", "o_fixed", "o_pair"], source=body,
                        ensure_row_contiguous=False)
    x = _strided(layout, device)
    other = torch.randn(*reversed(x.shape), device=device).permute(*reversed(range(x.dim())))
    assert not x.is_contiguous() and not other.is_contiguous()
    shape = tuple(x.shape)
    rest = math.prod(shape[:-2])
    outs = launch(k, device, [x, other], [shape] * 5, [torch.float32] * 5, (shape[-1], shape[-2], rest),
                  (8, 4, 2), template=[("NDIM", x.dim())])
    for name, out in zip(["o_uint", "o_int64", "o_pos", "o_fixed"], outs[:4]):
        assert torch.equal(out.cpu(), x.cpu()), name
    torch.testing.assert_close(outs[4].cpu(), x.cpu() + 10 * other.cpu())


def test_ceildiv(device):
    body = """
    uint i = thread_position_in_grid.x;
    out[i * 3 + 0] = ceildiv(a[i], b[i]);
    out[i * 3 + 1] = ceildiv(uint(a[i]), 32u);
    out[i * 3 + 2] = ceildiv(int64_t(a[i]) << 20, int64_t(b[i]));
"""
    k = kk.metal_kernel(name="ceildiv", input_names=["a", "b"], output_names=["out"], source=body)
    n = 300
    a = rand_int(0, 5000, n, device)
    b = rand_int(1, 70, n, device)
    a[:3] = torch.tensor([0, 32, 33], dtype=torch.int32)
    out = launch(k, device, [a, b], [(n, 3)], [torch.int64], (n, 1, 1), (128, 1, 1))[0]
    ref = [[-(-x // y), -(-x // 32), -(-(x << 20) // y)] for x, y in zip(a.cpu().tolist(), b.cpu().tolist())]
    assert out.cpu().tolist() == ref


def test_clang_loop_pragmas(device):
    """`#pragma clang loop unroll(...)` (the tensor-ops talk unrolls its loops over cooperative
    tensors so) becomes the target compiler's unroll pragma; other clang loop hints are dropped."""
    body = """
    uint i = thread_position_in_grid.x;
    float acc[8];
    #pragma clang loop unroll(full)
    for (int k = 0; k < 8; ++k) acc[k] = inp[i] * float(k);
    float s = 0.0f;
#pragma clang loop unroll_count(4)
    for (int k = 0; k < 8; ++k) s += acc[k];
    #pragma clang loop vectorize(enable) interleave(enable)
    for (int k = 0; k < 2; ++k) s += 1.0f;
    #pragma clang loop unroll(disable)
    for (int k = 0; k < 3; ++k) s -= 0.5f;
    out[i] = s;
"""
    k = kk.metal_kernel("clang_loop_pragmas", ["inp"], ["out"], body)
    x = torch.randn(64, device=device)
    out = launch(k, device, [x], [(64,)], [torch.float32], (64, 1, 1), (64, 1, 1))[0]
    torch.testing.assert_close(out, x * 28 + 0.5)
    source = next(iter(k._variants.values())).source
    assert "KK_UNROLL_FULL" in source and "KK_UNROLL_COUNT(4)" in source and "KK_UNROLL_COUNT(1)" in source
    assert "pragma clang" not in source
