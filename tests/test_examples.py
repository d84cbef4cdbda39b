"""Each script of examples/ runs as a user runs it (a fresh process, any working directory),
checks its own results against torch and exits 0: on the GPU where there is one, else on the
CPU backend. Without a GPU, its kernels are also compiled for Hopper (sm_90), as every kernel
of the suite is (conftest.py)."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SM90_CHECK

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))
SLOW = {"multi_gpu_ddp"}  # starts two processes: ~10 s on 2 cores
CASES = [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in EXAMPLES]


def test_there_are_examples_and_the_docs_list_each():
    assert len(EXAMPLES) >= 5
    listed = (EXAMPLES[0].parent.parent / "docs" / "quickstart.md").read_text()
    assert not [p.name for p in EXAMPLES if f"`{p.name}`" not in listed]


@pytest.mark.parametrize("script", CASES)
def test_example_runs_and_checks_itself(script, tmp_path):
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ": ok" in r.stdout, r.stdout


# multi_gpu_ddp starts its ranks with mp.spawn: new processes, which conftest's check never sees,
# and run from pytest's process (runpy) a rank once waited in gloo for ever: its kernels are
# grid_sample's and matmul_add_relu's, compiled for sm_90 by the ops' tests.
IN_PROCESS = [p for p in EXAMPLES if p.stem not in SLOW]


@pytest.mark.skipif(not SM90_CHECK, reason="no sm_90 compile check here (a GPU, or KERNELKIT_TEST_SM90=0)")
@pytest.mark.parametrize("script", IN_PROCESS, ids=lambda p: p.stem)
def test_example_kernels_compile_for_hopper(script):
    runpy.run_path(str(script), run_name="__main__")  # in this process: conftest compiles each kernel
