"""CUDA kernel bodies on the CPU backend (include/kernelkit/cuda_cpu.h), without
the Python pipeline.

cuda_tests.cpp holds kernels written like the generated source of a
kk.cuda_kernel (harness.h launches them through libkkrt, in loop and fiber
mode) and checks them in C++; the warp intrinsics are checked here against a
model written from CUDA's documentation (and, on a GPU machine, the model
against the GPU: test_warp_model_on_gpu). generated_kernel.cpp is built four
ways with the CPU backend's flags, with the stub CUDA headers on the include
path, and run through its exported kk_launch.

Everything is built once per module, on a thread pool (a few seconds).
"""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parents[1] / "src" / "kernelkit" / "include"
STUBS = INCLUDE / "cpu_cuda_stubs"
RUNTIME = INCLUDE / "kernelkit" / "cpu_runtime.cpp"
CXX = os.environ.get("CXX", "g++")
WARN = ["-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas"]
# The CPU backend's flags for a kernel library (backends/cpu.py), relaxed math.
KERNEL_FLAGS = ["-std=c++17", "-O3", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
                "-Wno-attributes", "-ffp-contract=fast", "-fno-math-errno", *WARN,
                f"-I{INCLUDE}", f"-I{STUBS}"]
GENERATED = {  # library -> defines (see generated_kernel.cpp)
    "gen_loop.so": ["-DGEN_SYNC=0"],
    "gen_loop_early.so": ["-DGEN_SYNC=0", "-DEARLY"],
    "gen_fiber.so": ["-DGEN_SYNC=1"],
    "gen_both.so": ["-DGEN_SYNC=2"],
}

pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")


def _compile(argv):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if proc.returncode:
        raise AssertionError(f"compile failed: {' '.join(map(str, argv))}\n{proc.stderr}")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_cpu")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        # the biggest first: the test program
        rt = pool.submit(_compile, [CXX, "-std=c++17", "-O2", "-pthread", "-fPIC", "-shared", RUNTIME,
                                    "-o", d / "libkkrt.so"])
        libs = [pool.submit(_compile, [CXX, *KERNEL_FLAGS, *defs, HERE / "generated_kernel.cpp",
                                       "-o", d / name]) for name, defs in GENERATED.items()]
        rt.result()
        prog = pool.submit(_compile, [CXX, "-std=c++17", "-O1", "-pthread", "-frounding-math", *WARN,
                                      f"-I{INCLUDE}", HERE / "cuda_tests.cpp", "-L", d, "-lkkrt", "-ldl",
                                      "-o", d / "cuda_tests"])
        for f in [*libs, prog]:
            f.result()
    return d


def _run(build, *names, timeout=120):
    env = dict(os.environ, LD_LIBRARY_PATH=str(build))
    proc = subprocess.run([str(build / "cuda_tests"), *names], capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("name", ["indices", "reduce", "dyn_shared", "shfl_types", "atomics", "half",
                                  "math", "coop", "errors"])
def test_program(build, name):
    assert f"ok {name}" in _run(build, name)


def test_generated_libraries(build):
    """The generated source's shape, the backend's flags, the stub headers:
    loop mode (KK_CPU_SYNC before or after the prelude), fibers, and both."""
    assert "ok generated=" in _run(build, f"generated={build}")


# ---------------------------------------------------------------------------
# The warp intrinsics against CUDA's documented semantics.

WIDTHS = [1, 2, 4, 8, 16, 32]
SRCS = [-1, 0, 1, 5, 7, 15, 16, 31, 32, 37]
DELTAS = [0, 1, 2, 3, 5, 8, 15, 16, 17, 31]
MASKS = [0, 1, 2, 3, 5, 8, 16, 17, 31, 32]
FULL = 0xFFFFFFFF


def i32(x):
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def warp_model(block, live):
    """Rows of expected values per thread (None: the thread returned at once)."""
    rows = []

    def per_lane(f):
        row = []
        for t in range(block):
            warp, lane = divmod(t, 32)
            lanes = [k for k in range(32) if k < live and warp * 32 + k < block]  # live lanes
            row.append(f(warp, lane, lanes) if lane in lanes else None)
        rows.append(row)

    def val(warp, lane):
        return lane * 7 + 3 + warp * 1000

    def shuffle(src_of):
        # a lane reads src_of(lane); reading a lane that is not live gives its own value
        def f(warp, lane, lanes):
            s = src_of(lane)
            return val(warp, s if s in lanes else lane)
        return f

    for w in WIDTHS:
        for k in range(10):
            # __shfl_sync: lane srcLane % width of the lane's own width-group
            per_lane(shuffle(lambda lane, s=SRCS[k], w=w: lane // w * w + s % w))
            # __shfl_up_sync: lane - delta, unless that leaves the group (then own)
            per_lane(shuffle(lambda lane, d=DELTAS[k], w=w: lane - d if lane % w >= d else lane))
            # __shfl_down_sync: lane + delta, unless past the group's end
            per_lane(shuffle(lambda lane, d=DELTAS[k], w=w: lane + d if lane % w + d < w else lane))
            # __shfl_xor_sync: lane ^ mask; lanes of later groups are out of reach (own value)
            per_lane(shuffle(lambda lane, m=MASKS[k], w=w:
                             lane ^ m if (lane ^ m) < (lane // w + 1) * w else lane))
    per_lane(shuffle(lambda lane: 3))
    per_lane(shuffle(lambda lane: lane - 4 if lane >= 4 else lane))
    per_lane(shuffle(lambda lane: lane + 4 if lane + 4 < 32 else lane))
    per_lane(shuffle(lambda lane: lane ^ 6))

    def bits(ks):
        return i32(sum(1 << k for k in ks))

    # votes (over the live lanes, restricted to mask)
    per_lane(lambda w, l, L: bits(k for k in L if val(w, k) % 3 == 0))
    per_lane(lambda w, l, L: bits(k for k in L if val(w, k) % 3 == 0 and (0x0F0F0F0F >> k) & 1))
    per_lane(lambda w, l, L: int(5 in L))
    per_lane(lambda w, l, L: 0)
    per_lane(lambda w, l, L: 1)
    per_lane(lambda w, l, L: int(7 not in L))
    per_lane(lambda w, l, L: int(all(k >= 4 for k in L if (0xFFFFFF00 >> k) & 1)))
    per_lane(lambda w, l, L: 1)
    per_lane(lambda w, l, L: int(len({k < 3 for k in L}) == 1))
    per_lane(lambda w, l, L: bits(L))
    # reductions
    sv = lambda k: (k * 37) % 23 - 11  # noqa: E731
    uv = lambda k: (k * 2654435761) & 0xFFFFFFFF  # noqa: E731
    per_lane(lambda w, l, L: sum(sv(k) for k in L))
    per_lane(lambda w, l, L: i32(sum(val(w, k) for k in L)))
    per_lane(lambda w, l, L: min(sv(k) for k in L))
    per_lane(lambda w, l, L: max(sv(k) for k in L))
    per_lane(lambda w, l, L: i32(min(uv(k) for k in L)))
    per_lane(lambda w, l, L: i32(max(uv(k) for k in L)))

    def fold(op, xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = op(acc, x)
        return i32(acc)

    per_lane(lambda w, l, L: fold(lambda a, b: a & b, [uv(k) | 0x10 for k in L]))
    per_lane(lambda w, l, L: fold(lambda a, b: a | b, [uv(k) & 0xF0F0 for k in L]))
    per_lane(lambda w, l, L: fold(lambda a, b: a ^ b, [uv(k) for k in L]))
    # match: lanes of mask (live) holding the same value
    per_lane(lambda w, l, L: bits(k for k in L if k % 5 == l % 5))
    per_lane(lambda w, l, L: bits(k for k in L if k < 16 and k % 3 == l % 3))
    per_lane(lambda w, l, L: bits(L))  # __match_all_sync(warp): all equal
    per_lane(lambda w, l, L: 1)
    per_lane(lambda w, l, L: bits(L) if len({k // 16 for k in L}) == 1 else 0)
    per_lane(lambda w, l, L: int(len({k // 16 for k in L}) == 1))
    per_lane(lambda w, l, L: -7)
    return rows


def test_warp_intrinsics(build):
    lines = _run(build, "warp_dump").splitlines()
    checked = 0
    i = 0
    while i < len(lines) and lines[i].startswith("block"):
        _, block, _, live, _, nrows = lines[i].split()
        block, live, nrows = int(block), int(live), int(nrows)
        got = [[int(v) for v in line.split()] for line in lines[i + 1:i + 1 + nrows]]
        want = warp_model(block, live)
        assert len(want) == nrows
        for r, (g, w) in enumerate(zip(got, want)):
            for t in range(block):
                expected = -1 if w[t] is None else w[t]  # returned threads leave -1
                assert g[t] == expected, (
                    f"block {block}, live lanes {live}, row {r}, thread {t}: {g[t]} != {expected}")
                checked += 1
        i += 1 + nrows
    assert i == len(lines) - 1 and lines[-1] == "ok warp_dump"
    assert checked == 270 * (64 + 64 + 48 + 48)


# Rows of warp_body.inc that are undefined on a GPU: lanes outside `mask` call
# the function (__ballot_sync(0x0f0f0f0f), __all_sync(0xffffff00),
# __match_any_sync(0x0000ffff)); the CPU gives them a defined meaning.
_UNDEFINED_ON_GPU = {245, 250, 264}


@pytest.mark.gpu
def test_warp_model_on_gpu():
    """The model above is CUDA's: the same body on an NVIDIA GPU, through
    kk.cuda_kernel, gives what the model says (two whole warps, all lanes live)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    import kernelkit as kk

    body = (HERE / "warp_body.inc").read_text()
    kernel = kk.cuda_kernel(name="warp_model", input_names=["live"], output_names=["out"], source=body)
    block, rows = 64, 270
    out = kernel(inputs=[32], output_shapes=[(rows, block)], output_dtypes=[torch.int32], grid=(block, 1, 1),
                 threadgroup=(block, 1, 1), stream=torch.device("cuda"))[0].cpu()
    want = warp_model(block, 32)
    for r in range(rows):
        if r in _UNDEFINED_ON_GPU:
            continue
        assert out[r].tolist() == want[r], f"row {r}: GPU {out[r].tolist()} vs model {want[r]}"
