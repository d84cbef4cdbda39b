"""kernelkit.preconditions: an op's argument checks, each error path and its message."""

import numpy as np
import pytest
import torch

import kernelkit as kk
from kernelkit.preconditions import FLOATS, Preconditions, check_once, dtype_names


def _rand(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, device=device).to(dtype)


def test_exported():
    assert kk.Preconditions is Preconditions


def test_dtype_names():
    assert dtype_names(FLOATS) == "float16, bfloat16, float32 or float64"
    assert dtype_names([torch.int32]) == "int32"


def test_accepts_and_binds():
    pre = Preconditions("op")
    x = _rand(2, 5, 7, 3)
    grid = _rand(2, 4, 6, 2)
    assert pre.tensor("x", x, dtype=FLOATS, shape=("B", "H", "W", "C")) is x
    assert pre.tensor("grid", grid, dtype="x", shape=("B", "gH", "gW", 2), contiguous=True) is grid
    assert pre.dims == {"B": 2, "H": 5, "W": 7, "C": 3, "gH": 4, "gW": 6}
    assert (pre["B"], pre["gW"]) == (2, 6)
    assert pre.device == torch.device("cpu")
    assert pre.choice("mode", "nearest", ("bilinear", "nearest")) == "nearest"
    assert pre.flag("align_corners", False) is False


def test_leading_dims_and_wildcards():
    pre = Preconditions("matmul")
    pre.tensor("lhs", _rand(3, 2, 4, 5), shape=(..., "M", "K"))
    pre.tensor("rhs", _rand(5, 6), shape=(..., "K", "N"))
    pre.tensor("bias", _rand(7, 6), shape=(None, "N"), ndim=2)
    assert pre.dims == {"M": 4, "K": 5, "N": 6}


def test_not_a_tensor():
    pre = Preconditions("op")
    for value, kind in [(np.zeros(3), "ndarray"), ([1.0], "list"), (1.0, "float"), (None, "NoneType")]:
        with pytest.raises(TypeError, match=f"^op: x must be a torch.Tensor, got {kind}\\.$"):
            pre.tensor("x", value)


def test_dtype():
    pre = Preconditions("op")
    with pytest.raises(TypeError, match=r"^op: x has dtype int64; expected float16, bfloat16, float32 "
                                        r"or float64\.$"):
        pre.tensor("x", torch.arange(3), dtype=FLOATS)
    with pytest.raises(TypeError, match=r"^op: x has dtype float64; expected float32\.$"):
        pre.tensor("x", _rand(3, dtype=torch.float64), dtype=torch.float32)
    pre.tensor("a", _rand(3, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^op: b has dtype bfloat16; expected float16 \(the dtype of a\)\.$"):
        pre.tensor("b", _rand(3, dtype=torch.bfloat16), dtype="a")
    with pytest.raises(KeyError, match="names no earlier tensor"):
        pre.tensor("c", _rand(3), dtype="nope")


def test_ndim():
    with pytest.raises(ValueError, match=r"^op: x has shape \(2, 3\); expected 3 dims\.$"):
        Preconditions("op").tensor("x", _rand(2, 3), ndim=3)
    with pytest.raises(ValueError, match=r"^op: x has shape \(2, 3\); expected 4 dims \(B, H, W, C\)\.$"):
        Preconditions("op").tensor("x", _rand(2, 3), shape=("B", "H", "W", "C"))
    with pytest.raises(ValueError,
                       match=r"^op: x has shape \(3,\); expected at least 2 dims \(\.\.\., M, K\)\.$"):
        Preconditions("op").tensor("x", _rand(3), shape=(..., "M", "K"))
    with pytest.raises(ValueError, match=r"^op: x has shape \(\); expected 1 dims \(n,\)\.$"):
        Preconditions("op").tensor("x", torch.tensor(1.0), shape=("n",))


def test_fixed_dim():
    pre = Preconditions("grid_sample")
    pre.tensor("x", _rand(2, 5, 5, 4), shape=("B", "H", "W", "C"))
    with pytest.raises(ValueError, match=r"^grid_sample: grid has shape \(2, 5, 5, 3\); expected "
                                         r"\(B=2, gH, gW, 2\): dim 3 is 3, expected 2\.$"):
        pre.tensor("grid", _rand(2, 5, 5, 3), shape=("B", "gH", "gW", 2))


def test_symbolic_dim():
    pre = Preconditions("grid_sample")
    pre.tensor("x", _rand(2, 5, 5, 4), shape=("B", "H", "W", "C"))
    with pytest.raises(ValueError, match=r"^grid_sample: grid has shape \(3, 5, 5, 2\); expected "
                                         r"\(B=2, gH, gW, 2\): dim 0 is 3, expected B=2 \(as in x\)\.$"):
        pre.tensor("grid", _rand(3, 5, 5, 2), shape=("B", "gH", "gW", 2))
    # a symbol twice in one shape: the tensor itself binds it
    with pytest.raises(ValueError, match=r"^op: m has shape \(3, 4\); expected \(n, n\): dim 1 is 4, "
                                         r"expected n=3\.$"):
        Preconditions("op").tensor("m", _rand(3, 4), shape=("n", "n"))
    # with leading dims, dims count from the end
    pre = Preconditions("mm")
    pre.tensor("lhs", _rand(2, 4, 5), shape=(..., "M", "K"))
    with pytest.raises(ValueError, match=r"^mm: rhs has shape \(2, 6, 3\); expected \(\.\.\., K=5, N\): "
                                         r"dim 1 is 6, expected K=5 \(as in lhs\)\.$"):
        pre.tensor("rhs", _rand(2, 6, 3), shape=(..., "K", "N"))


def test_ellipsis_only_leads():
    with pytest.raises(ValueError, match="may only lead"):
        Preconditions("op").tensor("x", _rand(2, 3), shape=("a", ...))


def test_contiguous():
    x = _rand(4, 6)[:, ::2]
    with pytest.raises(ValueError, match=r"^op: x is not contiguous \(shape \(4, 3\), strides \(6, 2\)\); "
                                         r"expected a contiguous tensor\.$"):
        Preconditions("op").tensor("x", x, contiguous=True)
    Preconditions("op").tensor("x", x.contiguous(), contiguous=True)


def test_device():
    with pytest.raises(ValueError, match=r"^op: x is on cpu; expected cuda\.$"):
        Preconditions("op").tensor("x", _rand(3), device="cuda")
    Preconditions("op").tensor("x", _rand(3), device="cpu")
    pre = Preconditions("op")
    pre.tensor("a", _rand(3))
    with pytest.raises(ValueError, match=r"^op: b is on meta but a is on cpu; expected one device\.$"):
        pre.tensor("b", torch.empty(3, device="meta"))
    pre.tensor("c", torch.empty(3, device="meta"), same_device=False)  # the op moves it itself


def test_choice_and_flag():
    pre = Preconditions("op")
    with pytest.raises(ValueError, match=r"^op: mode must be one of \('a', 'b'\), got 'c'\.$"):
        pre.choice("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"got 1"):
        pre.choice("level", 1, (True, False))  # 1 == True, but it is not a bool
    with pytest.raises(ValueError, match="got tensor"):
        pre.choice("mode", torch.tensor(1), (1, 2))
    for value in (1, 0, None, "yes", np.bool_(True)):
        with pytest.raises(TypeError, match=f"^op: align_corners must be a bool, got {value!r}\\.$"):
            pre.flag("align_corners", value)


def test_fail():
    pre = Preconditions("op")
    with pytest.raises(ValueError, match="^op: something$"):
        pre.fail("something")
    with pytest.raises(TypeError, match="^op: other$"):
        pre.fail("other", TypeError)


@pytest.mark.parametrize("seed", range(5))
def test_random_shapes(seed):
    """Fresh random shapes: a consistent call binds every symbol; changing one dim of one tensor
    is caught at that dim."""
    g = torch.Generator().manual_seed(seed)
    sizes = {s: int(torch.randint(1, 6, (), generator=g)) for s in "BHWCgh"}
    specs = {"x": ("B", "H", "W", "C"), "grid": ("B", "g", "h", 2), "cot": ("B", "g", "h", "C")}

    def shape_of(spec):
        return tuple(sizes[d] if isinstance(d, str) else d for d in spec)

    pre = Preconditions("op")
    for name, spec in specs.items():
        pre.tensor(name, torch.zeros(shape_of(spec)), shape=spec)
    assert pre.dims == sizes
    name = ["grid", "cot"][seed % 2]
    bound = {"B", "H", "W", "C"} | ({"g", "h"} if name == "cot" else set())  # before `name`
    checked = [i for i, d in enumerate(specs[name]) if not isinstance(d, str) or d in bound]
    at = checked[int(torch.randint(0, len(checked), (), generator=g))]
    shape = list(shape_of(specs[name]))
    shape[at] += 1
    pre = Preconditions("op")
    pre.tensor("x", torch.zeros(shape_of(specs["x"])), shape=specs["x"])
    if name == "cot":
        pre.tensor("grid", torch.zeros(shape_of(specs["grid"])), shape=specs["grid"])
    with pytest.raises(ValueError, match=f"^op: {name} has shape .*: dim {at} is {shape[at]}, expected "):
        pre.tensor(name, torch.zeros(shape), shape=specs[name])


def test_ops_use_it(device):
    """kernelkit.ops check through it: the messages name the op and the argument."""
    from kernelkit.ops import exp, exp_strided, grid_sample, matmul_add_relu
    with pytest.raises(TypeError, match="^exp: a has dtype int64"):
        exp(torch.arange(4, device=device))
    with pytest.raises(TypeError, match="^exp_strided: a must be a torch.Tensor"):
        exp_strided([1.0])
    assert exp(torch.empty(0, 3, device=device)).shape == (0, 3)
    with pytest.raises(ValueError, match="^grid_sample: grid has shape"):
        grid_sample(torch.randn(1, 2, 2, 1, device=device), torch.rand(1, 2, 2, 3, device=device))
    with pytest.raises(TypeError, match="^matmul_add_relu: rhs has dtype float64"):
        matmul_add_relu(torch.randn(2, 3, device=device), torch.randn(3, 2, device=device).double(),
                        torch.randn(2, device=device))


def test_check_once_checks_each_signature_once():
    """check_once runs a check once for each signature (a tensor's type, shape, dtype and device,
    another argument's type and value); a failing check raises on every call; arguments that
    cannot be hashed are checked every call."""
    seen = []

    def check(x, flag, extra=None):
        seen.append((tuple(x.shape), x.dtype, flag))
        pre = Preconditions("op")
        pre.tensor("x", x, dtype=torch.float32)
        pre.flag("flag", flag)

    x = torch.randn(2, 3)
    for _ in range(3):
        check_once(check, x, True)
    check_once(check, torch.randn(2, 3), True)  # another tensor of that signature
    assert len(seen) == 1
    check_once(check, torch.randn(3, 2), True)  # another shape
    check_once(check, x, False)                 # another value
    assert len(seen) == 3
    for _ in range(2):
        with pytest.raises(TypeError, match="^op: x has dtype float64"):
            check_once(check, x.double(), True)
        with pytest.raises(TypeError, match="^op: flag must be a bool"):
            check_once(check, x, 1)
    assert len(seen) == 7
    check_once(check, x, True, [1])  # a list: no signature, checked every call
    check_once(check, x, True, [1])
    assert len(seen) == 9
