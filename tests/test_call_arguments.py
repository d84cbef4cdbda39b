"""Call arguments as MLX code writes them: integers of any integral kind (NumPy, 0-d tensors,
torch.Size), empty launches, kernels built again on every call, and checks that values which
compare equal cannot slip past (8.0 is not 8)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import kernelkit as kk

ADD_N = "uint i = thread_position_in_grid.x; if (i < N) out[i] = inp[i] + T(N);"


def _add_n():
    return kk.metal_kernel(name="add_n", input_names=["inp"], output_names=["out"], source=ADD_N)


INTEGRALS = [lambda n: n, np.int64, np.uint32, np.int32, lambda n: torch.tensor(n),
             lambda n: torch.Size([n])[0]]


@pytest.mark.parametrize("integral", INTEGRALS)
def test_integral_values_everywhere_mlx_takes_an_int(device, integral):
    """grid, threadgroup, output shapes, template ints and init_value: anything operator.index takes."""
    x = torch.randn(40, device=device)
    k = _add_n()
    for _ in range(3):  # the general path, then the plan of a repeated call
        out = k(inputs=[x], template=[("T", torch.float32), ("N", integral(40))],
                grid=(integral(40), integral(1), 1), threadgroup=(integral(32), 1, integral(1)),
                output_shapes=[(integral(40),)], output_dtypes=[torch.float32])[0]
        torch.testing.assert_close(out, x + 40)
    k2 = kk.metal_kernel(name="fill_part", input_names=["inp"], output_names=["out"],
                         source="uint i = thread_position_in_grid.x; out[i] = inp[i];")
    out = k2(inputs=[x], grid=(integral(8), 1, 1), threadgroup=(8, 1, 1), output_shapes=[(40,)],
             output_dtypes=[torch.float32], init_value=integral(7))[0]
    assert torch.equal(out[8:], torch.full((32,), 7.0, device=device))


def test_numpy_prod_grid_as_the_seed_writes_it(device):
    x = torch.randn(2, 3, 5, device=device)
    k = _add_n()
    out = k(inputs=[x], template=[("T", x.dtype), ("N", np.prod(x.shape))],
            grid=(np.prod(x.shape), 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
            output_dtypes=[x.dtype])[0]
    torch.testing.assert_close(out, x + 30)


@pytest.mark.parametrize("bad", [8.0, True, np.float32(8), np.bool_(True), torch.tensor(8.0), "8"])
def test_floats_and_bools_are_not_ints(device, bad):
    x = torch.randn(8, device=device)
    k = _add_n()
    base = dict(inputs=[x], template=[("T", torch.float32), ("N", 8)], grid=(8, 1, 1),
                threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[torch.float32])
    with pytest.raises(ValueError, match="`grid` must be three non-negative ints"):
        k(**{**base, "grid": (bad, 1, 1)})
    with pytest.raises(ValueError, match="`threadgroup` must be three positive ints"):
        k(**{**base, "threadgroup": (bad, 1, 1)})
    with pytest.raises(ValueError, match=r"output_shapes\[0\] for 'out' must be"):
        k(**{**base, "output_shapes": [(bad,)]})


def test_equal_values_of_other_types_are_checked_again(device):
    """Checks remembered for (8, 1, 1) or ("N", 2) do not pass (8.0, 1, 1) or ("N", 2.0)."""
    x = torch.randn(8, device=device)
    k = _add_n()
    good = dict(inputs=[x], template=[("T", torch.float32), ("N", 2)], grid=(8, 1, 1),
                threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[torch.float32])
    for _ in range(3):  # remembered, and a plan made
        k(**good)
    with pytest.raises(ValueError, match="`grid` must be three non-negative ints"):
        k(**{**good, "grid": (8.0, 1, 1)})
    with pytest.raises(ValueError, match="`threadgroup` must be three positive ints"):
        k(**{**good, "threadgroup": (8.0, 1, 1)})
    with pytest.raises(TypeError, match="template value for 'N' must be a dtype, an int or a bool"):
        k(**{**good, "template": [("T", torch.float32), ("N", 2.0)]})


def test_none_is_not_a_dtype(device):
    x = torch.randn(8, device=device)
    k = _add_n()
    with pytest.raises(TypeError, match="output 'out': None is not a dtype"):
        k(inputs=[x], template=[("T", torch.float32), ("N", 8)], grid=(8, 1, 1),
          threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[None])
    with pytest.raises(TypeError, match="template value for 'T' must be a dtype"):
        k(inputs=[x], template=[("T", None), ("N", 8)], grid=(8, 1, 1),
          threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[torch.float32])


# A kernel that, were it run, writes out of bounds: the checked call would raise IndexError.
WRITES_FAR = "uint i = thread_position_in_grid.x; out[i + 1000] = 1.0f; other[i + 1000] = 1.0f;"


@pytest.mark.parametrize("grid, shapes", [((0, 1, 1), [(5,), (2, 3)]), ((4, 0, 2), [(0,), (3,)]),
                                          ((64, 1, 1), [(0,), (2, 0)])])
def test_empty_launch_allocates_and_fills_without_running(device, grid, shapes):
    """An empty grid, or outputs all empty: outputs allocated and init-filled, no kernel run."""
    k = kk.metal_kernel(name="writes_far", input_names=["inp"], output_names=["out", "other"],
                        source=WRITES_FAR)
    x = torch.randn(4, device=device)
    for init in (None, 3):
        outs = k(inputs=[x], grid=grid, threadgroup=(32, 1, 1), output_shapes=shapes,
                 output_dtypes=[torch.float32, torch.int32], init_value=init, check_bounds=True)
        assert [tuple(o.shape) for o in outs] == [tuple(s) for s in shapes]
        assert outs[0].dtype == torch.float32 and outs[1].dtype == torch.int32
        assert all(o.device.type == device.type for o in outs)
        if init is not None:
            assert all(bool((o == 3).all()) for o in outs)
    assert not k._variants  # nothing was compiled


def test_empty_input_with_the_seeds_grid(device):
    a = torch.randn(0, 16, device=device)
    k = kk.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                        source="uint elem = thread_position_in_grid.x; out[elem] = metal::exp(inp[elem]);")
    out = k(inputs=[a], grid=(a.numel(), 1, 1), threadgroup=(256, 1, 1), output_shapes=[a.shape],
            output_dtypes=[a.dtype])[0]
    assert out.shape == (0, 16)


def test_building_a_kernel_again_is_the_same_prepared_kernel(device):
    source = "uint i = thread_position_in_grid.x; out[i] = inp[i] * 2.0f;"
    make = lambda src=source, **kw: kk.metal_kernel(name="twice", input_names=["inp"],  # noqa: E731
                                                    output_names=["out"], source=src, **kw)
    k = make()
    assert make() is k  # built again: the same prepared kernel, with its variants and plans
    assert kk.metal_kernel("twice", ("inp",), ("out",), source) is k  # names as a tuple
    x = torch.randn(8, device=device)

    def run(kernel):
        return kernel(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                      output_dtypes=[torch.float32])[0]

    torch.testing.assert_close(run(k), x * 2)
    # Same name, another source, header, option: another kernel, never the first one's binary
    other = make("uint i = thread_position_in_grid.x; out[i] = inp[i] * 3.0f;")
    assert other is not k
    torch.testing.assert_close(run(other), x * 3)
    torch.testing.assert_close(run(make()), x * 2)
    assert make(header="// another header") is not k
    assert make(compile_options={"math_mode": "safe"}) is not k
    assert make(ensure_row_contiguous=False) is not k
    assert kk.cuda_kernel("twice", ["inp"], ["out"], source) is not k


def test_rebuilding_with_bad_arguments_still_fails():
    source = "uint i = thread_position_in_grid.x; out[i] = inp[i];"
    kk.metal_kernel("copy", ["inp"], ["out"], source)
    with pytest.raises(TypeError, match="input_names must be a list of strings"):
        kk.metal_kernel("copy", "inp", ["out"], source)
    with pytest.raises(ValueError, match="shared_memory must be a non-negative int"):
        kk.cuda_kernel("copy", ["inp"], ["out"], source, shared_memory=1024.0)
    kk.cuda_kernel("copy", ["inp"], ["out"], source, shared_memory=1024)
    with pytest.raises(ValueError, match="shared_memory must be a non-negative int"):
        kk.cuda_kernel("copy", ["inp"], ["out"], source, shared_memory=1024.0)


def test_ops_reachable_from_the_package():
    code = "import kernelkit as kk; print(kk.ops.grid_sample.__name__, kk.ops.matmul_add_relu.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["grid_sample", "matmul_add_relu"]


class _DLPackOnly:
    """An array that speaks only DLPack (as CuPy's and JAX's do, beside their own APIs)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, *args, **kwargs):
        return self._t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_arrays_of_other_libraries_through_dlpack(device):
    x = torch.randn(2, 8, device=device)
    k = kk.metal_kernel(name="copy2", input_names=["a", "b"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = a[i] + b[i];")
    for a in (_DLPackOnly(x), _DLPackOnly(x.T.contiguous().T)):  # a strided one is copied
        out = k(inputs=[a, x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(2, 8)],
                output_dtypes=[torch.float32])[0]
        assert isinstance(out, torch.Tensor)
        torch.testing.assert_close(out, 2 * x)
    with pytest.raises(TypeError, match=r"input 'a' must be a torch.Tensor, a NumPy array, an array "
                                        r"with __dlpack__"):
        k(inputs=[[1.0] * 16, x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
          output_dtypes=[torch.float32])


@pytest.mark.gpu
def test_cupy_arrays_in():
    cupy = pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    a = cupy.arange(16, dtype=cupy.float32)
    k = kk.metal_kernel(name="twice_cupy", input_names=["a"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = 2.0f * a[i];")
    out = k(inputs=[a], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
            output_dtypes=[torch.float32])[0]
    assert out.is_cuda
    torch.testing.assert_close(out, 2 * torch.arange(16, dtype=torch.float32, device="cuda"))
