"""The documentation's code runs as written, on a machine without a GPU too: every ```python
block of README.md and of the documentation site's pages (docs/), and the examples in the
public API's docstrings.

The blocks of one page run in order in one namespace, as a reader would run them.
"""

import re
import textwrap
from pathlib import Path

import pytest

import kernelkit
from kernelkit.backends.cuda import CudaUnavailable

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def blocks(text: str) -> list[tuple[int, str]]:
    """(line number, dedented code) of each ```python block."""
    return [(text.count("\n", 0, m.start()) + 2, textwrap.dedent(m.group(2)))
            for m in FENCE.finditer(text)]


def run_blocks(text: str, where: str) -> None:
    namespace: dict = {"__name__": "__readme__"}
    for line, code in blocks(text):
        # compiled with the block's line numbers: a traceback points into the page
        try:
            exec(compile("\n" * (line - 1) + code, where, "exec"), namespace)
        except CudaUnavailable as e:  # a block that compiles for a GPU, where `kernelkit[cuda]` is not installed
            pytest.skip(f"{where} line {line} and after: {e}")


def test_blocks_are_found():
    assert [line for line, _ in blocks("a\n```python\nx = 1\n```\n  ```python\n  y = 2\n  ```\n")] == [3, 6]


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p.read_text())],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_runs(page):
    run_blocks(page.read_text(), str(page.relative_to(ROOT)))


@pytest.mark.parametrize("function", [kernelkit.metal_kernel, kernelkit.cuda_kernel],
                         ids=lambda f: f.__name__)
def test_docstring_example_runs(function):
    assert blocks(function.__doc__), f"{function.__name__}'s docstring has no example"
    run_blocks(function.__doc__, f"{function.__name__}.__doc__")
