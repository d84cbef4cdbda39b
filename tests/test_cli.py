"""The `kernelkit` command, run as users run it: `python -m kernelkit ...` in a fresh process."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit import cache
from kernelkit.benchmarks import Progress, have_matplotlib
from kernelkit.benchmarks.report import _ms
from kernelkit.cache import CompileCache

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


def cache_cmd(*args, capsys) -> subprocess.CompletedProcess:
    """`kernelkit cache ...` run in this process on the test's KERNELKIT_CACHE_DIR (a new
    interpreter would cost seconds to import torch)."""
    from kernelkit.cli import main
    capsys.readouterr()
    returncode = main(["cache", *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["kernelkit", "cache", *args], returncode, out, err)


def _entries_of_two_versions(root: Path, monkeypatch, old_version: str = "0.0.1") -> None:
    """An entry of this kernelkit, written by the cache itself, and an older version's directory
    as that version left it (marked, one entry)."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(root))
    CompileCache().get("ab" + "0" * 62, ".so", "template <typename T> void custom_kernel_myexp() {}",
                       lambda: b"\0" * 2000)
    old = root / old_version
    (old / "cd").mkdir(parents=True)
    (old / cache.MARKER).write_text(cache._MARKER_START.format(old_version) + ", as an older text said\n")
    (old / "cd" / ("cd" + "1" * 62 + ".cubin")).write_bytes(b"\0" * 500)


def test_cache_info_list_clear(tmp_path, monkeypatch, capsys):
    _entries_of_two_versions(tmp_path, monkeypatch)
    current = tmp_path / kernelkit.__version__

    r = kernelkit_cmd("cache", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path}: 3 files" in r.stdout and "(limit 1.0 GiB)" in r.stdout
    assert f"{kernelkit.__version__}/ (this kernelkit): 2 files" in r.stdout
    assert "0.0.1/ (another kernelkit version): 1 file, 500 B" in r.stdout

    r = cache_cmd("list", capsys=capsys)
    assert r.returncode == 0, r.stderr
    assert any("ab000000" in line and "cpu" in line and "myexp" in line for line in r.stdout.splitlines())
    assert any("cd111111" in line and "cuda" in line for line in r.stdout.splitlines())

    r = cache_cmd("clear", "--stale", capsys=capsys)
    assert r.returncode == 0 and "removed 1 other kernelkit versions' files" in r.stdout, r.stdout
    assert not (tmp_path / "0.0.1").exists() and len(list(current.glob("ab/ab*"))) == 2

    copies = {}  # private copies of libraries being loaded: one a crashed process left, one in use
    for name, age in (("abcdefgh", 7200), ("ijklmnop", 0)):
        copy = current / f".load-{name}" / ("ef" + "3" * 62 + ".so")
        copy.parent.mkdir()
        copy.write_bytes(b"\0")
        os.utime(copy.parent, (time.time() - age, time.time() - age))
        copies[name] = copy
    r = cache_cmd("clear", capsys=capsys)
    assert r.returncode == 0 and "removed 2 files" in r.stdout, r.stdout
    assert not copies["abcdefgh"].parent.exists() and copies["ijklmnop"].exists()
    copies["ijklmnop"].unlink()
    copies["ijklmnop"].parent.rmdir()
    assert sorted(p.name for p in tmp_path.rglob("*")) == [kernelkit.__version__, cache.MARKER,
                                                           cache.KEY_FILE]  # kept for running processes


def test_cache_info_with_a_bad_size_cap_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KERNELKIT_CACHE_MAX", "lots")
    r = cache_cmd(capsys=capsys)
    assert r.returncode == 2 and r.stderr.startswith("kernelkit cache: KERNELKIT_CACHE_MAX='lots' is not a "
                                                    "size"), r.stderr


def test_cache_clear_never_removes_what_is_not_kernelkits(tmp_path, monkeypatch, capsys):
    """Issue 15, finding 3: KERNELKIT_CACHE_DIR=~/.cache, an easy mistake, must cost no user file."""
    root = tmp_path / ".cache"
    entry_name = "ab" + "2" * 62 + ".so"
    user = {"notes.txt": b"mine", "pip/wheel.whl": b"wheel",
            "0.0.1/notes.txt": b"a folder named like a version",
            f"0.0.2/ab/{entry_name}": b"named like an entry, in a folder kernelkit never marked",
            f"{kernelkit.__version__}/mine.txt": b"in the folder kernelkit adopts",
            f"{kernelkit.__version__}/ab/notes.txt": b"in a folder named like a shard",
            f"{kernelkit.__version__}/zz/x.so": b"a library of the user's",
            "0.0.3/keep.txt": b"beside an old kernelkit's entries"}
    for rel, data in user.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"outside the cache")
    _entries_of_two_versions(root, monkeypatch, old_version="0.0.3")  # beside keep.txt
    os.symlink(precious, root / kernelkit.__version__ / "ab" / entry_name)  # an entry's name, not a file

    def untouched():
        assert {rel: (root / rel).read_bytes() for rel in user} == user
        assert precious.read_bytes() == b"outside the cache"

    r = cache_cmd(capsys=capsys)
    assert r.returncode == 0, r.stderr
    listed = {line.split("/")[0].strip() for line in r.stdout.splitlines()[1:]}
    assert listed == {"0.0.3", kernelkit.__version__}, r.stdout

    r = cache_cmd("clear", "--stale", capsys=capsys)
    assert r.returncode == 0 and "removed 1 other kernelkit versions' files" in r.stdout, r.stdout
    untouched()
    assert not (root / "0.0.3" / cache.MARKER).exists() and not (root / "0.0.3" / "cd").exists()

    r = cache_cmd("clear", capsys=capsys)
    assert r.returncode == 0 and "removed 2 files" in r.stdout, r.stdout
    untouched()
    assert (root / kernelkit.__version__ / "ab" / entry_name).is_symlink()


@pytest.mark.slow
def test_doctor_check_fails_with_the_compilers_message(tmp_path):
    """Issue 15, finding 9: a failed check exits non-zero and says what the compiler said."""
    silent = tmp_path / "silent-c++"
    silent.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'silent c++ 1.0' && exit 0\nexit 3\n")
    silent.chmod(0o755)
    r = kernelkit_cmd("doctor", "--check", cache=tmp_path / "cache", env={"CXX": str(silent)})
    assert r.returncode == 1, r.stdout + r.stderr
    check = next(line for line in r.stdout.splitlines() if "run on cpu" in line)
    assert f"CompileError: `{silent} " in check and "exited with status 3 and printed nothing" in check

    r = kernelkit_cmd("doctor", "--check", cache=tmp_path / "cache", env={"CXX": "/bin/false"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[ok] C++ compiler" not in r.stdout
    for line in ("C++ compiler", "run on cpu"):
        found = next(x for x in r.stdout.splitlines() if line in x)
        assert "`/bin/false --version` exited with status 1" in found, found


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
    assert "| forward | 0.259 ms | 0.254 ms | 1.02× |" in r.stdout  # h100/grid_sample.json
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
    from kernelkit.benchmarks import report
    monkeypatch.setattr(report, "have_matplotlib", lambda: False)  # where write_results looks it up
    result = {"benchmark": "overhead", "device": "cpu", "date": "2026-01-01", "command": "kernelkit bench",
              "kernelkit_call_us": 9.0, "torch_add__us": 2.0, "torch_empty_us": 1.0}
    written, notes = report.write_results({"overhead": result}, tmp_path)
    assert notes == [report.MATPLOTLIB_NOTE]
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
