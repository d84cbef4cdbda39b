// What grid_sample's kernels share: the forward (grid_sample_sample.cu), the backward's binning
// (BIN_SOURCE in grid_sample.py), its tiles (grid_sample_scatter.cu) and spill list
// (grid_sample_spilled.cu), and the CPU's backward (grid_sample_points.cu). Each kernel takes its
// settings as template constants: T (x's dtype), A (compute dtype), V (channels per access), L
// (lanes per point), NEAREST, PADDING, ALIGN. The grid has fewer than 2**32 points (checked), so
// a point's index fits 32 bits where it is divided.
//
// PyTorch's grid_sampler_compute_source_index_set_grad (aten/src/ATen/native/GridSampler.h),
// step for step, in the compute type A, specialised to the padding (0 zeros, 1 border,
// 2 reflection) and align_corners; `grad` receives d(source index) / d(grid coordinate). Then
// the tiles a point reaches, and vector accesses: gs_ld / gs_st move V consecutive elements
// (V * sizeof(T) bytes, at most 16, aligned to that) as one access, converting to / from A.

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
