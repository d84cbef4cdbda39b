"""kernelkit.ops as library ops: grid_sample (torch.nn.functional.grid_sample parity on NHWC data)
and matmul_add_relu (Burn's fused op), forward and backward, against plain torch."""

import contextlib
import itertools
import sys
from unittest import mock

import pytest
import torch

import kernelkit as kk
from kernelkit.ops import grid_sample, grid_sample_torch, matmul_add_relu, matmul_add_relu_reference
from kernelkit.ops.grid_sample import MODES, grid_sample_backward, grid_sample_forward

SETTINGS = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True]))
HALF = [torch.float16, torch.bfloat16]


def relative_error(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert out.shape == ref.shape and not out.isnan().any()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def lattice_grid(B, gH, gW, device, dtype, reach=1.25):
    """Grid points on a 1/64 lattice in [-reach, reach]: with H, W <= 16 the source coordinates
    are exact in float32 and in every input dtype, so the kernel (float32) and the float64
    reference take the same corners, the same nearest pixel (ties included) and the same
    border/reflection branches; they differ only by rounding of values."""
    g = (torch.rand(B, gH, gW, 2, device=device, dtype=torch.float64) * 2 - 1) * reach
    return ((g * 64).round() / 64).to(dtype)


def smooth_grid(B, gH, gW, H, W, align_corners, device):
    """Float64 grid points whose source coordinates u keep 0.1 away from every multiple of 1/2,
    where grid_sample's kinks are (corners, clipping, reflection): for gradcheck."""
    def axis(size):
        u = torch.rand(B, gH, gW, device=device, dtype=torch.float64) * (size + 1) - 1  # some outside
        u = torch.floor(2 * u) / 2 + 0.1 + 0.3 * torch.rand_like(u)
        return 2 * u / (size - 1) - 1 if align_corners else (2 * u + 1) / size - 1
    return torch.stack([axis(W), axis(H)], dim=-1)


# ---------------------------------------------------------------------------------------------
# grid_sample


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("mode,padding_mode,align_corners", SETTINGS)
def test_grid_sample_forward(device, mode, padding_mode, align_corners, dtype):
    x = torch.randn(2, 9, 13, 40, device=device).to(dtype)
    grid = lattice_grid(2, 6, 7, device, dtype)
    out = grid_sample(x, grid, mode, padding_mode, align_corners)
    ref = grid_sample_torch(x.double(), grid.double(), mode, padding_mode, align_corners)
    assert out.dtype == dtype and out.shape == ref.shape
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    else:
        assert relative_error(out, ref) < 1e-2


@pytest.mark.parametrize("C", [1, 3, 16, 33, 64])
def test_grid_sample_channels(device, C):
    """Each lane count per pixel (1 to 32) and channel counts it does not divide."""
    x = torch.randn(2, 5, 6, C, device=device)
    grid = lattice_grid(2, 4, 5, device, torch.float32)
    for mode in ("bilinear", "nearest"):
        out = grid_sample(x, grid, mode, "border")
        ref = grid_sample_torch(x.double(), grid.double(), mode, "border")
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_grid_sample_non_contiguous(device):
    base = torch.randn(2, 8, 12, 10, device=device)
    x = base.permute(0, 2, 1, 3)[:, ::2]                        # (2, 6, 8, 10), strided
    grid = lattice_grid(2, 5, 12, device, torch.float32)[:, :, ::2]  # (2, 5, 6, 2), strided
    assert not x.is_contiguous() and not grid.is_contiguous()
    out = grid_sample(x, grid, "bilinear", "reflection", True)
    ref = grid_sample_torch(x.double(), grid.double(), "bilinear", "reflection", True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_grid_sample_nonfinite_grid(device):
    """NaN and far-off points sample nothing (zeros padding), as torch's CUDA kernel does."""
    x = torch.randn(1, 4, 5, 3, device=device)
    grid = torch.tensor([[[[float("nan"), 0.0], [1e30, 0.0], [0.0, -float("inf")], [0.1, 0.2]]]],
                        device=device)
    out = grid_sample(x, grid)
    assert torch.equal(out[0, 0, :3].cpu(), torch.zeros(3, 3))
    torch.testing.assert_close(out[0, 0, 3], grid_sample_torch(x, grid[:, :, 3:])[0, 0, 0])


def _backward(x, grid, cot, *args):
    x = x.detach().requires_grad_()
    grid = grid.detach().requires_grad_()
    grid_sample(x, grid, *args).backward(cot)
    return x.grad, grid.grad


def _reference_backward(x, grid, cot, *args):
    x = x.detach().double().requires_grad_()
    grid = grid.detach().double().requires_grad_()
    grid_sample_torch(x, grid, *args).backward(cot.double())
    return x.grad, grid.grad


@pytest.mark.parametrize("mode,padding_mode,align_corners", SETTINGS)
def test_grid_sample_backward(device, mode, padding_mode, align_corners):
    _check_backward(device, mode, padding_mode, align_corners)


def _check_backward(device, mode, padding_mode, align_corners, grid=None):
    """Both gradients of a float32 backward against torch's in float64."""
    args = (mode, padding_mode, align_corners)
    x = torch.randn(2, 9, 13, 40, device=device)
    grid = lattice_grid(2, 6, 7, device, torch.float32) if grid is None else grid
    cot = torch.randn(2, 6, 7, 40, device=device)
    x_grad, grid_grad = _backward(x, grid, cot, *args)  # the forward's kernel bins the points
    x_ref, grid_ref = _reference_backward(x, grid, cot, *args)
    assert x_grad.dtype == grid_grad.dtype == torch.float32
    torch.testing.assert_close(x_grad.double(), x_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grid_grad.double(), grid_ref, rtol=1e-4, atol=1e-4)
    # the backward alone (on a GPU it bins the points itself, _bin), and on the CPU also the GPU's
    # backward by tiles
    paths = [contextlib.nullcontext()]
    if device.type == "cpu":
        paths.append(mock.patch.object(sys.modules["kernelkit.ops.grid_sample"], "_per_point",
                                       lambda device: False))
    for path in paths:
        with path:
            alone = grid_sample_backward(x, grid, cot, *args)
        for ref, other in zip((x_ref, grid_ref), alone):
            torch.testing.assert_close(other.double(), ref, rtol=1e-4, atol=1e-4)
    if mode == "nearest":
        assert not grid_grad.any()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "zeros"), ("bilinear", "border"),
                                               ("bilinear", "reflection"), ("nearest", "zeros")])
def test_grid_sample_backward_half(device, mode, padding_mode, dtype):
    """x_grad accumulates in float32: many samples land on few pixels (a 4x5 image) and still
    sum to within rounding of the stored result."""
    x = torch.randn(2, 4, 5, 24, device=device).to(dtype)
    grid = lattice_grid(2, 16, 16, device, dtype)
    cot = torch.randn(2, 16, 16, 24, device=device).to(dtype)
    x_grad, grid_grad = _backward(x, grid, cot, mode, padding_mode, False)
    x_ref, grid_ref = _reference_backward(x, grid, cot, mode, padding_mode, False)
    assert x_grad.dtype == grid_grad.dtype == dtype
    assert relative_error(x_grad, x_ref) < 1e-2
    if mode == "bilinear":
        assert relative_error(grid_grad, grid_ref) < 1e-2


@pytest.mark.parametrize("mode,padding_mode,align_corners", SETTINGS)
def test_grid_sample_gradcheck(device, mode, padding_mode, align_corners):
    if device.type != "cpu":
        pytest.skip("gradcheck runs on the CPU backend")
    x = torch.randn(2, 3, 4, 3, dtype=torch.float64, requires_grad=True)
    grid = smooth_grid(2, 2, 3, 3, 4, align_corners, device).requires_grad_(mode == "bilinear")

    def f(x, grid):
        return grid_sample(x, grid, mode, padding_mode, align_corners)
    # nearest: the output is piecewise constant in grid, so only x is checked
    assert torch.autograd.gradcheck(f, (x, grid), nondet_tol=1e-12)


def _gpu_backward_on_the_cpu(monkeypatch):
    """On the CPU backend too, the GPU's backward (by tiles) with the GPU's lanes per point (sums
    across them by shuffles): so that CI checks them without a GPU."""
    module = sys.modules["kernelkit.ops.grid_sample"]
    lanes = module._lanes
    monkeypatch.setattr(module, "_per_point", lambda device: False)
    monkeypatch.setattr(module, "_lanes", lambda v, size, device: lanes(v, size, torch.device("cuda")))
    return module


@pytest.mark.parametrize("tile_bytes", [4 * 40 * 3, 4 * 40, 64], ids=["3px", "1px", "channel-chunks"])
@pytest.mark.parametrize("mode,padding_mode,align_corners",
                         [("bilinear", "zeros", False), ("nearest", "zeros", True),
                          ("bilinear", "reflection", True)])
def test_grid_sample_backward_tiles(device, monkeypatch, tile_bytes, mode, padding_mode, align_corners):
    """The backward's x_grad tiles: several per row, points whose corners straddle tiles, channels
    split into chunks."""
    module = _gpu_backward_on_the_cpu(monkeypatch)
    monkeypatch.setattr(module, "_TILE_BYTES", tile_bytes)
    _check_backward(device, mode, padding_mode, align_corners)


@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "reflection"), ("nearest", "zeros")])
def test_grid_sample_gpu_path_on_the_cpu(monkeypatch, mode, padding_mode):
    """On the CPU a point gets one thread and the backward works per point; the GPU's choices
    (lanes per point, the forward binning for the backward by tiles) run there too."""
    module = _gpu_backward_on_the_cpu(monkeypatch)
    assert module._lanes(10, 16, torch.device("cpu")) > 1
    x = torch.randn(2, 9, 13, 40)
    grid = lattice_grid(2, 6, 7, "cpu", torch.float32)
    torch.testing.assert_close(grid_sample(x, grid, mode, padding_mode), grid_sample_torch(x, grid, mode, padding_mode))
    _check_backward(torch.device("cpu"), mode, padding_mode, False)


@pytest.mark.parametrize("case", ["one-slot", "one-slot-chunks", "clustered"])
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_backward_spills(device, monkeypatch, case, mode):
    """Entries past their tile's slots go through the spill list: every entry past the first of a
    tile (tiles of 3 pixels: entries in two tiles of a row; or of 16 channels: a tile's channels
    in chunks), or the points crowded into a corner of x (their tiles fill, the others stay empty)."""
    module = _gpu_backward_on_the_cpu(monkeypatch)
    if case.startswith("one-slot"):
        monkeypatch.setattr(module, "_capacity", lambda *args: 1)
        monkeypatch.setattr(module, "_TILE_BYTES", 4 * 40 * 3 if case == "one-slot" else 64)
        grid = lattice_grid(2, 6, 7, device, torch.float32)
    else:  # in [-0.75, -0.25]: rows 0 to 3 of 9
        grid = lattice_grid(2, 6, 7, device, torch.float32, reach=0.25) - 0.5
    layout = module._layout((2, 9, 13, 40), torch.float32, grid.shape, mode)
    count = module._binning(layout, (2, 9, 13, 40), grid, mode, "border", False)[1]
    assert count[-1] > 0  # entries spilled
    _check_backward(device, mode, "border", False, grid)


@pytest.mark.parametrize("dtype", HALF)
def test_grid_sample_backward_half_spills(monkeypatch, dtype):
    """float16/bfloat16 entries past their tile's slots are added to x_grad in the storage dtype
    (each add rounds, as in torch's CUDA backward): still within half precision's rounding when
    every entry past a tile's first spills and many land on each pixel."""
    module = _gpu_backward_on_the_cpu(monkeypatch)
    monkeypatch.setattr(module, "_capacity", lambda *args: 1)
    x = torch.randn(2, 4, 5, 24).to(dtype)
    grid = lattice_grid(2, 16, 16, "cpu", dtype)
    cot = torch.randn(2, 16, 16, 24).to(dtype)
    layout = module._layout(x.shape, dtype, grid.shape, "bilinear")
    assert module._binning(layout, x.shape, grid, "bilinear", "zeros", False)[1][-1] > 256  # spilled
    x_grad, grid_grad = grid_sample_backward(x, grid, cot)
    x_ref, grid_ref = _reference_backward(x, grid, cot, "bilinear", "zeros", False)
    assert x_grad.dtype == grid_grad.dtype == dtype
    assert relative_error(x_grad, x_ref) < 1e-2
    assert relative_error(grid_grad, grid_ref) < 1e-2


def test_grid_sample_torch_func(device):
    """torch.func.grad and vjp through grid_sample (the forward bins for the backward there too),
    and a call under no_grad (it does not)."""
    x = torch.randn(2, 5, 6, 8, device=device)
    grid = lattice_grid(2, 3, 4, device, torch.float32)
    cot = torch.randn(2, 3, 4, 8, device=device)

    def loss(f):
        return lambda x, g: (f(x, g) * cot).sum()
    ours = torch.func.grad(loss(grid_sample), argnums=(0, 1))(x, grid)
    ref = torch.func.grad(loss(grid_sample_torch), argnums=(0, 1))(x, grid)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    out, vjp = torch.func.vjp(grid_sample, x, grid)
    for a, b in zip(vjp(cot), ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(grid_sample(x.requires_grad_(), grid), out)


def test_grid_sample_backward_variants_script():
    """bench/grid_sample_backward_variants.py edits the op's kernels: its variants still build
    and compute what the op computes (checked on the CPU backend at a small size)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).parents[1] / "bench" / "grid_sample_backward_variants.py"
    spec = importlib.util.spec_from_file_location("grid_sample_backward_variants", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main("cpu", (1, 16, 20, 64, 8, 8))


def test_grid_sample_empty(device, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched for an empty tensor")
    module = sys.modules["kernelkit.ops.grid_sample"]  # kernelkit.ops.grid_sample is the function
    for name in ("_sample", "_sample_bin", "_bin", "_scatter", "_spilled"):
        monkeypatch.setattr(module, name, no_launch)
    cases = [((0, 4, 5, 3), (0, 2, 2, 2)), ((2, 4, 5, 0), (2, 2, 2, 2)), ((2, 4, 5, 3), (2, 0, 3, 2)),
             ((1, 0, 5, 3), (1, 0, 3, 2))]
    for x_shape, grid_shape in cases:
        x = torch.randn(x_shape, device=device, requires_grad=True)
        grid = torch.rand(grid_shape, device=device, requires_grad=True)
        out = grid_sample(x, grid)
        assert out.shape == (x_shape[0], grid_shape[1], grid_shape[2], x_shape[3])
        out.sum().backward()
        assert x.grad.shape == x.shape and not x.grad.any()
        assert grid.grad.shape == grid.shape and not grid.grad.any()


def test_grid_sample_errors(device):
    x = torch.randn(2, 4, 5, 3, device=device)
    grid = torch.rand(2, 3, 3, 2, device=device)
    cases = [
        ((x[0], grid), ValueError, r"x has shape \(4, 5, 3\); expected 4 dims \(B, H, W, C\)"),
        ((x, grid[0]), ValueError, r"grid has shape \(3, 3, 2\); expected 4 dims \(B=2, gH, gW, 2\)"),
        ((x, torch.rand(2, 3, 3, 3, device=device)), ValueError,
         r"expected \(B=2, gH, gW, 2\): dim 3 is 3, expected 2"),
        ((x, grid[:1]), ValueError, r"dim 0 is 1, expected B=2 \(as in x\)"),
        ((x.long(), grid), TypeError, "x has dtype int64; expected float16, bfloat16, float32 or float64"),
        ((x, grid.double()), TypeError, r"grid has dtype float64; expected float32 \(the dtype of x\)"),
        ((x, grid.to("meta")), ValueError, "grid is on meta but x is on .*; expected one device"),
        ((x.numpy() if device.type == "cpu" else [1.0], grid), TypeError, "x must be a torch.Tensor"),
        ((x, grid, "bicubic"), ValueError, "mode must be one of"),
        ((x, grid, "bilinear", "wrap"), ValueError, "padding_mode must be one of"),
        ((x, grid, "bilinear", "zeros", 1), TypeError, "align_corners must be a bool"),
        ((x[:, :0], grid), ValueError, "non-empty spatial dims"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match="^grid_sample: .*" + message):
            grid_sample(*args)
    with pytest.raises(ValueError, match=r"cotangent has shape \(2, 3, 3, 4\); .* expected C=3"):
        grid_sample_backward(x, grid, torch.zeros(2, 3, 3, 4, device=device))


def test_grid_sample_forward_backward_functions(device):
    """The kernels without autograd, as a benchmark calls them."""
    x = torch.randn(1, 6, 7, 5, device=device)
    grid = lattice_grid(1, 3, 4, device, torch.float32)
    cot = torch.randn(1, 3, 4, 5, device=device)
    torch.testing.assert_close(grid_sample_forward(x, grid), grid_sample_torch(x, grid))
    x_grad, grid_grad = grid_sample_backward(x, grid, cot)
    x_ref, grid_ref = _reference_backward(x, grid, cot, "bilinear", "zeros", False)
    torch.testing.assert_close(x_grad.double(), x_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grid_grad.double(), grid_ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# matmul_add_relu

# (lhs, rhs, bias) shapes: broadcasting batch dims and bias, sizes not multiples of the 64 x 64
# tile (or of its K step of 16), and one over several tiles each way.
SHAPES = [
    ((5, 7), (7, 9), (9,)),
    ((3, 65, 33), (33, 70), (65, 1)),
    ((2, 1, 17, 5), (4, 5, 19), (19,)),
    ((130, 3), (3, 66), ()),
    ((2, 3, 4), (2, 4, 5), (2, 3, 5)),
    ((1, 2, 70, 20), (3, 1, 20, 129), (3, 1, 1, 129)),
]


def _operands(shapes, device, dtype):
    return [torch.randn(s, device=device).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *HALF])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_matmul_add_relu_forward(device, shapes, dtype):
    lhs, rhs, bias = _operands(shapes, device, dtype)
    out = matmul_add_relu(lhs, rhs, bias)
    ref = matmul_add_relu_reference(lhs.double(), rhs.double(), bias.double())
    assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    elif dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    else:
        assert relative_error(out, ref) < 1e-2


def test_matmul_add_relu_strided(device):
    """Transposed, sliced and expanded operands are read through their strides."""
    lhs = torch.randn(3, 40, 50, device=device)[:, ::2, 1:]         # (3, 20, 49), strided rows
    rhs = torch.randn(3, 33, 49, device=device).transpose(-1, -2)   # (3, 49, 33), column-major
    bias = torch.randn(1, 33, device=device).expand(20, 33)
    out = matmul_add_relu(lhs, rhs, bias)
    ref = matmul_add_relu_reference(lhs.double(), rhs.double(), bias.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_matmul_add_relu_backward(device):
    lhs, rhs, bias = (t.requires_grad_() for t in _operands(SHAPES[5], device, torch.float32))
    out = matmul_add_relu(lhs, rhs, bias)
    cot = torch.randn_like(out)
    out.backward(cot)
    refs = [t.detach().double().requires_grad_() for t in (lhs, rhs, bias)]
    matmul_add_relu_reference(*refs).backward(cot.double())
    for t, r in zip((lhs, rhs, bias), refs):
        assert t.grad.shape == t.shape
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_add_relu_wide_tiles(device, dtype):
    """16-bit types over several of the GPU's 256 x 128 tiles (edges off the tile, K aligned for
    TMA and not), forward and backward, against float64."""
    for k in (264, 77):
        lhs, rhs, bias = (t.requires_grad_() for t in _operands(((2, 300, k), (k, 200), (200,)), device, dtype))
        out = matmul_add_relu(lhs, rhs, bias)
        refs = [t.detach().double().requires_grad_() for t in (lhs, rhs, bias)]
        ref = matmul_add_relu_reference(*refs)
        assert relative_error(out.detach(), ref.detach()) < 1e-2
        cot = torch.randn_like(out)
        out.backward(cot)
        ref.backward(cot.double())
        for t, r in zip((lhs, rhs, bias), refs):
            assert t.grad.dtype == dtype and relative_error(t.grad, r.grad) < 2e-2


def _persistent_cases(dtype):
    """(lhs, rhs, bias) that the persistent Hopper GEMM takes: each operand majorness, edges off
    the 128 x 256 tiles (a tile's last quarters of 64 columns or a warpgroup's 64 rows wholly
    outside) and K off its 64-element stages, a broadcast rhs, more tiles than an H100 has SMs;
    full biases (staged by TMA: one a batch, one for all batches), a row for all rows and a full
    bias TMA cannot read (pairs loaded by the layer), a column (loaded by the epilogue), and none
    (the backward's products)."""
    def r(*shape):
        return torch.randn(shape, device="cuda").to(dtype)
    return [
        (r(2, 300, 264), r(264, 200), r(200)),                                   # rhs shared by the batch
        (r(2, 264, 304)[..., :300].transpose(1, 2),                              # M-major lhs,
         r(2, 200, 264).transpose(1, 2), r(2, 300, 200)),                         # K-major rhs
        (r(1100, 136), r(136, 2056), r(1100, 2056)),                             # one matrix, 9 x 17 tiles
        (r(3, 513, 520), r(3, 520, 1032), r(3, 513, 1032)),                      # 3 x 3 x 9 tiles
        (r(2, 300, 264), r(2, 264, 200), r(300, 200)),                           # bias for all batches
        (r(300, 136), r(136, 200), r(308, 208)[8:, 4:204]),                      # bias 8-byte aligned
        (r(3, 513, 520), r(3, 520, 1032), r(3, 513, 1)),                         # a column
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", HALF)
def test_matmul_add_relu_persistent(dtype, monkeypatch):
    """Hopper's path for 16-bit operands TMA can read: forward and backward against float64, and
    the path taken (its kernel launched) for every product."""
    mar = sys.modules["kernelkit.ops.matmul_add_relu"]
    launches = []
    kernel = mar._persistent_kernel
    monkeypatch.setattr(mar, "_persistent_kernel", lambda **kw: launches.append(kw["template"]) or kernel(**kw))
    for lhs, rhs, bias in _persistent_cases(dtype):
        leaves = [t.requires_grad_() for t in (lhs, rhs, bias)]
        out = matmul_add_relu(*leaves)
        refs = [t.detach().double().requires_grad_() for t in leaves]
        ref = matmul_add_relu_reference(*refs)
        assert out.shape == ref.shape and relative_error(out.detach(), ref.detach()) < 1e-2
        cot = torch.randn_like(out)
        out.backward(cot)
        ref.backward(cot.double())
        for t, r in zip(leaves, refs):
            assert relative_error(t.grad, r.grad) < 2e-2
    assert len(launches) == 3 * 7  # forward, then the backward's two products, each case
    assert {(dict(t)["KA"], dict(t)["KB"]) for t in launches} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert {dict(t)["BIAS"] for t in launches[::3]} == {1, 2, 3}


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_add_relu_persistent_compiles_for_sm90a(dtype, nvrtc):
    """The persistent kernel in each operand majorness and bias mode (staged tiles and pairs by
    the layer, elements by the epilogue, none), as an H100 launches it, compiled by NVRTC (on a
    GPU machine too)."""
    mar = sys.modules["kernelkit.ops.matmul_add_relu"]
    meta = torch.empty(2, 256, 256, dtype=dtype, device="meta")
    for ka, kb, bias in [(0, 0, 1), (0, 1, 3), (1, 0, 1), (1, 1, 0), (1, 0, 2), (1, 0, 3)]:
        template = [("T", dtype), ("KA", ka), ("KB", kb), ("BIAS", bias), ("RELU", 1)]
        compiled = kk.compile_for(mar._persistent_kernel, "sm_90", inputs=[meta] * 3, output_dtypes=[dtype],
                                  output_shapes=[meta.shape], template=template, grid=(384, 1, 1),
                                  threadgroup=(384, 1, 1))
        assert compiled.arch == "sm_90a" and compiled.binary


def test_matmul_add_relu_relaxed_precision(device):
    """float32 is exact by default; relaxed_precision=True allows tf32 products (10-bit mantissas)."""
    lhs, rhs, bias = _operands(((2, 130, 70), (70, 150), (150,)), device, torch.float32)
    ref = matmul_add_relu_reference(lhs.double(), rhs.double(), bias.double())
    relaxed = matmul_add_relu(lhs, rhs, bias, relaxed_precision=True)
    assert relative_error(relaxed, ref) < 5e-3
    # float32 sums of 70 products: rounding grows with the sums' magnitudes (a fixed atol of 1e-5
    # failed on the H100 for one element in a run); tf32's errors are ~100x these
    torch.testing.assert_close(matmul_add_relu(lhs, rhs, bias).double(), ref, rtol=1e-5,
                               atol=1e-5 * ref.abs().max().item())
    lhs.requires_grad_()
    out = matmul_add_relu(lhs, rhs, bias, relaxed_precision=True)
    out.sum().backward()
    # relu's mask from the output itself: tf32 products may flip the sign of a sum near zero
    assert relative_error(lhs.grad, (out.detach() > 0).double() @ rhs.double().T) < 5e-3


def test_matmul_add_relu_gradcheck(device):
    if device.type != "cpu":
        pytest.skip("gradcheck runs on the CPU backend")
    lhs, rhs, bias = (torch.randn(s, dtype=torch.float64, requires_grad=True)
                      for s in ((2, 1, 3, 4), (3, 4, 5), (3, 1)))
    assert torch.autograd.gradcheck(matmul_add_relu, (lhs, rhs, bias))


def test_matmul_add_relu_empty(device):
    out = matmul_add_relu(torch.randn(2, 0, 3, device=device), torch.randn(3, 4, device=device),
                          torch.randn(4, device=device))
    assert out.shape == (2, 0, 4)
    bias = torch.randn(5, 4, device=device)  # K = 0: an empty sum, relu(bias)
    out = matmul_add_relu(torch.randn(5, 0, device=device), torch.randn(0, 4, device=device), bias)
    assert torch.equal(out, torch.relu(bias))


def test_matmul_add_relu_errors(device):
    a, b = torch.randn(4, 3, device=device), torch.randn(3, 5, device=device)
    c = torch.randn(5, device=device)
    cases = [
        ((a[0], b, c), ValueError, r"lhs has shape \(3,\); expected at least 2 dims \(\.\.\., M, K\)"),
        ((a, b[:2], c), ValueError, r"rhs has shape \(2, 5\); expected \(\.\.\., K=3, N\): dim 0 is 2"),
        ((a.expand(2, 4, 3), b.expand(3, 3, 5), c), ValueError, "batch dims .* do not broadcast"),
        ((a, b, torch.randn(4, device=device)), ValueError, "does not broadcast to the output"),
        ((a, b, torch.randn(2, 4, 5, device=device)), ValueError, "does not broadcast to the output"),
        ((a, b.double(), c), TypeError, r"rhs has dtype float64; expected float32 \(the dtype of lhs\)"),
        ((a.int(), b.int(), c.int()), TypeError, "expected float16, bfloat16, float32 or float64"),
        ((a, b, c.to("meta")), ValueError, "bias is on meta but lhs is on"),
        ((a, b, 1.0), TypeError, "bias must be a torch.Tensor"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match="^matmul_add_relu: .*" + message):
            matmul_add_relu(*args)
