"""The parts of the build pyproject.toml cannot say: every non-Python file of the package as
package data (the prelude headers above all), and the fast-call extension
(src/kernelkit/fastcall.cpp) compiled at install time.

The extension is optional: where the build has no C++ compiler or no Python headers, the wheel
holds none and kernelkit builds it on first use at run time, else takes the pure-Python path
(kernelkit/fastcall.py). Editable installs skip it on purpose, so that an edit to fastcall.cpp
is never shadowed by a stale build in the source tree: there fastcall.py builds it on first
use, keyed by the file's content. Its companions fastcall_torch.cpp and autograd_node.cpp are
package data, never built here: they are bound to the installed torch's C++ ABI, so kernelkit
builds them (into one library) at run time.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = Path("src") / "kernelkit"


def data_files() -> list[str]:
    """Every file of the package that is not Python: the prelude headers under include/
    (extension-less ones such as metal_stdlib and cuda/std/limits too), kernel sources beside
    the ops (.metal, .cu), fastcall.cpp, py.typed. A list of globs would miss each new
    directory; built libraries and bytecode are left out."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc", ".so", ".pyd")
                  and "__pycache__" not in p.parts)


class OptionalBuildExt(build_ext):
    """Skip the extension in editable installs (see above)."""

    def run(self):
        if self.editable_mode:
            self.extensions = []
            return
        super().run()


setup(
    package_data={"kernelkit": data_files()},
    ext_modules=[Extension(
        "kernelkit._fastcall", [str(PACKAGE / "fastcall.cpp")], language="c++", optional=True,
        extra_compile_args=["-std=c++17", "-O3", "-g0", "-fvisibility=hidden"],
    )],
    cmdclass={"build_ext": OptionalBuildExt},
)
