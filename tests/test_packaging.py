"""What a user installs: the wheel's files and metadata, the fast-call extension built at install,
the CPU backend without NVIDIA's wheels, the version flag.

CI runs this file twice: in the editable install (the wheel is built from the source tree and
opened), and against a wheel installed into a fresh virtual environment (the installed package
is compared with the source tree).
"""

import email
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kernelkit
from kernelkit import fastcall

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "kernelkit"
INSTALLED = Path(kernelkit.__file__).resolve().parent
EDITABLE = INSTALLED == SOURCE
BUILT = (".pyc", ".so", ".pyd")


def package_files(root: Path) -> set[str]:
    """The package's files, relative to it, without bytecode and built libraries."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in BUILT}


def run(*args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          **kwargs)


def build_wheel(tmp: Path, env: dict | None = None) -> tuple[Path, Path]:
    """A wheel built from a copy of the source tree (pip wheel, no network), and the copy's
    package (colleagues' headers may appear in src/ meanwhile)."""
    if int(importlib.metadata.version("setuptools").split(".")[0]) < 77:
        pytest.skip("building the wheel needs setuptools >= 77 (pyproject's build-system)")
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(SOURCE, tree / "src" / "kernelkit",
                    ignore=shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in BUILT)))
    r = run("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"),
            str(tree), env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = (tmp / "dist").glob("kernelkit-*.whl")
    return path, tree / "src" / "kernelkit"


def wheel_package(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as z:
        return {n[len("kernelkit/"):] for n in z.namelist() if n.startswith("kernelkit/")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_wheel_holds_every_file_and_the_extension(wheel):
    path, source = wheel
    in_package = wheel_package(path)
    extensions = {n for n in in_package if n.startswith("_fastcall.") and n.endswith(BUILT)}
    assert len(extensions) == 1, in_package
    # every header (extension-less ones, every directory), fastcall.cpp, py.typed, the Python
    assert in_package - extensions == package_files(source)
    with zipfile.ZipFile(path) as z:
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())


@pytest.mark.slow
def test_wheel_without_a_compiler_has_no_extension(tmp_path):
    """The extension is optional: without a compiler the wheel still builds, with every file
    (kernelkit then builds fastcall.cpp on first use, or takes the Python path)."""
    fail = "/bin/false"
    path, source = build_wheel(tmp_path, {"CC": fail, "CXX": fail, "LDSHARED": fail,
                                          "LDCXXSHARED": fail})
    assert wheel_package(path) == package_files(source)


@pytest.mark.slow
def test_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel[0]) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        msg = email.message_from_bytes(z.read(meta))
    assert msg["Version"] == kernelkit.__version__
    assert msg["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in msg.get_all("Classifier")
    requires = msg.get_all("Requires-Dist")
    plain = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split(">")[0] for r in plain) == ["numpy", "torch"]  # the CPU backend's only
    cuda = [r for r in requires if 'extra == "cuda"' in r]
    for name in ("cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
                 "nvidia-cuda-cccl"):
        assert any(r.startswith(name) for r in cuda), name
    assert any(r.startswith("kernelkit[cuda]") and 'extra == "test"' in r for r in requires)


def test_installed_package_matches_the_source_tree():
    if EDITABLE:
        # CI's wheel job sets KERNELKIT_TEST_WHEEL=1: there the tests must not import src/
        assert os.environ.get("KERNELKIT_TEST_WHEEL") != "1", "kernelkit is imported from src/"
        pytest.skip("kernelkit is imported from the source tree (editable install)")
    assert package_files(INSTALLED) == package_files(SOURCE)
    module = fastcall.module()
    assert not isinstance(module, str), module
    assert Path(module.__file__).parent == INSTALLED  # built at install, not at first use


@pytest.mark.skipif(not EDITABLE, reason="kernelkit is installed from a wheel")
def test_editable_install_builds_the_extension_on_first_use():
    """An editable install holds no build of fastcall.cpp that an edit could leave stale."""
    assert not [p for p in SOURCE.glob("_fastcall*") if p.suffix in BUILT]
    module = fastcall.module()
    if isinstance(module, str):
        pytest.skip(f"no extension here: {module}")
    assert Path(module.__file__).parent != SOURCE


# Blocks NVIDIA's Python packages, as on a machine where `kernelkit[cuda]` is not installed.
NO_CUDA = """
import sys
class NoCuda:
    def find_spec(self, name, path=None, target=None):
        if name == "cuda" or name.startswith("cuda."):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, NoCuda())
"""


def test_cpu_backend_without_nvidia_wheels():
    script = NO_CUDA + """
import torch
import kernelkit as kk
from kernelkit.backends import cuda
k = kk.metal_kernel(name="twice", input_names=["inp"], output_names=["out"],
                    source="uint i = thread_position_in_grid.x; out[i] = 2 * inp[i];")
a = torch.arange(8.0)
for _ in range(3):  # the fast path too
    out = k(inputs=[a], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[a.shape],
            output_dtypes=[a.dtype])[0]
assert torch.equal(out, 2 * a)
assert not [m for m in sys.modules if m == "cuda" or m.startswith("cuda.")]
try:
    cuda.compile_source("extern \\"C\\" __global__ void f() {}", "sm_90", "relaxed")
except cuda.CudaUnavailable as e:
    print(e)
"""
    r = run("-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'pip install "kernelkit[cuda]"' in r.stdout
    assert "the CPU backend is available" in r.stdout


def test_doctor_without_nvidia_wheels_names_the_extra():
    r = run("-c", NO_CUDA + "from kernelkit.cli import main; sys.exit(main(['doctor']))")
    assert r.returncode == 0, r.stdout + r.stderr  # the CPU backend is ready
    nvrtc = [line for line in r.stdout.splitlines() if "] NVRTC" in line]
    assert nvrtc and "[ok]" not in nvrtc[0], r.stdout
    assert 'fix: pip install "kernelkit[cuda]"' in r.stdout


def test_missing_nvrtc_library_names_the_extra(monkeypatch):
    bindings = pytest.importorskip("cuda.bindings")
    from kernelkit.backends import cuda

    class NoLibrary:
        @staticmethod
        def nvrtcVersion():
            raise RuntimeError("Failure finding libnvrtc.so")

    monkeypatch.setattr(bindings, "nvrtc", NoLibrary, raising=False)
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", NoLibrary)
    cuda._nvrtc.cache_clear()
    try:
        with pytest.raises(cuda.CudaUnavailable, match=r'NVRTC not found \(Failure finding libnvrtc.so\): '
                           r'pip install "kernelkit\[cuda\]"'):
            cuda._nvrtc()
    finally:
        cuda._nvrtc.cache_clear()


@pytest.mark.parametrize("command", [["-m", "kernelkit"], ["-c", "from kernelkit.cli import main; main()"]])
def test_version_flag(command):
    r = run(*command, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"kernelkit {kernelkit.__version__}"
    assert importlib.metadata.version("kernelkit") == kernelkit.__version__


def test_public_api_is_typed_and_documented():
    assert (INSTALLED / "py.typed").is_file()
    for f in (kernelkit.metal_kernel, kernelkit.cuda_kernel):
        hints = f.__annotations__
        assert {"name", "input_names", "output_names", "source", "return"} <= set(hints), f
        for arg in f.__code__.co_varnames[:f.__code__.co_argcount]:
            assert f"{arg}:" in f.__doc__, (f.__name__, arg)
        assert "Example:" in f.__doc__


def test_bench_writes_under_the_user_data_directory(monkeypatch, tmp_path):
    import torch

    from kernelkit import benchmarks
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert benchmarks.results_dir(torch.device("cpu")) == \
        tmp_path / "kernelkit" / "bench" / benchmarks.device_tag(torch.device("cpu"))
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert benchmarks.results_dir(torch.device("cpu")).is_relative_to(tmp_path / ".local" / "share")


def test_license_is_apache():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    if not EDITABLE:
        assert importlib.metadata.metadata("kernelkit")["License-Expression"] == "Apache-2.0"


def test_demo_on_a_gpu_without_the_cuda_extra_runs_on_the_cpu(monkeypatch, capsys):
    import torch

    from kernelkit import cli
    from kernelkit.backends import cuda

    def missing():
        raise cuda.CudaUnavailable(f"NVRTC not found: {cuda.INSTALL}")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_nvrtc", missing)
    assert cli._device(None, "demo") == torch.device("cpu")
    assert 'pip install "kernelkit[cuda]"; running on the CPU' in capsys.readouterr().err
