"""Checked calls (issue 7): check_bounds=True finds out-of-bounds accesses through a kernel's
buffers and names them; timeout= stops a kernel that runs too long. Both dialects, both
backends; after either error the process runs the next kernel as usual."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch

import kernelkit as kk
from kernelkit import debugging
from kernelkit.ops.grid_sample import FORWARD_SOURCE, VJP_SOURCE, grid_sample_reference

# --- bounds ------------------------------------------------------------------------------------

# (dialect, body) pairs for the three acceptance kernels; line 2 is the faulty access.
INDEX_METAL = "int i = int(thread_position_in_grid.x);\n"
INDEX_CUDA = "int i = int(blockIdx.x * blockDim.x + threadIdx.x);\n"
READ_PAST = "out[i] = inp[i + 1];"
WRITE_BEFORE = "out[i - 1] = inp[i];"
NEGATIVE = "out[i] = *(inp + (2 * i - 3));"


def make(dialect, name, body, **kw):
    factory = kk.metal_kernel if dialect == "metal" else kk.cuda_kernel
    prefix = INDEX_METAL if dialect == "metal" else INDEX_CUDA
    return factory(name=name, input_names=["inp"], output_names=["out"], source=prefix + body, **kw)


def call(k, x, n=None, **kw):
    n = x.numel() if n is None else n
    return k(inputs=[x], grid=(n, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(n,)],
             output_dtypes=[x.dtype], **kw)[0]


def thread_of(message: str, dialect: str) -> int:
    """The grid x position of the thread an IndexError / TimeoutError names."""
    if dialect == "metal":
        m = re.search(r"thread_position_in_grid \((\d+), 0, 0\) \(thread_position_in_threadgroup "
                      r"\((\d+), 0, 0\) of threadgroup_position_in_grid \((\d+), 0, 0\)\)", message)
        assert m, message
        assert int(m.group(1)) == int(m.group(3)) * 8 + int(m.group(2))
        return int(m.group(1))
    m = re.search(r"threadIdx \((\d+), 0, 0\) of blockIdx \((\d+), 0, 0\)", message)
    assert m, message
    return int(m.group(2)) * 8 + int(m.group(1))


def runs_correctly(device):
    """The process is usable: a correct kernel (checked and plain) and torch give right results."""
    k = kk.metal_kernel(name="after", input_names=["a"], output_names=["b"],
                        source="uint i = thread_position_in_grid.x; b[i] = a[i] * 2.0f;")
    a = torch.randn(1000, device=device)
    for checked in (True, False):
        b = k(inputs=[a], grid=(1000, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(1000,)],
              output_dtypes=[torch.float32], check_bounds=checked)[0]
        torch.testing.assert_close(b, a * 2)
    torch.testing.assert_close((a + 1).sum().cpu(), (a.cpu() + 1).sum(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_read_past_the_input(device, dialect):
    k = make(dialect, "read_past", READ_PAST)
    x = torch.arange(16, dtype=torch.float32, device=device)
    with pytest.raises(IndexError) as e:
        call(k, x, check_bounds=True)
    msg = str(e.value)
    assert f"[{dialect}_kernel] kernel 'read_past': out-of-bounds access to input 'inp' at index 16 " \
           "('inp' has 16 elements)" in msg
    assert thread_of(msg, dialect) == 15
    assert "body line 2:\n    out[i] = inp[i + 1];" in msg
    # the same kernel, right-sized: no error, right values; then other kernels
    torch.testing.assert_close(call(k, torch.arange(17.0, device=device), 16, check_bounds=True),
                               torch.arange(1.0, 17.0, device=device))
    runs_correctly(device)


@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_write_before_the_output(device, dialect):
    k = make(dialect, "write_before", WRITE_BEFORE)
    x = torch.arange(16, dtype=torch.float32, device=device)
    with pytest.raises(IndexError) as e:
        call(k, x, check_bounds=True)
    msg = str(e.value)
    assert "out-of-bounds access to output 'out' at index -1 ('out' has 16 elements)" in msg
    assert thread_of(msg, dialect) == 0
    assert "body line 2:\n    out[i - 1] = inp[i];" in msg
    runs_correctly(device)


@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_negative_offset(device, dialect):
    k = make(dialect, "negative", NEGATIVE)
    x = torch.arange(32, dtype=torch.float32, device=device)
    with pytest.raises(IndexError) as e:
        call(k, x, 16, check_bounds=True)
    msg = str(e.value)
    m = re.search(r"input 'inp' at index (-?\d+) \('inp' has 32 elements\)", msg)
    assert m, msg
    assert int(m.group(1)) == 2 * thread_of(msg, dialect) - 3 < 0  # thread 0 (-3) or 1 (-1)
    assert "body line 2:\n    out[i] = *(inp + (2 * i - 3));" in msg
    runs_correctly(device)


@pytest.mark.parametrize("body, index", [
    ("const device float* row = inp + 8;\nout[i] = row[i];", 16),  # a pointer declared from inp
    ("out[i] = AT(i + 1);", 16),  # a macro of the header
    ("device float* o = out;\no -= 2;\no[i] = inp[i];", -2),  # a moved copy
])
def test_derived_pointers_and_macros_are_checked(device, body, index):
    k = kk.metal_kernel(name="derived", input_names=["inp"], output_names=["out"],
                        header="#define AT(j) inp[(j)]", source=INDEX_METAL + body)
    x = torch.arange(16, dtype=torch.float32, device=device)
    with pytest.raises(IndexError, match=rf"at index {index} \('(inp|out)' has 16 elements\)"):
        call(k, x, check_bounds=True)


@pytest.mark.slow
def test_environment_variable_checks_every_call(tmp_path):
    script = ("import torch, kernelkit as kk\n"
              "k = kk.metal_kernel(name='env', input_names=['inp'], output_names=['out'],\n"
              "    source='uint i = thread_position_in_grid.x; out[i] = inp[i + 1];')\n"
              "x = torch.zeros(4)\n"
              "try:\n"
              "    k(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],\n"
              "      output_dtypes=[x.dtype])\n"
              "except IndexError as e:\n"
              "    print('IndexError', e)\n"
              "k(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],\n"
              "  output_dtypes=[x.dtype], check_bounds=False)\n"
              "print('unchecked ok')\n")
    env = dict(os.environ, KERNELKIT_CHECK_BOUNDS="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "IndexError [metal_kernel] kernel 'env': out-of-bounds access to input 'inp' at index 4" \
        in proc.stdout
    assert "unchecked ok" in proc.stdout


def test_strided_input_size_is_the_span_of_the_view(device):
    # a (4, 4) view with strides (8, 1): its pointer may reach 1 + 3 * 8 + 3 = 28 elements
    k = kk.metal_kernel(name="strided", input_names=["inp"], output_names=["out"],
                        ensure_row_contiguous=False,
                        source="uint i = thread_position_in_grid.x;\n"
                               "out[i] = inp[elem_to_loc(i, inp_shape, inp_strides, inp_ndim)] + "
                               "inp[i == 15 ? R : 0];")
    base = torch.arange(32, dtype=torch.float32, device=device).reshape(4, 8)
    view = base[:, :4]
    expected = view.reshape(-1) + base.reshape(-1)[0]
    for reach in (27, 28):
        args = dict(inputs=[view], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
                    output_dtypes=[torch.float32], template=[("R", reach)], check_bounds=True)
        if reach == 27:
            out = k(**args)[0]
            expected[15] = view[3, 3] + base.reshape(-1)[27]
            torch.testing.assert_close(out, expected)
        else:
            with pytest.raises(IndexError, match=r"input 'inp' at index 28 \('inp' spans 28 elements "
                                                 r"\(a strided view of shape \(4, 4\) with strides "
                                                 r"\(8, 1\)"):
                k(**args)


# Valid accesses in every form the front end rewrites: checked calls agree with plain ones.
FORMS_HEADER = """
template <typename T> METAL_FUNC T first(const device T* p) { return p[0]; }
METAL_FUNC float sum4(const device float4* p) { float4 v = p[0]; return v.x + v.y + v.z + v.w; }
#define AT(j) inp[(j)]
"""
FORMS_BODY = """
uint i = thread_position_in_grid.x;
const device float* row = inp + 4 * (i / 4);
float acc = *row + row[3] + first(row) + first(inp + 1) + *(inp + i) + AT(i) + i[inp];
acc += sum4(reinterpret_cast<const device float4*>(row)) + ((const device float4*)inp)[0].y;
for (const device float* p = inp; p < inp + 4; ++p) acc += *p;
auto q = inp; q += 2; acc += q[1];
auto get = [&](uint j) { return inp[j]; };
acc += get(i);
device atomic<float>* o = out + i;
atomic_store_explicit(o, acc, memory_order_relaxed);
atomic_fetch_add_explicit(counts + (i % 4), 1, memory_order_relaxed);
atomic_fetch_add_explicit(&counts[i % 4], 1, memory_order_relaxed);
"""


def test_checked_forms_agree_with_plain(device):
    k = kk.metal_kernel(name="forms", input_names=["inp"], output_names=["out", "counts"],
                        source=FORMS_BODY, header=FORMS_HEADER, atomic_outputs=True)
    x = torch.randn(64, device=device)
    args = dict(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,), (4,)],
                output_dtypes=[torch.float32, torch.int32], init_value=0)
    plain = k(**args)
    checked = k(**args, check_bounds=True, timeout=10.0)
    torch.testing.assert_close(checked[0], plain[0])
    assert checked[1].tolist() == [32, 32, 32, 32] == plain[1].tolist()
    assert len(k._variants) == 2  # the checked variant is its own


CUDA_FORMS_HEADER = """
template <typename T> __device__ T first(const T* p) { return p[0]; }
__device__ constexpr int twice(int n) { int r = 0; for (int k = 0; k < 2; ++k) r += n; return r; }
"""
CUDA_FORMS_BODY = """
int i = blockIdx.x * blockDim.x + threadIdx.x;
if (i >= inp_shape[0]) return;
const float* row = inp + 4 * (i / 4);
float acc = *row + row[3] + first(row) + first(inp + 1) + inp[i] + s[0] + twice(1);
acc += reinterpret_cast<const float4*>(row)->y;
int k = 0;
while (k < 4) { acc += row[k]; ++k; }
do { --k; } while (k > 0);
out[i] = acc;
atomicAdd(counts + (i % 4), 1);
atomicAdd(&counts[i % 4], 1);
"""


def test_checked_forms_agree_with_plain_cuda_dialect(device):
    k = kk.cuda_kernel(name="forms_cuda", input_names=["inp", "s"], output_names=["out", "counts"],
                       source=CUDA_FORMS_BODY, header=CUDA_FORMS_HEADER)
    x = torch.randn(60, device=device)
    for s in (2.0, torch.tensor(2.0, device=device)):
        args = dict(inputs=[x, s], grid=(60, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(60,), (4,)], output_dtypes=[torch.float32, torch.int32],
                    init_value=0)
        plain = k(**args)
        checked = k(**args, check_bounds=True, timeout=10.0)
        torch.testing.assert_close(checked[0], plain[0])
        assert checked[1].tolist() == [30, 30, 30, 30] == plain[1].tolist()


CAST_BODIES = {
    "metal": """
auto row = inp + i;
auto either = i % 2 ? inp + i : row;
const device uint* kept = inp + i;
out[i] = ((const device uint8_t*)row)[0] + reinterpret_cast<const device uint8_t*>(either)[1]
       + static_cast<const device uchar4*>((const device void*)kept)->z + *row + either[0];
""",
    "cuda": """
auto row = inp + i;
auto either = i % 2 ? inp + i : row;
out[i] = reinterpret_cast<const uint8_t*>(row)[0] + ((const uint8_t*)either)[1]
       + reinterpret_cast<const uchar4*>(static_cast<const void*>(row))->z + *row + either[0];
""",
}


@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_checked_build_compiles_pointer_casts(device, dialect):
    """A checked pointer cast to another pointer type (C-style, static_cast, reinterpret_cast),
    also one `auto` made from a buffer: the checked variant compiles whenever the plain one does,
    and agrees with it (accesses through the cast pointer are unchecked)."""
    k = make(dialect, "casts", CAST_BODIES[dialect])
    x = torch.randint(0, 2**31 - 1, (64,), dtype=torch.int32, device=device).view(torch.uint32)
    args = dict(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                output_dtypes=[torch.uint32])
    plain = k(**args)[0]
    checked = k(**args, check_bounds=True)[0]
    b = x.view(torch.uint8).view(64, 4).long()
    expected = (b[:, 0] + b[:, 1] + b[:, 2] + 2 * x.long()) % 2**32
    assert torch.equal(plain.long(), expected) and torch.equal(checked.long(), expected)


NULL_BODIES = {
    "metal": """
const device uint* p = i % 2 ? inp : 0;
const device uint* q = i % 3 ? NULL : inp;
device uint* r = i > 40 ? out : nullptr;
out[i] = (p ? p[i] : 1u) + (q ? q[i] : 2u) + (r ? 4u : 0u);
""",
    "cuda": """
const uint32_t* p = i % 2 ? inp : 0;
const uint32_t* q = i % 3 ? NULL : inp;
uint32_t* r = i > 40 ? out : nullptr;
out[i] = (p ? p[i] : 1u) + (q ? q[i] : 2u) + (r ? 4u : 0u);
""",
}


@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_checked_build_compiles_null_pointer_conditionals(device, dialect):
    """`c ? buffer : 0` (and NULL, nullptr) with a checked pointer as the other operand: the
    checked variant compiles whenever the plain one does, the null side checks nothing."""
    k = make(dialect, "nulls", NULL_BODIES[dialect])
    x = torch.randint(0, 2**20, (64,), dtype=torch.int32, device=device).view(torch.uint32)
    args = dict(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                output_dtypes=[torch.uint32])
    i = torch.arange(64, device=device)
    v = x.long()
    expected = torch.where(i % 2 > 0, v, 1) + torch.where(i % 3 > 0, 2, v) + torch.where(i > 40, 4, 0)
    for check in (False, True):
        assert torch.equal(k(**args, check_bounds=check)[0].long(), expected)


# --- the seed's grid_sample --------------------------------------------------------------------

def _seed_forward():
    return kk.metal_kernel(name="grid_sample", input_names=["x", "grid"], output_names=["out"],
                           source=FORWARD_SOURCE)


def _run_seed_forward(k, x, grid, **kw):
    B, _, _, C = x.shape
    _, gN, gM, _ = grid.shape
    shape = (B, gN, gM, C)
    return k(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[shape],
             output_dtypes=[x.dtype], grid=(B * gN * gM * C, 1, 1), threadgroup=(256, 1, 1), **kw)[0]


def test_seed_grid_sample_forward_reads_outside_x(device):
    """The seed's forward reads the four corners before masking them: at border samples a
    corner's index falls outside x. check_bounds reports the first such read."""
    torch.manual_seed(0)
    B, H, W, C = 2, 5, 6, 3
    # A margin around x: the unchecked call below reads outside x too, and on the GPU a read
    # before a fresh allocation can be an illegal address (which loses the CUDA context).
    x = torch.randn(B + 2, H, W, C, device=device)[1:-1]
    k = _seed_forward()
    inside = torch.rand(B, 3, 4, 2, device=device) * 1.2 - 0.6  # samples well inside: no error
    torch.testing.assert_close(_run_seed_forward(k, x, inside, check_bounds=True),
                               grid_sample_reference(x, inside), rtol=1e-4, atol=1e-5)
    border = inside.clone()
    border[0, 0, 0] = torch.tensor([-1.0, -1.0])  # top-left corner of image 0
    border[1, 2, 3] = torch.tensor([1.0, 1.0])  # bottom-right corner of the last image
    with pytest.raises(IndexError) as e:
        _run_seed_forward(k, x, border, check_bounds=True)
    msg = str(e.value)
    m = re.search(r"input 'x' at index (-?\d+) \('x' has (\d+) elements\) by thread_position_in_grid "
                  r"\((\d+), 0, 0\).*body line (\d+):\n    T I_(nw|ne|sw|se) = x\[", msg, re.S)
    assert m, msg
    index, size, elem, line = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))
    assert size == x.numel()
    assert index < 0 or index >= size
    # the thread is one of the border samples' channels, and the index is its corner's
    lines = FORWARD_SOURCE.splitlines()
    corner = m.group(5)
    assert lines[line - 1].strip().startswith(f"T I_{corner} = x[")
    sample, channel = divmod(elem, C)
    b, rest = divmod(sample, 3 * 4)
    gy, gx = divmod(rest, 4)
    gxy = border[b, gy, gx].tolist()
    assert gxy in ([-1.0, -1.0], [1.0, 1.0]), (elem, gxy)
    ix, iy = ((gxy[0] + 1) * W - 1) / 2, ((gxy[1] + 1) * H - 1) / 2
    cx = int(torch.tensor(ix).floor()) + (corner in ("ne", "se"))
    cy = int(torch.tensor(iy).floor()) + (corner in ("sw", "se"))
    assert index == b * H * W * C + cy * W * C + cx * C + channel
    # unchecked, the forward still gives torch's result (the masks drop what it read, here
    # from the margin)
    torch.testing.assert_close(_run_seed_forward(k, x, border), grid_sample_reference(x, border),
                               rtol=1e-4, atol=1e-5)


def test_seed_grid_sample_vjp_is_clean_with_atomic_outputs(device):
    """The seed's VJP masks before it reads or adds: no report, and the same gradients."""
    torch.manual_seed(1)
    B, H, W, C = 1, 4, 5, 8
    x = torch.randn(B, H, W, C, device=device)
    grid = torch.rand(B, 3, 3, 2, device=device) * 2 - 1
    grid[0, 0, 0] = torch.tensor([-1.0, -1.0])
    grid[0, 2, 2] = torch.tensor([1.0, 1.0])
    cot = torch.randn(B, 3, 3, C, device=device)
    k = kk.metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                        output_names=["x_grad", "grid_grad"], source=VJP_SOURCE, atomic_outputs=True)
    args = dict(inputs=[x, grid, cot], template=[("T", x.dtype)], output_shapes=[x.shape, grid.shape],
                output_dtypes=[x.dtype, x.dtype], grid=(B * 3 * 3 * 32, 1, 1),
                threadgroup=(256, 1, 1), init_value=0)
    plain = k(**args)
    checked = k(**args, check_bounds=True)
    for a, b in zip(checked, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# --- timeouts ----------------------------------------------------------------------------------

SPIN_METAL = """float v = inp[0];
while (v >= 0.0f) { v = v + 1.0f; }
out[thread_position_in_grid.x] = v;"""
SPIN_CUDA = """float v = inp[0];
for (;;) { if (v < 0.0f) break; v = v + 1.0f; }
out[blockIdx.x * blockDim.x + threadIdx.x] = v;"""
SPIN_SYNC = """threadgroup atomic_int flag;
if (thread_index_in_threadgroup == 0) atomic_store_explicit(&flag, int(inp[0]), memory_order_relaxed);
threadgroup_barrier(mem_flags::mem_threadgroup);
while (atomic_load_explicit(&flag, memory_order_relaxed) == 0) {}
out[thread_position_in_grid.x] = float(atomic_load_explicit(&flag, memory_order_relaxed));"""
SPIN_HEADER = """inline float spin(float v) {
  do { v = v + 1.0f; } while (v >= 0.0f);
  return v;
}"""


def _spinner(kind):
    if kind == "cuda":
        return kk.cuda_kernel(name="spin_cuda", input_names=["inp"], output_names=["out"],
                              source=SPIN_CUDA), "body line 2:\n    for (;;) {"
    if kind == "sync":
        return kk.metal_kernel(name="spin_sync", input_names=["inp"], output_names=["out"],
                               source=SPIN_SYNC), "body line 4:\n    while ("
    if kind == "header":
        return kk.metal_kernel(name="spin_header", input_names=["inp"], output_names=["out"],
                               header=SPIN_HEADER,
                               source="out[thread_position_in_grid.x] = spin(inp[0]);"), \
            "header line 2:\n    do {"
    return kk.metal_kernel(name="spin", input_names=["inp"], output_names=["out"],
                           source=SPIN_METAL), "body line 2:\n    while (v >= 0.0f)"


@pytest.mark.parametrize("kind", ["metal", "cuda", "sync", "header"])
def test_spinning_kernel_times_out(device, kind):
    k, where = _spinner(kind)
    n = 4096  # many threadgroups: on the CPU the pool's workers spin too
    args = dict(grid=(n, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(n,)],
                output_dtypes=[torch.float32], timeout=0.5)
    # compiled, and a call that ends: the loop does not run for a negative value (or flag 1)
    stop = torch.tensor([1.0 if kind == "sync" else -1e30], device=device)
    out = k(inputs=[stop], **args)[0]
    assert out.tolist() == [float(stop.item())] * n
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        k(inputs=[torch.zeros(1, device=device)], **args)
    elapsed = time.monotonic() - start
    assert elapsed < 1.5, elapsed
    msg = str(e.value)
    assert "ran past its timeout of 0.5 s and was stopped" in msg
    assert where in msg, msg
    # the next calls work: the same kernel, checked and plain, and another one
    assert k(inputs=[stop], **args)[0].tolist() == [float(stop.item())] * n
    runs_correctly(device)


def test_loops_that_end_in_time_give_the_right_result(device):
    k = kk.metal_kernel(name="row_sums", input_names=["inp"], output_names=["out"], source="""
        uint r = thread_position_in_grid.x;
        int n = inp_shape[1];
        float acc = 0.0f;
        for (int c = 0; c < n; ++c) acc += inp[r * n + c];
        int k = 0;
        while (k < 3) { acc += 1.0f; k++; }
        out[r] = acc;""")
    x = torch.randn(300, 200, device=device)
    for kw in (dict(timeout=5.0), dict(timeout=5.0, check_bounds=True), {}):
        out = k(inputs=[x], grid=(300, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(300,)],
                output_dtypes=[torch.float32], **kw)[0]
        torch.testing.assert_close(out, x.sum(1) + 3, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [0, -1.0, "1", True, float("inf")])
def test_timeout_must_be_positive_seconds(bad):
    k = make("metal", "t", READ_PAST)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        call(k, torch.zeros(4), timeout=bad)


def test_request():
    assert debugging.request(None, None, "c") is None or debugging.CHECK_BOUNDS
    r = debugging.request(True, 0.25, "c")
    assert r.mode == debugging.Mode(True, True) and r.timeout_ns == 250_000_000
    assert debugging.request(False, 2, "c").mode == debugging.Mode(False, True)


@pytest.mark.parametrize("nbytes", [48 * 1024, 64 * 1024])
def test_checked_kernel_with_dynamic_shared_memory(device, nbytes):
    """The GPU's checked variant keeps its state in static shared memory: 48 KiB of dynamic
    shared memory still fits (the limit is raised as for larger sizes)."""
    k = kk.cuda_kernel(name="dyn_smem_checked", input_names=["x"], output_names=["out"],
                       shared_memory=nbytes, source="""
        extern __shared__ float smem[];
        const int n = N_BYTES / sizeof(float);
        for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = x[blockIdx.x];
        __syncthreads();
        out[blockIdx.x * blockDim.x + threadIdx.x] = smem[n - 1 - threadIdx.x];""")
    x = torch.randn(3, device=device)
    out = k(inputs=[x], template=[("N_BYTES", nbytes)], grid=(3 * 128, 1, 1),
            threadgroup=(128, 1, 1), output_shapes=[(3 * 128,)], output_dtypes=[torch.float32],
            check_bounds=True, timeout=10.0)[0]
    torch.testing.assert_close(out.view(3, 128), x.view(3, 1).expand(3, 128))


def test_check_bounds_stops_a_write_far_past_an_output(device):
    """100,000 floats past a 64-element output: without checks such a write may land in mapped
    memory (README); checked, it never reaches memory and is an IndexError."""
    k = make("metal", "far_write", "out[i + 100000] = inp[i];")
    x = torch.randn(64, device=device)
    # (the report is the first access the checks caught; on a GPU, any thread's may come first)
    with pytest.raises(IndexError, match=r"out-of-bounds access to output 'out' at index 1000[0-6]\d "
                                         r"\('out' has 64 elements\)"):
        call(k, x, check_bounds=True)
    torch.testing.assert_close(call(make("metal", "near_write", "out[i] = inp[i];"), x), x)


def test_verbose_shows_the_path_of_each_tensor_op_run(device, capfd):
    """verbose=True on a tensor-op kernel: beside the source, each matmul2d run prints the path it
    took (the talk's tile matmul: loops on the CPU, tensor cores on a GPU), with its line."""
    header = ("#include <metal_tensor>\n#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n"
              "using namespace mpp::tensor_ops;\n")
    body = """
  auto A = tensor(a, dextents<int, 2>(16, 64));
  auto B = tensor(b, dextents<int, 2>(64, 16));
  auto C = tensor(c, dextents<int, 2>(64, 64));
  constexpr auto descriptor = matmul2d_descriptor(64, 64, dynamic_length_v<int>);
  matmul2d<descriptor, execution_simdgroups<4>> op;
  op.run(A, B, C);
"""
    k = kk.metal_kernel("verbose_tile_matmul", ["a", "b"], ["c"], body, header=header)
    a = torch.randn(64, 16, device=device, dtype=torch.float16)
    b = torch.randn(16, 64, device=device, dtype=torch.float16)
    args = dict(inputs=[a, b], output_shapes=[(64, 64)], output_dtypes=[torch.float32], grid=(128, 1, 1),
                threadgroup=(128, 1, 1))
    c = k(**args, verbose=True)[0]
    out = capfd.readouterr().out
    path = ("loops (float)" if device.type == "cpu" else
            "wgmma" if torch.cuda.get_device_capability(device) == (9, 0) else "mma.sync")
    assert "kernelkit tensor ops: body:7: matmul2d<(64, 64, 0: dynamic), execution_simdgroups<4>>: " + path in out
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    k(**args)  # a plain call: no report
    assert "kernelkit tensor ops" not in capfd.readouterr().out
