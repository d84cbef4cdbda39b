"""Factorizations: the curated notes' block Cholesky and panel QR grown into torch.linalg's
`cholesky`, `cholesky_ex` and `qr`, batched, differentiable, on the GPU and the CPU.

- Cholesky (`cholesky.metal`): one threadgroup a matrix, the blocked right-looking algorithm in
  steps of NB = 32 columns (the notes' pattern: the diagonal block factored by one SIMD-group in
  threadgroup memory, the panel and the trailing update spread over the group's threads, barriers
  between). On a GPU, matrices up to 64 x 64 take `cholesky_simd.metal` instead: a lane a row,
  each step's column shared by shuffles within a SIMD-group (up to 32) or through threadgroup
  memory across two (up to 64). Large matrices in small batches take two launches a step instead
  (`cholesky_panel.metal`, `cholesky_update.metal`), each spread over many threadgroups: the
  panel's rows, then the trailing triangle's tiles. Their shared parts: `cholesky_blocks.metal`.
- QR (`qr.metal`): Householder reflectors as LAPACK's geqr2 / org2r make them, one threadgroup a
  matrix, a SIMD-group a column. Large matrices go in panels of NB columns (LAPACK's geqrf /
  orgqr): `qr_panel.metal` factors a panel and makes its block reflector I - V T V^T, which GEMMs
  (torch.matmul: cuBLAS, MKL) apply to the columns right of it and, last panel first, to Q.
  Their shared steps: `qr_blocks.metal`.
- On the CPU a thread takes a matrix (`cholesky_serial.metal` for small ones, `qr_serial.metal`:
  the same arithmetic with no synchronisation, which the CPU runs as plain loops). Code shared by
  all of them: `linalg.metal`.

Inputs are (..., n, n) / (..., m, n) float32 or float64 tensors (sums in their dtype). Outputs
follow torch.linalg: L lower (or U = L^T with upper=True, made from A's upper triangle), info as
LAPACK's; Q and R in torch's column-major layout (transposed views of row-major buffers). The
backward passes are torch's formulas on plain torch ops (triangular solves and products).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from .. import custom_function, metal_kernel
from ..preconditions import Preconditions, check_once
from ..torch_ops import tracing

_HERE = Path(__file__)
NB, TILE = 32, 64  # the Cholesky's block of columns, and its trailing update's tiles
_DTYPES = (torch.float32, torch.float64)
_OPTIONS = {"math_mode": "relaxed"}  # IEEE division and square roots; FMAs contracted


def _kernel(name: str, inputs: list, outputs: list, headers=("linalg",), **kwargs):
    return metal_kernel(name=name, input_names=inputs, output_names=outputs,
                        header="".join(_HERE.with_name(f"{h}.metal").read_text() for h in headers),
                        source=_HERE.with_name(f"{name}.metal").read_text(), compile_options=_OPTIONS,
                        **kwargs)


_BLOCKS = ("linalg", "cholesky_blocks")
_cholesky = _kernel("cholesky", ["A"], ["L", "info"], _BLOCKS)
_cholesky_serial = _kernel("cholesky_serial", ["A"], ["L", "info"])
_cholesky_simd = _kernel("cholesky_simd", ["A"], ["L", "info"])
# The blocked steps write L and info in place (inputs the op made): their copies would be lost.
_cholesky_panel = _kernel("cholesky_panel", ["L", "info", "step"], ["S"], _BLOCKS, ensure_row_contiguous=False)
_cholesky_update = _kernel("cholesky_update", ["L", "info", "S", "step"], [], _BLOCKS,
                           ensure_row_contiguous=False)
_QR_BLOCKS = ("linalg", "qr_blocks")
_qr = _kernel("qr", ["A", "q", "rr"], ["W", "QT", "RT", "tau"], _QR_BLOCKS)
_qr_serial = _kernel("qr_serial", ["A", "q", "rr"], ["W", "QT", "RT", "tau"])
_qr_panel = _kernel("qr_panel", ["W", "first"], ["VT", "tfactor"], _QR_BLOCKS, ensure_row_contiguous=False)

# Which kernel takes a batch (settings of the module: the tests move them). On the CPU a thread
# takes a matrix, for QR below QR_BLOCKED_MIN_N and for Cholesky factors up to n = 128 (the
# one-threadgroup kernels' barriers and SIMD-group sums switch the CPU's fibers more often than
# they compute; larger Cholesky factors gain more from the tiles): SERIAL_MAX_N by op and device
# type. Large matrices in small batches take the blocked Cholesky's steps (the whole device on
# each step); the rest a threadgroup a matrix.
SERIAL_MAX_N = {"cholesky": {"cpu": 128}, "qr": {"cpu": 1 << 62}}
# Cholesky factors up to SIMD_MAX_N (by device type; 64 at most, a lane a row) take a SIMD-group's
# lanes, or two SIMD-groups' past 32 (on the CPU its lanes are fibers that switch at every shuffle
# and barrier: the serial kernel is faster). On the H200 it beats a threadgroup a matrix 4-9x up
# to 33 and 1.7-3.3x at 48-64 (bench/profile_cholesky_paths.py).
SIMD_MAX_N = {"cuda": 64}
BLOCKED_MIN_N = 256
# QR of matrices whose smaller side reaches QR_BLOCKED_MIN_N (by device type) takes the blocked
# steps: a panel kernel, then the panel's block reflector applied by GEMMs (torch.matmul). (On
# the CPU the panel kernel's SIMD-group sums cost fiber switches: a thread a matrix is faster up
# to ~400 x 400 on 2 cores.)
QR_BLOCKED_MIN_N = {"cpu": 512, "cuda": 128}


def _serial(op: str, n: int, device: torch.device) -> bool:
    return n <= SERIAL_MAX_N[op].get(device.type, 0)


def _threads(n: int, device: torch.device) -> int:
    """Threads of a one-matrix threadgroup: a SIMD-group for the smallest matrices, else up to 256
    on a GPU; 64 on the CPU (its threads are fibers that switch at every barrier)."""
    return 32 if n <= 32 else 64 if device.type == "cpu" else min(256, 32 * -(-n // 32))


def _blocked(n: int, batch: int, device: torch.device) -> bool:
    if n < BLOCKED_MIN_N:
        return False
    if device.type == "cuda":
        return batch < torch.cuda.get_device_properties(device).multi_processor_count
    return batch < (os.cpu_count() or 1)


def _one_thread_each(kernel, batch: int, **call):
    """A call of a one-thread-a-matrix kernel over `batch` matrices."""
    return kernel(grid=(batch, 1, 1), threadgroup=(64, 1, 1), **call)


def _factor(a: torch.Tensor, upper: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) for a contiguous (batch, n, n) tensor."""
    batch, n = a.shape[0], a.shape[-1]
    if _serial("cholesky", n, a.device):
        return _one_thread_each(_cholesky_serial, batch, inputs=[a], template=[("T", a.dtype), ("UPPER", upper)],
                                output_shapes=[a.shape, (batch,)], output_dtypes=[a.dtype, torch.int32])
    if n <= min(64, SIMD_MAX_N.get(a.device.type, 0)):
        p = 1 << (n - 1).bit_length()  # lanes a matrix
        group = 64 if p > 32 else 128  # (a matrix a threadgroup past 32: cholesky_simd.metal)
        return _cholesky_simd(inputs=[a], template=[("T", a.dtype), ("P", p), ("UPPER", upper)],
                              output_shapes=[a.shape, (batch,)], output_dtypes=[a.dtype, torch.int32],
                              grid=(32 * -(-batch * p // 32), 1, 1), threadgroup=(group, 1, 1))
    template = [("T", a.dtype), ("NB", NB), ("TILE", TILE), ("UPPER", upper)]
    if not _blocked(n, batch, a.device):
        nt = _threads(n, a.device)
        return _cholesky(inputs=[a], template=template, output_shapes=[a.shape, (batch,)],
                         output_dtypes=[a.dtype, torch.int32], grid=(nt * batch, 1, 1),
                         threadgroup=(nt, 1, 1))
    l = (a.triu() if upper else a.tril()).contiguous()
    info = torch.zeros(batch, dtype=torch.int32, device=a.device)
    nt = _threads(n, a.device)
    for b0 in range(0, n, NB):
        rows = n - min(b0 + NB, n)
        s = _cholesky_panel(inputs=[l, info, b0], template=template, output_shapes=[(batch, NB, NB)],
                            output_dtypes=[a.dtype], grid=(nt * max(1, -(-rows // nt)), batch, 1),
                            threadgroup=(nt, 1, 1))[0]
        tiles = -(-rows // TILE)
        _cholesky_update(inputs=[l, info, s, b0], template=template, output_shapes=[], output_dtypes=[],
                         grid=(nt * max(1, tiles * (tiles + 1) // 2), batch, 1), threadgroup=(nt, 1, 1))
    return l, info


def _check(name: str, A, upper, check_errors=False) -> None:
    pre = Preconditions(name)
    pre.tensor("A", A, dtype=_DTYPES, shape=(..., "n", "n"))
    pre.flag("upper", upper)
    pre.flag("check_errors", check_errors)


def _check_qr(A, mode) -> None:
    pre = Preconditions("qr")
    pre.tensor("A", A, dtype=_DTYPES, shape=(..., "m", "n"))
    pre.choice("mode", mode, _QR_MODES)


@custom_function
def _cholesky_fn(A, upper=False, raise_as=None):
    """(L, info); raise_as: the op's name, to raise where an info is not 0 (inside the function,
    so that a compiled graph keeps it whole)."""
    batch, n = A.shape[:-2], A.shape[-1]
    if math.prod(batch) == 0 or n == 0:
        return A.new_zeros(A.shape), torch.zeros(batch, dtype=torch.int32, device=A.device)
    if A.dim() == 3 and A.is_contiguous():  # (the usual call: no views, each a few us of host time)
        L, info = _factor(A, upper)
    else:
        L, info = _factor(A.reshape(-1, n, n).contiguous(), upper)
        L, info = L.view(A.shape), info.view(batch)
    if raise_as is not None and not tracing():  # (fake tensors, for torch.compile: no data)
        _raise_for(info, raise_as)
    return L, info


@_cholesky_fn.vjp
def _cholesky_vjp(A, cotangents, outputs, upper=False, raise_as=None):
    L, gL = outputs[0], cotangents[0]
    if upper:
        L, gL = L.mT, gL.mT
    # gA = L^-T Phi(L^T gL) L^-1, symmetrised (Phi: the lower triangle, its diagonal halved)
    phi = (L.mT @ gL.tril()).tril()
    phi.diagonal(dim1=-2, dim2=-1).mul_(0.5)
    g = torch.linalg.solve_triangular(L.mT, phi, upper=True)
    g = torch.linalg.solve_triangular(L, g, upper=False, left=False)
    return (g + g.mT) * 0.5


@_cholesky_fn.jvp
def _cholesky_jvp(A, dA, upper=False, raise_as=None):
    # dL = L Phi(L^-1 dA L^-T), dA the symmetric matrix of the triangle that is read
    L = _cholesky_fn(A, upper=upper, raise_as=raise_as)[0]
    if upper:
        L, dA = L.mT, dA.mT
    dA = dA.tril() + dA.tril(-1).mT
    phi = torch.linalg.solve_triangular(L, dA, upper=False)
    phi = torch.linalg.solve_triangular(L.mT, phi, upper=True, left=False).tril()
    phi.diagonal(dim1=-2, dim2=-1).mul_(0.5)
    dL = L @ phi
    return (dL.mT if upper else dL), None


@_cholesky_fn.vmap
def _cholesky_vmap(A, axis, upper=False, raise_as=None):
    return _cholesky_fn(A.movedim(axis, 0), upper=upper, raise_as=raise_as), 0


def cholesky_ex(A: torch.Tensor, *, upper: bool = False,
                check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) as torch.linalg.cholesky_ex: A = L L^T for A (..., n, n) symmetric positive-definite
    (float32 or float64; only its lower triangle is read, its upper one with upper=True, which
    returns U = L^T). info (..., int32): 0, or the order of the leading minor that is not
    positive-definite (L then holds the factorization as far as it got). check_errors=True raises
    torch.linalg.LinAlgError where an info is not 0 (a sync with the GPU). Differentiable in A."""
    check_once(_check, "cholesky_ex", A, upper, check_errors)
    return _cholesky_fn(A, upper=upper, raise_as="cholesky_ex" if check_errors else None)


def cholesky(A: torch.Tensor, *, upper: bool = False) -> torch.Tensor:
    """L with A = L L^T, as torch.linalg.cholesky (see cholesky_ex); raises
    torch.linalg.LinAlgError where a matrix is not positive-definite (a sync with the GPU)."""
    check_once(_check, "cholesky", A, upper)
    return _cholesky_fn(A, upper=upper, raise_as="cholesky")[0]


def _raise_for(info: torch.Tensor, name: str) -> None:
    if not info.any():  # (the usual case: one reduction and one byte read back)
        return
    bad = torch.nonzero(info.reshape(-1))
    if bad.numel():
        i = int(bad[0, 0])
        where = f"(Batch element {i}): " if info.dim() else ""
        raise torch.linalg.LinAlgError(
            f"{name}: {where}The factorization could not be completed because the input is not "
            f"positive-definite (the leading minor of order {int(info.reshape(-1)[i])} is not "
            "positive-definite).")


_QR_MODES = ("reduced", "complete", "r")


@custom_function
def _qr_fn(A, mode="reduced"):
    batch, (m, n) = A.shape[:-2], A.shape[-2:]
    k = min(m, n)
    q, rr = {"reduced": (k, k), "complete": (m, m), "r": (0, k)}[mode]
    b = math.prod(batch)
    a = A.reshape(b, m, n).contiguous()
    if k >= QR_BLOCKED_MIN_N.get(A.device.type, 0):
        qt, rt = _qr_blocked(a, q, rr)
    else:
        call = dict(inputs=[a, q, rr], template=[("T", A.dtype), ("WANT_Q", mode != "r")],
                    output_shapes=[(b, n, m), (b, q, m), (b, n, rr), (b, k)], output_dtypes=[A.dtype] * 4)
        if _serial("qr", max(m, n), A.device):
            _, qt, rt, _ = _one_thread_each(_qr_serial, b, **call)
        else:
            nt = _threads(max(m, n), A.device)
            _, qt, rt, _ = _qr(grid=(nt * b, 1, 1), threadgroup=(nt, 1, 1), **call)
    R = rt.view(*batch, n, rr).mT
    Q = A.new_empty(0) if mode == "r" else qt.view(*batch, q, m).mT
    return Q, R


def _qr_blocked(a: torch.Tensor, q: int, rr: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q^T, R^T) of a contiguous (b, m, n) tensor (Q^T with q rows, none where q is 0) in panels
    of NB columns: W = A^T, each panel factored by _qr_panel into its block reflector
    I - V T V^T, which GEMMs apply to the columns right of it (rows of W: W -= W V T V^T); Q
    accumulated from the identity the same way, the last panel first."""
    b, m, n = a.shape
    k = min(m, n)
    w = a.mT.contiguous()
    nt = _threads(m, a.device)
    panels = []
    for k0 in range(0, k, NB):
        vt, t = _qr_panel(inputs=[w, k0], template=[("T", a.dtype), ("NB", NB)],
                          output_shapes=[(b, NB, m), (b, NB, NB)], output_dtypes=[a.dtype] * 2,
                          grid=(nt * b, 1, 1), threadgroup=(nt, 1, 1))
        v = vt[..., k0:]  # (V's rows above k0 are zero)
        panels.append((k0, v, t))
        rest = w[:, min(k0 + NB, k):, k0:]
        if rest.shape[1]:
            rest.baddbmm_(rest @ v.mT @ t, v, alpha=-1)
    qt = torch.eye(q, m, dtype=a.dtype, device=a.device).expand(b, q, m).contiguous()
    for k0, v, t in reversed(panels if q else ()):
        z = qt[:, k0:, k0:]
        z.baddbmm_(z @ v.mT @ t.mT, v, alpha=-1)
    return qt, w[..., :rr].tril()


def _qr_tall_grad(Q, R, gQ, gR):
    """gA of A = Q R (m >= n, R square): (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q."""
    M = R @ gR.mT - gQ.mT @ Q
    lower = M.tril(-1)
    sym = lower + lower.mT + torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))
    return torch.linalg.solve_triangular(R.mT, gQ + Q @ sym, upper=False, left=False)


def _differentiable(mode: str, m: int, n: int) -> None:
    if mode == "r":
        raise RuntimeError("qr: the derivative depends on Q, which is not computed when mode='r'; "
                           "use mode='reduced' to differentiate through qr.")
    if mode == "complete" and m > n:
        raise RuntimeError("qr: the QR decomposition is not differentiable when mode='complete' "
                           "and nrows > ncols.")


@_qr_fn.vjp
def _qr_vjp(A, cotangents, outputs, mode="reduced"):
    m, n = A.shape[-2:]
    _differentiable(mode, m, n)
    (Q, R), (gQ, gR) = outputs, cotangents
    if m >= n:
        return _qr_tall_grad(Q, R, gQ, gR)
    # A = [X | Y] with X = Q U square: Y = Q V moves Q too
    Y, gU, gV = A[..., m:], gR[..., :m], gR[..., m:]
    return torch.cat([_qr_tall_grad(Q, R[..., :m], gQ + Y @ gV.mT, gU), Q @ gV], dim=-1)


def _qr_tall_jvp(Q, R, dA):
    """(dQ, dR) of A = Q R (m >= n, R square): with X = dA R^-1 and C = Q^T X, dR = (C - W) R and
    dQ = X - Q (C - W), W = Q^T dQ the skew-symmetric matrix of C's strict lower triangle."""
    X = torch.linalg.solve_triangular(R, dA, upper=True, left=False)
    C = Q.mT @ X
    lower = C.tril(-1)
    upper = C - lower + lower.mT  # C - W
    return X - Q @ upper, upper @ R


@_qr_fn.jvp
def _qr_jvp(A, dA, mode="reduced"):
    m, n = A.shape[-2:]
    _differentiable(mode, m, n)
    Q, R = _qr_fn(A, mode=mode)
    if m >= n:
        return _qr_tall_jvp(Q, R, dA)
    dQ, dU = _qr_tall_jvp(Q, R[..., :m], dA[..., :m])  # A = [X | Y], Y = Q V
    return dQ, torch.cat([dU, Q.mT @ (dA[..., m:] - dQ @ R[..., m:])], dim=-1)


@_qr_fn.vmap
def _qr_vmap(A, axis, mode="reduced"):
    return _qr_fn(A.movedim(axis, 0), mode=mode), (None if mode == "r" else 0, 0)


def qr(A: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, R) with A = Q R, as torch.linalg.qr, for A (..., m, n) float32 or float64: mode
    "reduced" (Q (..., m, k), R (..., k, n), k = min(m, n)), "complete" (Q (..., m, m), R
    (..., m, n)) or "r" (R only; Q empty). Householder reflectors as LAPACK makes them, so Q and R
    match LAPACK's and cuSOLVER's signs. Differentiable as torch's: mode "reduced", or "complete"
    with m <= n."""
    check_once(_check_qr, A, mode)
    return _qr_fn(A, mode=mode)


def cholesky_reference(A: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """The plain-torch reference: torch.linalg.cholesky in float64."""
    return torch.linalg.cholesky(A.double(), upper=upper)


def qr_reference(A: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """The plain-torch reference: torch.linalg.qr in float64."""
    return torch.linalg.qr(A.double(), mode=mode)
