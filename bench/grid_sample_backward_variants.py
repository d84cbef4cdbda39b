"""Where grid_sample's backward spends its time: variants of its kernels, timed at the seed's
size (x 8x1024x1024x64, grid 8x256x256x2, float32) on a CUDA GPU. Not a test, not the op.

    PYTHONPATH=src python3 bench/grid_sample_backward_variants.py

Each variant is the op's own kernel source with one change (text replaced here, asserted to
match once, so an edit of the op that breaks a variant fails loudly). Notes and the H100
figures: bench/notes/grid_sample_backward.md.
"""

import importlib
import sys

import torch

import kernelkit as kk
from kernelkit.benchmarks import cuda_median_ms

G = importlib.import_module("kernelkit.ops.grid_sample")
SCATTER_INPUTS = ["x", "cotangent", "slopes", "entries", "count", "tile_w", "chunk", "capacity"]


def replaced(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise RuntimeError(f"the op's kernel changed: {old!r} is not in it once")
    return source.replace(old, new)


def scatter_variant(name: str, source: str, header: str = G.HEADER):
    return kk.cuda_kernel(name=name, input_names=SCATTER_INPUTS, output_names=["x_grad", "grid_grad"],
                          source=source, header=header, shared_memory=G._TILE_BYTES,
                          compile_options=G._OPTIONS)


S = G.SCATTER_SOURCE
# the tile's count and first entry loaded, then no entries: the tile's zeros stored
ONE_LOAD = scatter_variant("gs_var_one_load", replaced(S, "const int total = min(count[bin], K);",
                                                        "const int total = 0 * count[bin];"))
# no loads at all: only the tile's zeros (through shared memory, with both barriers)
NO_LOADS = scatter_variant("gs_var_no_loads", replaced(replaced(
    S, "const int total = min(count[bin], K);", "const int total = 0;"),
    "gs_entry<A> e = slots[j < K ? j : 0];", "gs_entry<A> e;"))
# x_grad only: no reads of x, no parts of grid_grad
NO_PART = scatter_variant("gs_var_no_part",
                          replaced(S, "if (!NEAREST) gs_add_grid_part", "if (false) gs_add_grid_part"),
                          "#define GS_X_READS 0\n" + replaced(replaced(
                              G.HEADER, "if (!NEAREST) {\n                gs_ld<V>(xs + cx0",
                              "if (!NEAREST && GS_X_READS) {\n                gs_ld<V>(xs + cx0"),
                              "if (!NEAREST) {\n                gs_ld<V>(xs + cx1",
                              "if (!NEAREST && GS_X_READS) {\n                gs_ld<V>(xs + cx1"))
# grid_grad alone, per point (reads x's corners and the cotangent again, as the forward reads x)
GRID_GRAD = kk.cuda_kernel(name="gs_var_grid_grad", input_names=["x", "grid", "cotangent", "slopes"],
                           output_names=["grid_grad"], header=G.HEADER, compile_options=G._OPTIONS, source="""
    const int H = x_shape[1], W = x_shape[2], C = x_shape[3];
    const uint64_t n = slopes_shape[0];
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t p = tid / L;
    const int lane = int(tid % L);
    if (p >= n) return;
    A unused;
    const gs_bilinear<A> s(gs_source_index<0, false>(A(grid[2 * p]), W, unused),
                           gs_source_index<0, false>(A(grid[2 * p + 1]), H, unused));
    const T* xb = x + int64_t(unsigned(p) / unsigned(n / x_shape[0])) * H * W * C;
    A gix = A(0), giy = A(0);
    for (int c = lane * V; c < C; c += L * V) {
        A go[V], v[V];
        gs_ld<V>(cotangent + p * C + c, go);
        for (int k = 0; k < 4; ++k) {
            if (!s.in(k, H, W)) continue;
            gs_ld<V>(xb + (int64_t(s.py(k)) * W + s.px(k)) * C + c, v);
            for (int i = 0; i < V; ++i) { gix += v[i] * s.d_ix(k) * go[i]; giy += v[i] * s.d_iy(k) * go[i]; }
        }
    }
    for (int d = L / 2; d > 0; d /= 2) {
        gix += __shfl_xor_sync(0xffffffffu, gix, d);
        giy += __shfl_xor_sync(0xffffffffu, giy, d);
    }
    if (lane == 0) {
        grid_grad[2 * p] = T(slopes[2 * p] * gix);
        grid_grad[2 * p + 1] = T(slopes[2 * p + 1] * giy);
    }
""")
WRITE = kk.cuda_kernel(name="gs_var_write", input_names=["n"], output_names=["out"], source="""
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i * 4 < uint64_t(n[0])) reinterpret_cast<float4*>(out)[i] = make_float4(0, 0, 0, 0);
""")


def main(device="cuda", shape=(8, 1024, 1024, 64, 256, 256)):
    """Checks the variants against the op, then (on a GPU) times them."""
    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    x = torch.randn(B, H, W, C, device=device)
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    args = ("bilinear", "zeros", False)
    layout = G._layout(x.shape, x.dtype, grid.shape, args[0])
    tw, cq, k, bins = layout.tw, layout.cq, layout.capacity, layout.bins
    slopes, count, entries = G._binning(layout, x.shape, grid, *args)
    n = B * gH * gW
    v = G._vector(C, 4, x, cot)
    lanes = G._lanes(C // v, v * 4, x.device)
    template = G._template(x, *args, v, lanes)

    def scatter(kernel, extra=()):
        return kernel(inputs=[x, cot, slopes, entries, count, tw, cq, k],
                      template=template[:5] + list(extra), output_shapes=[x.shape, grid.shape],
                      output_dtypes=[x.dtype, torch.float32], grid=(bins * 128, 1, 1), threadgroup=(128, 1, 1),
                      init_value=[None, 0])

    def grid_grad():
        return GRID_GRAD(inputs=[x, grid, cot, slopes], template=template[:4], output_shapes=[grid.shape],
                         output_dtypes=[x.dtype], grid=(n * lanes, 1, 1), threadgroup=(256, 1, 1))[0]

    def with_spills(x_grad):  # the op's _spilled after a _scatter variant: the entries past the slots
        G._add_spilled(x, grid, cot, slopes, entries, count, x_grad, torch.zeros_like(grid), layout, template)
        return x_grad

    x_ref, g_ref = G._backward_checked(x, grid, cot, *args)  # the variants compute the same
    for out, ref in ((with_spills(scatter(NO_PART)[0]), x_ref), (grid_grad(), g_ref)):
        assert float((out - ref).norm() / ref.norm()) < 1e-5  # sums in another order
    binned = G._forward_checked(x, grid, *args, binning=True)[1:]
    if device == "cpu":
        return
    side = torch.cuda.Stream()

    def two_streams():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            grid_grad()
        scatter(NO_PART)
        torch.cuda.current_stream().wait_stream(side)

    rows = [
        ("forward", lambda: G._forward_checked(x, grid, *args)),
        ("forward, then the binning (_bin)", lambda: (G._forward_checked(x, grid, *args),
                                                       G._binning(layout, x.shape, grid, *args))),
        ("forward binning too (the op when a gradient is wanted)",
         lambda: G._forward_checked(x, grid, *args, binning=True)),
        ("backward, binning itself", lambda: G._backward_checked(x, grid, cot, *args)),
        ("backward given the forward's binning (the op)",
         lambda: G._backward_checked(x, grid, cot, *args, binned)),
        ("_scatter (the op's)", lambda: scatter(G._scatter)),
        ("_scatter, x_grad only", lambda: scatter(NO_PART)),
        ("grid_grad kernel alone", grid_grad),
        ("x_grad only + grid_grad kernel, two streams", two_streams),
        ("_scatter, tile count + first entry loaded, no entries", lambda: scatter(ONE_LOAD)),
        ("_scatter, no loads (zeros through shared memory)", lambda: scatter(NO_LOADS)),
        ("float4 zeros over x_grad's 2 GiB", lambda: WRITE(inputs=[x.numel()], output_shapes=[x.shape],
                                                          output_dtypes=[x.dtype], grid=(x.numel() // 4, 1, 1),
                                                          threadgroup=(256, 1, 1))),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, fn in rows:
        print(f"{name:<55} {cuda_median_ms(fn, 20):8.3f} ms", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (main('cpu', small shape) only checks the variants)")
    main()
