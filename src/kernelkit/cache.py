"""The compile cache: written once, around every backend's `compile(source) -> bytes`.

Memory first, then disk, the compiler only on a miss (MLX's jit_module, tinygrad's
compile_cached). On disk (as CuPy's): one directory per kernelkit version; each
entry is the binary, a checksum beside it (a corrupt or half-written binary is a
miss, never a crash), and the source for debugging. Writes go to a temporary
file and are `os.replace`d, so processes sharing the directory never see a
partial file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable

from . import __version__

_INCLUDE = Path(__file__).resolve().parent / "include"


def cache_dir() -> Path:
    root = os.environ.get("KERNELKIT_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelkit"


@functools.lru_cache(maxsize=None)
def prelude_digest() -> str:
    """The prelude headers' contents: the generated source only #includes them. (os.walk, not
    pathlib: this runs in a process's first call, where pathlib cost ~10 ms.)"""
    root = str(_INCLUDE)
    files = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _, names in os.walk(root) for f in names)
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode())
        with open(os.path.join(root, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def key_of(*parts: str) -> str:
    """Everything that changes the binary: source, prelude headers, options, target, compiler,
    kernelkit version."""
    h = hashlib.sha256()
    for part in (__version__, prelude_digest(), *parts):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class CompileCache:
    def __init__(self):
        self._memory: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def directory(self) -> Path:
        return cache_dir() / __version__

    def path(self, key: str, suffix: str) -> Path:
        return self.directory() / key[:2] / (key + suffix)

    def get(self, key: str, suffix: str, source: str, build: Callable[[], bytes]) -> tuple[bytes, Path]:
        """The binary for `key` (and its path on disk), building it on a miss."""
        path = self.path(key, suffix)
        binary = self._memory.get(key)
        if binary is None:
            binary = self._read(path)
            if binary is None:
                binary = build()
                self._write(path, binary, source)
            with self._lock:
                self._memory[key] = binary
        return binary, path

    def _read(self, path: Path) -> bytes | None:
        try:
            binary = path.read_bytes()
            checksum = path.with_name(path.name + ".sha256").read_text()
        except OSError:
            return None
        if hashlib.sha256(binary).hexdigest() != checksum.strip():
            return None
        return binary

    def _write(self, path: Path, binary: bytes, source: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path.with_name(path.name + ".src"), source.encode())
            _atomic_write(path, binary)
            _atomic_write(path.with_name(path.name + ".sha256"), hashlib.sha256(binary).hexdigest().encode())
        except OSError:
            pass  # a read-only or full cache directory costs a recompile next time, nothing else

    def entries(self) -> list[Path]:
        root = cache_dir()
        return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []

    def clear(self) -> int:
        removed = 0
        for p in self.entries():
            try:
                p.unlink()
                removed += 1
            except OSError:
                pass
        with self._lock:
            self._memory.clear()
        return removed


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


CACHE = CompileCache()
