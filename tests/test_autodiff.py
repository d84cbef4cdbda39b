"""kk.custom_function: MLX's custom vjp/jvp/vmap rules, through torch.autograd and torch.func."""

import warnings

import numpy as np
import pytest
import torch
from torch.func import grad, jacrev, jvp, vjp, vmap

import kernelkit as kk
from kernelkit import fastcall

# torch's own forward-AD setup scripts its decompositions with the deprecated torch.jit.script.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning")

# out = sin(x) * y and its derivatives, as kernels.
_fwd = kk.metal_kernel(name="sin_mul", input_names=["x", "y"], output_names=["out"], source="""
    uint i = thread_position_in_grid.x;
    out[i] = metal::sin(x[i]) * y[i];""")
_bwd = kk.metal_kernel(name="sin_mul_vjp", input_names=["x", "y", "ct"], output_names=["dx", "dy"],
                       source="""
    uint i = thread_position_in_grid.x;
    dx[i] = metal::cos(x[i]) * y[i] * ct[i];
    dy[i] = metal::sin(x[i]) * ct[i];""")
_tan = kk.metal_kernel(name="sin_mul_jvp", input_names=["x", "y", "tx", "ty"], output_names=["t"],
                       source="""
    uint i = thread_position_in_grid.x;
    t[i] = metal::cos(x[i]) * y[i] * tx[i] + metal::sin(x[i]) * ty[i];""")
_triple = kk.metal_kernel(name="triple", input_names=["x"], output_names=["y"], source="""
    uint i = thread_position_in_grid.x;
    y[i] = 3 * x[i];""")


def launch(kernel, inputs, n_out):
    x = inputs[0]
    n = x.numel() if isinstance(x, torch.Tensor) else x.size  # or a NumPy array
    return kernel(inputs=inputs, template=[("T", x.dtype)], grid=(max(n, 1), 1, 1),
                  threadgroup=(256, 1, 1), output_shapes=[x.shape] * n_out,
                  output_dtypes=[x.dtype] * n_out)


def batch_rule(fun):
    """A vmap rule for an elementwise custom_function: batch on axis 0, one launch over it all."""
    def rule(inputs, axes):
        inputs = [t.movedim(a, 0) if a is not None else t for t, a in zip(inputs, axes)]
        n = max(t.shape[0] for t, a in zip(inputs, axes) if a is not None)
        inputs = [t if a is not None else t.expand(n, *t.shape) for t, a in zip(inputs, axes)]
        return fun(*[t.contiguous() for t in inputs]), 0
    return rule


CALLS = {"vjp": 0, "jvp": 0, "vmap": 0}


@kk.custom_function
def sin_mul(x, y):
    """sin(x) * y, by a kernel."""
    return launch(_fwd, [x, y], 1)[0]


@kk.custom_function
def sin_mul_vjp(x, y, ct):
    return tuple(launch(_bwd, [x, y, ct], 2))


sin_mul_vjp.vmap(batch_rule(sin_mul_vjp))  # so that vmap(grad(sin_mul)) and jacrev work


@sin_mul.vjp
def _(primals, cotangent, output):
    CALLS["vjp"] += 1
    x, y = primals
    return sin_mul_vjp(x, y, cotangent)


@sin_mul.jvp
def _(primals, tangents):
    CALLS["jvp"] += 1
    return launch(_tan, [*primals, *tangents], 1)[0]


@sin_mul.vmap
def _(inputs, axes):
    CALLS["vmap"] += 1
    return batch_rule(sin_mul)(inputs, axes)


@pytest.fixture(autouse=True, params=["C++ node", "autograd.Function"])
def recorder(request, monkeypatch):
    """Every test on both roads of a call plain autograd records: the C++ node
    (autograd_node.cpp) and torch.autograd.Function (where that node is not built)."""
    fastcall.module(block=True)
    if request.param == "C++ node":
        if fastcall.node_attach is None:
            pytest.skip(f"no C++ node here: {fastcall.torch_helper()}")
    else:
        monkeypatch.setattr(fastcall, "node_attach", None)
    return request.param


def inputs(device, dtype=torch.float32, n=37):
    return (torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype))


def close(a, b):
    # Metal bodies compile with fast math (as on Metal): on a GPU metal::sin is an approximation.
    tol = 1e-4 if a.dtype == torch.float32 else 1e-7
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# --- torch.autograd ---------------------------------------------------------------------------

def test_backward_and_autograd_grad_through_the_vjp(device):
    x, y = inputs(device)
    assert sin_mul(x, y).grad_fn is None  # nothing to record: the function is simply called
    x, y = x.requires_grad_(), y.requires_grad_()
    out = sin_mul(x, y)
    assert isinstance(out, torch.Tensor) and out.grad_fn.name() == "sin_mulBackward"
    assert out.requires_grad and not out.is_leaf
    close(out, torch.sin(x) * y)
    ct = torch.randn_like(out)
    before = CALLS["vjp"]
    out.backward(ct)
    assert CALLS["vjp"] == before + 1
    close(x.grad, torch.cos(x) * y * ct)
    close(y.grad, torch.sin(x) * ct)

    gx, gy = torch.autograd.grad((sin_mul(x, y) ** 2).sum(), (x, y))
    s = torch.sin(x) * y
    close(gx, 2 * s * torch.cos(x) * y)
    close(gy, 2 * s * torch.sin(x))


def test_gradcheck_float64():
    x, y = (t.requires_grad_() for t in inputs("cpu", torch.float64, n=9))
    assert torch.autograd.gradcheck(sin_mul, (x, y), check_forward_ad=True)


# --- torch.func -------------------------------------------------------------------------------

def test_func_grad(device):
    x, y = inputs(device)
    gx, gy = grad(lambda a, b: sin_mul(a, b).sum(), argnums=(0, 1))(x, y)
    close(gx, torch.cos(x) * y)
    close(gy, torch.sin(x))


def test_func_vjp(device):
    x, y = inputs(device)
    out, vjp_fn = vjp(sin_mul, x, y)
    close(out, torch.sin(x) * y)
    ct = torch.randn_like(out)
    gx, gy = vjp_fn(ct)
    close(gx, torch.cos(x) * y * ct)
    close(gy, torch.sin(x) * ct)


def test_func_jvp_and_forward_ad_use_the_jvp_rule(device):
    x, y = inputs(device)
    tx, ty = inputs(device)
    before = CALLS["jvp"]
    out, t = jvp(sin_mul, (x, y), (tx, ty))
    assert CALLS["jvp"] == before + 1
    close(out, torch.sin(x) * y)
    close(t, torch.cos(x) * y * tx + torch.sin(x) * ty)

    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        t = fwAD.unpack_dual(sin_mul(fwAD.make_dual(x, tx), y)).tangent
    close(t, torch.cos(x) * y * tx)  # y has no tangent: it arrives as zeros


def test_func_vmap_uses_the_vmap_rule(device):
    X = torch.randn(5, 37, device=device)
    _, y = inputs(device)
    before = CALLS["vmap"]
    out = vmap(sin_mul, in_dims=(0, None))(X, y)
    assert CALLS["vmap"] == before + 1
    close(out, torch.sin(X) * y)
    Y = torch.randn(5, 37, device=device)
    out = vmap(sin_mul, in_dims=(1, 0))(X.T, Y)  # batch on different axes
    assert CALLS["vmap"] == before + 2
    close(out, torch.sin(X) * Y)


def test_vmap_of_grad_and_jacrev_through_rules(device):
    X = torch.randn(4, 37, device=device)
    _, y = inputs(device)
    per_sample = vmap(grad(lambda a, b: sin_mul(a, b).sum()), in_dims=(0, None))(X, y)
    close(per_sample, torch.cos(X) * y)
    x = X[0]
    close(jacrev(sin_mul)(x, y), torch.diag(torch.cos(x) * y))


# --- missing rules ----------------------------------------------------------------------------

@kk.custom_function
def twice(x):
    return launch(_fwd, [x, torch.full_like(x, 2.0)], 1)[0]


def test_missing_rules_raise_clear_errors():
    x = torch.randn(8, requires_grad=True)
    out = twice(x)  # no rule is needed to call it, even with requires_grad inputs
    close(out, torch.sin(x) * 2)
    assert out.requires_grad
    msg = (r"\[custom_function\] twice has no vjp rule: "
           r"define one with @twice.vjp to differentiate it")
    with pytest.raises(NotImplementedError, match=msg):
        out.sum().backward()
    with pytest.raises(NotImplementedError, match=msg):
        grad(lambda a: twice(a).sum())(x.detach())
    with pytest.raises(NotImplementedError, match=r"twice has no jvp rule: define one with @twice"):
        jvp(twice, (x.detach(),), (torch.ones(8),))
    with pytest.raises(NotImplementedError, match=r"no vmap rule: define one with @twice.vmap"):
        vmap(twice)(torch.randn(3, 8))


def test_without_a_rule_the_cause_names_the_kernel():
    """The missing rule's error comes from the kernel that f calls, which says why it cannot run
    under the transform (on its general path, and on a plan's, where outputs would be filled)."""
    x = torch.randn(8)
    for _ in range(3):  # plain calls: a plan made for the kernel
        twice(x)
    for transform in (lambda: grad(lambda a: twice(a).sum())(x), lambda: vmap(twice)(x[None])):
        with pytest.raises(NotImplementedError, match="twice has no") as info:
            transform()
        assert "have storage" in str(info.value.__cause__)
    copy = kk.metal_kernel(name="copy_init", input_names=["a"], output_names=["out"],
                           source="uint i = thread_position_in_grid.x; out[i] = a[i];")
    with pytest.raises(RuntimeError, match=r"kernel 'copy_init': input 'a' is a tensor of a "
                                           r"torch.func transform \(grad, jvp, vmap...\)"):
        grad(lambda a: copy(inputs=[a], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                            output_dtypes=[torch.float32], init_value=0)[0].sum())(x)


# --- rules not given: as MLX, the transform goes through f itself ---------------------------

@kk.custom_function
def weighted(p, n, *, bias):
    """torch code and no rule: every transform goes through it. p: a dict of tensors, n: a
    number; the second output is an integer tensor (no gradient, no tangent)."""
    return p["w"] * torch.sin(p["x"]) * n + bias, torch.argmax(p["x"], dim=-1, keepdim=True)


def test_without_rules_grad_jvp_and_vmap_go_through_the_function(device):
    x, w = (torch.randn(6, device=device, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(6, device=device, dtype=torch.float64)

    def out(p):
        return weighted(p, 3, bias=bias)[0]

    # torch.autograd: f runs again in the backward, its cotangents are used
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y, top = weighted({"x": xr, "w": wr}, 3, bias=bias)
    assert not top.requires_grad and top.dtype == torch.int64
    ct = torch.randn_like(y)
    y.backward(ct)
    close(xr.grad, wr * torch.cos(x) * 3 * ct)
    close(wr.grad, torch.sin(x) * 3 * ct)
    # torch.func.grad, double backward and grad of grad
    g = grad(lambda p: out(p).sum())({"x": x, "w": w})
    close(g["x"], w * torch.cos(x) * 3)
    close(g["w"], torch.sin(x) * 3)
    (gx,) = torch.autograd.grad(out({"x": xr, "w": w}).sum(), xr, create_graph=True)
    close(torch.autograd.grad(gx.sum(), xr)[0], -w * torch.sin(x) * 3)
    close(grad(lambda a: grad(lambda b: out({"x": b, "w": w}).sum())(a).sum())(x),
          -w * torch.sin(x) * 3)
    # torch.func.jvp and forward-mode AD
    tx, tw = torch.randn_like(x), torch.randn_like(w)
    _, t = jvp(lambda a, b: out({"x": a, "w": b}), (x, w), (tx, tw))
    close(t, (w * torch.cos(x) * tx + torch.sin(x) * tw) * 3)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        t = fwAD.unpack_dual(out({"x": fwAD.make_dual(x, tx), "w": w})).tangent
    close(t, w * torch.cos(x) * tx * 3)
    # torch.func.vmap, over one leaf of the dict, and jacrev (vmap of the backward)
    X = torch.randn(4, 6, device=device, dtype=torch.float64)
    ys, tops = vmap(lambda a: weighted({"x": a, "w": w}, 3, bias=bias))(X)
    close(ys, w * torch.sin(X) * 3 + bias)
    assert torch.equal(tops, torch.argmax(X, dim=-1, keepdim=True))
    close(jacrev(lambda a: out({"x": a, "w": w}))(x), torch.diag(w * torch.cos(x) * 3))


def test_kernel_rule_under_vmap_without_a_vmap_rule_says_so():
    @kk.custom_function
    def f(x, y):
        return launch(_fwd, [x, y], 1)[0]

    @f.vjp
    def _(primals, ct, out):
        return tuple(launch(_bwd, [*primals, ct], 2))

    x, y = inputs("cpu")
    with pytest.raises(RuntimeError, match=r"f's vjp rule runs under torch.func.vmap"):
        jacrev(f)(x, y)


# --- double backward --------------------------------------------------------------------------

@kk.custom_function
def sin_(x):
    return launch(_fwd, [x, torch.ones_like(x)], 1)[0]


@sin_.vjp
def _(x, cotangent, output):  # differentiable: torch ops
    return cotangent * torch.cos(x)


@kk.custom_function
def sin_via(x):
    return torch.sin(x)


@sin_via.vjp
def _(x, cotangent, output):  # differentiable: another custom_function
    return cotangent * cos_(x)


@kk.custom_function
def cos_(x):
    return torch.cos(x)


@cos_.vjp
def _(x, cotangent, output):
    return -cotangent * torch.sin(x)


@pytest.mark.parametrize("fun", [sin_, sin_via])
def test_double_backward(device, fun):
    x = torch.randn(11, device=device, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(fun(x).sum(), x, create_graph=True)
    close(g, torch.cos(x))
    (gg,) = torch.autograd.grad((g * g).sum(), x)  # d/dx cos(x)^2
    close(gg, -2 * torch.cos(x) * torch.sin(x))
    # and through torch.func: grad of grad
    gg = grad(lambda a: grad(lambda b: fun(b).sum())(a).sum())(x.detach())
    close(gg, -torch.sin(x.detach()))
    assert torch.autograd.gradgradcheck(fun, (x.detach().cpu().requires_grad_(),))


# --- what the rules receive ---------------------------------------------------------------------

def test_single_output_vjp_gets_a_single_cotangent():
    seen = {}

    @kk.custom_function
    def f(x):
        return launch(_fwd, [x, torch.ones_like(x)], 1)[0]

    @f.vjp
    def _(primals, cotangents, outputs):
        seen.update(primals=primals, cotangents=cotangents, outputs=outputs)
        return cotangents * torch.cos(primals)

    x = torch.randn(6, requires_grad=True)
    out = f(x)
    ct = torch.randn(6)
    out.backward(ct)
    # MLX: one positional argument is passed as itself, one output likewise.
    assert isinstance(seen["primals"], torch.Tensor) and torch.equal(seen["primals"], x)
    assert isinstance(seen["cotangents"], torch.Tensor) and torch.equal(seen["cotangents"], ct)
    assert isinstance(seen["outputs"], torch.Tensor) and torch.equal(seen["outputs"], out)
    close(x.grad, ct * torch.cos(x))


def test_multiple_outputs_unused_and_integer_outputs():
    seen = {}

    @kk.custom_function
    def f(x, y):
        s = launch(_fwd, [x, y], 1)[0]
        return s, (s > 0).to(torch.int32), [x * y]

    @f.vjp
    def _(primals, cotangents, outputs):
        x, y = primals
        d_s, d_pos, (d_prod,) = cotangents
        seen.update(cotangents=cotangents, outputs=outputs)
        return d_s * torch.cos(x) * y + d_prod * y, d_s * torch.sin(x) + d_prod * x

    x, y = (t.requires_grad_() for t in inputs("cpu"))
    s, pos, (prod,) = f(x, y)
    assert s.requires_grad and prod.requires_grad
    assert pos.dtype == torch.int32 and not pos.requires_grad  # non-differentiable
    torch.testing.assert_close(pos, (torch.sin(x) * y > 0).to(torch.int32))
    prod.sum().backward()  # s and pos unused: their cotangents are zeros
    d_s, d_pos, (d_prod,) = seen["cotangents"]
    assert torch.equal(d_s, torch.zeros_like(s)) and torch.equal(d_pos, torch.zeros_like(pos))
    assert d_s.stride() == (0,) * d_s.dim() and d_pos.stride() == (0,) * d_pos.dim()  # nothing filled
    assert torch.equal(d_prod, torch.ones_like(prod))
    assert isinstance(seen["outputs"], tuple) and isinstance(seen["outputs"][2], list)
    close(x.grad, y)
    close(y.grad, x)


def test_missing_cotangents_share_one_zero(device):
    """Missing cotangents cost no fill after the first: one zero per dtype and device, seen through
    zero strides (one view per shape, made once); a write into such a view fails, and a zero
    written all the same is made again."""
    seen = []

    @kk.custom_function
    def f(x):
        return x * 2, x * 3

    @f.vjp
    def _(primals, cotangents, outputs):
        seen.append(cotangents[1])
        return cotangents[0] * 2 + cotangents[1] * 3

    x = torch.randn(5, device=device, requires_grad=True)
    for _ in range(2):
        f(x)[0].sum().backward()
    first, second = seen
    assert first is second and not second.any()
    with pytest.raises(RuntimeError, match="more than one element"):
        second.add_(1)
    first._base.fill_(1)  # written through the zero itself
    f(x)[0].sum().backward()
    assert not seen[-1].any() and seen[-1].stride() == (0,)
    close(x.grad, torch.full_like(x, 6.0))


def test_non_tensor_arguments_pass_through():
    seen = {}

    @kk.custom_function
    def f(x, scale, pair, mode="sin"):
        a, b = pair
        assert isinstance(scale, float) and mode in ("sin", "cos")
        base = torch.sin(x) if mode == "sin" else torch.cos(x)
        return base * scale * a + b

    @f.vjp
    def _(primals, cotangent, output, mode="sin"):
        x, scale, (a, b) = primals
        seen.update(scale=scale, mode=mode, a=a)
        d = torch.cos(x) if mode == "sin" else -torch.sin(x)
        return cotangent * d * scale * a, None, (None, cotangent)  # None: no gradient

    x = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    out = f(x, 3.0, (2, b), mode="cos")
    close(out, torch.cos(x) * 6 + b)
    out.sum().backward()
    assert seen == {"scale": 3.0, "mode": "cos", "a": 2}
    close(x.grad, -torch.sin(x) * 6)
    close(b.grad, torch.ones(5))

    # the vjp may also leave the non-tensor arguments out, as MLX's flattening does
    f.vjp(lambda primals, ct, out, mode="sin": (ct * torch.cos(primals[0]) * primals[1] * 2, ct))
    x.grad = b.grad = None
    f(x, 3.0, (2, b)).sum().backward()
    close(x.grad, torch.cos(x) * 6)
    close(b.grad, torch.ones(5))



def test_keyword_arguments_are_constants():
    """Keyword arguments reach the function and every rule as given and get no gradient: held
    aside where they hold no tensor, carried as leaves where one does (a tensor keyword still
    gets no gradient, and vmap refuses to batch it)."""
    seen = []

    @kk.custom_function
    def f(x, *, scale, shift=None, mode="sin"):
        base = torch.sin(x) if mode == "sin" else torch.cos(x)
        return base * scale + (0 if shift is None else shift)

    @f.vjp
    def _(x, cotangent, output, *, scale, shift=None, mode="sin"):
        seen.append((scale, mode, shift is None))
        return cotangent * scale * (torch.cos(x) if mode == "sin" else -torch.sin(x))

    @f.vmap
    def _(x, axis, *, scale, shift=None, mode="sin"):
        seen.append(("vmap", scale, mode))
        return f(x, scale=scale, shift=shift, mode=mode), axis

    x = torch.randn(5, requires_grad=True)
    shift = torch.randn(5, requires_grad=True)
    close(f(x, scale=2.0, mode="cos"), torch.cos(x) * 2)
    (g,) = torch.autograd.grad(f(x, scale=2.0, mode="cos").sum(), x)
    close(g, -torch.sin(x) * 2)
    (g,) = torch.autograd.grad(f(x, scale=3.0, shift=shift).sum(), x)
    close(g, torch.cos(x) * 3)
    assert seen == [(2.0, "cos", True), (3.0, "sin", False)]
    assert torch.autograd.grad(f(x, scale=3.0, shift=shift).sum(), shift, allow_unused=True) == (None,)

    xs = torch.randn(3, 5)
    close(vmap(lambda t: f(t, scale=2.0, mode="cos"))(xs), torch.cos(xs) * 2)
    assert seen[-1] == ("vmap", 2.0, "cos")
    with pytest.raises(ValueError, match="keyword arguments cannot be vmapped"):
        vmap(lambda t, s: f(t, scale=2.0, shift=s))(xs, xs)


def test_numpy_and_numbers_only_call_the_function():
    @kk.custom_function
    def f(x, y):
        return launch(_fwd, [x, y], 1)[0]

    a, b = np.random.rand(4), np.random.rand(4)
    out = f(a, b)  # nothing torch can differentiate: the function is simply called
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, np.sin(a) * b)


def test_wraps_metadata_and_setters():
    assert sin_mul.__name__ == "sin_mul" and sin_mul.__doc__ == "sin(x) * y, by a kernel."
    assert sin_mul.__wrapped__.__name__ == "sin_mul" and sin_mul.__module__ == __name__
    assert sin_mul.__qualname__ == "sin_mul"
    assert "rules: vjp, jvp, vmap" in repr(sin_mul)

    @kk.custom_function
    def g(x):
        return x * 2

    assert g.vjp(lambda x, ct, out: ct * 2) is g  # as MLX, a setter returns the custom_function


def test_bad_vjp_results_are_named():
    @kk.custom_function
    def f(x, y):
        return x * y

    f.vjp(lambda primals, ct, out: (ct,))
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"f's vjp returned 1 gradients for 2 primals"):
        f(x, y).sum().backward()
    f.vjp(lambda primals, ct, out: (ct.sum(), ct))
    with pytest.raises(ValueError, match=r"f's vjp returned a gradient of shape \(\) for primal"):
        f(x, y).sum().backward()


def test_an_input_returned_as_is():
    @kk.custom_function
    def first(x, y):
        return x, y[0]  # the input itself, and a view of one

    @first.vjp
    def _(primals, cotangents, outputs):
        x, y = primals
        dx, dy0 = cotangents
        return dx, torch.cat([dy0[None], torch.zeros_like(y[1:])])

    x, y = torch.randn(3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    a, b = first(x, y)
    (a.sum() + 2 * b.sum()).backward()
    close(x.grad, torch.ones(3))
    close(y.grad, torch.tensor([[2.0] * 3, [0.0] * 3]))


def test_graph_rules_as_torch_s(recorder):
    """What autograd promises of a recorded call, on both roads: a graph runs once unless
    retained, a saved tensor modified in place is caught, saved-tensor hooks see the call's
    tensors and outputs, and the graph (outputs included) is freed with its last output."""
    import gc
    import weakref

    x, y = (t.requires_grad_() for t in inputs("cpu"))
    out = sin_mul(x, y)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    close(x.grad, 2 * torch.cos(x) * y)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()

    x2 = x.detach().clone().requires_grad_()
    out = sin_mul(x2, y)
    with torch.no_grad():
        x2.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()

    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
        out = sin_mul(x, y)
    assert len(packed) == 3  # x, y and the output
    (gx,) = torch.autograd.grad(out.sum(), x)
    close(gx, torch.cos(x) * y)

    x3 = x.detach().clone().requires_grad_()
    out = sin_mul(x3, y)
    saved, alive = weakref.ref(x3), weakref.ref(out)
    del x3
    gc.collect()
    assert saved() is not None  # kept by the graph
    del out
    gc.collect()
    assert alive() is None and saved() is None


def test_errors_of_a_vjp_reach_the_caller_as_raised(recorder):
    @kk.custom_function
    def f(x):
        return x * 2

    @f.vjp
    def _(primals, cotangent, output):
        raise KeyError("from the vjp")

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(KeyError, match="from the vjp"):
        f(x).sum().backward()
    f.vjp(lambda primals, cotangent, output: "not a gradient")
    with pytest.raises((TypeError, ValueError), match="f's vjp"):
        f(x).sum().backward()


def test_a_call_whose_tensors_do_not_all_require_grad(recorder):
    """Gradients flow to the tensors that require them; the others get none."""
    x, y = inputs("cpu")
    x.requires_grad_()
    out = sin_mul(x, y)
    (gx,) = torch.autograd.grad(out.sum(), x)
    close(gx, torch.cos(x) * y)
    assert y.grad is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(sin_mul(x, y).sum(), y)


def test_compiled_autograd(recorder):
    """Compiled autograd traces Python autograd nodes: a call recorded while it is on goes through
    torch.autograd.Function; one recorded on the C++ node before it was turned on says so."""
    from torch._dynamo import compiled_autograd

    @kk.custom_function
    def triple(x):
        return launch(_triple, [x], 1)[0]

    @triple.vjp
    def _(primals, cotangent, output):
        return triple(cotangent)

    x = torch.randn(8, requires_grad=True)
    with compiled_autograd._enable(torch.compile(backend="eager")):
        triple(x).sum().backward()
    close(x.grad, torch.full((8,), 3.0))
    if recorder == "C++ node":
        out = triple(x)
        with pytest.raises(NotImplementedError, match="recorded before compiled autograd was turned on"):
            with compiled_autograd._enable(torch.compile(backend="eager")):
                out.sum().backward()



def test_ops_on_both_roads(recorder):
    """kernelkit's ops under plain autograd take autodiff.record_op (the C++ node without
    custom_function's argument handling) where the node is built, else their custom_function:
    the same gradients either way, as torch.func's (which always goes through custom_function)."""
    from kernelkit.ops import flash_attention, flash_attention_reference, grid_sample, grid_sample_torch

    q, k, v = (torch.randn(1, 2, 9, 64, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert o.grad_fn.name() == "_attentionBackward"
    dout = torch.randn_like(o)
    got = torch.autograd.grad((o * dout).sum(), (q, k, v), retain_graph=True)  # lse's cotangent: zeros
    ref = torch.autograd.grad((flash_attention_reference(q, k, v, causal=True) * dout).sum(), (q, k, v))
    with warnings.catch_warnings():  # (an op's backward kernels do not warn that they have no derivative)
        warnings.simplefilter("error")
        by_func = torch.func.grad(lambda *x: (flash_attention(*x, causal=True) * dout).sum(),
                                  argnums=(0, 1, 2))(q, k, v)
    for a, b, c in zip(got, ref, by_func):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, b)
    dlse = torch.randn_like(lse)
    (gq,) = torch.autograd.grad((lse * dlse).sum(), q)
    _, lse_ref = flash_attention_reference(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(gq, torch.autograd.grad((lse_ref * dlse).sum(), q)[0])

    x = torch.randn(2, 5, 6, 3, dtype=torch.float64, requires_grad=True)
    grid = (torch.rand(2, 4, 3, 2, dtype=torch.float64) * 2 - 1).requires_grad_()
    out = grid_sample(x, grid)
    assert out.grad_fn.name() == "_grid_sampleBackward"
    ct = torch.randn_like(out)
    got = torch.autograd.grad((out * ct).sum(), (x, grid))
    ref = torch.autograd.grad((grid_sample_torch(x, grid) * ct).sum(), (x, grid))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_func = torch.func.grad(lambda *a: (grid_sample(*a) * ct).sum(), argnums=(0, 1))(x, grid)
    for a, b, c in zip(got, ref, by_func):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, b)
