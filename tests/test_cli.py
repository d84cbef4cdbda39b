"""The `kernelkit` command, run as users run it: `python -m kernelkit ...` in a fresh process."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.benchmarks import Progress, _ms, have_matplotlib

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
RECORDED = [RESULTS / "h100", RESULTS / "cpu-x86_64-2core"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One compile cache for the demo and bench runs of this module (they share kernels)."""
    return tmp_path_factory.mktemp("kernelkit-cache")


def kernelkit_cmd(*args, cache, env=None, timeout=300):
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(cache), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kernelkit", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_doctor(tmp_path):
    r = kernelkit_cmd("doctor", cache=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for piece in ("kernelkit", "torch", "GPU", "driver", "NVRTC", "CUDA headers", "C++ compiler", "cache"):
        assert f"] {piece}" in r.stdout, piece
    assert "backends: CPU ready" in r.stdout
    assert str(tmp_path) in r.stdout

    r = kernelkit_cmd("doctor", "--json", cache=tmp_path, env={"CXX": str(tmp_path / "no-such-c++")})
    report = json.loads(r.stdout)
    cxx = next(f for f in report["findings"] if f["name"] == "C++ compiler")
    assert cxx["status"] == "missing" and "apt-get install g++, or set CXX" in cxx["fix"]
    assert report["backends"]["cpu"] is False
    assert r.returncode == (0 if report["backends"]["cuda"] else 1)


@pytest.mark.slow
def test_cache_info_list_clear(tmp_path):
    current = tmp_path / kernelkit.__version__ / "ab"
    current.mkdir(parents=True)
    (current / "abcdef.so").write_bytes(b"\0" * 2000)
    (current / "abcdef.so.sha256").write_text("0" * 64)
    (current / "abcdef.so.src").write_text("template <typename T> void custom_kernel_myexp() {}")
    old = tmp_path / "0.0.1" / "cd"
    old.mkdir(parents=True)
    (old / "cdef.cubin").write_bytes(b"\0" * 500)

    r = kernelkit_cmd("cache", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path}: 4 files" in r.stdout
    assert f"{kernelkit.__version__}/ (this kernelkit): 3 files" in r.stdout
    assert "0.0.1/ (another kernelkit version): 1 file, 500 B" in r.stdout

    r = kernelkit_cmd("cache", "list", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert any("abcdef" in line and "cpu" in line and "myexp" in line for line in r.stdout.splitlines())
    assert any("cdef" in line and "cuda" in line for line in r.stdout.splitlines())

    r = kernelkit_cmd("cache", "clear", "--stale", cache=tmp_path)
    assert r.returncode == 0 and "removed 1 other kernelkit versions' files" in r.stdout, r.stdout
    assert not (tmp_path / "0.0.1").exists() and (current / "abcdef.so").exists()

    r = kernelkit_cmd("cache", "clear", cache=tmp_path)
    assert r.returncode == 0 and "removed 3 files" in r.stdout, r.stdout
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_demo_small_on_the_cpu(cache_dir, tmp_path):
    plot = tmp_path / "demo.png"
    args = ["demo", "--device", "cpu", "--small"] + (["--plot", plot] if have_matplotlib() else [])
    r = kernelkit_cmd(*args, cache=cache_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0] for line in r.stdout.splitlines()[3:] if line.startswith(("exp", "grid", "matmul"))}
    assert rows == {"exp", "grid_sample", "matmul_add_relu"}
    assert "grid_sample VJP" in r.stdout and "exp (strided view)" in r.stdout
    assert "all checks passed" in r.stdout and "MISMATCH" not in r.stdout
    if have_matplotlib():
        assert plot.stat().st_size > 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_demo_on_a_missing_gpu_is_a_clear_error(cache_dir):
    r = kernelkit_cmd("demo", "--device", "cuda", cache=cache_dir)
    assert r.returncode == 2 and "no CUDA device" in r.stderr, r.stderr


@pytest.mark.slow
def test_bench_quick_writes_json_markdown_and_charts(cache_dir, tmp_path):
    out = tmp_path / "results"
    r = kernelkit_cmd("bench", "--quick", "--device", "cpu", "--out", out, cache=cache_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind in ("cpu", "overhead"):
        result = json.loads((out / f"{kind}.json").read_text())
        assert result["benchmark"] == kind and result["quick"] is True
        assert result["command"].startswith("kernelkit bench --quick")
        assert result["device"].startswith("cpu") and result["date"]
        assert result["versions"]["kernelkit"] == kernelkit.__version__
        assert result["versions"]["torch"] == torch.__version__
        assert {"nvrtc", "cxx", "driver"} <= set(result["versions"])
    cpu = json.loads((out / "cpu.json").read_text())
    assert cpu["exp"]["kernelkit_ms"] > 0 and cpu["compile"]["warm_disk_first_call_s"] > 0
    md = (out / "results.md").read_text()
    assert "## The CPU backend" in md and "## Per-call host overhead" in md and "| exp, 4M float32" in md
    if have_matplotlib():
        assert (out / "cpu.png").exists() and (out / "overhead.png").exists(), r.stdout
        assert (out / "cpu.png").stat().st_size > 1000
    else:
        assert "note: matplotlib is not installed or cannot draw" in r.stdout

    # the Markdown writer: the same tables from the JSON, and from the figures recorded earlier
    r = kernelkit_cmd("bench", "--markdown", out / "cpu.json", *RECORDED, cache=cache_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("## The CPU backend") == 2
    assert "| forward | 0.259 ms | 0.254 ms | 1.02× | ≤ 1.05× |" in r.stdout  # h100/grid_sample.json
    assert "| grid_sample forward + backward, grid × 0.1 (points crowded in the centre of x) | same |" in r.stdout
    cpu = json.loads((RESULTS / "cpu-x86_64-2core" / "cpu.json").read_text())["exp"]
    assert (f"| exp, 64M float32 (plain loops) | {_ms(cpu['kernelkit_ms'])} | "
            f"{_ms(cpu['torch_ms'])} (`torch.exp`)") in r.stdout


def test_progress_bar_only_on_a_terminal():
    quiet = io.StringIO()
    p = Progress(3, stream=quiet)  # a StringIO is not a tty
    p.tick("one")
    p.close()
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    p = Progress(2, stream=shown, enabled=True)
    p.tick("first step")
    p.tick("second step")
    p.close()
    text = shown.getvalue()
    assert "[" in text and "0/2" in text and "1/2" in text and "second step" in text


def test_results_without_matplotlib_get_a_note(tmp_path, monkeypatch):
    from kernelkit import benchmarks
    monkeypatch.setattr(benchmarks, "have_matplotlib", lambda: False)
    result = {"benchmark": "overhead", "device": "cpu", "date": "2026-01-01", "command": "kernelkit bench",
              "kernelkit_call_us": 9.0, "torch_add__us": 2.0, "torch_empty_us": 1.0}
    written, notes = benchmarks.write_results({"overhead": result}, tmp_path)
    assert notes == [benchmarks.MATPLOTLIB_NOTE]
    assert sorted(p.name for p in written) == ["overhead.json", "results.md"]


def test_markdown_reads_the_older_result_layouts():
    from kernelkit import benchmarks
    ops = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22", "torch": "2.11.0+cu130",
           "command": "python bench/bench_ops.py",
           "grid_sample_bilinear_zeros_float32": {
               "forward_ms": {"kernelkit": 0.3, "torch_grid_sample_nchw": 1.5,
                              "torch_grid_sample_nhwc_view": 3.9, "composed_reference": 9.0},
               "forward_backward_ms": {"kernelkit": 2.0, "torch_grid_sample_nhwc_view": 20.0}},
           "matmul_add_relu_batch8_2048": {"bfloat16": {"kernelkit_ms": 2.0, "torch_ms": 1.0,
                                                        "kernelkit_tflops": 137.0, "torch_tflops": 275.0}}}
    md = benchmarks.markdown([(ops, "ops-h100.json")])
    assert "| grid_sample forward (bilinear, zeros, float32) | x 8×1024×1024×64, grid 8×256×256×2 | 0.3 ms" in md
    assert "| matmul_add_relu bfloat16 | 8 × 2048×2048 @ 2048×2048 | 2 ms (137 TFLOP/s)" in md
