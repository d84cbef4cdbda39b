"""Fuzzing the call's arguments (hypothesis, CPU backend): each example takes a valid call and
spells its values in any of the forms MLX code uses (NumPy integers, 0-d tensors, torch.Size,
dtype names), then maybe corrupts one argument with a value a careless user passes. A valid call
returns the right outputs; a corrupted one raises TypeError, ValueError or OverflowError naming
the call ("[metal_kernel] ..."), never anything else; and the kernel still answers rightly after.
Few kernels are compiled (a handful of dtype combinations): the examples vary arguments only.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelkit as kk

BODY = "uint i = thread_position_in_grid.x; if (i < N) out[i] = T(inp[i]) + T(N);"
EXAMPLES = 250

INTEGRAL_FORMS = [int, np.int64, np.int32, np.uint32, lambda n: torch.tensor(n),
                  lambda n: torch.Size([n])[0]]
DTYPE_FORMS = [lambda d: d, lambda d: str(d).removeprefix("torch."), lambda d: np.dtype(str(d)[6:])]

BAD = {
    "grid": [(8.0, 1, 1), (True, 1, 1), (-1, 1, 1), (1, 1), "8", None, (2**32, 1, 1),
             (np.float32(8), 1, 1), (torch.tensor(1.5), 1, 1), (1, 1, 1, 1)],
    # (a threadgroup over the device's limit is clamped to these small grids first: valid)
    "threadgroup": [(0, 1, 1), (8.5, 1, 1), (False, 1, 1), (1, 0, 1), None, (np.bool_(True), 1, 1)],
    "output_shapes": [[(-1,)], [(8.0,)], [("8",)], [None], [(True,)], [(np.float64(2),)],
                      [(8,), (8,)], [], (8,)],
    "output_dtypes": [[None], ["float128"], [torch.complex128], [object], [3], [], [torch.float32] * 2],
    "template": [[("T", None), ("N", 8)], [("T", torch.float32), ("N", 2.5)],
                 [("T", torch.float32), ("N", 2**40)], [("1T", torch.float32), ("N", 8)],
                 [("T", torch.float32), ("N", 8), ("N", 9)], [("T",)], "T", [("inp", 3), ("N", 8)]],
    "init_value": ["x", [1, 2], object(), [None, None]],
    "inputs": [["not a tensor"], [None], [[1.0, 2.0]], [], [torch.zeros(2, dtype=torch.complex128)],
               [2**40]],
}
ERRORS = (TypeError, ValueError, OverflowError)


@st.composite
def calls(draw):
    n = draw(st.integers(1, 40))
    N = draw(st.integers(0, n))
    in_dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.int32]))
    out_dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    threads = draw(st.integers(1, 64))
    integral = lambda v: draw(st.sampled_from(INTEGRAL_FORMS))(v)  # noqa: E731
    dtype = lambda d: draw(st.sampled_from(DTYPE_FORMS))(d)  # noqa: E731
    shape_kind = draw(st.sampled_from([tuple, list, torch.Size]))
    args = dict(
        grid=(integral(n), integral(1), 1), threadgroup=(integral(threads), 1, integral(1)),
        output_shapes=[shape_kind([integral(n)] if shape_kind is not torch.Size else [n])],
        output_dtypes=[dtype(out_dtype)],
        template=[("T", dtype(torch.float32)), ("N", integral(N))],
        init_value=draw(st.sampled_from([None, 0, 3, 2.5, np.float32(1.5)])))
    bad = draw(st.sampled_from([None, None, *BAD]))
    if bad is not None:
        args[bad] = draw(st.sampled_from(BAD[bad]))
    contiguous = draw(st.booleans())
    return n, N, in_dtype, contiguous, args, bad


@settings(deadline=None, database=None, max_examples=EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls(), st.integers(0, 2**31 - 1))
def test_call_arguments(case, seed):
    n, N, in_dtype, contiguous, args, bad = case
    g = torch.Generator().manual_seed(seed)
    base = (torch.rand(2 * n, generator=g) * 100).to(in_dtype)
    x = base[:n] if contiguous else base[::2]
    k = kk.metal_kernel(name="fuzzed", input_names=["inp"], output_names=["out"], source=BODY)
    if bad is not None:
        inputs = args.pop("inputs", [x])
        with pytest.raises(ERRORS, match=r"^\[metal_kernel\] "):
            k(inputs=inputs, **args)
        return  # (the next examples call the same kernel: stale state would show there)
    out = k(inputs=[x], **args)[0]
    out_dtype = kk.arrays.dtype_of(args["output_dtypes"][0]).torch
    assert out.shape == (n,) and out.dtype == out_dtype
    expected = (x[:N].to(torch.float32) + N).to(out_dtype)
    torch.testing.assert_close(out[:N], expected)
    if args["init_value"] is not None:
        assert torch.all(out[N:] == float(args["init_value"]))
