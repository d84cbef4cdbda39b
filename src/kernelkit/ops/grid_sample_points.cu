// grid_sample's backward on the CPU (_vjp_points): one thread per point adds its contributions to
// x_grad with atomics (x_grad zero-filled, in A: float16/bfloat16 data converts it after) and
// sums its grid gradient itself. No barriers: the CPU backend runs it as plain loops (the tile
// backward, _scatter, needs fibers there, and its threadgroups cost more than its atomics save
// on two cores).
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
