"""MLX's own tests of its custom kernels and custom functions, translated to kernelkit.

From ml-explore/mlx at 846d176227a0ac13d2667e58d2bb68b322109ab0: every `mx.fast.metal_kernel` /
`mx.fast.cuda_kernel` test of python/tests/test_fast.py, the custom kernels of test_eval.py and
test_export_import.py, and test_custom_function of test_autograd.py. Kernel sources, names and
arguments are MLX's, spelled as MLX spells them; only `mx` arrays and dtypes became torch's
(`stream=mx.gpu` is `stream=device`, the device the test runs on).

MLX runs its Metal source on a Mac and its CUDA source on an NVIDIA GPU; kernelkit runs both
sources on both of its backends, so each such test runs for each source (`source`) on each
device (`device`). MLX's seeded draws (`mx.random.seed(7)`) are a seeded torch generator's, which
draws other numbers: where MLX checks against constants its own draws produce, the expectation
is computed from the inputs.

Where MLX checks something of its own (lazy evaluation, .mlxfn files, Metal-only devices), the
test says what it checks instead and why.
"""

import gc
import weakref

import pytest
import torch
from torch.func import grad, jvp, vmap

import kernelkit as kk

# torch's own forward-AD setup scripts its decompositions with the deprecated torch.jit.script.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning")

@pytest.fixture(params=["metal", "cuda"])
def source(request):
    """Which of MLX's two sources a test runs: its `mx.metal.is_available()` branch or its
    `mx.cuda.is_available()` one."""
    return request.param


def seed(s):
    """mx.random.seed(s): a torch generator, seeded, that the test draws from."""
    return torch.Generator().manual_seed(s)


def normal(shape, generator, device):
    """mx.random.normal(shape=shape): the next draws of the test's generator, on the device."""
    return torch.randn(shape, generator=generator).to(device)


# --- test_fast.py -------------------------------------------------------------------------------

def test_custom_kernel_basic(device, source):
    if source == "metal":
        source = """
            uint elem = thread_position_in_grid.x;
            out1[elem] = a[elem];
        """
        custom_kernel = kk.metal_kernel
    else:
        source = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            out1[elem] = a[elem];
        """
        custom_kernel = kk.cuda_kernel

    g = seed(7)
    a = normal((2, 2), g, device)
    kernel = custom_kernel(
        name="basic",
        input_names=["a"],
        output_names=["out1"],
        source=source,
    )
    out = kernel(
        inputs=[a],
        grid=(4, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(2, 2)],
        output_dtypes=[torch.float32],
        stream=device,
    )
    assert torch.allclose(out[0], a)


def test_custom_kernel_args(device, source):
    if source == "metal":
        source = """
            uint elem = thread_position_in_grid.x;
            T tmp = a[0];
            if (e) {
                out1[elem] = a[1] + b[2] + c[3] + d + f;
            } else {
                out1[elem] = 1;
            }
            out2[elem] = a[1] + b[2] + c[1] - d;
        """
        custom_kernel = kk.metal_kernel
    else:
        source = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            T tmp = a[0];
            if (e) {
                out1[elem] = a[1] + b[2] + static_cast<float>(c[3]) + d[0] + f;
            } else {
                out1[elem] = 1;
            }
            out2[elem] = a[1] + b[2] + static_cast<float>(c[1]) - d[0];
        """
        custom_kernel = kk.cuda_kernel

    g = seed(7)
    a = normal((3, 6), g, device)
    c = normal((2, 2), g, device).to(torch.bfloat16)

    kernel = custom_kernel(
        name="arg_test",
        input_names=["a", "b", "c", "d"],
        output_names=["out1", "out2"],
        source=source,
    )
    out = kernel(
        inputs=[
            a,
            torch.tensor([3, 4, 5], dtype=torch.int32, device=device),  # mx.array's int is int32
            c,
            7.3,
        ],
        template=[
            ("e", True),
            ("f", 3),
            ("T", torch.float16),
        ],
        grid=(6, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(3, 2), (3, 2)],
        output_dtypes=[torch.float32, torch.int32],
        stream=device,
    )

    # MLX compares with 14.0484 and -2, what its own draws give; here the same sums of these draws.
    a, c = a.flatten().double(), c.flatten().double()
    expected1 = a[1] + 5 + c[3] + 7.3 + 3
    assert torch.allclose(out[0].double(), torch.full((3, 2), expected1.item(), device=device,
                                                       dtype=torch.float64))
    # out2 is the kernel's float sum stored to int32 (truncated): summed here in float32 as the
    # kernel sums it, so that a sum near an integer truncates the same way
    f32 = torch.tensor([a[1], c[1], 7.3], dtype=torch.float32)
    expected2 = int(((f32[0] + 5) + f32[1]) - f32[2])
    assert torch.allclose(out[1], torch.full((3, 2), expected2, dtype=torch.int32, device=device))


def test_custom_kernel_strides(device, source):
    if source == "metal":
        source = """
            uint elem = thread_position_in_grid.x;
            uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
            T tmp = inp[loc];
            out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;
        """
        source_contig = """
            uint elem = thread_position_in_grid.x;
            T tmp = inp[elem];
            out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;
        """
        custom_kernel = kk.metal_kernel
    else:
        source = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            auto loc = elem_to_loc(elem, inp_shape.data(), inp_strides.data(), inp_ndim);
            T tmp = inp[loc];
            out[elem] = exp(tmp) * WARP_SIZE;
        """
        source_contig = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            T tmp = inp[elem];
            out[elem] = exp(tmp) * WARP_SIZE;
        """
        custom_kernel = kk.cuda_kernel

    g = seed(7)
    a = normal((3, 6), g, device)

    # non contiguous
    a = torch.tile(a[::2], [4, 1])

    for contig in [True, False]:
        kernel = custom_kernel(
            name="myexp" + str(contig),
            input_names=["inp"],
            output_names=["out"],
            source=source_contig if contig else source,
            ensure_row_contiguous=contig,
        )
        outputs = kernel(
            inputs=[a],
            template=[("T", torch.float32)],
            grid=(a.numel(), 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )
        assert torch.allclose(torch.exp(a.double()) * 32, outputs[0].double())


def test_custom_kernel_helper(device, source):
    if source == "metal":
        header = """
        template <typename T>
        T do_exp(T x) {
            return metal::precise::exp(x);
        }
        """
        source = """
            uint elem = thread_position_in_grid.x;
            out1[elem] = do_exp(a[elem]);
        """
        custom_kernel = kk.metal_kernel
    else:
        header = """
        template <typename T>
        __device__ T do_exp(T x) {
            return exp(x);
        }
        """
        source = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            out1[elem] = do_exp(a[elem]);
        """
        custom_kernel = kk.cuda_kernel

    g = seed(7)
    a = normal((2, 2), g, device)
    kernel = custom_kernel(
        name="helper",
        input_names=["a"],
        output_names=["out1"],
        header=header,
        source=source,
    )
    out = kernel(
        inputs=[a],
        grid=(4, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(2, 2)],
        output_dtypes=[torch.float32],
        stream=device,
    )
    assert torch.allclose(out[0].double(), torch.exp(a.double()))


def test_custom_kernel_attributes(device, source):
    if source == "metal":
        source = "out[0] = threads_per_threadgroup.x;"
        custom_kernel = kk.metal_kernel
    else:
        source = "out[0] = blockDim.x;"
        custom_kernel = kk.cuda_kernel

    a = torch.zeros((1, 1), device=device)
    kernel = custom_kernel(
        name="test_fun",
        input_names=["a"],
        output_names=["out"],
        source=source,
    )
    out = kernel(
        inputs=[a],
        grid=(2, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(1, 1)],
        output_dtypes=[torch.uint32],
        stream=device,
    )[0]
    assert out.item() == 2


def test_custom_kernel_caching(device):
    def call_kernel(a: torch.Tensor, source):
        kernel = kk.metal_kernel(
            name="my_kernel",
            input_names=["inp"],
            output_names=["out"],
            source=source,
        )
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(a.numel(), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )[0]

    a = torch.randn((32,), device=device)

    source = """
        uint elem = thread_position_in_grid.x;
        out[elem] = 0.0;
    """

    out = call_kernel(a, source)
    assert torch.equal(out, torch.zeros_like(out))

    source = """
        uint elem = thread_position_in_grid.x;
        out[elem] = 1.0;
    """
    out = call_kernel(a, source)
    assert torch.equal(out, torch.ones_like(out))


def _same_name_pair(custom_kernel, device, source_a, source_b):
    """Two kernels that share a name, called one after the other before either output is read.

    MLX's `mx.eval(out_a, out_b)` runs both in one lazy batch; kernelkit launches at the call
    (queued on the device's stream, on a GPU), so the nearest check calls both before reading
    either."""
    def call_kernel(a, source):
        kernel = custom_kernel(
            name="dup_name",
            input_names=["inp"],
            output_names=["out"],
            source=source,
        )
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(a.numel(), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )[0]

    a = torch.arange(32, dtype=torch.float32, device=device)
    out_a = call_kernel(a, source_a)
    out_b = call_kernel(a, source_b)
    assert torch.equal(out_a, a * 2.0)
    assert torch.equal(out_b, a + 100.0)


def test_custom_kernel_same_name_different_source_one_eval(device):
    # Regression test for MLX's #3832: two kernels sharing a name but with different sources must
    # each run their own compiled code instead of silently reusing the first's.
    _same_name_pair(kk.metal_kernel, device,
                    "uint e = thread_position_in_grid.x; out[e] = inp[e] * 2.0f;",
                    "uint e = thread_position_in_grid.x; out[e] = inp[e] + 100.0f;")


def test_cuda_kernel_same_name_different_source(device):
    # MLX's CUDA module cache was keyed on the kernel name alone, so the second kernel here
    # silently ran the first one's code.
    elem = "auto e = cooperative_groups::this_grid().thread_rank();"
    _same_name_pair(kk.cuda_kernel, device, f"{elem} out[e] = inp[e] * 2.0f;",
                    f"{elem} out[e] = inp[e] + 100.0f;")


def test_custom_metal_kernel_math_mode(device):
    with pytest.raises(ValueError):
        kk.metal_kernel(
            name="invalid_math_mode",
            input_names=["inp"],
            output_names=["out"],
            source="out[0] = inp[0];",
            compile_options={"math_mode": "precise"},
        )

    with pytest.raises(ValueError):
        kk.metal_kernel(
            name="invalid_compile_options",
            input_names=["inp"],
            output_names=["out"],
            source="out[0] = inp[0];",
            compile_options={"unknown": "value"},
        )

    # Branch on the compiler's __FAST_MATH__ macro: it is defined only when fast math is enabled,
    # so the test fails if the selected math mode is not forwarded to the compiler.
    source = """
        uint elem = thread_position_in_grid.x;
        #if defined(__FAST_MATH__) && __FAST_MATH__
        out[elem] = 1.0f;
        #else
        out[elem] = 0.0f;
        #endif
    """

    a = torch.zeros((4,), dtype=torch.float32, device=device)
    expected = {
        "safe": torch.zeros_like(a),
        "fast": torch.ones_like(a),
    }

    # The same kernel name across modes, so a build cached for one mode cannot serve another.
    for mode, expected_out in expected.items():
        kernel = kk.metal_kernel(
            name="math_mode",
            input_names=["inp"],
            output_names=["out"],
            source=source,
            compile_options={"math_mode": mode},
        )
        out = kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(a.numel(), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )[0]
        assert torch.equal(out, expected_out)


def test_custom_kernel_mixed_dtypes(device):
    # MLX: calling the same kernel with different input dtypes in a single graph must not
    # invalidate pipeline states still in use by an uncommitted command buffer. kernelkit has no
    # graph (calls launch at once); the nearest check: the second dtype's variant is built before
    # the first call's output is read, and both outputs are right.
    kernel = kk.metal_kernel(
        name="mixed_dtypes",
        input_names=["inp"],
        output_names=["out"],
        source="""
            uint elem = thread_position_in_grid.x;
            out[elem] = inp[elem] + inp[elem];
        """,
    )

    def call_kernel(a: torch.Tensor):
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(a.numel(), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )[0]

    a = torch.full((32,), 1.5, dtype=torch.float16, device=device)
    b = torch.full((32,), 2.5, dtype=torch.float32, device=device)
    out = call_kernel(a).to(torch.float32) + call_kernel(b)
    assert torch.allclose(out, torch.full((32,), 8.0, device=device))


# --- test_eval.py -------------------------------------------------------------------------------

def test_eval_exception_does_not_corrupt_state(device):
    # A compile error raised by a kernel call must not corrupt arrays computed before it. MLX
    # raises it lazily inside `mx.eval`; kernelkit compiles at the call, so the call raises.
    a = torch.full((1024,), 3.0, device=device)
    b = a * 2.0

    kernel = kk.metal_kernel(
        name="test_eval_exception_bad_kernel",
        input_names=["inp"],
        output_names=["out"],
        source="this is not metal code {",
    )
    with pytest.raises(Exception):
        (y,) = kernel(
            inputs=[b],
            output_shapes=[b.shape],
            output_dtypes=[b.dtype],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
        )

    assert (b == 6.0).all().item()

    # Fresh computations after the failure stay correct.
    x = torch.full((512,), 2.0, device=device)
    assert (x + 1.0).sum().item() == 512.0 * 3.0


# --- test_export_import.py ----------------------------------------------------------------------
# MLX exports a function that calls a kernel to an .mlxfn file (mx.export_function) and imports it
# back (mx.import_function). torch's equivalent is torch.export of a module calling the function,
# saved with torch.export.save and loaded with torch.export.load.

def export_function(path, fun, a, shapeless=False):
    """mx.export_function(path, fun, a, shapeless=...) as torch.export (MLX's tests export
    functions of one array): shapeless exports with every dimension dynamic."""
    class Call(torch.nn.Module):
        def forward(self, a):
            return fun(a)

    dynamic = {"a": {d: torch.export.Dim.AUTO for d in range(a.dim())}} if shapeless else None
    torch.export.save(torch.export.export(Call(), (a,), dynamic_shapes=dynamic), path)


def import_function(path):
    return torch.export.load(path).module()


def test_export_import_custom_kernel(device, source, tmp_path):
    if source == "metal":
        source = """
            uint elem = thread_position_in_grid.x;
            out1[elem] = a[elem];
        """
        custom_kernel = kk.metal_kernel
    else:
        source = """
            auto elem = cooperative_groups::this_grid().thread_rank();
            out1[elem] = a[elem];
        """
        custom_kernel = kk.cuda_kernel

    kernel = custom_kernel(
        name="basic",
        input_names=["a"],
        output_names=["out1"],
        source=source,
    )

    def call(a):
        return kernel(
            inputs=[a],
            grid=(4, 1, 1),
            threadgroup=(2, 1, 1),
            output_shapes=[(2, 2)],
            output_dtypes=[torch.float32],
        )[0]  # (no stream=device: torch.export takes no stream; the inputs' device is used)

    g = seed(7)
    a = normal((2, 2), g, device)

    path = tmp_path / "fn.pt2"
    expected = call(a)
    export_function(path, call, a)

    imported = import_function(path)

    out = imported(a)
    assert torch.allclose(expected, out)


def test_export_custom_metal_kernel_without_evaluation(device, tmp_path):
    source = """
        uint elem = thread_position_in_grid.x;
        out[elem] = a[elem];
    """
    kernel = kk.metal_kernel(
        name="export_only",
        input_names=["a"],
        output_names=["out"],
        source=source,
    )

    def call(a):
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(min(a.numel(), 256), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
        )[0]

    a = torch.zeros((2, 2), device=device)
    for shapeless in (False, True):
        path = tmp_path / f"metal_kernel_export_only_{shapeless}.pt2"
        export_function(path, call, a, shapeless=shapeless)  # the kernel has never run
        assert path.exists()

        # MLX cannot call a shapeless import (its CustomKernel infers no shapes); kernelkit's
        # output shapes and grid follow the symbolic sizes, so both imports are called, the
        # shapeless one on another shape too.
        imported = import_function(path)
        assert torch.equal(imported(a), call(a))
        if shapeless:
            b = torch.randn((3, 5), device=device)
            assert torch.equal(imported(b), b)

    # MLX refuses (ValueError, "Only supports the GPU") to export a call pinned to a stream its
    # kernel cannot run on (stream=mx.cpu). kernelkit runs on every device, but a call pinned to a
    # stream is refused in an export all the same, with ValueError.
    def call_cpu(a):
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(min(a.numel(), 256), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=device,
        )[0]

    with pytest.raises(ValueError, match=r"\[metal_kernel\] stream, verbose, check_bounds and "
                                         "timeout are not supported under torch.compile"):
        export_function(tmp_path / "metal_kernel_export_cpu.pt2", call_cpu, a)
    # (MLX's last check, "No Metal back-end" where Metal is missing, has no counterpart: a
    # kernelkit kernel always has a backend, the CPU's, where the calls above ran.)


def test_export_custom_metal_kernel_with_math_mode(device, tmp_path):
    source = """
        uint elem = thread_position_in_grid.x;
        out[elem] = metal::exp(a[elem]);
    """
    kernel = kk.metal_kernel(
        name="math_mode_export",
        input_names=["a"],
        output_names=["out"],
        source=source,
        compile_options={"math_mode": "safe"},
    )

    def call(a):
        return kernel(
            inputs=[a],
            grid=(a.numel(), 1, 1),
            threadgroup=(min(a.numel(), 256), 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
        )[0]

    a = torch.tensor([-float("inf"), 0.0], device=device)
    path = tmp_path / "metal_kernel_math_mode.pt2"
    export_function(path, call, a)
    assert path.exists()

    imported = import_function(path)
    assert torch.equal(imported(a), call(a))

# --- test_autograd.py ---------------------------------------------------------------------------

def test_custom_function():
    # Make a custom function
    my_exp = kk.custom_function(torch.exp)

    # Ensure everything works
    dy = grad(my_exp)(torch.tensor(1.0))
    assert torch.allclose(dy, torch.exp(torch.tensor(1.0)))
    ex, dex = jvp(my_exp, (torch.tensor(1.0),), (torch.tensor(1.0),))
    assert torch.allclose(dex, torch.exp(torch.tensor(1.0)))
    assert torch.allclose(ex, dex)
    ex = vmap(my_exp)(torch.ones(10))
    assert torch.allclose(ex, torch.exp(torch.ones(10)))

    # Ensure that the vjp is being overriden but everything else still
    # works.
    @my_exp.vjp
    def my_exp_vjp(x, dx, ex):
        return torch.ones_like(x) * 42

    dy = grad(my_exp)(torch.tensor(1.0))
    assert torch.allclose(dy, torch.tensor(42.0))
    ex, dex = jvp(my_exp, (torch.tensor(1.0),), (torch.tensor(1.0),))
    assert torch.allclose(dex, torch.exp(torch.tensor(1.0)))
    assert torch.allclose(ex, dex)
    ex = vmap(my_exp)(torch.ones(10))
    assert torch.allclose(ex, torch.exp(torch.ones(10)))

    # Ensure that setting the jvp and vmap also works.
    @my_exp.jvp
    def my_exp_jvp(x, dx):
        return torch.ones_like(x) * 7 * dx

    @my_exp.vmap
    def my_exp_vmap(x, axis):
        return torch.ones_like(x) * 3, axis

    dy = grad(my_exp)(torch.tensor(1.0))
    assert torch.allclose(dy, torch.tensor(42.0))
    ex, dex = jvp(my_exp, (torch.tensor(1.0),), (torch.tensor(1.0),))
    assert torch.allclose(dex, torch.tensor(7.0))
    assert torch.allclose(ex, torch.exp(torch.tensor(1.0)))
    ex = vmap(my_exp)(torch.ones(10))
    assert torch.allclose(ex, 3 * torch.ones(10))

    # Test pytrees
    @kk.custom_function
    def my_double(params):
        return {"out": 2 * params["x"] * params["y"]}

    dy = grad(lambda p: my_double(p)["out"].sum())({"x": torch.ones(2), "y": torch.ones(2)})
    assert torch.allclose(dy["x"], torch.ones(2) * 2)
    assert torch.allclose(dy["y"], torch.ones(2) * 2)

    @my_double.vjp
    def random_grads(primals, cotangents, outputs):
        return {"x": torch.zeros_like(primals["x"]), "y": torch.ones_like(primals["y"])}

    dy = grad(lambda p: my_double(p)["out"].sum())({"x": torch.ones(2), "y": torch.ones(2)})
    assert torch.allclose(dy["x"], torch.zeros(2))
    assert torch.allclose(dy["y"], torch.ones(2))

    def outer_f(a, b):
        return my_double({"x": a, "y": b})["out"]

    inputs = [torch.randn(2) for i in range(2)]
    tans = [torch.randn(2) for i in range(2)]
    out1, dout1 = jvp(outer_f, tuple(inputs), tuple(tans))

    @my_double.jvp
    def random_grads(primals, tangents):  # noqa: F811 - MLX's name, again
        return {
            "out": 2 * primals["x"] * tangents["y"]
            + 2 * primals["y"] * tangents["x"]
            + 1
        }

    out2, dout2 = jvp(outer_f, tuple(inputs), tuple(tans))
    assert torch.allclose(out1, out2)
    assert torch.allclose(dout1 + 1, dout2)


def test_leaks():
    # MLX compares mx.get_active_memory() before and after; torch's CPU allocator counts nothing,
    # so the check here is that the tensor held in the cycle is freed (a weak reference dies).
    # Of MLX's transforms (grad, value_and_grad, custom_function, checkpoint), custom_function is
    # kernelkit's.
    for transform in [kk.custom_function]:
        gc.collect()
        held = []

        def outer():
            d = {}

            def f(x):
                return d["x"]

            d["f"] = transform(f)
            d["x"] = torch.tensor([0] * 1000)
            held.append(weakref.ref(d["x"]))

        for _ in range(5):
            outer()
            gc.collect()
        assert all(r() is None for r in held)
