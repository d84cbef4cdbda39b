// grid_sample's backward by tiles (_scatter): one threadgroup per (tile, chunk of channels), its
// tile of x_grad in shared memory: zeroed, the entries' contributions added (shared-memory
// atomics: entries of a tile collide), then stored; each entry's part of its point's gradient in
// grid is added to grid_grad (device atomics: a point has up to four entries; x_grad's sums
// depend on the order of the shared-memory atomics anyway). A round of the entry loop gives each
// group of L lanes one entry; every lane runs the same rounds (the bounds are the threadgroup's),
// so that a warp's lanes meet at the shuffles. Entries past a tile's slots are _spilled's.
// (Written for few registers: this kernel's speed follows how many threads fit on a
// multiprocessor; at 32 registers a thread, all 2048 do.)
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
