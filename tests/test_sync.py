"""Threads that synchronise (issue 3): barriers, SIMD-group functions and atomics in whole
algorithms, on every backend, with exact expected results from a Python model (integer data,
so the CPU and the GPU give the same bits), SIMD-group functions in divergent code with the
GPU's active lanes (issue 14); and, on the CPU backend, the kernels that can never complete
(impossible barriers) stopped with a clear error instead of a hang.
"""

import threading
import time

import pytest
import torch

import kernelkit as kk


def launch(kernel, device, inputs, shapes, dtypes, grid, group, **kw):
    return kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                  threadgroup=group, stream=device, **kw)


def chunks(values, size):
    return [values[i:i + size] for i in range(0, len(values), size)]


# ---------------------------------------------------------------------------------------------
# Reductions and scans through threadgroup memory and SIMD-group functions

TREE_REDUCE = """
    uint tid = thread_index_in_threadgroup;
    uint n = threads_per_threadgroup.x;
    threadgroup int buf[256];
    buf[tid] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (tid < s && tid + s < n) buf[tid] += buf[tid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) out[threadgroup_position_in_grid.x] = buf[0];
"""


def test_threadgroup_tree_reduction(device):
    k = kk.metal_kernel(name="tree_reduce", input_names=["inp"], output_names=["out"], source=TREE_REDUCE)
    n = 256 * 300 + 77  # a partial last group
    x = torch.randint(-1000, 1001, (n,), dtype=torch.int32, device=device)
    out = launch(k, device, [x], [(-(-n // 256),)], [torch.int32], (n, 1, 1), (256, 1, 1))[0]
    assert out.cpu().tolist() == [sum(c) for c in chunks(x.cpu().tolist(), 256)]


BLOCK_SCAN = """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    uint nsg = simdgroups_per_threadgroup;
    threadgroup int totals[32];
    int v = inp[i];
    int x = simd_prefix_exclusive_sum(v);     // scan within the SIMD-group
    int total = simd_sum(v);
    if (simd_is_first()) totals[sg] = total;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {                             // scan of the SIMD-groups' totals
        int t = lane < nsg ? totals[lane] : 0;
        int offset = simd_prefix_exclusive_sum(t);
        int all = simd_sum(t);
        if (lane < nsg) totals[lane] = offset;
        if (lane == 0) block_sums[threadgroup_position_in_grid.x] = all;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = x + totals[sg];
"""
ADD_OFFSETS = """
    uint i = thread_position_in_grid.x;
    out[i] = part[i] + offsets[i / BLOCK];
"""


def test_simd_prefix_scan_large_array(device):
    scan = kk.metal_kernel(name="block_scan", input_names=["inp"], output_names=["out", "block_sums"],
                           source=BLOCK_SCAN)
    add = kk.metal_kernel(name="add_offsets", input_names=["part", "offsets"], output_names=["out"],
                          source=ADD_OFFSETS)
    B = 1024
    n = 1_000_003  # 977 blocks, the last one partial (611 threads: 19 SIMD-groups and 3 lanes)
    blocks = -(-n // B)
    x = torch.randint(0, 100, (n,), dtype=torch.int32, device=device)
    part, sums = launch(scan, device, [x], [(n,), (blocks,)], [torch.int32] * 2, (n, 1, 1), (B, 1, 1))
    offsets, total = launch(scan, device, [sums], [(blocks,), (1,)], [torch.int32] * 2,
                            (blocks, 1, 1), (B, 1, 1))
    out = launch(add, device, [part, offsets], [(n,)], [torch.int32], (n, 1, 1), (256, 1, 1),
                 template=[("BLOCK", B)])[0]
    xc = x.cpu().long()
    assert torch.equal(sums.cpu().long(), torch.stack([c.sum() for c in xc.split(B)]))
    assert total.item() == xc.sum().item()
    assert torch.equal(out.cpu().long(), torch.cumsum(xc, 0) - xc)


BUTTERFLY = """
    uint i = thread_position_in_grid.x;
    int v = inp[i];
    int s = v, m = v, t = v;
    for (uint d = 16; d > 0; d >>= 1) {
        s += simd_shuffle_xor(s, d);
        m = max(m, simd_shuffle_xor(m, d));
        t += simd_shuffle_down(t, d);
    }
    sum_all[i] = s;
    max_all[i] = m;
    if (thread_index_in_simdgroup == 0) tree[i / 32] = t;
"""


def test_simd_shuffle_xor_butterfly(device):
    k = kk.metal_kernel(name="butterfly", input_names=["inp"], output_names=["sum_all", "max_all", "tree"],
                        source=BUTTERFLY)
    n = 32 * 2000
    x = torch.randint(-10**6, 10**6, (n,), dtype=torch.int32, device=device)
    s, m, t = launch(k, device, [x], [(n,), (n,), (n // 32,)], [torch.int32] * 3, (n, 1, 1), (256, 1, 1))
    warps = chunks(x.cpu().tolist(), 32)
    assert s.cpu().tolist() == [sum(w) for w in warps for _ in w]   # every lane has the total
    assert m.cpu().tolist() == [max(w) for w in warps for _ in w]
    assert t.cpu().tolist() == [sum(w) for w in warps]              # lane 0 of the shuffle-down tree


BALLOT = """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    int v = inp[i];
    bool keep = v % 3 == 0;
    uint64_t bits = static_cast<uint64_t>(simd_ballot(keep));
    uint below = popcount(uint(bits) & ((1u << lane) - 1u));   // rank among the kept lanes
    uint count = popcount(uint(bits));
    uint slot = (threadgroup_position_in_grid.x * dispatch_simdgroups_per_threadgroup
                 + simdgroup_index_in_threadgroup) * 32;
    if (keep) compact[slot + below] = v;   // stream compaction within each SIMD-group
    ballots[i] = int64_t(bits);
    counts[i] = count;
"""


def test_simd_ballot_stream_compaction(device):
    k = kk.metal_kernel(name="ballot_compact", input_names=["inp"],
                        output_names=["compact", "ballots", "counts"], source=BALLOT)
    G = 128
    n = G * 40 + 45  # the last group has one full SIMD-group and a partial one of 13 lanes
    groups = -(-n // G)
    x = torch.randint(0, 1000, (n,), dtype=torch.int32, device=device)
    compact, ballots, counts = launch(k, device, [x], [(groups * G,), (n,), (n,)],
                                      [torch.int32, torch.int64, torch.int32], (n, 1, 1), (G, 1, 1),
                                      init_value=-1)
    vals = x.cpu().tolist()
    ref_compact, ref_ballots, ref_counts = [-1] * (groups * G), [], []
    for w0 in range(0, n, 32):  # G is a multiple of 32: SIMD-groups are aligned 32-thread chunks
        w = vals[w0:w0 + 32]
        kept = [v for v in w if v % 3 == 0]
        ref_compact[w0:w0 + len(kept)] = kept
        bits = sum(1 << lane for lane, v in enumerate(w) if v % 3 == 0)
        ref_ballots += [bits] * len(w)
        ref_counts += [len(kept)] * len(w)
    assert compact.cpu().tolist() == ref_compact
    assert ballots.cpu().tolist() == ref_ballots
    assert counts.cpu().tolist() == ref_counts


# ---------------------------------------------------------------------------------------------
# Contended atomics: many threadgroups in parallel on 16 counters

HISTOGRAM = """
    uint i = thread_position_in_grid.x;
    atomic_fetch_add_explicit(&hist[inp[i]], 1, memory_order_relaxed);
"""
HISTOGRAM_PRIVATE = """
    uint tid = thread_index_in_threadgroup;
    threadgroup atomic_uint local[16];
    if (tid < 16) atomic_store_explicit(&local[tid], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint k = thread_position_in_grid.x; k < uint(n); k += threads_per_grid.x) {
        atomic_fetch_add_explicit(&local[inp[k]], 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid < 16) {
        atomic_fetch_add_explicit(&hist[tid], atomic_load_explicit(&local[tid], memory_order_relaxed),
                                  memory_order_relaxed);
    }
"""


def test_contended_atomic_histogram(device):
    n = 4 * 1024 * 1024
    x = torch.randint(0, 16, (n,), dtype=torch.int32, device=device)
    x[: n // 4] = 5  # a hot bin: a quarter of all the adds hit one counter
    ref = torch.bincount(x.cpu().long(), minlength=16)

    direct = kk.metal_kernel(name="histogram", input_names=["inp"], output_names=["hist"],
                             source=HISTOGRAM, atomic_outputs=True)
    hist = launch(direct, device, [x], [(16,)], [torch.int32], (n, 1, 1), (256, 1, 1), init_value=0)[0]
    assert torch.equal(hist.cpu().long(), ref)

    private = kk.metal_kernel(name="histogram_private", input_names=["inp", "n"], output_names=["hist"],
                              source=HISTOGRAM_PRIVATE, atomic_outputs=True)
    hist = launch(private, device, [x, n], [(16,)], [torch.uint32], (256 * 64, 1, 1), (256, 1, 1),
                  init_value=0)[0]
    assert torch.equal(hist.cpu().long(), ref)


# ---------------------------------------------------------------------------------------------
# Early return before a barrier, partial edge groups in 2-D

EDGE_2D = """
    uint2 p = thread_position_in_grid.xy;
    uint2 t = thread_position_in_threadgroup.xy;
    uint2 size = threads_per_threadgroup.xy;        // smaller in the edge groups
    uint2 g0 = threadgroup_position_in_grid.xy * dispatch_threads_per_threadgroup.xy;
    uint W = threads_per_grid.x;
    uint idx = p.y * W + p.x;
    threadgroup int tile[8][8];
    if (mask[idx] == 0) {        // these threads leave before the barriers
        out[idx] = -1;
        return;
    }
    tile[t.y][t.x] = inp[idx];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint rx = (t.x + 1) % size.x, dy = (t.y + 1) % size.y;
    int right = mask[(g0.y + t.y) * W + g0.x + rx] ? tile[t.y][rx] : 0;
    int down = mask[(g0.y + dy) * W + g0.x + t.x] ? tile[dy][t.x] : 0;
    int r = tile[t.y][t.x] + 10 * right + 100 * down;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    tile[t.y][t.x] = r;          // a second phase over the same memory
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int left = mask[(g0.y + t.y) * W + g0.x + (t.x + size.x - 1) % size.x]
                   ? tile[t.y][(t.x + size.x - 1) % size.x] : 0;
    out[idx] = r + 1000 * left;
"""


def test_early_return_and_partial_groups_2d(device):
    k = kk.metal_kernel(name="edge_2d", input_names=["inp", "mask"], output_names=["out"], source=EDGE_2D)
    W, H, T = 37, 29, 8  # neither a multiple of the 8x8 threadgroup
    x = torch.randint(0, 10, (H, W), dtype=torch.int32, device=device)
    mask = (torch.rand(H, W, device=device) > 0.3).int()
    out = launch(k, device, [x, mask], [(H, W)], [torch.int32], (W, H, 1), (T, T, 1))[0]
    xs, ms = x.cpu().tolist(), mask.cpu().tolist()
    ref = [[-1] * W for _ in range(H)]

    def phase1(y, xx, gx, gy, sx, sy):
        tx, ty = xx - gx, y - gy
        rx, dy = gx + (tx + 1) % sx, gy + (ty + 1) % sy
        right = xs[y][rx] if ms[y][rx] else 0
        down = xs[dy][xx] if ms[dy][xx] else 0
        return xs[y][xx] + 10 * right + 100 * down

    for y in range(H):
        for xx in range(W):
            if not ms[y][xx]:
                continue
            gx, gy = xx - xx % T, y - y % T
            sx, sy = min(T, W - gx), min(T, H - gy)
            lx = gx + (xx - gx + sx - 1) % sx
            left = phase1(y, lx, gx, gy, sx, sy) if ms[y][lx] else 0
            ref[y][xx] = phase1(y, xx, gx, gy, sx, sy) + 1000 * left
    assert out.cpu().tolist() == ref


def test_early_return_whole_simdgroups_and_barrier(device):
    # Whole SIMD-groups and single threads leave; the rest meet at barriers and SIMD functions.
    body = """
    uint i = thread_position_in_grid.x;
    uint tid = thread_index_in_threadgroup;
    uint sg = simdgroup_index_in_threadgroup;
    threadgroup int partial[8];
    if (sg == 1 || (sg == 2 && thread_index_in_simdgroup % 5 == 0)) { out[i] = -1; return; }
    int s = simd_sum(inp[i]);
    if (simd_is_first()) partial[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int total = 0;
    for (uint k = 0; k < simdgroups_per_threadgroup; ++k) {
        if (k != 1) total += partial[k];
    }
    out[i] = total;
"""
    k = kk.metal_kernel(name="early_simd", input_names=["inp"], output_names=["out"], source=body)
    G, n = 128, 128 * 20 + 70  # the last group: SIMD-groups of 32, 32 and 6 lanes
    x = torch.randint(-100, 101, (n,), dtype=torch.int32, device=device)
    out = launch(k, device, [x], [(n,)], [torch.int32], (n, 1, 1), (G, 1, 1))[0]
    xs, ref = x.cpu().tolist(), []
    for g0 in range(0, n, G):
        size = min(G, n - g0)

        def stays(t):
            return not (t // 32 == 1 or (t // 32 == 2 and t % 32 % 5 == 0))

        total = sum(xs[g0 + t] for t in range(size) if stays(t))
        ref += [total if stays(t) else -1 for t in range(size)]
    assert out.cpu().tolist() == ref


# ---------------------------------------------------------------------------------------------
# SIMD-group functions in divergent code (issue 14): the lanes that reach a call are its active
# lanes, whatever the others do (wait at a barrier, run the other side of a branch). Only results
# that a GPU defines are checked (a shuffle from an inactive lane is not).

DIVERGENT_SIMD = """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    uint sg = simdgroup_index_in_threadgroup;
    int v = inp[i];
    int a = -1, b = -1, c = -1, d = -1, e = -1;
    if (sg == 0 && lane < 8) {   // a scan step of 8 lanes; lanes 8-31 and SIMD-group 1 wait below
        a = simd_shuffle_up(v, 1);
        b = simd_prefix_exclusive_sum(v);
        c = simd_sum(v);
        d = quad_sum(v);
        e = quad_shuffle_xor(v, 1);
    } else if (sg == 1) {        // both sides of a branch, each with its own lanes
        if (lane < 16) {
            a = simd_sum(v);
            b = simd_prefix_inclusive_sum(v);
            c = simd_max(v);
        } else {
            a = simd_min(v);
            b = int(uint64_t(simd_ballot(v > 0)) >> 16);
            c = simd_broadcast_first(v);
            d = simd_is_first() ? 1 : 0;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[5 * i] = a;
    out[5 * i + 1] = b;
    out[5 * i + 2] = c;
    out[5 * i + 3] = d;
    out[5 * i + 4] = e;
"""


def divergent_simd_reference(xs):
    out = []
    for g0 in range(0, len(xs), 64):
        w0, w1 = xs[g0:g0 + 32], xs[g0 + 32:g0 + 64]
        for lane in range(32):
            v = w0[lane]
            if lane < 8:
                q = lane & ~3
                out += [w0[lane - 1] if lane else v, sum(w0[:lane]), sum(w0[:8]),
                        sum(w0[q:q + 4]), w0[lane ^ 1]]
            else:
                out += [-1] * 5
        lo, hi = w1[:16], w1[16:]
        for lane in range(32):
            if lane < 16:
                out += [sum(lo), sum(lo[:lane + 1]), max(lo), -1, -1]
            else:
                ballot = sum(1 << k for k, x in enumerate(hi) if x > 0)
                out += [min(hi), ballot, hi[0], int(lane == 16), -1]
    return out


def test_simd_functions_in_divergent_code_beside_a_barrier(device):
    k = kk.metal_kernel(name="divergent_simd", input_names=["inp"], output_names=["out"],
                        source=DIVERGENT_SIMD)
    n = 64 * 37
    x = torch.randint(-50, 51, (n,), dtype=torch.int32, device=device)
    out = launch(k, device, [x], [(5 * n,)], [torch.int32], (n, 1, 1), (64, 1, 1))[0]
    assert out.cpu().tolist() == divergent_simd_reference(x.cpu().tolist())


DIVERGENT_SHFL = """
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int i = blockIdx.x * blockDim.x + tid;
    __shared__ int seen[64];
    int v = inp[i];
    int up = -1, x = -1, b = -1;
    if (warp == 0 && lane < 8) {   // lanes 8-31 and warp 1 are at __syncthreads
        up = __shfl_up_sync(0xffu, v, 1);
        x = v + __shfl_xor_sync(0xffu, v, 4);
        b = int(__ballot_sync(0xffu, v > 0));
    }
    seen[tid] = v;
    __syncthreads();
    out[4 * i] = up;
    out[4 * i + 1] = x;
    out[4 * i + 2] = b;
    out[4 * i + 3] = seen[63 - tid];
"""


def test_cuda_partial_mask_shuffles_beside_syncthreads(device):
    k = kk.cuda_kernel(name="divergent_shfl", input_names=["inp"], output_names=["out"],
                       source=DIVERGENT_SHFL)
    n = 64 * 21
    x = torch.randint(-50, 51, (n,), dtype=torch.int32, device=device)
    out = launch(k, device, [x], [(4 * n,)], [torch.int32], (n, 1, 1), (64, 1, 1))[0]
    xs, ref = x.cpu().tolist(), []
    for g0 in range(0, n, 64):
        w = xs[g0:g0 + 8]
        ballot = sum(1 << k for k, v in enumerate(w) if v > 0)
        for t in range(64):
            v = xs[g0 + t]
            if t < 8:
                ref += [w[t - 1] if t else v, v + w[t ^ 4], ballot]
            else:
                ref += [-1, -1, -1]
            ref.append(xs[g0 + 63 - t])
    assert out.cpu().tolist() == ref


# ---------------------------------------------------------------------------------------------
# CPU only: kernels that can never complete raise KernelLaunchError, quickly, and the runtime
# stays usable afterwards.

DEADLOCKS = {
    # threads 0..31 wait at one barrier, threads 32..63 at another
    "two_barriers": ("""
    uint tid = thread_index_in_threadgroup;
    if (!bad || tid < 32) {
        threadgroup_barrier(mem_flags::mem_threadgroup);   // site
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);   // site
    }
    out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];
""", ["threadgroup_barrier", "cannot complete"]),
    # half of a SIMD-group leaves a loop of SIMD-group functions for a barrier, the other half
    # goes on to another barrier
    "simd_loop_then_two_barriers": ("""
    uint lane = thread_index_in_simdgroup;
    int v = inp[thread_position_in_grid.x];
    for (uint k = 0; k < (lane & 3u); ++k) v = simd_sum(v) & 1023;
    if (!bad || lane < 16) {
        threadgroup_barrier(mem_flags::mem_threadgroup);   // site
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);   // site
    }
    out[thread_position_in_grid.x] = v;
""", ["threadgroup_barrier", "cannot complete"]),
}


def _launch_with_deadline(fn, seconds=20.0):
    """Runs fn() in a thread: a hang fails the test instead of stopping the whole run."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(seconds)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive(), f"the launch hung for more than {seconds} s"
    return result, elapsed


@pytest.mark.parametrize("case", list(DEADLOCKS))
def test_cpu_impossible_synchronisation_raises(case):
    body, words = DEADLOCKS[case]
    name = f"deadlock_{case}"
    k = kk.metal_kernel(name=name, input_names=["inp", "bad"], output_names=["out"], source=body)
    n = 64 * 4
    x = torch.randint(0, 100, (n,), dtype=torch.int32)

    def call(bad):
        return k(inputs=[x, bad], output_shapes=[(n,)], output_dtypes=[torch.int32], grid=(n, 1, 1),
                 threadgroup=(64, 1, 1), stream=torch.device("cpu"))[0]

    good = call(False)  # every lane on the same path: compiles the kernel, and completes
    result, elapsed = _launch_with_deadline(lambda: call(True))
    error = result.get("error")
    assert isinstance(error, kk.KernelLaunchError), f"expected KernelLaunchError, got {result!r}"
    assert elapsed < 1.0, f"the error took {elapsed:.2f} s"
    msg = str(error)
    assert f"kernel '{name}'" in msg, msg
    for word in words:
        assert word in msg, msg
    # it names the user's lines: those of the synchronising calls involved (marked `// site`)
    lines = [n for n, text in enumerate(body.splitlines(), 1) if text.endswith("// site")]
    assert lines and all(f"body:{n}" in msg for n in lines), f"expected body lines {lines}: {msg}"

    # the runtime is still usable: the same kernel and a fresh one run correctly
    again = call(False)
    assert torch.equal(again, good)
    reduce_k = kk.metal_kernel(name="after_deadlock", input_names=["inp"], output_names=["out"],
                               source=TREE_REDUCE)
    out = reduce_k(inputs=[x], output_shapes=[(1,)], output_dtypes=[torch.int32], grid=(n, 1, 1),
                   threadgroup=(256, 1, 1))[0]
    assert out.item() == x.sum().item()
