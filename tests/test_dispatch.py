"""Metal dispatch semantics (SPEC §2): grid in threads, clamped and partial threadgroups."""

import itertools

import pytest
import torch

import kernelkit as kk
from kernelkit.signature import ATTRIBUTES

ATTRS = list(ATTRIBUTES)


def _components(name):
    return ["x", "y", "z"] if ATTRIBUTES[name] == "uint3" else [None]


COLUMNS = [(a, c) for a in ATTRS for c in _components(a)]
BODY = """
    uint3 p = thread_position_in_grid;
    uint row = (p.z * threads_per_grid.y + p.y) * threads_per_grid.x + p.x;
""" + "".join(
    f"    out[row * {len(COLUMNS)} + {i}] = {a}{'.' + c if c else ''};\n" for i, (a, c) in enumerate(COLUMNS))


def _model(grid, group):
    """Every attribute of every thread, computed in Python from Metal's definitions."""
    group = tuple(min(t, g) for t, g in zip(group, grid))
    groups = tuple(-(-n // g) for n, g in zip(grid, group))
    rows = {}
    for pos in itertools.product(*(range(n) for n in grid)):
        gid = tuple(p // g for p, g in zip(pos, group))
        tid = tuple(p % g for p, g in zip(pos, group))
        size = tuple(min(g, n - i * g) for g, n, i in zip(group, grid, gid))
        tindex = tid[0] + size[0] * (tid[1] + size[1] * tid[2])  # over the (edge) group's own size
        nthreads, ndispatch = size[0] * size[1] * size[2], group[0] * group[1] * group[2]
        v = {
            "thread_position_in_grid": pos, "thread_position_in_threadgroup": tid,
            "threadgroup_position_in_grid": gid, "threadgroups_per_grid": groups,
            "threads_per_grid": grid, "threads_per_threadgroup": size,
            "dispatch_threads_per_threadgroup": group, "grid_origin": (0, 0, 0), "grid_size": grid,
            "thread_index_in_threadgroup": tindex, "thread_index_in_simdgroup": tindex % 32,
            "thread_index_in_quadgroup": tindex % 4, "simdgroup_index_in_threadgroup": tindex // 32,
            "quadgroup_index_in_threadgroup": tindex // 4,
            "simdgroups_per_threadgroup": -(-nthreads // 32),
            "quadgroups_per_threadgroup": -(-nthreads // 4),
            "dispatch_simdgroups_per_threadgroup": -(-ndispatch // 32),
            "dispatch_quadgroups_per_threadgroup": -(-ndispatch // 4),
            "threads_per_simdgroup": 32, "thread_execution_width": 32,
        }
        row = (pos[2] * grid[1] + pos[1]) * grid[0] + pos[0]
        rows[row] = [v[a]["xyz".index(c)] if c else v[a] for a, c in COLUMNS]
    return torch.tensor([rows[r] for r in range(len(rows))], dtype=torch.int64)


@pytest.mark.parametrize("grid,group", [
    ((70, 1, 1), (32, 1, 1)),       # partial last group
    ((5, 1, 1), (256, 1, 1)),       # threadgroup clamped to the grid
    ((13, 7, 3), (8, 4, 2)),        # partial in every dimension
    ((9, 10, 1), (16, 3, 1)),       # clamped in x, partial in y
])
def test_every_attribute_matches_metal(device, grid, group, lane_order):
    k = kk.metal_kernel(name="attrs", input_names=[], output_names=["out"], source=BODY, header=lane_order)
    n = grid[0] * grid[1] * grid[2]
    out = k(inputs=[], grid=grid, threadgroup=group, output_shapes=[(n, len(COLUMNS))],
            output_dtypes=[torch.uint32], stream=device)[0]
    assert torch.equal(out.cpu().to(torch.int64), _model(grid, group))


# One partial sum a SIMD-group, then the first thread adds simdgroups_per_threadgroup of them: right
# in the 2-D edge group too, whose SIMD-groups are cut from its own (smaller) size.
SIMD_REDUCE_2D = """
    uint3 g = thread_position_in_grid;
    float v = x[g.y * threads_per_grid.x + g.x];
    threadgroup float partial[32];
    float s = simd_sum(v);
    if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (thread_index_in_threadgroup == 0) {
        float t = 0;
        for (uint k = 0; k < simdgroups_per_threadgroup; ++k) t += partial[k];
        out[threadgroup_position_in_grid.y * threadgroups_per_grid.x + threadgroup_position_in_grid.x] = t;
    }
"""


@pytest.mark.parametrize("grid,group", [((80, 2, 1), (64, 2, 1)), ((70, 3, 1), (32, 3, 1)), ((20, 5, 1), (16, 4, 1))])
def test_simd_groups_of_a_2d_edge_group(device, grid, group, lane_order):
    k = kk.metal_kernel(name="rowsum2d", input_names=["x"], output_names=["out"], source=SIMD_REDUCE_2D,
                        header=lane_order)
    x = torch.randint(-9, 10, (grid[1], grid[0]), device=device).float()
    groups = (-(-grid[1] // group[1]), -(-grid[0] // group[0]))
    out = k(inputs=[x], grid=grid, threadgroup=group, output_shapes=[groups], output_dtypes=[torch.float32],
            init_value=-1)[0]
    ref = torch.tensor([[c.double().sum() for c in r.split(group[0], dim=1)] for r in x.split(group[1])])
    torch.testing.assert_close(out.double().cpu(), ref)


REDUCE = """
    uint tid = thread_index_in_threadgroup;
    uint n = threads_per_threadgroup.x;
    threadgroup float buf[256];
    buf[tid] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (tid < s && tid + s < n) buf[tid] += buf[tid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) out[threadgroup_position_in_grid.x] = buf[0];
"""


def test_barriers_in_partial_edge_group_complete(device):
    k = kk.metal_kernel(name="reduce_edge", input_names=["inp"], output_names=["out"], source=REDUCE)
    x = torch.randn(1000, device=device)
    out = k(inputs=[x], grid=(1000, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(4,)],
            output_dtypes=[torch.float32])[0]
    ref = torch.stack([c.double().sum() for c in x.split(256)])
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)


def test_early_return_before_barrier(device):
    body = """
        uint i = thread_position_in_grid.x;
        threadgroup float buf[64];
        if (i % 3 == 1) return;   // a third of the threads leave before the barrier
        buf[thread_index_in_threadgroup] = inp[i];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[i] = buf[thread_index_in_threadgroup] * 2;
    """
    k = kk.metal_kernel(name="early_return", input_names=["inp"], output_names=["out"], source=body)
    x = torch.randn(200, device=device)
    out = k(inputs=[x], grid=(200, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(200,)],
            output_dtypes=[torch.float32], init_value=-1)[0]
    keep = torch.arange(200, device=device) % 3 != 1
    torch.testing.assert_close(out[keep], x[keep] * 2)
    assert (out[~keep] == -1).all()


def test_init_value_fills_outputs(device):
    body = "if (thread_position_in_grid.x == 0) out[0] = 5;"
    k = kk.metal_kernel(name="init", input_names=[], output_names=["out", "other"], source=body)
    out, other = k(inputs=[], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(3,), (2, 2)],
                   output_dtypes=[torch.int32, torch.float32], init_value=7, stream=device)
    assert out.tolist() == [5, 7, 7]
    assert other.tolist() == [[7.0, 7.0], [7.0, 7.0]]


def test_init_value_per_output(device):
    """A list gives each output its value; None leaves that output as allocated."""
    body = "if (thread_position_in_grid.x == 0) { out[0] = 5; other[0] = 1; }"
    k = kk.metal_kernel(name="init_each", input_names=[], output_names=["out", "other"], source=body)
    out, other = k(inputs=[], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(3,), (2,)],
                   output_dtypes=[torch.int32, torch.float32], init_value=[-2, None], stream=device)
    assert out.tolist() == [5, -2, -2] and other[0] == 1
    for bad in ["zero", [0], [0, "x"]]:
        with pytest.raises(TypeError, match=r"init_value must be a number, or a list of a number or "
                                            r"None for each of the 2 outputs \['out', 'other'\]"):
            k(inputs=[], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(3,), (2,)],
              output_dtypes=[torch.int32, torch.float32], init_value=bad, stream=device)
