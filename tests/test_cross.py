"""Compiling for a GPU without one: kk.compile_for and `kernelkit check` (NVRTC needs no GPU)."""

import subprocess
import sys

import pytest
import torch

import kernelkit as kk

# NVRTC comes with the cuda extra; CI's wheel job installs kernelkit without it.
pytest.importorskip("cuda.bindings", reason='compiling for a GPU needs pip install "kernelkit[cuda]"')

EXP = "uint i = thread_position_in_grid.x; out[i] = metal::exp(T(inp[i]));"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compile_for_an_architecture(arch):
    k = kk.metal_kernel("cross_exp", ["inp"], ["out"], EXP)
    compiled = kk.compile_for(k, arch, inputs=[torch.empty(8, device="meta", dtype=torch.float16)],
                              output_dtypes=[torch.float16], template=[("T", torch.float32)],
                              output_shapes=[(8,)], grid=(8, 1, 1), threadgroup=(8, 1, 1))
    assert compiled.arch == arch and compiled.name == "cross_exp"
    assert compiled.binary[:4] == b"\x7fELF" and "custom_kernel_cross_exp" in compiled.source


def test_compile_for_reports_the_users_line():
    k = kk.metal_kernel("cross_bad", ["inp"], ["out"],
                        "uint i = thread_position_in_grid.x;\nout[i] = no_such_function(inp[i]);")
    with pytest.raises(kk.CompileError, match=r"kernel 'cross_bad' for sm_90 failed to compile(.|\n)*"
                                              r"body line 2: out\[i\] = no_such_function"):
        kk.compile_for(k, "sm_90", inputs=[torch.empty(4)], output_dtypes=[torch.float32])
    with pytest.raises(ValueError, match="arch must name an NVIDIA architecture"):
        kk.compile_for(k, "hopper", inputs=[torch.empty(4)], output_dtypes=[torch.float32])
    with pytest.raises(TypeError, match=r"unknown call arguments \['grids'\]"):
        kk.compile_for(k, "sm_90", inputs=[torch.empty(4)], output_dtypes=[torch.float32], grids=1)


SCRIPT = """
import sys, torch, kernelkit as kk
host = len(sys.argv) > 1 and sys.argv[1] == "host-only"
header = "#include <vector>\\ninline float first(float v) { std::vector<float> a{v}; return a[0]; }" \\
    if host else "inline float first(float v) { return v; }"
k = kk.metal_kernel("script_kernel", ["inp"], ["out"],
                    "uint i = thread_position_in_grid.x; out[i] = first(inp[i]) * 2.0f;", header=header)
x = torch.randn(16)
out = k(inputs=[x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
        output_dtypes=[torch.float32])[0]
assert torch.allclose(out, 2 * x)
print("ran", sys.argv[1:])
"""


@pytest.mark.slow
def test_kernelkit_check_runs_the_script_and_compiles_its_kernels(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "kernelkit", "check", "--arch", "sm_80", "--arch",
                          "sm_90", str(script), "plain"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "ran ['plain']" in run.stdout
    assert "1 kernel(s) compiled for sm_80, sm_90: script_kernel" in run.stderr
    # A kernel the CPU compiles (the C++ library) but NVRTC cannot: check says so, exits 1
    run = subprocess.run([sys.executable, "-m", "kernelkit", "check", str(script), "host-only"],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "kernel 'script_kernel' for sm_90 failed to compile" in run.stderr
