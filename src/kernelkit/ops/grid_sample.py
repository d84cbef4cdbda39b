"""grid_sample on NHWC data: the "Complex Example" of MLX's custom Metal kernel guide, grown
to torch.nn.functional.grid_sample's 2-D semantics.

First the seed: its forward and VJP kernel sources unchanged (grid_sample_seed_forward.metal,
grid_sample_seed_vjp.metal), and the Python around them (`grid_sample_seed`, `grid_sample_vjp`)
with torch tensors in place of mx arrays; tests and benchmarks use them. Then the full op,
`grid_sample`: every mode, padding and align_corners, float16/bfloat16/float32/float64,
differentiable through `kk.custom_function`, written with `kk.cuda_kernel` for speed (see "The
full op" below). Its kernels are files beside this one too, each opening with what it does:
grid_sample.cu (the header they share), grid_sample_sample.cu (the forward; with GS_BINNING
defined, the forward that also bins for the backward), grid_sample_scatter.cu and
grid_sample_spilled.cu (the backward by tiles), grid_sample_points.cu (the CPU's backward); the
binning kernel, a few lines, is BIN_SOURCE here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch

from .. import cuda_kernel, custom_function, metal_kernel
from ..arrays import aligned
from ..autodiff import kernel_backward, record_op
from ..preconditions import FLOATS, Preconditions, check_once


def _source(name: str) -> str:
    """A kernel body or header beside this module. Each file is exactly the text passed, so the
    line numbers that compile errors and check_bounds quote are the file's."""
    return Path(__file__).with_name(name).read_text()


# Seed 1 (mlx_custom_metal_kernels.txt), the fused forward kernel and the VJP kernel (atomic
# outputs, init_value=0, simd_sum), verbatim (less the opening newline and closing indent of the
# guide's Python strings).
# The forward reads the four corners of x before masking them: for samples near the border those
# reads fall outside x (see BENCHMARKS.md / the issue notes).
FORWARD_SOURCE = _source("grid_sample_seed_forward.metal")
VJP_SOURCE = _source("grid_sample_seed_vjp.metal")

_forward = metal_kernel(name="grid_sample", input_names=["x", "grid"], output_names=["out"],
                        source=FORWARD_SOURCE)
_vjp = metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                    output_names=["x_grad", "grid_grad"], source=VJP_SOURCE, atomic_outputs=True)


def grid_sample_seed(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The seed's forward: bilinear sampling of NHWC x at grid (B, gH, gW, 2) in [-1, 1];
    zeros outside, align_corners=False. (`grid_sample` below is the full op.)"""
    assert x.ndim == 4, "`x` must be 4D."
    assert grid.ndim == 4, "`grid` must be 4D."
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    out_shape = (B, gN, gM, C)
    assert D == 2, "Last dim of `grid` must be size 2."
    return _forward(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[out_shape],
                    output_dtypes=[x.dtype], grid=(math.prod(out_shape), 1, 1),
                    threadgroup=(256, 1, 1))[0]


def grid_sample_vjp(x: torch.Tensor, grid: torch.Tensor, cotangent: torch.Tensor):
    """(x_grad, grid_grad) of grid_sample for the given cotangent of its output."""
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    assert D == 2, "Last dim of `grid` must be size 2."
    # pad the output channels to simd group size so that our `simd_sum`s don't overlap.
    simdgroup_size = 32
    C_padded = (C + simdgroup_size - 1) // simdgroup_size * simdgroup_size
    grid_size = B * gN * gM * C_padded
    x_grad, grid_grad = _vjp(inputs=[x, grid, cotangent], template=[("T", x.dtype)],
                             output_shapes=[x.shape, grid.shape], output_dtypes=[x.dtype, x.dtype],
                             grid=(grid_size, 1, 1), threadgroup=(256, 1, 1), init_value=0)
    return x_grad, grid_grad


def grid_sample_reference(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.grid_sample on the NCHW view (bilinear, zeros, align_corners=False)."""
    out = torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, mode="bilinear",
                                          padding_mode="zeros", align_corners=False)
    return out.permute(0, 2, 3, 1)


# ---------------------------------------------------------------------------------------------
# The full op: torch.nn.functional.grid_sample's 2-D semantics on NHWC data, forward and VJP.
#
# Differences from the seed's kernels, and why:
# - every mode (bilinear, nearest), padding (zeros, border, reflection) and align_corners,
#   through PyTorch's own source-index function, so results match torch's; the settings are
#   template constants, so each kernel is specialised to its setting (no branch on them);
# - corners outside x are never read (the seed reads, then masks);
# - coordinates and sums in float32 (float64 for float64 data), whatever the storage dtype;
# - one thread per (output point, lane) with L lanes per point, each lane handling V
#   consecutive channels at a time (one access of 4 to 16 bytes: a float4 for float32 data
#   with C % 4 == 0) and looping over the channels lane * V, (lane + L) * V...: the coordinate
#   math is shared by a point's channels, and consecutive lanes touch consecutive channels
#   (on the CPU backend L is 1: a thread loops over the channels);
# - the backward writes every element of x_grad once, from shared memory, instead of
#   zero-filling x_grad and scattering into it with device atomics (which reads back from
#   memory every line the scatter touches: half a GiB more traffic at the seed's size); only
#   entries past a tile's slots (none, usually) are added afterwards with device atomics. The
#   points are binned by the tiles of x their corners fall in (a tile: TW consecutive pixels
#   of one row by CQ channels; a point reaches at most 2 rows x 2 tiles, its "entries"), and
#   one threadgroup per tile zeroes the tile in shared memory, adds its entries' contributions
#   there (shared-memory atomics: entries of a tile collide) and stores the tile; each entry's
#   part of its point's gradient in grid (summed over the entry's lanes by warp shuffles) is
#   added to grid_grad with device atomics. On the CPU backend the backward is per point instead
#   (_vjp_points, below): no barriers, no fibers.
#
# The backward, kernel by kernel (N points, `bins` tiles):
#   _bin      per point (a thread per entry): the derivatives of its source coordinates
#             (`slopes`), and its entries, each into a free slot of its tile (an atomic
#             increment of the tile's count gives the slot); a tile holds `capacity` slots,
#             sized for the tile's share of the points if they spread evenly, and entries past
#             them go to a spill list.
#             When grid_sample's caller will want a gradient, the forward's kernel does this
#             instead (_sample_bin: the point's lanes take its entries while its loads are in
#             flight) and hands it to the vjp as extra outputs.
#   _scatter  per tile (and chunk of channels): x_grad's tile, and its entries' parts of grid_grad
#   _spilled  the spill list's entries (none, usually), added to x_grad and grid_grad
# Every kernel after the binning reads the coordinates it stored, so they agree on every
# point's entries, bit for bit. Sums of atomics depend on their order: like torch's,
# grid_sample's backward is not bit-reproducible. (Measured ways there, and the ones that did
# not pay: bench/notes/grid_sample_backward.md.)
# The forward and the full op are cuda_kernel bodies (CUDA C++: vector loads through the
# read-only cache, warp shuffles, dynamic shared memory); they run on the CPU backend too.

# The full op's kernels (their files open with what each does; grid_sample.cu, with the header,
# says what they take as template constants).
HEADER = _source("grid_sample.cu")
SAMPLE_SOURCE = _source("grid_sample_sample.cu")
SCATTER_SOURCE = _source("grid_sample_scatter.cu")
SPILLED_SOURCE = _source("grid_sample_spilled.cu")
POINTS_SOURCE = _source("grid_sample_points.cu")
# The forward that also bins (_sample_bin) is grid_sample_sample.cu with GS_BINNING defined: a
# macro, as its lines use the inputs and outputs that _sample lacks; defined after the header's
# last line, so that the header's line numbers stay its file's.
_BINNING_HEADER = HEADER + "#define GS_BINNING 1\n"

# _bin: four threads per point, one per entry (see gs_bin_entry).
BIN_SOURCE = """
    const int H = height[0], W = width[0];
    const unsigned per_image = unsigned(grid_shape[1]) * unsigned(grid_shape[2]);
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t p = tid / 4;
    if (p >= uint64_t(grid_shape[0]) * per_image) return;
    const int64_t bins = int64_t(grid_shape[0]) * H * ((W + tile_w[0] - 1) / tile_w[0]);
    gs_bin_entry<NEAREST, PADDING, ALIGN>(grid, p, unsigned(p) / per_image, int(tid % 4), H, W, tile_w[0],
                                          capacity[0], bins, slopes, count, entries);
"""

# "relaxed" math: FMA contraction as nvcc compiles PyTorch's kernels, and IEEE division.
_OPTIONS = {"math_mode": "relaxed"}
# Shared memory of a _scatter threadgroup: its tile of x_grad, in A. (12 KiB and 128 threads: 16
# threadgroups, 2048 threads, on a multiprocessor; measured best on the H100.)
_TILE_BYTES = 12 * 1024
_sample = cuda_kernel(name="grid_sample_nhwc", input_names=["x", "grid"], output_names=["out"],
                      source=SAMPLE_SOURCE, header=HEADER, compile_options=_OPTIONS)
_sample_bin = cuda_kernel(name="grid_sample_nhwc_binning", input_names=["x", "grid", "tile_w", "capacity"],
                          output_names=["out", "slopes", "count", "entries"], source=SAMPLE_SOURCE,
                          header=_BINNING_HEADER, compile_options=_OPTIONS)
_bin = cuda_kernel(name="grid_sample_nhwc_bin", input_names=["grid", "height", "width", "tile_w", "capacity"],
                   output_names=["slopes", "count", "entries"], source=BIN_SOURCE, header=HEADER,
                   compile_options=_OPTIONS)
_scatter = cuda_kernel(name="grid_sample_nhwc_scatter",
                       input_names=["x", "cotangent", "slopes", "entries", "count", "tile_w", "chunk", "capacity"],
                       output_names=["x_grad", "grid_grad"], source=SCATTER_SOURCE, header=HEADER,
                       shared_memory=_TILE_BYTES, compile_options=_OPTIONS)
_spilled = cuda_kernel(name="grid_sample_nhwc_spilled",
                       input_names=["x", "grid", "cotangent", "slopes", "entries", "count", "x_grad", "grid_grad",
                                    "tile_w", "capacity"],
                       output_names=[], source=SPILLED_SOURCE, header=HEADER, compile_options=_OPTIONS)
_vjp_points = cuda_kernel(name="grid_sample_nhwc_vjp_points", input_names=["x", "grid", "cotangent"],
                          output_names=["x_grad", "grid_grad"], source=POINTS_SOURCE, header=HEADER,
                          compile_options=_OPTIONS)

MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")
_THREADS = 256          # threadgroup size of the kernels over points
_SCATTER_THREADS = 128  # _scatter's threadgroup (one tile)


def _vector(C: int, itemsize: int, *tensors) -> int:
    """Channels per access: the most (up to 16 bytes) that divide C and keep every tensor's
    accesses aligned."""
    for v in (8, 4, 2):
        size = v * itemsize
        if size <= 16 and C % v == 0 and all(aligned(t, size) for t in tensors):
            return v
    return 1


def _lanes(vectors: int, size: int, device: torch.device) -> int:
    """Lanes per point for `vectors` accesses of `size` bytes each: on a GPU a power of two up to
    32 (a warp), at least 32 bytes per access of the point's lanes (a memory sector) where there
    are enough, with the fewest idle lanes; on the CPU one (a CPU thread loops over the channels
    faster than the backend runs more threads: 3x for the forward at 64 channels)."""
    if device.type == "cpu":
        return 1
    cap = min(32, 1 << max(vectors - 1, 0).bit_length())
    floor_ = min(cap, max(1, 32 // size))
    options = [cl for cl in (32, 16, 8, 4, 2, 1) if floor_ <= cl <= cap]
    return min(options, key=lambda cl: (-(-vectors // cl) * cl, -cl))


def _per_point(device: torch.device) -> bool:
    """Whether the backward runs per point (_vjp_points, on the CPU) rather than per tile."""
    return device.type == "cpu"


def _template(x, mode, padding_mode, align_corners, v, lanes):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return [("T", x.dtype), ("A", acc), ("V", v), ("L", lanes), ("NEAREST", mode == "nearest"),
            ("PADDING", PADDING_MODES.index(padding_mode)), ("ALIGN", align_corners)]


def _check(x, grid, mode, padding_mode, align_corners) -> Preconditions:
    pre = Preconditions("grid_sample")
    pre.tensor("x", x, dtype=FLOATS, shape=("B", "H", "W", "C"))
    pre.tensor("grid", grid, dtype="x", shape=("B", "gH", "gW", 2))
    pre.choice("mode", mode, MODES)
    pre.choice("padding_mode", padding_mode, PADDING_MODES)
    pre.flag("align_corners", align_corners)
    if (pre["H"] == 0 or pre["W"] == 0) and pre["B"] * pre["gH"] * pre["gW"] * pre["C"]:
        pre.fail(f"x has shape {tuple(x.shape)}; expected non-empty spatial dims (H, W) for a "
                 "non-empty output.")
    return pre


def _threads(points: int, lanes: int) -> int:
    if points * lanes >= 2**32:
        raise ValueError(f"grid_sample: {points} grid points x {lanes} lanes exceed the 2**32 "
                         "threads of one launch; split the batch.")
    return points * lanes


def grid_sample_forward(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """grid_sample's output, not differentiable (the kernel alone); arguments as grid_sample."""
    _check(x, grid, mode, padding_mode, align_corners)
    return _forward_checked(x, grid, mode, padding_mode, align_corners)


def _forward_checked(x, grid, mode, padding_mode, align_corners, binning=False):
    """The output; with binning, (out, slopes, count, entries): the backward's binning too (see
    _binning), done by the forward's kernel."""
    B, gH, gW, _ = grid.shape
    C = x.shape[3]
    out_shape = (B, gH, gW, C)
    if math.prod(out_shape) == 0:
        out = x.new_empty(out_shape)
        return (out, *(x.new_empty(0) for _ in range(3))) if binning else out
    x = x.contiguous()  # (the kernel would copy it anyway) the data whose alignment counts
    v = _vector(C, x.element_size(), x)  # the output is a fresh allocation: aligned
    lanes = _lanes(C // v, v * x.element_size(), x.device)
    template = _template(x, mode, padding_mode, align_corners, v, lanes)
    threads = (_threads(B * gH * gW, lanes), 1, 1)
    if not binning:
        return _sample(inputs=[x, grid], template=template, output_shapes=[out_shape], output_dtypes=[x.dtype],
                       grid=threads, threadgroup=(_THREADS, 1, 1))[0]
    layout = _layout(x.shape, x.dtype, grid.shape, mode)
    return tuple(_sample_bin(inputs=[x, grid, layout.tw, layout.capacity], template=template,
                             output_shapes=[out_shape, *layout.shapes], output_dtypes=[x.dtype, *layout.dtypes],
                             grid=threads, threadgroup=(_THREADS, 1, 1), init_value=[None, None, 0, None]))


def grid_sample_backward(x, grid, cotangent, mode="bilinear", padding_mode="zeros",
                         align_corners=False):
    """(x_grad, grid_grad) of grid_sample for the cotangent of its output (B, gH, gW, C)."""
    pre = _check(x, grid, mode, padding_mode, align_corners)
    pre.tensor("cotangent", cotangent, shape=("B", "gH", "gW", "C"), same_device=False)  # (moved)
    return _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners)


def _tiling(W: int, C: int, acc_size: int, v: int) -> tuple[int, int]:
    """(TW, CQ): a _scatter tile is TW pixels of a row by CQ channels of x, within _TILE_BYTES."""
    elems = _TILE_BYTES // acc_size
    if C <= elems:
        return min(W, elems // C), C
    return 1, elems // v * v


def _capacity(n: int, bins: int, tw: int, nearest: bool) -> int:
    """Entry slots per tile: a tile's expected entries if the points spread evenly over x, and
    four standard deviations of that count (Poisson's); a fuller tile spills the rest."""
    mean = n * (1 if nearest else 2 * (1 + 1 / tw)) / bins
    return math.ceil(mean + 4 * math.sqrt(mean)) + 1


class _Layout(NamedTuple):
    """The backward's tiles for x of one shape and dtype and a grid of one shape."""
    tw: int        # pixels of a row in a tile
    cq: int        # channels in a tile
    bins: int      # tiles
    capacity: int  # entry slots per tile
    shapes: list   # of the binning's outputs: slopes, count, entries
    dtypes: list


def _layout(x_shape, dtype, grid_shape, mode) -> _Layout:
    B, H, W, C = x_shape
    n = B * grid_shape[1] * grid_shape[2]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    # the tiles' channels: a multiple of the widest access, hence of the one the backward takes
    itemsize = dtype.itemsize
    tw, cq = _tiling(W, C, 8 if acc == torch.float64 else 4, max(1, 16 // itemsize))
    bins, chunks = B * H * -(-W // tw), -(-C // cq)
    if 4 * n >= 2**31 or 2 * bins >= 2**31 or bins * chunks * _SCATTER_THREADS >= 2**32:
        raise ValueError(f"grid_sample: the backward of {n} grid points on x of shape {tuple(x_shape)} "
                         "exceeds one launch; split the batch.")
    k = _capacity(n, bins, tw, mode == "nearest")
    return _Layout(tw, cq, bins, k, [(n, 2), (bins + 1,), (bins * k + 4 * n, 4)],
                   [acc, torch.int32, acc])


def _binning(layout, x_shape, grid, mode, padding_mode, align_corners):
    """The backward's first half, which needs no cotangent (nor x's data), for x of this shape
    (its _layout) and grid (a non-empty output): (slopes, count, entries). slopes (N, 2): per
    point the derivatives of its source coordinates; entries: the points' entries in their
    tiles' slots, then the spill list; count: see gs_bin_entry."""
    settings = [("A", layout.dtypes[0]), ("NEAREST", mode == "nearest"),
                ("PADDING", PADDING_MODES.index(padding_mode)), ("ALIGN", align_corners)]
    n = layout.shapes[0][0]
    return tuple(_bin(inputs=[grid, x_shape[1], x_shape[2], layout.tw, layout.capacity], template=settings,
                      output_shapes=layout.shapes, output_dtypes=layout.dtypes, grid=(_threads(n, 4), 1, 1),
                      threadgroup=(_THREADS, 1, 1), init_value=[None, 0, None]))


def _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners, binned=None):
    """binned: the forward's (slopes, count, entries), or None (the binning is done here)."""
    B, H, W, C = x.shape
    _, gH, gW, _ = grid.shape
    out_shape = (B, gH, gW, C)
    if math.prod(out_shape) == 0:
        return torch.zeros_like(x), torch.zeros_like(grid)
    x, grid = x.contiguous(), grid.contiguous()
    cotangent = cotangent.to(device=x.device, dtype=x.dtype).contiguous()
    v = _vector(C, x.element_size(), x, cotangent)
    template = _template(x, mode, padding_mode, align_corners, v, _lanes(C // v, v * x.element_size(), x.device))
    n = B * gH * gW
    if _per_point(x.device):
        x_grad, grid_grad = _vjp_points(inputs=[x, grid, cotangent], template=template[:3] + template[4:],
                                        output_shapes=[x.shape, grid.shape], output_dtypes=[template[1][1], x.dtype],
                                        grid=(_threads(n, 1), 1, 1), threadgroup=(_THREADS, 1, 1),
                                        init_value=[0, None])
        return x_grad.to(x.dtype), grid_grad
    layout = _layout(x.shape, x.dtype, grid.shape, mode)
    slopes, count, entries = binned or _binning(layout, x.shape, grid, mode, padding_mode, align_corners)
    chunks = -(-C // layout.cq)
    # (nearest: the output is piecewise constant in grid, torch's grid_grad is zero, as left)
    acc = layout.dtypes[0]
    x_grad, grid_grad = _scatter(inputs=[x, cotangent, slopes, entries, count, layout.tw, layout.cq, layout.capacity],
                                 template=template[:5], output_shapes=[x.shape, grid.shape],
                                 output_dtypes=[x.dtype, acc], grid=(layout.bins * chunks * _SCATTER_THREADS, 1, 1),
                                 threadgroup=(_SCATTER_THREADS, 1, 1), init_value=[None, 0])
    _add_spilled(x, grid, cotangent, slopes, entries, count, x_grad, grid_grad, layout, template)
    return x_grad, grid_grad.to(x.dtype)


def _add_spilled(x, grid, cotangent, slopes, entries, count, x_grad, grid_grad, layout, template):
    """_spilled: the spill list's contributions added into _scatter's x_grad and grid_grad."""
    n = layout.shapes[0][0]
    threads = min(4 * n * template[3][1], _THREADS * 1024)  # L lanes an entry, striding over the list
    _spilled(inputs=[x, grid, cotangent, slopes, entries, count, x_grad, grid_grad, layout.tw, layout.capacity],
             template=template[:5], output_shapes=[], output_dtypes=[], grid=(threads, 1, 1),
             threadgroup=(_THREADS, 1, 1))


# The settings are keyword arguments: custom_function passes them to the rules as constants.
# (grid_sample checked the arguments.) With binning, the forward also returns the backward's
# binning, (slopes, count, entries), as outputs that the vjp reads (MLX's way to hand a vjp what
# the forward computed); their cotangents are zero views, which cost nothing.
@custom_function
def _grid_sample(x, grid, *, mode, padding_mode, align_corners, binning):
    return _forward_checked(x, grid, mode, padding_mode, align_corners, binning)


@kernel_backward
def _op_gradients(x, grid, *tensors, mode, padding_mode, align_corners, binning):
    """(x's gradient, grid's): the backward of both roads (autodiff.record_op's, and the vjp's).
    tensors: the outputs, then their cotangents (the binning's are zeros)."""
    binned, cotangent = (tuple(tensors[1:4]), tensors[4]) if binning else (None, tensors[1])
    return _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners, binned)


@_grid_sample.vjp
def _grid_sample_vjp(primals, cotangents, outputs, **settings):
    if not settings["binning"]:  # one output: MLX hands it, and its cotangent, as they are
        outputs, cotangents = (outputs,), (cotangents,)
    return _op_gradients(*primals, *outputs, *cotangents, **settings)


def grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: bool = False) -> torch.Tensor:
    """torch.nn.functional.grid_sample (2-D) on NHWC data: samples x (B, H, W, C) at grid
    (B, gH, gW, 2) of (x, y) in [-1, 1] into (B, gH, gW, C). mode "bilinear" | "nearest",
    padding_mode "zeros" | "border" | "reflection". Differentiable in x and grid (for "nearest",
    grid's gradient is zero, as torch's). float16/bfloat16 compute in float32. On a GPU the
    backward adds up with atomics: as torch's CUDA backward, its results can differ in the last
    bits from call to call."""
    check_once(_check, x, grid, mode, padding_mode, align_corners)
    # when a gradient will be wanted, the forward's kernel bins the points for the backward too
    binning = torch.is_grad_enabled() and (x.requires_grad or grid.requires_grad) and not _per_point(x.device)
    settings = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners, "binning": binning}
    out = record_op(_grid_sample, (x, grid), settings, _op_gradients)
    return out[0] if binning else out


def grid_sample_torch(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """The plain-torch reference: torch.nn.functional.grid_sample on the NCHW view of x."""
    out = torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, mode=mode,
                                          padding_mode=padding_mode, align_corners=align_corners)
    return out.permute(0, 2, 3, 1)
