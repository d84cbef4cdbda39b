"""Each script of examples/ runs as a user runs it (a fresh process, any working directory),
checks its own results against torch and exits 0: on the GPU where there is one, else on the
CPU backend."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_checks_itself(script, tmp_path):
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ": ok" in r.stdout, r.stdout
