// grid_sample's backward, last (_spilled): the spill list's entries, after _scatter: their
// contributions added to _scatter's x_grad and grid_grad with device atomics (threads striding
// over the list: usually empty, its length known on the GPU only). kernelkit's kernels allocate
// their outputs, so this one adds into two of its inputs (not const: _scatter's fresh outputs).
// A round gives each group of L lanes an entry; a warp's lanes run the same rounds.
// (float16/bfloat16: these adds round to the storage dtype each, as torch's CUDA backward does
// for every point; the tiles sum in float32.)
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
