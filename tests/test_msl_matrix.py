"""MSL matrix types (floatCxR, halfCxR, matrix<T, Cols, Rows>; MSL §2.3, §6.6) on every backend.

Matrices are column-major: a C x R matrix (`floatCxR`) has C columns of R rows, and the model of
one in torch is an (R, C) tensor. The kernels write each result column by column into a float
output that starts at -7 (init_value), so an unwritten element fails; references are float64.
"""

import pytest
import torch

import kernelkit as kk

# put(out, k, x): x's elements (a matrix column by column, a vector, a scalar) at out[k...].
HEADER = """
template <typename T, int C, int R>
void put(device float* out, thread uint& k, matrix<T, C, R> m) {
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) out[k++] = float(m[c][r]);
}
template <typename T, int N>
void put(device float* out, thread uint& k, vec<T, N> v) {
    for (int r = 0; r < N; ++r) out[k++] = float(v[r]);
}
void put(device float* out, thread uint& k, float v) { out[k++] = v; }
// A C x R matrix from C * R consecutive elements of p (column-major).
template <typename T, int C, int R, typename P>
matrix<T, C, R> load(const device P* p) {
    matrix<T, C, R> m;
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) m[c][r] = T(p[c * R + r]);
    return m;
}
"""


def launch(kernel, device, inputs, n_out, grid=1, dtype=torch.float32):
    return kernel(inputs=inputs, output_shapes=[(grid, n_out)], output_dtypes=[dtype],
                  grid=(grid, 1, 1), threadgroup=(min(grid, 32), 1, 1), stream=device,
                  init_value=-7)[0].cpu().double()


def mat(flat, cols, rows):
    """The (rows, cols) matrix of cols * rows column-major elements."""
    return flat.reshape(cols, rows).T


def flat(m):
    """A matrix's elements column by column (as put writes them)."""
    return m.T.reshape(-1)


def test_constructors_and_access(device):
    header = HEADER + "constant float2x3 kM = float2x3(float3(1, 2, 3), float3(4, 5, 6));\n"
    body = """
    uint k = 0;
    put(out, k, float2x2(1, 2, 3, 4));                        // scalars, column-major
    put(out, k, float3x2(5.0f));                              // diagonal, non-square
    put(out, k, float2x4(2.5f));
    put(out, k, float2x3(float3(x[0], x[1], x[2]), float3(x[3], x[4], x[5])));
    put(out, k, half2x2(half2(x[0], x[1]), half2(x[2], x[3])));
    put(out, k, float3x3(half3x3(half3(0.5f, 1, 2), half3(3, 4, 5), half3(6, 7, 8))));
    put(out, k, kM);                                          // program-scope constant
    float4x4 m = float4x4(0.0f);
    m[1] = float4(2.0f);                                      // a column
    m[0][0] = 1.0f;                                           // an element
    m[2][3] = 3.0f;
    m[3].xz = float2(x[4], x[5]);                             // a swizzle written through m[3]
    m[0].yw += 10.0f;
    put(out, k, m);
    put(out, k, m[2].wzyx);                                   // a swizzle read
    put(out, k, m[3][2] + m[1].y);
    const float2x3 c = kM;
    put(out, k, c[1]);                                        // a const column
    packed_float3 p = packed_float3(7, 8, 9);
    put(out, k, float2x3(p, float3(1)));
    float2x2 copy = float2x2(1, 2, 3, 4);
    float2x2 other = copy;
    other[0][1] = 9;
    put(out, k, copy);
    put(out, k, other);
    """
    k = kk.metal_kernel(name="matrix_constructors", input_names=["x"], output_names=["out"],
                        source=body, header=header)
    x = torch.tensor([1.5, -2.0, 3.25, 4.0, -5.5, 6.0], device=device)
    out = launch(k, device, [x], 128)[0]
    xs = x.cpu().double().tolist()
    m = torch.zeros(4, 4, dtype=torch.float64)  # (row, column)
    m[:, 1] = 2.0
    m[0, 0] = 1.0
    m[3, 2] = 3.0
    m[0, 3], m[2, 3] = xs[4], xs[5]
    m[1, 0] += 10.0
    m[3, 0] += 10.0
    ref = ([1, 2, 3, 4], [5, 0, 0, 5, 0, 0], [2.5, 0, 0, 0, 0, 2.5, 0, 0], xs, xs[:4],
           [0.5, 1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6], flat(m).tolist(),
           m[:, 2].flip(0).tolist(), [m[2, 3] + m[1, 1]], [4, 5, 6], [7, 8, 9, 1, 1, 1],
           [1, 2, 3, 4], [1, 9, 3, 4])
    ref = torch.tensor([v for part in ref for v in part], dtype=torch.float64)
    assert torch.equal(out[:len(ref)], ref)
    assert torch.all(out[len(ref):] == -7)  # nothing written past them


def test_operators(device):
    """+ - unary - scalar * and the linear-algebra products, square and not, against torch."""
    body = """
    uint i = thread_position_in_grid.x;
    const device float* p = x + i * 96;
    uint k = 0;
    device float* o = out + i * 256;
    float2x3 a = load<float, 2, 3>(p);          // 2 columns of 3
    float2x3 b = load<float, 2, 3>(p + 6);
    float3x2 c = load<float, 3, 2>(p + 12);
    float4x3 d = load<float, 4, 3>(p + 18);
    float2x4 e = load<float, 2, 4>(p + 30);
    float4x4 f = load<float, 4, 4>(p + 38);
    float4x4 g = load<float, 4, 4>(p + 54);
    float3x3 s = load<float, 3, 3>(p + 70);
    float3 v3 = float3(p[79], p[80], p[81]);
    float4 v4 = float4(p[82], p[83], p[84], p[85]);
    float t = p[86];
    put(o, k, a + b);
    put(o, k, a - b);
    put(o, k, -a);
    put(o, k, a * t);
    put(o, k, t * a);
    put(o, k, a * c);                           // (3 x 2)(2 x 3): 3 x 3, float3x3
    put(o, k, c * a);                           // (2 x 3)(3 x 2): 2 x 2, float2x2
    put(o, k, d * e);                           // (3 x 4)(4 x 2): 3 x 2, float2x3
    put(o, k, f * g);
    put(o, k, d * v4);                          // matrix * column vector: float3
    put(o, k, v3 * d);                          // row vector * matrix: float4
    put(o, k, f * v4);
    put(o, k, v4 * f);
    put(o, k, a * float2(v3.x, v3.y));
    float2x3 m = a;
    m += b;
    m -= b * 2.0f;
    m *= 0.5f;
    put(o, k, m);
    float3x3 n = s;
    n *= a * c;                                 // square *= square
    put(o, k, n);
    """
    k = kk.metal_kernel(name="matrix_operators", input_names=["x"], output_names=["out"],
                        source=body, header=HEADER)
    threads = 5
    x = torch.randn(threads, 96, device=device)
    out = launch(k, device, [x], 256, grid=threads)
    for i in range(threads):
        p = x[i].cpu().double()
        a, b = mat(p[0:6], 2, 3), mat(p[6:12], 2, 3)
        c, d, e = mat(p[12:18], 3, 2), mat(p[18:30], 4, 3), mat(p[30:38], 2, 4)
        f, g, s = mat(p[38:54], 4, 4), mat(p[54:70], 4, 4), mat(p[70:79], 3, 3)
        v3, v4, t = p[79:82], p[82:86], p[86]
        refs = [a + b, a - b, -a, a * t, t * a, a @ c, c @ a, d @ e, f @ g, d @ v4, v3 @ d, f @ v4,
                v4 @ f, a @ v3[:2], (a + b - 2 * b) * 0.5, s @ (a @ c)]
        ref = torch.cat([flat(r) if r.dim() == 2 else r for r in refs])
        torch.testing.assert_close(out[i, :len(ref)], ref, rtol=1e-5, atol=1e-5)
        assert torch.all(out[i, len(ref):] == -7)


def test_transpose_and_determinant(device):
    body = """
    uint i = thread_position_in_grid.x;
    const device float* p = x + i * 64;
    uint k = 0;
    device float* o = out + i * 64;
    float2x2 m2 = load<float, 2, 2>(p);
    float3x3 m3 = load<float, 3, 3>(p + 4);
    float4x4 m4 = load<float, 4, 4>(p + 13);
    float2x3 a = load<float, 2, 3>(p + 29);
    float4x2 b = load<float, 4, 2>(p + 35);
    put(o, k, determinant(m2));
    put(o, k, determinant(m3));
    put(o, k, determinant(m4));
    put(o, k, transpose(a));                    // float3x2
    put(o, k, transpose(b));                    // float2x4
    put(o, k, transpose(m4));
    put(o, k, determinant(transpose(m4)) - determinant(m4) * 0.0f);
    """
    k = kk.metal_kernel(name="matrix_functions", input_names=["x"], output_names=["out"],
                        source=body, header=HEADER)
    threads = 16
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(threads, 64, generator=gen, dtype=torch.float64)
    for off, n in ((0, 2), (4, 3), (13, 4)):  # well-conditioned: the identity times 2 plus noise
        x[:, off:off + n * n] = (2 * torch.eye(n, dtype=torch.float64) + 0.5 *
                                 torch.randn(threads, n, n, generator=gen, dtype=torch.float64)
                                 ).reshape(threads, -1)
    x[1::2, 13:17] *= -1  # negative determinants too
    x = x.float()
    out = launch(k, device, [x.to(device)], 64, grid=threads)
    for i in range(threads):
        p = x[i].double()
        m2, m3, m4 = mat(p[0:4], 2, 2), mat(p[4:13], 3, 3), mat(p[13:29], 4, 4)
        a, b = mat(p[29:35], 2, 3), mat(p[35:43], 4, 2)
        dets = torch.stack([torch.linalg.det(m) for m in (m2, m3, m4)])
        torch.testing.assert_close(out[i, :3], dets, rtol=1e-5, atol=1e-5)
        ref = torch.cat([flat(a.T), flat(b.T), flat(m4.T)])
        assert torch.equal(out[i, 3:3 + len(ref)], ref)  # transposes are exact
        torch.testing.assert_close(out[i, 3 + len(ref)], dets[2], rtol=1e-5, atol=1e-5)
        assert torch.all(out[i, 4 + len(ref):] == -7)


def test_half_matrices(device):
    """half matrices compute in half: on small integers every result is exact."""
    body = """
    uint i = thread_position_in_grid.x;
    const device half* p = x + i * 48;
    uint k = 0;
    device float* o = out + i * 96;
    half4x4 f = load<half, 4, 4>(p);
    half4x4 g = load<half, 4, 4>(p + 16);
    half3x2 c = load<half, 3, 2>(p + 32);
    half2x3 a = load<half, 2, 3>(p + 38);
    half3 v = half3(p[44], p[45], p[46]);
    static_assert(is_same<decltype(f * g), half4x4>::value && is_same<decltype(c * v), half2>::value,
                  "half in, half out");
    static_assert(is_same<decltype(f * 2.0f), half4x4>::value, "the scalar converts to half");
    put(o, k, f * g);
    put(o, k, c * v);
    put(o, k, half2(c[0].x, 1) * c);
    put(o, k, a * c);
    put(o, k, f + g - half(2) * f);
    put(o, k, float(determinant(f)));
    put(o, k, float(determinant(half3x3(float3x3(half3x3(f[0].xyz, f[1].xyz, f[2].xyz))))));
    put(o, k, float(determinant(half2x2(f[0].xy, f[1].xy))));
    put(o, k, transpose(a));
    put(o, k, float4x4(f));
    """
    k = kk.metal_kernel(name="matrix_half", input_names=["x"], output_names=["out"],
                        source=body, header=HEADER)
    threads = 8
    x = torch.randint(-3, 4, (threads, 48)).half()
    out = launch(k, device, [x.to(device)], 96, grid=threads)
    for i in range(threads):
        p = x[i].double()
        f, g, c, a = mat(p[0:16], 4, 4), mat(p[16:32], 4, 4), mat(p[32:38], 3, 2), mat(p[38:44], 2, 3)
        v = p[44:47]
        refs = [f @ g, c @ v, torch.stack([c[0, 0], torch.tensor(1.0, dtype=torch.float64)]) @ c,
                a @ c, f + g - 2 * f, torch.linalg.det(f).round().reshape(1),
                torch.linalg.det(f[:3, :3]).round().reshape(1), torch.linalg.det(f[:2, :2]).round().reshape(1),
                a.T, f]
        ref = torch.cat([flat(r) if r.dim() == 2 else r for r in refs])
        assert torch.equal(out[i, :len(ref)], ref), (i, out[i, :len(ref)], ref)
        assert torch.all(out[i, len(ref):] == -7)


def test_device_matrix_buffers(device):
    """A float buffer read as `device float4x4*` (16 floats a matrix) and `device float3x3*`
    (3 columns of float3, each padded to 16 bytes: 12 floats a matrix); a matrix output; an
    array of matrices in threadgroup memory."""
    body = """
    static_assert(sizeof(float3x3) == 48 && sizeof(float4x4) == 64 && alignof(float4x4) == 16, "layout");
    static_assert(sizeof(half3x3) == 24 && sizeof(float3x2) == 24 && sizeof(half2x2) == 8, "layout");
    uint i = thread_position_in_grid.x;
    const device float4x4* m4 = reinterpret_cast<const device float4x4*>(x4);
    const device float3x3* m3 = reinterpret_cast<const device float3x3*>(x3);
    device float4x4* o = reinterpret_cast<device float4x4*>(out);
    threadgroup float4x4 tile[16];              // matrices in threadgroup memory too
    uint t = thread_position_in_threadgroup.x;
    tile[t] = m4[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    o[2 * i] = transpose(tile[t]);
    float3x3 s = m3[i];
    o[2 * i + 1] = float4x4(float4(m3[i][0], 0), float4(s[1], 0), float4(m3[i][2].xyz, 0), m4[i][3]);
    """
    k = kk.metal_kernel(name="matrix_buffers", input_names=["x4", "x3"], output_names=["out"],
                        source=body)
    n = 40
    x4 = torch.randn(n, 16, device=device)
    x3 = torch.randn(n, 12, device=device)
    out = k(inputs=[x4, x3], output_shapes=[(2 * n, 16)], output_dtypes=[torch.float32],
            grid=(n, 1, 1), threadgroup=(16, 1, 1), stream=device, init_value=-7)[0].cpu()
    x4, x3 = x4.cpu(), x3.cpu()
    for i in range(n):
        m = mat(x4[i], 4, 4)
        assert torch.equal(out[2 * i], flat(m.T))
        cols = x3[i].reshape(3, 4).clone()
        cols[:, 3] = 0  # the padding of each float3 column is not read
        assert torch.equal(out[2 * i + 1], torch.cat([cols.reshape(-1), x4[i, 12:16]]))


def test_product_of_mismatched_sizes_does_not_compile():
    body = "out[0] = (float2x3(1.0f) * float2x3(1.0f))[0][0];"
    k = kk.metal_kernel(name="matrix_mismatch", input_names=["x"], output_names=["out"], source=body)
    with pytest.raises(kk.CompileError, match="as many columns as the right one has rows"):
        k(inputs=[torch.zeros(1)], output_shapes=[(1,)], output_dtypes=[torch.float32],
          grid=(1, 1, 1), threadgroup=(1, 1, 1))
