// grid_sample's forward (_sample): a thread per (output point, lane), L lanes a point, each lane
// taking V consecutive channels at a time (channels lane * V, (lane + L) * V...), so that the
// point's coordinate math is shared by its channels and consecutive lanes touch consecutive
// channels. Bilinear sums PyTorch's terms in its order; corners outside x are never read.
// With GS_BINNING defined (_sample_bin, when a gradient will be wanted) it bins the point for the
// backward too: its lanes take its entries (gs_bin_entry) while its loads are in flight. A macro,
// not a template constant, as the binning's inputs and outputs are _sample_bin's alone.
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
#ifdef GS_BINNING
const int64_t bins = int64_t(grid_shape[0]) * H * ((W + tile_w[0] - 1) / tile_w[0]);
for (int k = lane; k < 4; k += L)
    gs_bin_entry<NEAREST, PADDING, ALIGN>(grid, p, b, k, H, W, tile_w[0], capacity[0], bins, slopes,
                                          count, entries);
#endif
if (NEAREST) {
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
