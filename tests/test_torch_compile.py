"""kernelkit under torch.compile, torch.library and CUDA graphs: kernel calls and custom_functions
are opaque custom ops (kernelkit::launch, kernelkit::custom_function) with fake implementations,
so torch.compile traces them without a graph break (fullgraph, dynamic shapes), opcheck passes,
and CUDA graphs capture them. Eager calls keep the fast path (tests/test_fast_path.py)."""

import warnings

import pytest
import torch

import kernelkit as kk
from kernelkit import torch_ops

SQUARE = "uint i = thread_position_in_grid.x; y[i] = x[i] * x[i] + T(s);"
CUDA_SQUARE = "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n[0]) y[i] = x[i] * x[i] + s[0];"


def _square(x, k):
    return k(inputs=[x], grid=(x.numel(), 1, 1), threadgroup=(32, 1, 1), output_shapes=[x.shape],
             output_dtypes=[x.dtype], template=[("T", x.dtype), ("s", 1)])[0]


def _no_breaks(fn, *args):
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("dynamic", [False, True])
def test_kernel_call_compiles_without_a_graph_break(device, dynamic):
    k = kk.metal_kernel("square", ["x"], ["y"], SQUARE)
    c = kk.cuda_kernel("cuda_square", ["x", "n", "s"], ["y"], CUDA_SQUARE)

    def f(x):
        y = _square(x, k) * 2
        z = c(inputs=[x, x.numel(), 1.0], grid=(x.numel(), 1, 1), threadgroup=(64, 1, 1),
              output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
        return y + z

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    for n in (64, 100, 37):
        x = torch.randn(n, device=device)
        torch.testing.assert_close(compiled(x), 3 * (x * x + 1))
    _no_breaks(f, torch.randn(8, device=device))


@kk.custom_function
def cube(x, scale=1.0):
    return _square(x, kk.metal_kernel("square", ["x"], ["y"], SQUARE)) * x * scale


@cube.vjp
def cube_vjp(primals, cotangent, output, scale=1.0):
    return 3 * primals * primals * cotangent * scale


def test_training_step_through_a_custom_function(device):
    lin = torch.nn.Linear(16, 16).to(device)

    def step(x):
        return cube(lin(x), scale=0.5).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 16, device=device)
        lin.zero_grad()
        step(x).backward()
        eager = [p.grad.clone() for p in lin.parameters()]
        lin.zero_grad()
        loss = compiled(x)
        loss.backward()
        for a, b in zip(eager, [p.grad for p in lin.parameters()]):
            torch.testing.assert_close(a, b)
        h = lin(x).detach()
        torch.testing.assert_close(loss, ((h * h + 1) * h * 0.5).sum(), rtol=1e-5, atol=1e-5)
    _no_breaks(step, torch.randn(4, 16, device=device))


@pytest.mark.slow
def test_ops_compile_and_train(device):
    x = torch.randn(2, 8, 8, 4, device=device, requires_grad=True)
    g = (torch.rand(2, 5, 6, 2, device=device) * 2 - 1).requires_grad_()
    a = torch.randn(3, 16, 24, device=device, requires_grad=True)
    b = torch.randn(3, 24, 8, device=device, requires_grad=True)
    bias = torch.randn(8, device=device, requires_grad=True)

    def step(x, g, a, b, bias):
        s = kk.ops.grid_sample(x, g, mode="bilinear", padding_mode="border", align_corners=True)
        return (s * s).sum() + kk.ops.matmul_add_relu(a, b, bias).sum() + kk.ops.exp(bias.detach()).sum()

    torch._dynamo.reset()
    args = (x, g, a, b, bias)
    eager = torch.autograd.grad(step(*args), args)
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*args), args)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(e, c, rtol=1e-4, atol=1e-4)
    _no_breaks(step, *args)



def test_linalg_ops_compile_and_train(device):
    """cholesky and qr: opaque ops whose backward (triangular solves) returns column-major
    gradients, and whose not-positive-definite error is raised at run time."""
    a = torch.randn(2, 6, 6, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 7, 5, device=device, dtype=torch.float64, requires_grad=True)

    def step(a, b):
        eye = torch.eye(6, device=a.device, dtype=a.dtype)
        q, r = kk.ops.qr(b)
        return kk.ops.cholesky(a @ a.mT + eye).sum() + (q * q.detach()).sum() + r.square().sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(step(a, b), (a, b))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(a, b), (a, b))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(e, c)
    _no_breaks(step, a, b)
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 1"):
        torch.compile(kk.ops.cholesky, fullgraph=True)(-torch.eye(3, device=device))


def test_ops_compile_for_inference(device):
    """Under no_grad a custom_function is still the opaque op: its Python (grid_sample's alignment
    check reads data pointers) runs at run time on real tensors, never traced on fake ones."""
    x = torch.randn(2, 8, 8, 4, device=device)
    g = torch.rand(2, 5, 6, 2, device=device) * 2 - 1
    a, b, bias = torch.randn(3, 16, 24, device=device), torch.randn(3, 24, 8, device=device), torch.randn(8, device=device)

    def infer(x, g, a, b, bias):
        return kk.ops.grid_sample(x, g).sum() + kk.ops.matmul_add_relu(a, b, bias).sum()

    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(infer, fullgraph=True)(x, g, a, b, bias), infer(x, g, a, b, bias))
        _no_breaks(infer, x, g, a, b, bias)

def test_an_op_compiles_once(device):
    """A graph of ops compiles once: Dynamo guards on nothing their eager road reads (the argument
    checks' cache of signatures seen, whether the C++ autograd node is built yet); such a guard
    compiled the graph again at its second step, and was checked at every step."""
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    x = torch.randn(2, 8, 8, 4, device=device)
    g = torch.rand(2, 5, 6, 2, device=device) * 2 - 1
    q = k = v = torch.randn(1, 2, 9, 64, device=device)
    torch._dynamo.reset()
    step = torch.compile(lambda x, g, q, k, v: kk.ops.grid_sample(x, g).sum() + kk.ops.flash_attention(q, k, v).sum(),
                         backend=backend, fullgraph=True)
    for _ in range(3):
        step(x, g, q, k, v)
    assert len(compiles) == 1


def test_opcheck(device):
    k = kk.metal_kernel("square", ["x"], ["y"], SQUARE)
    x = torch.randn(40, device=device)
    spec = torch_ops._launch_spec(k._op_key, "t", (("T", torch.float32), ("s", 1)),
                                  (torch.float32,), (1,), None, None)
    torch.library.opcheck(torch.ops.kernelkit.launch, (spec, [x], [], [40, 1, 1], [32, 1, 1], [40]))
    xg = torch.randn(40, device=device, requires_grad=True)
    spec = torch_ops._call_spec(cube._op_key, (tuple, 1), None, 1, (0,), ())
    torch.library.opcheck(torch.ops.kernelkit.custom_function, (spec, [xg]))
    y = torch.ops.kernelkit.custom_function(spec, [x])[0]
    for g in (torch.randn(40, device=device), None):  # a missing cotangent is None
        torch.library.opcheck(torch.ops.kernelkit.custom_function_vjp, (spec, [x], [y], [g]))


def test_a_plain_kernel_on_inputs_that_require_grad_warns(device):
    k = kk.metal_kernel("square", ["x"], ["y"], SQUARE)
    x = torch.randn(8, device=device, requires_grad=True)
    with pytest.warns(UserWarning, match="kernel 'square' is not differentiable"):
        out = _square(x, k)
    assert not out.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _square(x, k)  # once per kernel
        with torch.no_grad():
            _square(x, kk.metal_kernel("square", ["x"], ["y"], SQUARE + " "))


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    k = kk.metal_kernel("square", ["x"], ["y"], SQUARE)
    x = torch.randn(256, device="cuda")
    for _ in range(3):  # warm: compiled, planned
        _square(x, k)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _square(x, k)
    for _ in range(2):
        x.copy_(torch.randn(256, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, x * x + 1)
    compiled = torch.compile(lambda t: _square(t, k) * 2, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        t = torch.randn(256, device="cuda")
        torch.testing.assert_close(compiled(t), 2 * (t * t + 1))



@pytest.mark.gpu
def test_a_training_step_under_cuda_graphs():
    """torch.compile(mode="reduce-overhead") records the step's forward and backward (the ops'
    kernels, grid_sample's binning outputs handed to its vjp) as CUDA graphs; replays on new
    data give eager's gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    torch.manual_seed(0)
    points = torch.nn.Parameter(torch.rand(2, 5, 6, 2, device="cuda") * 2 - 1)
    weight = torch.nn.Parameter(torch.randn(4, 8, device="cuda"))
    bias = torch.nn.Parameter(torch.randn(8, device="cuda"))
    params = (points, weight, bias)

    def loss(x):
        s = kk.ops.grid_sample(x, points, mode="bilinear", padding_mode="zeros", align_corners=False)
        return kk.ops.matmul_add_relu(s.reshape(2, 30, 4), weight, bias).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up runs, the recording, then replays
        x = torch.randn(2, 8, 8, 4, device="cuda")
        eager = torch.autograd.grad(loss(x), params)
        replayed = [g.clone() for g in torch.autograd.grad(compiled(x), params)]
        for e, c in zip(eager, replayed):
            torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-4)

STEP_SCRIPT = """
import torch, kernelkit as kk
torch.manual_seed(0)
x = torch.randn(2, 8, 8, 4, requires_grad=True)
g = (torch.rand(2, 5, 6, 2) * 2 - 1).requires_grad_()
a = torch.randn(3, 16, 24, requires_grad=True)
b = torch.randn(3, 24, 8, requires_grad=True)
bias = torch.randn(8, requires_grad=True)
def step(x, g, a, b, bias):
    s = kk.ops.grid_sample(x, g, mode="bilinear", padding_mode="border", align_corners=True)
    return (s * s).sum() + kk.ops.matmul_add_relu(a, b, bias).sum()
args = (x, g, a, b, bias)
eager = torch.autograd.grad(step(*args), args)
compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*args), args)
print(max(float((p - q).abs().max()) for p, q in zip(eager, compiled)))
"""


@pytest.mark.slow
def test_graphs_from_torchs_caches_in_another_process(tmp_path):
    """torch.compile's on-disk caches give a later process the graphs (forward and backward) an
    earlier one compiled: their kernelkit ops must mean the same calls there."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", STEP_SCRIPT], env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert float(run.stdout.split()[-1]) < 1e-4


def test_equal_kernels_share_a_key_and_any_live_one_serves(device):
    """Two kernels built alike share their op key; the graph still finds one when the other dies
    (the same kernel made in a test and held by a module, say)."""
    import gc
    source = SQUARE + " // shared"
    held = kk.kernel.Kernel(kk._metal, "square", ["x"], ["y"], source)
    other = kk.kernel.Kernel(kk._metal, "square", ["x"], ["y"], source)
    assert other._op_key == held._op_key
    del other
    gc.collect()
    x = torch.randn(40, device=device)
    torch._dynamo.reset()
    out = torch.compile(lambda t: _square(t, held), fullgraph=True)(x)
    torch.testing.assert_close(out, x * x + 1)


ADD_INTO = "uint i = thread_position_in_grid.x; const_cast<device float*>(acc)[i] += 2.0f * g[i];"


@kk.custom_function
def doubled(x):
    return 2 * x


@doubled.vjp
def doubled_vjp(x, cotangent, output):
    # a vjp whose kernel adds into a buffer it takes as an input (no outputs), as grid_sample's
    # spill pass does: under torch.compile it must still run
    acc = torch.zeros_like(x)
    kk.metal_kernel("add_into", ["g", "acc"], [], ADD_INTO)(
        inputs=[cotangent.contiguous(), acc], output_shapes=[], output_dtypes=[],
        grid=(x.numel(), 1, 1), threadgroup=(32, 1, 1))
    return acc


def test_a_vjp_runs_as_written_under_compile(device):
    x = torch.randn(64, device=device, requires_grad=True)
    torch._dynamo.reset()
    (g,) = torch.autograd.grad(torch.compile(lambda t: doubled(t).sum(), fullgraph=True)(x), x)
    torch.testing.assert_close(g, torch.full_like(x, 2.0))


@kk.custom_function
def scaled_matrix(x):
    return 2 * x


@scaled_matrix.vjp
def scaled_matrix_vjp(x, cotangent, output):
    return (2 * cotangent.mT.contiguous()).mT  # a gradient laid out column-major


def test_a_vjp_may_return_any_layout_under_compile(device):
    """The compiled graph checks each gradient's strides against the vjp op's fake (empty_like of
    the input): a gradient in another layout is copied into that one."""
    x = torch.randn(3, 5, 4, device=device, requires_grad=True)
    torch._dynamo.reset()
    (g,) = torch.autograd.grad(torch.compile(lambda t: (scaled_matrix(t) * t).sum(), fullgraph=True)(x), x)
    torch.testing.assert_close(g, 4 * x.detach())


@kk.custom_function
def three_outputs(x):
    square = _square(x, kk.metal_kernel("square", ["x"], ["y"], SQUARE))
    return square, 3 * x, torch.arange(x.numel(), dtype=torch.int32, device=x.device)


@three_outputs.vjp
def three_outputs_vjp(x, cotangents, outputs):
    square, triple, index = cotangents
    # missing cotangents are zeros seen through a zero stride (no memory filled), compiled or not
    assert triple.stride() == index.stride() == (0,) and not triple.any() and not index.any()
    return 2 * x * square


def test_missing_cotangents_are_zero_views_under_compile(device):
    """The compiled backward fills no buffers for the cotangents of unused outputs: the vjp op makes
    them at run time, as eager autograd does."""
    x = torch.randn(32, device=device, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: three_outputs(t)[0].sum(), fullgraph=True)
    for loss in (compiled(x), compiled(x), three_outputs(x)[0].sum()):
        (g,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(g, 2 * x.detach())


@kk.custom_function
def mixed(pair, k, *, scale, shift):
    a, b = pair
    return a * b * k * scale + shift


@mixed.vjp
def mixed_vjp(primals, cotangent, output, *, scale, shift):
    (a, b), k = primals
    return (cotangent * b * k * scale, cotangent * a * k * scale), None


@kk.custom_function
def product(a, b):
    return a * b


@product.vjp
def product_vjp(primals, cotangent, output):
    assert type(primals) is tuple  # as eager autograd hands them (MLX's)
    a, b = primals
    return cotangent * b, cotangent * a


def test_custom_function_of_nested_and_keyword_tensors(device):
    """Arguments of every kind under compile (nested tuples, numbers, a keyword tensor): the op
    rebuilds them as the eager call has them, in the forward and for the vjp."""
    a, b = (torch.randn(8, device=device, requires_grad=True) for _ in range(2))
    shift = torch.randn(8, device=device)

    def loss(a, b):
        return (mixed((a, b), 3, scale=0.5, shift=shift) ** 2).sum()

    def plain(a, b):  # tensors as the only positional arguments: the op's shortest path
        return (product(a, b) ** 2).sum()

    for f in (loss, plain):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, dynamic=True)
        eager = torch.autograd.grad(f(a, b), (a, b))
        for e, c in zip(eager, torch.autograd.grad(compiled(a, b), (a, b))):
            torch.testing.assert_close(e, c)
        _no_breaks(f, a, b)


def test_a_compiled_step_parses_no_spec(device):
    """Run-time work of a compiled step: each spec was parsed when first run, not again."""
    lin = torch.nn.Linear(16, 16).to(device)
    x = torch.randn(4, 16, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: cube(lin(t), scale=0.5).sum(), fullgraph=True)
    compiled(x).backward()
    misses = torch_ops._literal_call.cache_info().misses, torch_ops._parse.cache_info().misses
    for _ in range(3):
        compiled(x).backward()
    assert (torch_ops._literal_call.cache_info().misses, torch_ops._parse.cache_info().misses) == misses
