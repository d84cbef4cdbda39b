"""cholesky / cholesky_ex / qr against torch.linalg in float64: values, LAPACK's info and signs,
gradients, errors; the one-threadgroup kernels and the blocked Cholesky's steps."""

import pytest
import torch

import kernelkit as kk
from kernelkit.ops import linalg

DTYPES = [torch.float64, torch.float32]
TOL = {torch.float64: 1e-12, torch.float32: 2e-5}


def _spd(shape, n, device, dtype=torch.float64, seed=0):
    """Symmetric positive-definite matrices, condition number ~10."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, n, n, generator=g, dtype=torch.float64)
    return (x @ x.mT / max(n, 1) + torch.eye(n, dtype=torch.float64)).to(dtype).to(device)


def _close(actual, expected, dtype):
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=0, atol=TOL[dtype] * scale)


@pytest.fixture(params=["serial", "simd", "one_group", "blocked"])
def path(request, monkeypatch):
    """Each test on every path: a thread a matrix (the CPU's for small matrices), a SIMD-group a
    matrix (Cholesky up to 32 x 32, the GPU's), a threadgroup a matrix, and the blocked steps
    (32-column panels)."""
    serial = {"cpu": 1 << 30, "cuda": 1 << 30} if request.param == "serial" else {}
    monkeypatch.setattr(linalg, "SERIAL_MAX_N", {"cholesky": serial, "qr": serial})
    monkeypatch.setattr(linalg, "SIMD_MAX_N", {"cpu": 64, "cuda": 64} if request.param == "simd" else {})
    blocked = 1 if request.param == "blocked" else 1 << 30
    monkeypatch.setattr(linalg, "BLOCKED_MIN_N", blocked)
    monkeypatch.setattr(linalg, "QR_BLOCKED_MIN_N", {"cpu": blocked, "cuda": blocked})
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("batch, n", [((), 1), ((3,), 5), ((2,), 32), ((2, 2), 33), ((1,), 100)])
def test_cholesky_matches_torch(device, path, dtype, upper, batch, n):
    """Sizes on and off the 32-column blocks and the update's 64-row tiles; garbage in the
    triangle that is not read."""
    a = _spd(batch, n, device, dtype)
    noise = torch.randn_like(a) * 100
    a_read = a + (noise.tril(-1) if upper else noise.triu(1))
    out = kk.ops.cholesky(a_read, upper=upper)
    assert out.shape == a.shape and out.dtype == dtype and out.device == a.device
    _close(out, torch.linalg.cholesky(a.double(), upper=upper), dtype)


@pytest.mark.parametrize("n", [23, 50, 70, 200])
def test_cholesky_ex_info_as_lapack(device, path, n):
    """(n = 23: a SIMD-group's path; 50: two SIMD-groups' lanes; 200: the blocked steps' panel
    rows over several threadgroups.)"""
    a = _spd((4,), n, device)
    spd = a[2].clone()
    mid = min(40, n // 2)      # (40: in the second block)
    a[1] = -a[1]               # the first minor
    a[2, mid, mid] = -1e3
    a[3, n - 1, n - 1] = float("nan")  # the last
    L, info = kk.ops.cholesky_ex(a)
    assert info.dtype == torch.int32 and info.device == a.device
    assert info.tolist() == torch.linalg.cholesky_ex(a.cpu()).info.tolist() == [0, 1, mid + 1, n]
    _close(L[0], torch.linalg.cholesky(a[0].double()), torch.float64)
    # the columns before the failing one are factored (they depend on A's columns up to theirs)
    _close(L[2, :, :mid], torch.linalg.cholesky(spd)[:, :mid], torch.float64)
    with pytest.raises(torch.linalg.LinAlgError, match=r"cholesky: \(Batch element 1\): The factorization "
                       r"could not be completed because the input is not positive-definite \(the "
                       r"leading minor of order 1 is not positive-definite\)"):
        kk.ops.cholesky(a)
    with pytest.raises(torch.linalg.LinAlgError, match=rf"cholesky_ex: .*order {mid + 1}\b"):
        kk.ops.cholesky_ex(a[2:], check_errors=True)
    with pytest.raises(torch.linalg.LinAlgError, match=rf"cholesky: The factorization .* order {n}"):
        kk.ops.cholesky(a[3])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 9, 16, 17, 31, 32, 33, 50, 64])
def test_cholesky_on_simd_groups_of_every_width(device, monkeypatch, n):
    """The SIMD-group path's lanes a matrix (n rounded up to a power of two) and its SIMD-groups
    shared by several matrices: 37 of them, no multiple of a SIMD-group's matrices, one failing."""
    monkeypatch.setattr(linalg, "SIMD_MAX_N", {"cpu": 64, "cuda": 64})
    a = _spd((37,), n, device, torch.float32, seed=n)
    a[20, n // 2, n // 2] = -1.0
    L, info = kk.ops.cholesky_ex(a)
    expected = torch.linalg.cholesky_ex(a.double().cpu())
    assert info.tolist() == expected.info.tolist()
    good = expected.info == 0
    _close(L[good.to(device)], expected.L[good], torch.float32)


def test_cholesky_gradients(device, path):
    a = _spd((2,), 40, device).requires_grad_()
    for upper in (False, True):
        g = torch.randn(2, 40, 40, dtype=torch.float64, device=device)
        ours, = torch.autograd.grad(kk.ops.cholesky(a, upper=upper), a, g)
        ref, = torch.autograd.grad(torch.linalg.cholesky(a, upper=upper), a, g)
        _close(ours, ref, torch.float64)


def test_cholesky_gradcheck():
    a = _spd((), 6, "cpu").requires_grad_()
    sym = lambda x: (x + x.mT) / 2  # noqa: E731 - the op reads one triangle: perturb both alike
    assert torch.autograd.gradcheck(lambda x: kk.ops.cholesky(sym(x)), (a,))
    assert torch.autograd.gradcheck(lambda x: kk.ops.cholesky_ex(sym(x), upper=True)[0], (a,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (3, 5), (4, 4), (2, 70, 33), (33, 70), (2, 1, 40, 40),
                                   (100, 70)])
def test_qr_matches_lapack(device, path, dtype, mode, shape):
    """LAPACK's reflectors, so LAPACK's Q and R (signs included), and Q R = A, Q^T Q = I."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    Q, R = kk.ops.qr(a, mode=mode)
    Qr, Rr = torch.linalg.qr(a.double().cpu(), mode=mode)
    assert Q.shape == Qr.shape and R.shape == Rr.shape and Q.dtype == R.dtype == dtype
    _close(R, Rr, dtype)
    if mode != "r":
        _close(Q, Qr, dtype)
        _close(Q @ R, a, dtype)
        _close(Q.mT @ Q, torch.eye(Q.shape[-1], dtype=torch.float64).expand(Q.mT.shape[:-1] + (Q.shape[-1],)),
               dtype)


def test_qr_special_columns(device, path):
    """A zero column (no reflector: H = I), a column already reduced, empty matrices."""
    a = torch.randn(6, 4, dtype=torch.float64, device=device)
    a[:, 1] = 0
    a[1:, 0] = 0
    Q, R = kk.ops.qr(a)
    Qr, Rr = torch.linalg.qr(a.cpu())
    _close(Q, Qr, torch.float64)
    _close(R, Rr, torch.float64)
    for shape, mode in [((0, 3), "reduced"), ((3, 0), "complete"), ((2, 0, 0), "reduced"), ((0, 4, 4), "r")]:
        Q, R = kk.ops.qr(torch.zeros(shape, device=device), mode=mode)
        Qr, Rr = torch.linalg.qr(torch.zeros(shape), mode=mode)
        assert Q.shape == Qr.shape and R.shape == Rr.shape
        assert torch.equal(Q.cpu(), Qr) and torch.equal(R.cpu(), Rr)


@pytest.mark.parametrize("shape, mode", [((7, 4), "reduced"), ((5, 5), "reduced"), ((4, 7), "reduced"),
                                         ((4, 7), "complete"), ((2, 6, 6), "complete"), ((40, 36), "reduced")])
def test_qr_gradients(device, path, shape, mode):
    a = torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True)
    Q, R = kk.ops.qr(a, mode=mode)
    gQ, gR = torch.randn_like(Q), torch.randn_like(R)
    ours, = torch.autograd.grad((Q, R), a, (gQ, gR))
    ref, = torch.autograd.grad(torch.linalg.qr(a, mode=mode), a, (gQ, gR))
    _close(ours, ref, torch.float64)
    ours, = torch.autograd.grad(kk.ops.qr(a, mode=mode)[1].sum(), a)  # Q unused: its cotangent zeros
    ref, = torch.autograd.grad(torch.linalg.qr(a, mode=mode)[1].sum(), a)
    _close(ours, ref, torch.float64)


def test_qr_gradcheck_and_what_is_not_differentiable():
    for shape in ((4, 3), (3, 4)):
        a = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(kk.ops.qr, (a,))
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="not computed when mode='r'"):
        kk.ops.qr(a, mode="r")[1].sum().backward()
    with pytest.raises(RuntimeError, match="not differentiable when mode='complete' and nrows > ncols"):
        kk.ops.qr(a, mode="complete")[1].sum().backward()


def test_errors():
    with pytest.raises(TypeError, match="cholesky: A has dtype float16; expected float32 or float64"):
        kk.ops.cholesky(torch.eye(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="cholesky: A has shape \\(3, 4\\)"):
        kk.ops.cholesky(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="cholesky_ex: A"):
        kk.ops.cholesky_ex(torch.zeros(3))
    with pytest.raises(TypeError, match="cholesky: upper"):
        kk.ops.cholesky(torch.eye(3), upper=1)
    with pytest.raises(TypeError, match="qr: A has dtype int32"):
        kk.ops.qr(torch.zeros(3, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="qr: mode"):
        kk.ops.qr(torch.zeros(3, 3), mode="full")
    with pytest.raises(TypeError, match="qr: A"):
        kk.ops.qr([[1.0]])
    assert kk.ops.cholesky(torch.zeros(0, 3, 3)).shape == (0, 3, 3)
    L, info = kk.ops.cholesky_ex(torch.zeros(2, 0, 0))
    assert L.shape == (2, 0, 0) and info.tolist() == [0, 0]


def test_references():
    a = _spd((2,), 5, "cpu", torch.float32)
    assert kk.ops.cholesky_reference(a).dtype == torch.float64
    Q, R = kk.ops.qr_reference(a, mode="complete")
    _close(Q @ R, a, torch.float32)


def test_forward_mode_and_vmap(device):
    """torch.func.jvp and vmap as torch.linalg's (the jvp rules recompute the factorization, as
    MLX's jvp rules get no outputs)."""
    from torch.func import jvp, vmap
    a = _spd((2,), 6, device)
    da = torch.randn(2, 6, 6, dtype=torch.float64, device=device)
    da = da + da.mT
    for upper in (False, True):
        ours = jvp(lambda x: kk.ops.cholesky(x, upper=upper), (a,), (da,))[1]
        _close(ours, jvp(lambda x: torch.linalg.cholesky(x, upper=upper), (a,), (da,))[1], torch.float64)
    for shape, mode in [((7, 4), "reduced"), ((4, 7), "complete"), ((2, 5, 5), "reduced")]:
        b, db = (torch.randn(shape, dtype=torch.float64, device=device) for _ in range(2))
        ours = jvp(lambda x: kk.ops.qr(x, mode=mode), (b,), (db,))[1]
        ref = jvp(lambda x: torch.linalg.qr(x, mode=mode), (b,), (db,))[1]
        for o, r in zip(ours, ref):
            _close(o, r, torch.float64)
    with pytest.raises(RuntimeError, match="not computed when mode='r'"):
        jvp(lambda x: kk.ops.qr(x, mode="r"), (b,), (db,))
    spd = _spd((4, 3), 5, device)
    _close(vmap(kk.ops.cholesky, in_dims=1)(spd), vmap(torch.linalg.cholesky, in_dims=1)(spd), torch.float64)
    w = torch.randn(4, 3, 6, 5, dtype=torch.float64, device=device)
    for o, r in zip(vmap(kk.ops.qr, in_dims=1)(w), vmap(torch.linalg.qr, in_dims=1)(w)):
        _close(o, r, torch.float64)
