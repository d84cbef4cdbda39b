"""MLX's kernel utilities (what MLX prepends to every custom kernel: mlx/backend/metal/kernels/
utils.h with bf16.h, bf16_math.h, complex.h, defines.h, logging.h), on every backend: Limits<T>
for each dtype, complex64_t against torch's complex128, log1p, LoopedElemToLoc, the small
helpers, and `#include "mlx/backend/metal/kernels/utils.h"` in a header."""

import math

import pytest
import torch

import kernelkit as kk


def launch(kernel, device, inputs, shapes, dtypes, grid, group, **kw):
    return kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                  threadgroup=group, stream=device, **kw)


FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
INTS = {"i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
        "u8": torch.uint8, "u16": torch.uint16, "u32": torch.uint32, "u64": torch.uint64}
CTYPE = {"f32": "float", "f16": "half", "bf16": "bfloat16_t", "f64": "double", "i8": "int8_t",
         "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t", "u16": "uint16_t",
         "u32": "uint32_t", "u64": "uint64_t"}


def int_range(dtype):
    bits = torch.iinfo(dtype).bits
    signed = dtype in (torch.int8, torch.int16, torch.int32, torch.int64)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


# ---------------------------------------------------------------------------------------------
# Limits<T>


def test_limits_of_every_type(device):
    """max, min, finite_max, finite_min of each dtype, as MLX's utils.h defines them."""
    names = [*FLOATS, *INTS]
    body = "\n".join(
        f"lim_{n}[0] = Limits<{CTYPE[n]}>::max; lim_{n}[1] = Limits<{CTYPE[n]}>::min;"
        f" lim_{n}[2] = Limits<{CTYPE[n]}>::finite_max; lim_{n}[3] = Limits<{CTYPE[n]}>::finite_min;"
        for n in names)
    body += "\nlim_bool[0] = Limits<bool>::max; lim_bool[1] = Limits<bool>::min;"
    dtypes = {**FLOATS, **INTS}
    k = kk.metal_kernel("mlx_limits", ["x"], [f"lim_{n}" for n in names] + ["lim_bool"], body)
    outs = launch(k, device, [torch.zeros(1, device=device)], [(4,)] * len(names) + [(2,)],
                  [dtypes[n] for n in names] + [torch.bool], (1, 1, 1), (1, 1, 1))
    for n, out in zip(names, outs):
        if n in FLOATS:
            big = torch.finfo(FLOATS[n]).max
            assert out.tolist() == [math.inf, -math.inf, big, -big], n
        else:
            lo, hi = int_range(INTS[n])
            assert out.tolist() == [hi, lo, hi, lo], n
    assert outs[-1].tolist() == [True, False]


ROW_EXTREMA = """
// MLX's reduction idiom: each lane starts from the identity, Limits<T>::min for a max
template <typename T, int N>
void row_extrema(const device T* x, device T* hi, device T* lo, uint row, uint lane) {
  T m = Limits<T>::min;
  T n = Limits<T>::max;
  for (uint j = lane; j < N; j += 32) {
    T v = x[row * N + j];
    m = max(m, v);
    n = min(n, v);
  }
  m = simd_max(m);
  n = simd_min(n);
  if (lane == 0) {
    hi[row] = m;
    lo[row] = n;
  }
}
"""


@pytest.mark.parametrize("family", ["floats", "ints"])
def test_reductions_start_from_limits(device, family):
    """Row max and min over rows of 5 (lanes 5..31 hold only the identity) and of 40."""
    types = FLOATS if family == "floats" else INTS
    body = "uint row = threadgroup_position_in_grid.x; uint lane = thread_index_in_simdgroup;\n"
    body += "\n".join(f"row_extrema<{CTYPE[n]}, N>(x_{n}, hi_{n}, lo_{n}, row, lane);" for n in types)
    k = kk.metal_kernel(f"mlx_limits_reduce_{family}", [f"x_{n}" for n in types],
                        [f"{o}_{n}" for n in types for o in ("hi", "lo")], body, header=ROW_EXTREMA)
    g = torch.Generator().manual_seed(0)
    for cols in (5, 40):
        xs = []
        for n, dt in types.items():
            if family == "floats":
                x = torch.randn(3, cols, generator=g, dtype=torch.float64) * 100
                x[1] = -torch.rand(cols, generator=g, dtype=torch.float64) - 1e30  # all very negative
                x[2] = torch.rand(cols, generator=g, dtype=torch.float64) + 1e30
                x = x.clamp(-torch.finfo(dt).max, torch.finfo(dt).max).to(dt)
            else:
                lo, hi = int_range(dt)
                x = torch.randint(max(lo, -2**62), min(hi, 2**62), (3, cols), generator=g)
                x[1] = lo if dt != torch.uint64 else 0  # a row at the type's lowest value
                x[2] = min(hi, 2**63 - 1)  # and one at its largest (uint64: 2^63 - 1)
                x = x.to(dt)
            xs.append(x.to(device))
        outs = launch(k, device, xs, [(3,)] * (2 * len(types)), [dt for dt in types.values() for _ in "hl"],
                      (96, 1, 1), (32, 1, 1), template=[("N", cols)])
        for i, (n, x) in enumerate(zip(types, xs)):
            want_hi = [max(r) for r in x.cpu().tolist()]
            want_lo = [min(r) for r in x.cpu().tolist()]
            assert outs[2 * i].cpu().tolist() == want_hi, (n, cols)
            assert outs[2 * i + 1].cpu().tolist() == want_lo, (n, cols)


# ---------------------------------------------------------------------------------------------
# complex64_t

COMPLEX_BODY = """
uint i = thread_position_in_grid.x;
const device complex64_t* A = reinterpret_cast<const device complex64_t*>(za);
const device complex64_t* B = reinterpret_cast<const device complex64_t*>(zb);
device complex64_t* R = reinterpret_cast<device complex64_t*>(r) + i * 21;
complex64_t a = A[i], b = B[i];
float x = s[i];
R[0] = a + b;
R[1] = a - b;
R[2] = a * b;
R[3] = a / b;
R[4] = -a;
R[5] = a + x;
R[6] = x - a;
R[7] = x / a;
R[8] = a - x;
R[9] = x + a;
complex64_t acc;                     // zero, as MLX's default constructor
acc += a;
acc += b;
R[10] = acc;
R[11] = x;                           // a real scalar is (x, 0)
float2 v = a;                        // the FFT kernels' float2 lanes
complex64_t from_v = float2(v.y, v.x);
R[12] = from_v;
complex32_t h = a;                   // half lanes
R[13] = complex64_t(h * h + h);
R[14] = log1p(a);
R[15] = i == 0 ? Limits<complex64_t>::max : Limits<complex64_t>::min;
R[16] = simd_shuffle_down(a, 1);
R[17] = a % b;
float re = a;                        // a complex converts to its real part
R[18] = complex64_t(re, float(cast_to<bool>(complex64_t(0.0f, b.imag))));
R[19] = complex64_t{1.0f, 2.0f} * complex64_t{3.0f, 4.0f};
threadgroup complex64_t buf[32];     // complex values in threadgroup memory
uint lid = thread_position_in_threadgroup.x;
buf[lid] = a;
threadgroup_barrier(mem_flags::mem_threadgroup);
R[20] = buf[31 - lid];
device int* C = cmp + i * 6;
C[0] = a < b;
C[1] = a > b;
C[2] = a <= b;
C[3] = a >= b;
C[4] = a == b;
C[5] = a == A[i];
"""


def complex_columns(a, b, s):
    """The reference of COMPLEX_BODY's columns, complex128 (where no exact float32 model)."""
    c = torch.complex128
    a64, b64, s64 = a.to(c), b.to(c), s.to(torch.float64)
    n = a.numel()
    cols = {0: a64 + b64, 1: a64 - b64, 2: a64 * b64, 3: a64 / b64, 4: -a64, 5: a64 + s64,
            6: s64 - a64, 7: s64 / a64, 8: a64 - s64, 9: s64 + a64, 10: a64 + b64,
            11: s64.to(c), 12: torch.complex(a64.imag, a64.real), 14: torch.log1p(a64)}
    hr, hi = a.real.half(), a.imag.half()  # complex32_t: each lane operation rounded to half
    cols[13] = torch.complex((hr * hr - hi * hi + hr).double(), (hr * hi + hi * hr + hi).double())
    inf = torch.full((n,), -math.inf, dtype=torch.float64)
    inf[0] = math.inf
    cols[15] = torch.complex(inf, inf)
    shifted = torch.cat([a64.view(-1, 32)[:, 1:], a64.view(-1, 32)[:, -1:]], dim=1).reshape(-1)
    cols[16] = shifted
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag  # float32, as the kernel computes %

    def floored_mod(x, y):
        r = x - y * torch.trunc(x / y)
        return torch.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    cols[17] = torch.complex(floored_mod(ar, br), floored_mod(ai, bi)).to(c)
    cols[17][6:8] = cols[17][6:8].real  # imag / 0 and imag / 1e-40 overflow int64 (undefined in MLX too)
    cols[18] = torch.complex(a64.real, (b.imag != 0).double())
    cols[19] = torch.full((n,), complex(-5, 10), dtype=c)
    cols[20] = a64.view(-1, 32).flip(1).reshape(-1)
    return cols


def test_complex64(device):
    n = 64
    g = torch.Generator().manual_seed(1)
    a = torch.complex(torch.randn(n, generator=g), torch.randn(n, generator=g))
    b = torch.complex(torch.randn(n, generator=g), torch.randn(n, generator=g))
    b[3] = a[3]  # equal pairs for ==, <=, >=
    b[4] = torch.complex(a[4].real, a[4].imag + 1)  # equal real parts: ordered by imag
    a[5] = 1e-3 * a[5]  # log1p near 0
    b[6] = torch.complex(b[6].real, torch.tensor(1e-40))  # a subnormal imaginary part: true
    b[7] = torch.complex(b[7].real, torch.tensor(0.0))
    s = torch.randn(n, generator=g)
    k = kk.metal_kernel("mlx_complex64", ["za", "zb", "s"], ["r", "cmp"], COMPLEX_BODY)
    r, cmp = launch(k, device, [torch.view_as_real(z).to(device) for z in (a, b)] + [s.to(device)],
                    [(n, 21, 2), (n, 6)], [torch.float32, torch.int32], (n, 1, 1), (32, 1, 1))
    got = torch.view_as_complex(r.cpu()).to(torch.complex128)
    for col, want in complex_columns(a, b, s).items():
        tol = 1e-3 if col == 13 else 2e-6
        if col == 17:
            got[6:8, col] = got[6:8, col].real
        torch.testing.assert_close(got[:, col], want, rtol=tol, atol=tol, msg=f"column {col}")
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    gt = (ar > br) | ((ar == br) & (ai > bi))
    ge = (ar > br) | ((ar == br) & (ai >= bi))
    eq = (ar == br) & (ai == bi)
    want = torch.stack([~ge, gt, ~gt, ge, eq, torch.ones(n, dtype=torch.bool)], dim=1).int()
    assert torch.equal(cmp.cpu(), want)


def test_complex64_buffers(device):
    """complex64 tensors in and out as complex64_t buffers (MLX passes complex arrays so), a strided
    view through elem_to_loc, and init_value filling a complex output."""
    body = """
    uint i = thread_position_in_grid.x;
    complex64_t v = z[elem_to_loc(i, z_shape, z_strides, z_ndim)];
    out[i] = v * complex64_t(0.0f, 1.0f) + complex64_t(w[i], 0.0f);
    if (i % 2 == 0) filled[i] = complex64_t(v.real, -v.imag);
"""
    k = kk.metal_kernel("complex_buffers", ["z", "w"], ["out", "filled"], body, ensure_row_contiguous=False)
    n = 24
    zs = torch.randn(n, 2, dtype=torch.complex64, device=device)
    z, w = zs[:, 1], torch.randn(n, device=device)  # a strided view
    out, filled = k(inputs=[z, w], grid=(n, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(n,), (n,)],
                    output_dtypes=[torch.complex64, torch.complex64], init_value=2.5)
    torch.testing.assert_close(out.cpu().to(torch.complex128), z.cpu().to(torch.complex128) * 1j + w.cpu().double())
    want = torch.where(torch.arange(n) % 2 == 0, z.cpu().conj(), torch.tensor(2.5, dtype=torch.complex64))
    torch.testing.assert_close(filled.cpu(), want)


def test_simd_functions_move_values_with_constructors(device):
    """Shuffles and reductions take any trivially copyable value, also one with constructors
    (complex64_t, a header's struct)."""
    header = """
struct Pair {
  float a; int b;
  Pair() : a(0), b(0) {}
  Pair(float a_, int b_) : a(a_), b(b_) {}
};
"""
    body = """
    uint i = thread_position_in_grid.x, lane = thread_index_in_simdgroup;
    complex64_t z = complex64_t(x[i], float(lane));
    complex64_t w = simd_shuffle_xor(z, 3u);
    complex64_t s = simd_sum(z);
    Pair p = simd_broadcast(Pair(x[i], int(lane) * 2), 5u);
    out[4 * i] = w.real; out[4 * i + 1] = w.imag; out[4 * i + 2] = s.real + s.imag; out[4 * i + 3] = p.a + p.b;
"""
    k = kk.metal_kernel("simd_constructed", ["x"], ["out"], body, header=header)
    n = 64
    x = torch.randn(n, device=device)
    out = k(inputs=[x], grid=(n, 1, 1), threadgroup=(n, 1, 1), output_shapes=[(n, 4)],
            output_dtypes=[torch.float32])[0].cpu().double()
    xc = x.cpu().double()
    lane = torch.arange(n) % 32
    src = torch.arange(n) // 32 * 32 + (lane ^ 3)
    group = xc.view(2, 32).sum(1).repeat_interleave(32) + float(sum(range(32)))
    five = torch.arange(n) // 32 * 32 + 5
    ref = torch.stack([xc[src], lane[src].double(), group, xc[five] + 10.0], 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_complex64_in_a_cuda_kernel_is_a_clear_error():
    k = kk.cuda_kernel("complex_in_cuda", ["z"], ["out"], "out[threadIdx.x] = 0;")
    with pytest.raises(TypeError, match="view_as_real"):
        k(inputs=[torch.zeros(4, dtype=torch.complex64)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.float32])


# ---------------------------------------------------------------------------------------------
# log1p, LoopedElemToLoc, the small helpers


def test_log1p(device):
    """MLX's log1p for float, bfloat16_t (and half, taken as float): accurate near 0."""
    x = torch.tensor([0.0, 1e-10, -1e-7, 3e-5, -0.25, 0.5, 1.0, 7.0, 1e6, math.inf, -1.0, 1e-3])
    body = """
    uint i = thread_position_in_grid.x;
    out[i * 3 + 0] = log1p(x[i]);
    out[i * 3 + 1] = log1p(bfloat16_t(x[i]));
    out[i * 3 + 2] = log1p(half(x[i]));
    """
    k = kk.metal_kernel("mlx_log1p", ["x"], ["out"], body)
    (out,) = launch(k, device, [x.to(device)], [(x.numel(), 3)], [torch.float32],
                    (x.numel(), 1, 1), (x.numel(), 1, 1))
    out = out.cpu().double()
    torch.testing.assert_close(out[:, 0], torch.log1p(x.double()), rtol=1e-6, atol=0)
    xb = x.bfloat16().double()
    torch.testing.assert_close(out[:, 1], torch.log1p(xb).bfloat16().double(), rtol=8e-3, atol=0)
    xh = x.half().double()  # 1e6 is inf in half
    torch.testing.assert_close(out[:, 2], torch.log1p(xh), rtol=1e-6, atol=0)


def test_looped_elem_to_loc(device):
    """The offsets of consecutive elements of a strided array, carried from one to the next:
    LoopedElemToLoc<2> over a 3-D view (each thread jumps to its chunk with next(n)), and
    LoopedElemToLoc<1, ..., false> along a 1-D stride."""
    body = """
    uint t = thread_position_in_grid.x;
    LoopedElemToLoc<2, int64_t> loop(inp_ndim);
    loop.next(int(t * CHUNK), inp_shape, inp_strides);
    for (int j = 0; j < CHUNK; ++j) {
      out[t * CHUNK + j] = inp[loop.location()];
      loop.next(inp_shape, inp_strides);
    }
    LoopedElemToLoc<1, size_t, false> line(1);
    line.next(int(t), line_in_shape, line_in_strides);
    line_out[t] = line_in[line.location()];
    LoopedElemToLoc<3, uint> step(inp_ndim);   // every third element, with next(3)
    for (int j = 0; j < int(t); ++j) step.next(3, inp_shape, inp_strides);
    third[t] = inp[step.location()];
    """
    k = kk.metal_kernel("mlx_looped", ["inp", "line_in"], ["out", "line_out", "third"], body,
                        ensure_row_contiguous=False)
    base = torch.arange(4 * 5 * 6, dtype=torch.float32).reshape(4, 5, 6)
    inp = base.permute(2, 0, 1)[:, 1:, ::2]  # shape (6, 3, 3), strides (1, 30, 12)
    line_in = torch.arange(40, dtype=torch.float32)[::3]  # 14 elements, stride 3
    chunk, threads = 6, inp.numel() // 6
    out, line_out, third = launch(k, device, [inp.to(device), line_in.to(device)],
                                  [(inp.numel(),), (threads,), (threads,)], [torch.float32] * 3,
                                  (threads, 1, 1), (threads, 1, 1), template=[("CHUNK", chunk)])
    torch.testing.assert_close(out.cpu(), inp.reshape(-1), rtol=0, atol=0)
    torch.testing.assert_close(line_out.cpu(), line_in[:threads], rtol=0, atol=0)
    torch.testing.assert_close(third.cpu(), inp.reshape(-1)[::3][:threads], rtol=0, atol=0)


MISC_HEADER = """
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/bf16.h"
#include "mlx/backend/metal/kernels/bf16_math.h"
#include "mlx/backend/metal/kernels/complex.h"
#include "mlx/backend/metal/kernels/defines.h"
#include <metal_stdlib>
using namespace metal;

// as MLX's utils.h writes it: the same macro again is no redefinition
#define MLX_MTL_PRAGMA_UNROLL _Pragma("clang loop unroll(full)")

constant mlx::os_log logger("kernelkit", "test_mlx_utils");

// a header's own helpers beside MLX's: its log1p(half) is the one called
inline half log1p(half x) { return x + half(100.0f); }

template <typename T>
T clamp_finite(T x) {
  return clamp(x, Limits<T>::finite_min, Limits<T>::finite_max);
}

template <typename T>
T twice(T x) { return x + x; }
instantiate_kernel("twice_float", twice, float)
"""

MISC_BODY = """
uint i = thread_position_in_grid.x;
logger.log_debug("thread %d", i);
float acc = 0;
MLX_MTL_PRAGMA_UNROLL
for (int j = 0; j < 4; ++j) acc += float(j);
device float* o = out + i * 16;
o[0] = acc;
o[1] = WorkPerThread<float>::n * 100 + WorkPerThread<half>::n * 10 + WorkPerThread<int8_t>::n;
o[2] = float(REDUCE_N_READS + SOFTMAX_N_READS + RMS_N_READS + REDUCE_N_WRITES
             + MAX_REDUCE_SPECIALIZED_DIMS + RMS_LOOPED_LIMIT);
o[3] = sizeof(ConditionalType<true, double, char>::type) * 10 + sizeof(ConditionalType<false, double, char>::type);
o[4] = bfloat16_to_uint16(bfloat16_t(x[i]));
o[5] = float(uint16_to_bfloat16(bfloat16_to_uint16(bfloat16_t(x[i]))));
o[6] = float(cast_to<bool>(x[i] * 1e-40f));   // subnormal: true
o[7] = float(cast_to<bool>(-0.0f));           // negative zero: false
o[8] = float(cast_to<int>(x[i] * 10.0f));     // static_cast
o[9] = float(log1p(half(x[i])));              // the header's overload
o[10] = clamp_finite(x[i] * 1e38f * 1e38f);   // +-inf clamped to +-FLT_MAX
o[11] = float(clamp_finite(half(x[i] * 1e5f)));
o[12] = ceildiv(int(i) + 5, 4);
MTL_CONST int three = 3;
o[13] = three;
o[14] = simd_shuffle_down(int64_t(i) << 40, 2) >> 40;   // 64-bit shuffles (MLX's overloads)
o[15] = float(simd_shuffle_up(bool(i & 1), 1));
"""


def test_includes_and_helpers(device):
    """A header that includes MLX's headers and uses their names, and the small helpers."""
    n = 32
    x = torch.linspace(-1.5, 1.5, n)
    x[0] = 0.0
    k = kk.metal_kernel("mlx_misc", ["x"], ["out"], MISC_BODY, header=MISC_HEADER)
    (out,) = launch(k, device, [x.to(device)], [(n, 16)], [torch.float32], (n, 1, 1), (n, 1, 1))
    out = out.cpu()
    i = torch.arange(n)
    xb = x.bfloat16()
    assert (out[:, 0] == 6).all() and (out[:, 1] == 248).all() and (out[:, 2] == 4096 + 20).all()
    assert (out[:, 3] == 81).all()
    assert torch.equal(out[:, 4], xb.view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).float())
    assert torch.equal(out[:, 5], xb.float())
    assert torch.equal(out[:, 6], (x != 0).float()) and (out[:, 7] == 0).all()
    assert torch.equal(out[:, 8], (x * 10).trunc())
    torch.testing.assert_close(out[:, 9], (x.half() + 100).float())
    big = torch.finfo(torch.float32).max
    want = torch.where(x > 0, big, torch.where(x < 0, -big, torch.tensor(math.nan)))
    torch.testing.assert_close(out[1:, 10], want[1:])  # x = 0: 0 * inf is NaN
    half_max = torch.finfo(torch.float16).max
    torch.testing.assert_close(out[:, 11], (x * 1e5).half().float().clamp(-half_max, half_max))
    assert torch.equal(out[:, 12], ((i + 5 + 3) // 4).float()) and (out[:, 13] == 3).all()
    assert torch.equal(out[:, 14], torch.where(i + 2 < 32, i + 2, i).float())
    assert torch.equal(out[:, 15], torch.where(i >= 1, (i - 1) & 1, i & 1).float())


def test_a_headers_own_names_hide_mlx_ones(device):
    """MLX's types and constants are at global scope, as in MLX: a header that declares its own
    (in namespace metal, where kernelkit compiles it) hides them instead of clashing."""
    header = """
template <typename T>
struct Limits {
  static constexpr T max = T(7);
};
static constexpr int REDUCE_N_READS = 2;
struct complex64_t { float re, im; };
"""
    body = """
    complex64_t z = {1.0f, 2.0f};
    out[0] = Limits<float>::max;
    out[1] = REDUCE_N_READS;
    out[2] = ::Limits<float>::max;
    out[3] = z.im + ::complex64_t(3.0f, 4.0f).imag;
    """
    k = kk.metal_kernel("mlx_hidden", ["x"], ["out"], body, header=header)
    (out,) = launch(k, device, [torch.zeros(1, device=device)], [(4,)], [torch.float32], (1, 1, 1),
                    (1, 1, 1))
    assert out.cpu().tolist() == [7.0, 2.0, math.inf, 6.0]
