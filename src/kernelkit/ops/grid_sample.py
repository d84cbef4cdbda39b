"""grid_sample on NHWC data: the "Complex Example" of MLX's custom Metal kernel guide, grown
to torch.nn.functional.grid_sample's 2-D semantics.

First the seed: its forward and VJP kernel sources unchanged, and the Python around them
(`grid_sample_seed`, `grid_sample_vjp`) with torch tensors in place of mx arrays; tests and
benchmarks use them. Then the full op, `grid_sample`: every mode, padding and align_corners,
float16/bfloat16/float32/float64, differentiable through `kk.custom_function`, written with
`kk.cuda_kernel` for speed (see "The full op" below).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import cuda_kernel, custom_function, metal_kernel
from ..arrays import aligned
from ..preconditions import FLOATS, Preconditions

# Seed 1 (mlx_custom_metal_kernels.txt), the fused forward kernel, verbatim.
# It reads the four corners of x before masking them: for samples near the
# border those reads fall outside x (see BENCHMARKS.md / the issue notes).
FORWARD_SOURCE = """
        uint elem = thread_position_in_grid.x;
        int H = x_shape[1];
        int W = x_shape[2];
        int C = x_shape[3];
        int gH = grid_shape[1];
        int gW = grid_shape[2];

        int w_stride = C;
        int h_stride = W * w_stride;
        int b_stride = H * h_stride;

        uint grid_idx = elem / C * 2;
        float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
        float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;

        int ix_nw = floor(ix);
        int iy_nw = floor(iy);

        int ix_ne = ix_nw + 1;
        int iy_ne = iy_nw;

        int ix_sw = ix_nw;
        int iy_sw = iy_nw + 1;

        int ix_se = ix_nw + 1;
        int iy_se = iy_nw + 1;

        T nw = (ix_se - ix)    * (iy_se - iy);
        T ne = (ix    - ix_sw) * (iy_sw - iy);
        T sw = (ix_ne - ix)    * (iy    - iy_ne);
        T se = (ix    - ix_nw) * (iy    - iy_nw);

        int batch_idx = elem / C / gH / gW * b_stride;
        int channel_idx = elem % C;
        int base_idx = batch_idx + channel_idx;

        T I_nw = x[base_idx + iy_nw * h_stride + ix_nw * w_stride];
        T I_ne = x[base_idx + iy_ne * h_stride + ix_ne * w_stride];
        T I_sw = x[base_idx + iy_sw * h_stride + ix_sw * w_stride];
        T I_se = x[base_idx + iy_se * h_stride + ix_se * w_stride];

        I_nw = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1 ? I_nw : 0;
        I_ne = iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1 ? I_ne : 0;
        I_sw = iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1 ? I_sw : 0;
        I_se = iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1 ? I_se : 0;

        out[elem] = nw * I_nw + ne * I_ne + sw * I_sw + se * I_se;
    """

# Seed 1, the VJP kernel (atomic outputs, init_value=0, simd_sum), verbatim.
VJP_SOURCE = """
        uint elem = thread_position_in_grid.x;
        int H = x_shape[1];
        int W = x_shape[2];
        int C = x_shape[3];
        // Pad C to the nearest larger simdgroup size multiple
        int C_padded = ceildiv(C, threads_per_simdgroup) * threads_per_simdgroup;

        int gH = grid_shape[1];
        int gW = grid_shape[2];

        int w_stride = C;
        int h_stride = W * w_stride;
        int b_stride = H * h_stride;

        uint grid_idx = elem / C_padded * 2;
        float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
        float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;

        int ix_nw = floor(ix);
        int iy_nw = floor(iy);

        int ix_ne = ix_nw + 1;
        int iy_ne = iy_nw;

        int ix_sw = ix_nw;
        int iy_sw = iy_nw + 1;

        int ix_se = ix_nw + 1;
        int iy_se = iy_nw + 1;

        T nw = (ix_se - ix)    * (iy_se - iy);
        T ne = (ix    - ix_sw) * (iy_sw - iy);
        T sw = (ix_ne - ix)    * (iy    - iy_ne);
        T se = (ix    - ix_nw) * (iy    - iy_nw);

        int batch_idx = elem / C_padded / gH / gW * b_stride;
        int channel_idx = elem % C_padded;
        int base_idx = batch_idx + channel_idx;

        T gix = T(0);
        T giy = T(0);
        if (channel_idx < C) {
            int cot_index = elem / C_padded * C + channel_idx;
            T cot = cotangent[cot_index];
            if (iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1) {
                int offset = base_idx + iy_nw * h_stride + ix_nw * w_stride;
                atomic_fetch_add_explicit(&x_grad[offset], nw * cot, memory_order_relaxed);

                T I_nw = x[offset];
                gix -= I_nw * (iy_se - iy) * cot;
                giy -= I_nw * (ix_se - ix) * cot;
            }
            if (iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1) {
                int offset = base_idx + iy_ne * h_stride + ix_ne * w_stride;
                atomic_fetch_add_explicit(&x_grad[offset], ne * cot, memory_order_relaxed);

                T I_ne = x[offset];
                gix += I_ne * (iy_sw - iy) * cot;
                giy -= I_ne * (ix - ix_sw) * cot;
            }
            if (iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1) {
                int offset = base_idx + iy_sw * h_stride + ix_sw * w_stride;
                atomic_fetch_add_explicit(&x_grad[offset], sw * cot, memory_order_relaxed);

                T I_sw = x[offset];
                gix -= I_sw * (iy - iy_ne) * cot;
                giy += I_sw * (ix_ne - ix) * cot;
            }
            if (iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1) {
                int offset = base_idx + iy_se * h_stride + ix_se * w_stride;
                atomic_fetch_add_explicit(&x_grad[offset], se * cot, memory_order_relaxed);

                T I_se = x[offset];
                gix += I_se * (iy - iy_nw) * cot;
                giy += I_se * (ix - ix_nw) * cot;
            }
        }

        T gix_mult = W / 2;
        T giy_mult = H / 2;

        // Reduce across each simdgroup first.
        // This is much faster than relying purely on atomics.
        gix = simd_sum(gix);
        giy = simd_sum(giy);

        if (thread_index_in_simdgroup == 0) {
            atomic_fetch_add_explicit(&grid_grad[grid_idx], gix * gix_mult, memory_order_relaxed);
            atomic_fetch_add_explicit(&grid_grad[grid_idx + 1], giy * giy_mult, memory_order_relaxed);
        }
    """

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

# PyTorch's grid_sampler_compute_source_index_set_grad (aten/src/ATen/native/GridSampler.h),
# step for step, in the compute type A, specialised to the padding (0 zeros, 1 border,
# 2 reflection) and align_corners; `grad` receives d(source index) / d(grid coordinate). Then
# the tiles a point reaches, and vector accesses: gs_ld / gs_st move V consecutive elements
# (V * sizeof(T) bytes, at most 16, aligned to that) as one access, converting to / from A.
HEADER = """
template <typename A>
A gs_clip(A in, int size, A& grad) {
    // clip_coordinates_set_grad: the borders count as outside for the gradient
    if (in <= A(0)) { grad = A(0); return A(0); }
    A hi = A(size - 1);
    if (in >= hi) { grad = A(0); return hi; }
    grad = A(1);
    return in;
}

template <typename A>
A gs_reflect(A in, int twice_low, int twice_high, A& grad) {
    // reflect_coordinates_set_grad
    if (twice_low == twice_high) { grad = A(0); return A(0); }
    A low = A(twice_low) / 2;
    A span = A(twice_high - twice_low) / 2;
    in = in - low;
    A sign = A(1);
    if (in < A(0)) { sign = A(-1); in = -in; }
    A extra = fmod(in, span);
    // PyTorch takes int(floor(in / span)) % 2; the parity computed in A stays defined when the
    // quotient does not fit an int
    bool odd = fmod(floor(in / span), A(2)) != A(0);
    grad = odd ? -sign : sign;
    return odd ? span - extra + low : extra + low;
}

template <int PADDING, bool ALIGN, typename A>
A gs_source_index(A coord, int size, A& grad) {
    if (ALIGN) {
        grad = A(size - 1) / 2;
        coord = (coord + 1) / 2 * A(size - 1);
    } else {
        grad = A(size) / 2;
        coord = ((coord + 1) * A(size) - 1) / 2;
    }
    A g_clip, g_refl;
    if (PADDING == 1) {
        coord = gs_clip(coord, size, g_clip);
        grad *= g_clip;
    } else if (PADDING == 2) {
        coord = ALIGN ? gs_reflect(coord, 0, 2 * (size - 1), g_refl)
                      : gs_reflect(coord, -1, 2 * size - 1, g_refl);
        coord = gs_clip(coord, size, g_clip);
        grad *= g_refl * g_clip;
    }
    // CUDA's safe_downgrade_to_int_range (with 2^30 for INT_MAX, which float rounds up): far-off
    // and non-finite coordinates (NaN fails both tests) become -100, outside the image, so
    // that converting them to int stays defined.
    if (!(coord > A(-1073741824) && coord < A(1073741824))) coord = A(-100);
    return coord;
}

// Bilinear sampling at (ix, iy): corner k (0 nw, 1 ne, 2 sw, 3 se) is pixel (px(k), py(k)), with
// PyTorch's weight and its terms of the gradient in ix and iy (d_ix, d_iy: the weight's
// derivatives). A struct of six numbers, so that a kernel loops over corners in few registers.
template <typename A>
struct gs_bilinear {
    int x0, y0;
    A ax, bx, ay, by;  // x0 + 1 - ix, ix - x0, y0 + 1 - iy, iy - y0
    gs_bilinear(A ix, A iy) : x0(int(floor(ix))), y0(int(floor(iy))) {
        ax = A(x0 + 1) - ix;
        bx = ix - A(x0);
        ay = A(y0 + 1) - iy;
        by = iy - A(y0);
    }
    int px(int k) const { return x0 + (k & 1); }
    int py(int k) const { return y0 + (k >> 1); }
    A wx(int k) const { return k & 1 ? bx : ax; }
    A wy(int k) const { return k & 2 ? by : ay; }
    A weight(int k) const { return wx(k) * wy(k); }
    A d_ix(int k) const { return k & 1 ? wy(k) : -wy(k); }
    A d_iy(int k) const { return k & 2 ? wx(k) : -wx(k); }
    bool in(int k, int H, int W) const {
        return px(k) >= 0 && px(k) < W && py(k) >= 0 && py(k) < H;
    }
};

// The rows [y_lo, y_hi] and columns [x_lo, x_hi] of x that a point's corners reach (lo > hi:
// none): bilinear floor(i) and floor(i) + 1, nearest rint(i) (halfway cases to even, as torch).
template <bool NEAREST, typename A>
void gs_reach(A ix, A iy, int H, int W, int& y_lo, int& y_hi, int& x_lo, int& x_hi) {
    int x0, y0, x1, y1;
    if (NEAREST) {
        x0 = x1 = int(rint(ix));
        y0 = y1 = int(rint(iy));
    } else {
        x0 = int(floor(ix));
        y0 = int(floor(iy));
        x1 = x0 + 1;
        y1 = y0 + 1;
    }
    x_lo = x0 < 0 ? 0 : x0;
    x_hi = x1 > W - 1 ? W - 1 : x1;
    y_lo = y0 < 0 ? 0 : y0;
    y_hi = y1 > H - 1 ? H - 1 : y1;
}

// A point's entries: the tiles of x (one row by tw columns) its corners reach, at most 2 x 2,
// row-major. Returns how many; entry k is in row y_lo + k / nt and tile t_lo + k % nt, with
// nt = t_hi - t_lo + 1: its bin is gs_bin(...).
template <bool NEAREST, typename A>
int gs_entries(A ix, A iy, int H, int W, int tw, int& y_lo, int& t_lo, int& t_hi) {
    int y_hi, x_lo, x_hi;
    gs_reach<NEAREST>(ix, iy, H, W, y_lo, y_hi, x_lo, x_hi);
    if (x_lo > x_hi || y_lo > y_hi) return 0;
    t_lo = x_lo / tw;
    t_hi = x_hi / tw;
    return (y_hi - y_lo + 1) * (t_hi - t_lo + 1);
}

inline int gs_bin(unsigned b, int H, int tiles, int y_lo, int t_lo, int t_hi, int k) {
    const int nt = t_hi - t_lo + 1;
    return (int(b) * H + y_lo + k / nt) * tiles + t_lo + k % nt;
}

// One entry as _bin stores it for _scatter: one aligned load.
template <typename A> struct alignas(4 * sizeof(A)) gs_entry { A ix, iy; int p, k; };

template <int BYTES> struct gs_bits;
template <> struct gs_bits<2> { typedef unsigned short type; };
template <> struct gs_bits<4> { typedef unsigned int type; };
template <> struct gs_bits<8> { typedef uint2 type; };
template <> struct gs_bits<16> { typedef uint4 type; };
struct alignas(32) gs_bits32 { uint4 lo, hi; };
template <> struct gs_bits<32> { typedef gs_bits32 type; };  // stores of 8 floats (a tile of A)
template <typename T, int V> struct alignas(sizeof(T) * V) gs_vec { T v[V]; };

// V elements at p into out[0..V), through the read-only data cache (the data is not written
// while the kernel runs); STREAM: first out of the caches (data read once).
template <int V, bool STREAM = false, typename T, typename A>
void gs_ld(const T* p, A* out) {
    typedef typename gs_bits<sizeof(T) * V>::type B;
    const B bits = STREAM ? __ldcs(reinterpret_cast<const B*>(p)) : __ldg(reinterpret_cast<const B*>(p));
    gs_vec<T, V> r;
    memcpy(&r, &bits, sizeof(r));
    for (int i = 0; i < V; ++i) out[i] = A(r.v[i]);
}

// v[0..V) rounded to T into p; STREAM: first out of the caches (data not read again soon).
template <int V, bool STREAM = false, typename T, typename A>
void gs_st(T* p, const A* v) {
    typedef typename gs_bits<sizeof(T) * V>::type B;
    gs_vec<T, V> r;
    for (int i = 0; i < V; ++i) r.v[i] = T(v[i]);
    B bits;
    memcpy(&bits, &r, sizeof(bits));
    if constexpr (STREAM) {
        __stcs(reinterpret_cast<B*>(p), bits);
    } else {
        *reinterpret_cast<B*>(p) = bits;
    }
}

// The binning, one entry at a time: point p's entry k (none when the point has k entries or
// fewer) into a free slot of its tile (an atomic increment of the tile's count gives the slot),
// or onto the spill list. Entry 0 also stores the point's slopes: d(ix)/d(grid x),
// d(iy)/d(grid y). count (bins + 1): each tile's entries (spilled ones too), then the spilled
// entries; entries: K slots per tile, then the spill list.
template <bool NEAREST, int PADDING, bool ALIGN, typename G, typename A>
void gs_bin_entry(const G* grid, uint64_t p, unsigned b, int k, int H, int W, int tw, int K,
                  int64_t bins, A* slopes, int* count, A* entries) {
    A gmx, gmy;
    const A ix = gs_source_index<PADDING, ALIGN>(A(grid[2 * p]), W, gmx);
    const A iy = gs_source_index<PADDING, ALIGN>(A(grid[2 * p + 1]), H, gmy);
    if (k == 0) {
        const A m[2] = {gmx, gmy};
        gs_st<2>(slopes + 2 * p, m);
    }
    int y_lo, t_lo, t_hi;
    if (k >= gs_entries<NEAREST>(ix, iy, H, W, tw, y_lo, t_lo, t_hi)) return;
    const int bin = gs_bin(b, H, (W + tw - 1) / tw, y_lo, t_lo, t_hi, k);
    const int r = atomicAdd(&count[bin], 1);
    gs_entry<A> e;
    e.ix = ix;
    e.iy = iy;
    e.p = int(p);
    gs_entry<A>* out = reinterpret_cast<gs_entry<A>*>(entries);
    e.k = k;
    out[r < K ? int64_t(bin) * K + r : bins * K + atomicAdd(&count[bins], 1)] = e;
}

// dst[0..V) += w * v[0..V), atomically: one 16-byte atomic for four float32 in global memory
// (GLOBAL: 16-byte aligned) where the GPU has it (sm_90), else one per element.
template <bool GLOBAL, int V, typename D, typename A>
void gs_atomic_add(D* dst, A w, const A* v) {
    for (int i = 0; i < V; ++i) atomicAdd(&dst[i], D(w * v[i]));
}
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <bool GLOBAL, int V, typename A>
void gs_atomic_add(float* dst, A w, const A* v) {
    if constexpr (GLOBAL && V == 4) {
        atomicAdd(reinterpret_cast<float4*>(dst), float4{float(w * v[0]), float(w * v[1]), float(w * v[2]),
                                                         float(w * v[3])});
    } else {
        for (int i = 0; i < V; ++i) atomicAdd(&dst[i], float(w * v[i]));
    }
}
#endif

// An entry's share of the backward, by its L lanes (`lane`: this thread's): for its point's
// corners in row `row` of x and columns [x_lo, x_lo + ncol), channels [0, nc) of the point's
// cotangent row `cot`, it adds weight x cotangent to dst (column col and channel c at
// dst[col * ld + c]; GLOBAL: dst is in global memory) and, bilinear, sums this lane's terms of
// the point's gradient in its source coordinates (gix, giy: before the slopes), reading x's
// corners at xs (x at column x_lo of the row). has: whether there is an entry (else e is a
// stand-in and nothing is done).
template <bool NEAREST, bool GLOBAL, int V, int L, typename T, typename A, typename D>
void gs_scatter_entry(const gs_entry<A>& e, bool has, int row, int x_lo, int ncol, int nc, int lane,
                      const T* cot, const T* xs, int C, D* dst, int ld, A& gix, A& giy) {
    // the corners (at most two): column from x_lo (-1: none), weight for dst (w) and for the
    // gradient in ix (dx) and iy (dy), as PyTorch's
    int cx0 = -1, cx1 = -1;
    A w0 = A(0), w1 = A(0), dx0 = A(0), dx1 = A(0), dy0 = A(0), dy1 = A(0);
    if (NEAREST) {
        const int xn = int(rint(e.ix)) - x_lo;
        if (xn >= 0 && xn < ncol) { cx0 = xn; w0 = A(1); }
    } else {
        const gs_bilinear<A> s(e.ix, e.iy);
        const int k = 2 * (row - s.y0);  // the point's corners in this row: k, k + 1
        if (s.px(k) - x_lo >= 0 && s.px(k) - x_lo < ncol) {
            cx0 = s.px(k) - x_lo; w0 = s.weight(k); dx0 = s.d_ix(k); dy0 = s.d_iy(k);
        }
        if (s.px(k + 1) - x_lo >= 0 && s.px(k + 1) - x_lo < ncol) {
            cx1 = s.px(k + 1) - x_lo; w1 = s.weight(k + 1); dx1 = s.d_ix(k + 1); dy1 = s.d_iy(k + 1);
        }
    }
    for (int c = lane * V; has && c < nc; c += L * V) {
        A go[V], v[V];
        gs_ld<V>(cot + c, go);
        if (cx0 >= 0) {
            gs_atomic_add<GLOBAL, V>(dst + cx0 * ld + c, w0, go);
            if (!NEAREST) {
                gs_ld<V>(xs + cx0 * C + c, v);
                for (int i = 0; i < V; ++i) { gix += v[i] * dx0 * go[i]; giy += v[i] * dy0 * go[i]; }
            }
        }
        if (cx1 >= 0) {
            gs_atomic_add<GLOBAL, V>(dst + cx1 * ld + c, w1, go);
            if (!NEAREST) {
                gs_ld<V>(xs + cx1 * C + c, v);
                for (int i = 0; i < V; ++i) { gix += v[i] * dx1 * go[i]; giy += v[i] * dy1 * go[i]; }
            }
        }
    }
}

// An entry's part of its point's gradient in grid, added to grid_grad (bilinear): the lanes'
// terms summed (a butterfly: an entry's L lanes are L consecutive lanes of one warp, and every
// lane of the warp calls this) times the point's slopes.
template <int L, typename A>
void gs_add_grid_part(A* grid_grad, int p, bool has, int lane, const A* slope, A gix, A giy) {
    for (int d = L / 2; d > 0; d /= 2) {
        gix += __shfl_xor_sync(0xffffffffu, gix, d);
        giy += __shfl_xor_sync(0xffffffffu, giy, d);
    }
    if (has && lane == 0) {
        atomicAdd(&grid_grad[2 * int64_t(p)], slope[0] * gix);
        atomicAdd(&grid_grad[2 * int64_t(p) + 1], slope[1] * giy);
    }
}
"""

# Every kernel below takes its settings as template constants: T (x's dtype), A (compute dtype),
# V (channels per access), L (lanes per point), NEAREST, PADDING, ALIGN. The grid has fewer than
# 2**32 points (checked), so a point's index fits 32 bits where it is divided.
_SAMPLE = """
    const int H = x_shape[1], W = x_shape[2], C = x_shape[3];
    const unsigned per_image = unsigned(grid_shape[1]) * unsigned(grid_shape[2]);
    const uint64_t n = uint64_t(grid_shape[0]) * per_image;
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t p = tid / L;
    const int lane = int(tid % L);
    if (p >= n) return;
    const unsigned b = unsigned(p) / per_image;
    A unused;
    const A ix = gs_source_index<PADDING, ALIGN>(A(grid[2 * p]), W, unused);
    const A iy = gs_source_index<PADDING, ALIGN>(A(grid[2 * p + 1]), H, unused);
    const T* xb = x + int64_t(b) * H * W * C;  // image b
    T* o = out + p * C;
""" + "{binning}" + """    if (NEAREST) {
        const int xn = int(rint(ix));
        const int yn = int(rint(iy));
        const bool in = xn >= 0 && xn < W && yn >= 0 && yn < H;
        const T* src = xb + (int64_t(yn) * W + xn) * C;
        for (int c = lane * V; c < C; c += L * V) {
            A v[V];
            if (in) {
                gs_ld<V>(src + c, v);
            } else {
                for (int i = 0; i < V; ++i) v[i] = A(0);
            }
            gs_st<V>(o + c, v);
        }
        return;
    }
    const gs_bilinear<A> s(ix, iy);  // PyTorch's weights and order of terms
    for (int c = lane * V; c < C; c += L * V) {
        A v[V], t[V];
        for (int i = 0; i < V; ++i) v[i] = A(0);
        for (int k = 0; k < 4; ++k) {
            if (!s.in(k, H, W)) continue;
            gs_ld<V>(xb + (int64_t(s.py(k)) * W + s.px(k)) * C + c, t);
            for (int i = 0; i < V; ++i) v[i] += t[i] * s.weight(k);
        }
        gs_st<V>(o + c, v);
    }
"""
SAMPLE_SOURCE = _SAMPLE.replace("{binning}", "")
# The forward that also bins (when a gradient will be wanted): the point's lanes take its entries,
# so the binning's atomics overlap the forward's loads.
SAMPLE_BIN_SOURCE = _SAMPLE.replace("{binning}", """    const int64_t bins = int64_t(grid_shape[0]) * H * ((W + tile_w[0] - 1) / tile_w[0]);
    for (int k = lane; k < 4; k += L)
        gs_bin_entry<NEAREST, PADDING, ALIGN>(grid, p, b, k, H, W, tile_w[0], capacity[0], bins, slopes,
                                              count, entries);
""")

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

# _spilled: the spill list's entries, after _scatter: their contributions added to _scatter's
# x_grad and grid_grad with device atomics (threads striding over the list: usually empty, its
# length known on the GPU only). kernelkit's kernels allocate their outputs, so this one adds
# into two of its inputs (not const: _scatter's fresh outputs). A round gives each group of L
# lanes an entry; a warp's lanes run the same rounds. (float16/bfloat16: these adds round to the
# storage dtype each, as torch's CUDA backward does for every point; the tiles sum in float32.)
SPILLED_SOURCE = """
    T* xg = const_cast<T*>(x_grad);
    A* gg = const_cast<A*>(grid_grad);
    const int H = x_shape[1], W = x_shape[2], C = x_shape[3];
    const unsigned per_image = unsigned(grid_shape[1]) * unsigned(grid_shape[2]);
    const int tw = tile_w[0], tiles = (W + tw - 1) / tw;
    const int64_t bins = int64_t(grid_shape[0]) * H * tiles;
    const int total = count[bins];
    const gs_entry<A>* list = reinterpret_cast<const gs_entry<A>*>(entries) + bins * capacity[0];
    const int tid = blockIdx.x * blockDim.x + threadIdx.x, lane = tid % L;
    const int stride = gridDim.x * blockDim.x / L;
    for (int i = tid / L; i - (threadIdx.x % 32) / L < total; i += stride) {  // (the warp's first group)
        const bool has = i < total;
        gs_entry<A> e = list[has ? i : 0];
        if (!has) { e.ix = A(0); e.iy = A(0); e.p = 0; e.k = 0; }  // a harmless stand-in
        int y_lo, t_lo, t_hi;
        gs_entries<NEAREST>(e.ix, e.iy, H, W, tw, y_lo, t_lo, t_hi);
        const int nt = t_hi - t_lo + 1;  // the point's tiles in a row
        const int row = y_lo + e.k / nt, x_lo = (t_lo + e.k % nt) * tw;
        const int64_t at = ((int64_t(unsigned(e.p) / per_image) * H + row) * W + x_lo) * C;
        A slope[2] = {A(0), A(0)};
        if (!NEAREST && has) gs_ld<2>(slopes + 2 * int64_t(e.p), slope);
        A gix = A(0), giy = A(0);
        gs_scatter_entry<NEAREST, true, V, L>(e, has, row, x_lo, min(W - x_lo, tw), C, lane,
                                              cotangent + int64_t(e.p) * C, x + at, C, xg + at, C, gix, giy);
        if (!NEAREST) gs_add_grid_part<L>(gg, e.p, has, lane, slope, gix, giy);
    }
"""

# _scatter: one threadgroup per (tile, chunk of channels), its tile of x_grad in shared memory:
# zeroed, the entries' contributions added (shared-memory atomics: entries of a tile collide),
# then stored; each entry's part of its point's gradient in grid is added to grid_grad (device
# atomics: a point has up to four entries; x_grad's sums depend on the order of the shared-memory
# atomics anyway). A round of the entry loop gives each group of L lanes one entry; every lane
# runs the same rounds (the bounds are the threadgroup's), so that a warp's lanes meet at the
# shuffles. Entries past a tile's slots are _spilled's.
# (Written for few registers: this kernel's speed follows how many threads fit on a
# multiprocessor; at 32 registers a thread, all 2048 do.)
SCATTER_SOURCE = """
    extern __shared__ float4 gs_shared[];
    A* tile = reinterpret_cast<A*>(gs_shared);  // element (column px, channel c) at px * nc + c
    const int H = x_shape[1], W = x_shape[2], C = x_shape[3];
    const int tw = tile_w[0], cq = chunk[0];
    const unsigned tiles = (W + tw - 1) / tw, chunks = (C + cq - 1) / cq;
    const unsigned bin = blockIdx.x / chunks;
    const int q = blockIdx.x % chunks;
    const int row = bin / tiles % H;
    const int x_lo = bin % tiles * tw, ncol = min(W - x_lo, tw);
    const int c_lo = q * cq, nc = min(C - c_lo, cq);  // a multiple of V
    const int n = ncol * nc;
    const unsigned b = bin / tiles / H;
    const int nt = blockDim.x, tid = threadIdx.x, lane = tid % L, group = tid / L, groups = nt / L;
    for (int i = tid * V; i < n; i += nt * V)
        for (int k = 0; k < V; ++k) tile[i + k] = A(0);
    __syncthreads();
    const int64_t origin = ((int64_t(b) * H + row) * W + x_lo) * C + c_lo;  // the tile in x, x_grad
    const int K = capacity[0];
    const int total = min(count[bin], K);
    const gs_entry<A>* slots = reinterpret_cast<const gs_entry<A>*>(entries) + int64_t(bin) * K;
    // A round per `groups` entries; the first runs before the tile's count is known (even for an
    // empty tile), so that its entry's load overlaps the count's (a slot past the count holds
    // garbage, not used).
    int j0 = 0;
    do {
        const int j = j0 + group;
        const bool has = j < total;
        gs_entry<A> e = slots[j < K ? j : 0];
        if (!has) { e.ix = A(x_lo); e.iy = A(row); e.p = 0; e.k = 0; }  // a harmless stand-in
        A slope[2] = {A(0), A(0)};
        if (!NEAREST && has) gs_ld<2>(slopes + 2 * int64_t(e.p), slope);
        A gix = A(0), giy = A(0);
        gs_scatter_entry<NEAREST, false, V, L>(e, has, row, x_lo, ncol, nc, lane, cotangent + int64_t(e.p) * C + c_lo,
                                               x + origin, C, tile, nc, gix, giy);
        if (!NEAREST) gs_add_grid_part<L>(grid_grad, e.p, has, lane, slope, gix, giy);
        j0 += groups;
    } while (j0 < total);
    __syncthreads();
    T* dst = x_grad + origin;
    if (nc == C) {  // the tile is contiguous in x_grad
        for (int i = tid * V; i < n; i += nt * V) gs_st<V>(dst + i, tile + i);
    } else {
        for (int i = tid * V; i < n; i += nt * V) gs_st<V>(dst + i / nc * C + i % nc, tile + i);
    }
"""

# _vjp_points, the CPU's backward: one thread per point adds its contributions to x_grad with
# atomics (x_grad zero-filled, in A: float16/bfloat16 data converts it after) and sums its grid
# gradient itself. No barriers: the CPU backend runs it as plain loops (the tile backward above
# needs fibers there, and its threadgroups cost more than its atomics save on two cores).
POINTS_SOURCE = """
    const int H = x_shape[1], W = x_shape[2], C = x_shape[3];
    const unsigned per_image = unsigned(grid_shape[1]) * unsigned(grid_shape[2]);
    const uint64_t p = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= uint64_t(grid_shape[0]) * per_image) return;
    A gmx, gmy;
    const A ix = gs_source_index<PADDING, ALIGN>(A(grid[2 * p]), W, gmx);
    const A iy = gs_source_index<PADDING, ALIGN>(A(grid[2 * p + 1]), H, gmy);
    const int64_t image = int64_t(unsigned(p) / per_image) * H * W * C;
    const T* g = cotangent + p * C;
    if (NEAREST) {  // grid's gradient is zero
        const int xn = int(rint(ix)), yn = int(rint(iy));
        if (xn >= 0 && xn < W && yn >= 0 && yn < H) {
            A* dst = x_grad + image + (int64_t(yn) * W + xn) * C;
            for (int c = 0; c < C; c += V) {
                A go[V];
                gs_ld<V>(g + c, go);
                for (int i = 0; i < V; ++i) atomicAdd(&dst[c + i], go[i]);
            }
        }
        grid_grad[2 * p] = T(0);
        grid_grad[2 * p + 1] = T(0);
        return;
    }
    const gs_bilinear<A> s(ix, iy);
    A gix = A(0), giy = A(0);
    for (int c = 0; c < C; c += V) {
        A go[V], v[V];
        gs_ld<V>(g + c, go);
        for (int k = 0; k < 4; ++k) {
            if (!s.in(k, H, W)) continue;
            const int64_t at = image + (int64_t(s.py(k)) * W + s.px(k)) * C + c;
            for (int i = 0; i < V; ++i) atomicAdd(&x_grad[at + i], s.weight(k) * go[i]);
            gs_ld<V>(x + at, v);
            for (int i = 0; i < V; ++i) { gix += v[i] * s.d_ix(k) * go[i]; giy += v[i] * s.d_iy(k) * go[i]; }
        }
    }
    grid_grad[2 * p] = T(gmx * gix);
    grid_grad[2 * p + 1] = T(gmy * giy);
"""

# "relaxed" math: FMA contraction as nvcc compiles PyTorch's kernels, and IEEE division.
_OPTIONS = {"math_mode": "relaxed"}
# Shared memory of a _scatter threadgroup: its tile of x_grad, in A. (12 KiB and 128 threads: 16
# threadgroups, 2048 threads, on a multiprocessor; measured best on the H100.)
_TILE_BYTES = 12 * 1024
_sample = cuda_kernel(name="grid_sample_nhwc", input_names=["x", "grid"], output_names=["out"],
                      source=SAMPLE_SOURCE, header=HEADER, compile_options=_OPTIONS)
_sample_bin = cuda_kernel(name="grid_sample_nhwc_binning", input_names=["x", "grid", "tile_w", "capacity"],
                          output_names=["out", "slopes", "count", "entries"], source=SAMPLE_BIN_SOURCE,
                          header=HEADER, compile_options=_OPTIONS)
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


@_grid_sample.vjp
def _grid_sample_vjp(primals, cotangents, outputs, *, mode, padding_mode, align_corners, binning):
    x, grid = primals
    cotangent = cotangents[0] if binning else cotangents
    return _backward_checked(x, grid, cotangent, mode, padding_mode, align_corners,
                             tuple(outputs[1:]) if binning else None)


def grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: bool = False) -> torch.Tensor:
    """torch.nn.functional.grid_sample (2-D) on NHWC data: samples x (B, H, W, C) at grid
    (B, gH, gW, 2) of (x, y) in [-1, 1] into (B, gH, gW, C). mode "bilinear" | "nearest",
    padding_mode "zeros" | "border" | "reflection". Differentiable in x and grid (for "nearest",
    grid's gradient is zero, as torch's). float16/bfloat16 compute in float32. On a GPU the
    backward adds up with atomics: as torch's CUDA backward, its results can differ in the last
    bits from call to call."""
    _check(x, grid, mode, padding_mode, align_corners)
    # when a gradient will be wanted, the forward's kernel bins the points for the backward too
    binning = torch.is_grad_enabled() and (x.requires_grad or grid.requires_grad) and not _per_point(x.device)
    out = _grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners,
                       binning=binning)
    return out[0] if binning else out


def grid_sample_torch(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """The plain-torch reference: torch.nn.functional.grid_sample on the NCHW view of x."""
    out = torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, mode=mode,
                                          padding_mode=padding_mode, align_corners=align_corners)
    return out.permute(0, 2, 3, 1)
