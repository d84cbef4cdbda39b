"""The compile cache: written once, around every backend's `compile(source) -> bytes`.

Memory first, then disk, the compiler only on a miss (MLX's jit_module, tinygrad's
compile_cached). On disk (as CuPy's, and stricter): a root directory this user owns and
nobody else can write (else a private fallback, with a warning); in it one directory per
kernelkit version, marked as kernelkit's by a `CACHEDIR.TAG` file, holding an HMAC key that
only this user can read. An entry is one file, `<key><suffix>`: a magic, the HMAC of
(key, suffix, binary), the binary; its source is saved beside it for debugging. Whoever can
rewrite an entry cannot forge its HMAC, and anything that fails to verify (a truncated or
foreign file, a directory, unreadable bytes) is a miss, never an error. Writes go to a
temporary file that is `os.replace`d. The entries of all versions share a size cap
(`KERNELKIT_CACHE_MAX`, default 1 GiB): the least recently used go first (a hit touches
its entry), never the one just written. Only files with kernelkit's names inside marked
version directories are ever deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import hmac
import logging
import math
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from . import __version__

_LOG = logging.getLogger("kernelkit")  # compiles (info), disk hits (debug), refused directories

_INCLUDE = Path(__file__).resolve().parent / "include"

DEFAULT_MAX_BYTES = 1 << 30
MARKER = "CACHEDIR.TAG"  # the Cache Directory Tagging convention: backup tools skip the directory
# What every kernelkit version's marker starts with (the text after it may change), its version
# the directory's name: `clear --stale` must know older versions' directories.
_MARKER_START = "Signature: 8a477f597d28d172789f06886806bc55\n# kernelkit {}'s compile cache"
_MARKER_TEXT = _MARKER_START + " (kernelkit cache clear removes its entries).\n"
KEY_FILE = "hmac.key"
_KEY_BYTES = 32
_MAGIC = b"KKCACHE1"
_HEADER = len(_MAGIC) + 32  # magic, HMAC-SHA256
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]*")
_SHARD = re.compile(r"[0-9a-f]{2}")
# an entry's binary, its source, and the checksum file of the layout before the HMAC
_ENTRY = re.compile(r"(?P<stem>[0-9a-f]{64}\.[a-z]+)(?P<extra>\.src|\.sha256)?")
_TEMP = re.compile(r"\.tmp-[a-z0-9_]{8}")  # tempfile.mkstemp(prefix=".tmp-")
_LOADING = re.compile(r"\.load-[a-z0-9_]{8}")  # private_dir(): a library's copy while it loads
_RECOUNT = 600  # seconds between counts of the cache's size by one process (DiskCache.write)
_LOADING_LEFT_AFTER = 3600  # seconds: older ones are a crashed process's, which clear removes
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def cache_dir() -> Path:
    """The configured cache root: $KERNELKIT_CACHE_DIR, else the user's cache directory."""
    root = os.environ.get("KERNELKIT_CACHE_DIR")
    return Path(root).expanduser() if root else _default_dir()


def _default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelkit"


def max_bytes() -> int | None:
    """The size cap of the disk cache in bytes ($KERNELKIT_CACHE_MAX); None: no cap."""
    text = os.environ.get("KERNELKIT_CACHE_MAX", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"KERNELKIT_CACHE_MAX={text!r} is not a size: expected bytes with an "
                         "optional K, M, G or T suffix (e.g. 512M or 2G), or 0 for no limit.")
    return int(float(m[1]) * _UNITS[m[2].lower()]) or None


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


# --- files and directories ----------------------------------------------------------------------

def _unsafe(st: os.stat_result) -> str | None:
    """Why a directory with this stat may not hold this user's cache; None if it may."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _owned_dir(path: Path, tighten: bool) -> str | None:
    """Make `path` a directory only this user can write (new ones are created 0700); why it
    cannot be, or None. `tighten`: a directory of kernelkit's own that this user owns but others
    may write is made 0700 (a user's own directory is refused instead)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot be created ({e.strerror})"
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    problem = _unsafe(st)
    if problem and tighten and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        try:
            os.chmod(path, 0o700)
            return None
        except OSError:
            pass
    return problem


def _read_regular(path: Path, private: bool = False) -> bytes | None:
    """The bytes of a regular file (symlinks not followed, a FIFO never waited on); None for
    anything else or any error. `private`: only a file this user owns and nobody else can
    read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if private and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _temp_file(directory: Path, data: bytes) -> str:
    """A new file (mode 0600) in `directory` holding `data`: its path."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _temp_file(path.parent, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _marked(directory: Path) -> bool:
    data = _read_regular(directory / MARKER)
    return data is not None and data.startswith(_MARKER_START.format(directory.name).encode())


def _signing_key(directory: Path) -> bytes | None:
    """The HMAC key of a version directory (32 random bytes in a file only this user can read
    or write), made on first use, along with the directory's marker; None where there is none
    and none can be made (a read-only cache: then nothing in it verifies)."""
    path = directory / KEY_FILE
    if not _marked(directory):
        try:
            _atomic_write(directory / MARKER, _MARKER_TEXT.format(directory.name).encode())
        except OSError:  # a read-only cache; or the marker's name is taken: the key still works
            pass
    key = _read_regular(path, private=True)
    if key is not None and len(key) == _KEY_BYTES:
        return key
    try:
        tmp = _temp_file(directory, os.urandom(_KEY_BYTES))
        try:
            try:
                os.link(tmp, path)  # never replaces: of processes starting together, one key wins
            except FileExistsError:
                key = _read_regular(path, private=True)
                if key is None or len(key) != _KEY_BYTES:  # a foreign or damaged key file
                    os.replace(tmp, path)
        finally:
            _unlink(tmp)
    except OSError:
        pass
    key = _read_regular(path, private=True)
    return key if key is not None and len(key) == _KEY_BYTES else None


def _mac(secret: bytes, key: str, suffix: str, binary: bytes) -> bytes:
    h = hmac.new(secret, key.encode() + b"\0" + suffix.encode() + b"\0", hashlib.sha256)
    h.update(binary)
    return h.digest()


# --- what kernelkit has on disk ------------------------------------------------------------------

@dataclass
class Entry:
    """One cache entry: its binary's path (which may be gone), every file it has, their size, and
    when it was last used."""
    version: str
    path: Path
    files: list[Path]
    size: int
    used: float


def version_dirs(root: Path) -> list[Path]:
    """kernelkit's version directories under `root`: a version's name, and kernelkit's marker."""
    try:
        with os.scandir(root) as it:
            found = [Path(e.path) for e in it
                     if _VERSION.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return sorted(d for d in found if _marked(d))


def _shards(version_dir: Path) -> list[str]:
    try:
        with os.scandir(version_dir) as it:
            return sorted(e.path for e in it if _SHARD.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _own_files(version_dir: Path) -> Iterator[tuple[os.DirEntry, re.Match | None]]:
    """Regular files with kernelkit's names in a version directory's shard directories: entries
    (with their name's match) and temporary files (None)."""
    for shard in _shards(version_dir):
        try:
            with os.scandir(shard) as it:
                files = list(it)
        except OSError:
            continue
        for f in files:
            m = _ENTRY.fullmatch(f.name)
            if (m or _TEMP.fullmatch(f.name)) and f.is_file(follow_symlinks=False):
                yield f, m


def entries(root: Path) -> list[Entry]:
    """Every entry of every kernelkit version under `root` (temporary files not included)."""
    found: dict[str, Entry] = {}
    for d in version_dirs(root):
        for f, m in _own_files(d):
            if m is None:
                continue
            try:
                st = f.stat(follow_symlinks=False)
            except OSError:
                continue
            path = os.path.join(os.path.dirname(f.path), m["stem"])
            e = found.setdefault(path, Entry(d.name, Path(path), [], 0, 0.0))
            e.files.append(Path(f.path))
            e.size += st.st_size
            if m["extra"] is None:
                e.used = st.st_mtime
    return sorted(found.values(), key=lambda e: e.path)


def usage(root: Path) -> list[tuple[str, int, int]]:
    """(version, files, bytes) per kernelkit version directory under `root`."""
    rows = {d.name: [0, 0] for d in version_dirs(root)}
    for e in entries(root):
        rows[e.version][0] += len(e.files)
        rows[e.version][1] += e.size
    return [(v, n, size) for v, (n, size) in rows.items()]


def _crashed_loads(version_dir: Path) -> list[str]:
    """private_dir()s that a process left behind (it crashed while loading a library)."""
    try:
        with os.scandir(version_dir) as it:
            found = [e for e in it if _LOADING.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        old = time.time() - _LOADING_LEFT_AFTER
        return [e.path for e in found if e.stat(follow_symlinks=False).st_mtime < old]
    except OSError:
        return []


def clear(root: Path, stale: bool = False) -> tuple[int, int]:
    """Remove kernelkit's entries under `root` (with `stale`, only other versions'): (files,
    bytes) removed. Other versions' directories go entirely (their marker and key too); this
    version keeps its marker and key, which running processes use. Nothing else is touched."""
    removed = size = 0
    for d in version_dirs(root):
        current = d.name == __version__
        if stale and current:
            continue
        for f, _ in _own_files(d):
            try:
                n = f.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            if _unlink(f.path):
                removed, size = removed + 1, size + n
        crashed = _crashed_loads(d)
        for loading in crashed:
            try:
                with os.scandir(loading) as it:
                    copies = [f.path for f in it
                              if _ENTRY.fullmatch(f.name) and f.is_file(follow_symlinks=False)]
            except OSError:
                continue
            for f in copies:
                _unlink(f)
        for folder in [*_shards(d), *crashed]:
            try:
                os.rmdir(folder)  # only if empty: whatever else is there stays
            except OSError:
                pass
        if not current:
            for name in (KEY_FILE, MARKER):
                _unlink(d / name)
            try:
                os.rmdir(d)
            except OSError:
                pass
    return removed, size


# --- the disk cache ---------------------------------------------------------------------------

class DiskCache:
    """This kernelkit version's directory under a checked root."""

    def __init__(self, root: Path, refused: str | None = None):
        self.root = root
        self.directory = root / __version__
        self.refused = refused  # why the configured directory was not used (a fallback's), or None
        self._secret: bytes | None = None
        # Bytes of all entries as last counted plus what this process wrote since, and when they
        # were counted: a count walks every entry (~0.1 s for thousands), so it is made on this
        # process's first write, when the estimate passes the cap, and every _RECOUNT seconds
        # (other processes write too).
        self._size, self._counted = 0, -math.inf

    def path(self, key: str, suffix: str) -> Path:
        return self.directory / key[:2] / (key + suffix)

    def read(self, key: str, suffix: str) -> bytes | None:
        """The verified binary of an entry, or None (a miss) for anything else."""
        if self._secret is None:
            self._secret = _signing_key(self.directory)
            if self._secret is None:
                return None
        path = self.path(key, suffix)
        data = _read_regular(path)
        if data is None or len(data) < _HEADER or not data.startswith(_MAGIC):
            return None
        binary = data[_HEADER:]
        if not hmac.compare_digest(data[len(_MAGIC):_HEADER], _mac(self._secret, key, suffix, binary)):
            return None
        try:
            os.utime(path)  # used now: the size cap evicts the least recently used first
        except OSError:
            pass
        return binary

    def write(self, key: str, suffix: str, binary: bytes, source: str, limit: int | None) -> bool:
        """Store an entry (then evict down to `limit` bytes); False where the cache cannot be
        written (read-only, full, or cleared meanwhile): it costs a compile next time, nothing
        else."""
        path = self.path(key, suffix)
        try:
            # the directory may have been removed since (`kernelkit cache clear --stale` of a
            # newer version): made again, with a fresh key
            if _owned_dir(self.directory, tighten=True) is not None:
                return False
            self._secret = _signing_key(self.directory)
            if self._secret is None:
                return False
            if _owned_dir(path.parent, tighten=True) is not None:
                return False
            _atomic_write(path.with_name(path.name + ".src"), source.encode())
            _atomic_write(path, _MAGIC + _mac(self._secret, key, suffix, binary) + binary)
            _unlink(path.with_name(path.name + ".sha256"))  # the checksum of the layout before
        except OSError:
            return False
        self._size += _HEADER + len(binary) + len(source)
        if limit is not None and (self._size > limit or time.monotonic() > self._counted + _RECOUNT):
            self._size, self._counted = self.evict(limit, keep=path), time.monotonic()
        return True

    def evict(self, limit: int, keep: Path) -> int:
        """Remove the least recently used entries of every kernelkit version under the root until
        they fit in `limit` bytes; never `keep` (the entry just written). The bytes left."""
        found = entries(self.root)
        total = sum(e.size for e in found)
        for e in sorted(found, key=lambda e: e.used):
            if total <= limit:
                break
            if e.path == keep:
                continue
            for f in sorted(e.files, key=lambda f: f != e.path):  # the binary first: never half an entry
                _unlink(f)
            total -= e.size
        return total


def _warn(message: str) -> None:
    _LOG.warning("kernelkit: %s", message)


def _open(configured: Path) -> DiskCache | str:
    """The configured root if this user owns it and nobody else can write it, else the first
    such of the user's default cache directory and a per-user directory in the temporary
    directory (with a warning); where none is, why (also warned: there is no disk cache)."""
    candidates = {configured: not os.environ.get("KERNELKIT_CACHE_DIR")}  # root: kernelkit's own
    for fallback in (_default_dir(), Path(tempfile.gettempdir()) / f"kernelkit-cache-{os.geteuid()}"):
        candidates.setdefault(fallback, True)
    problems: list[str] = []
    for root, ours in candidates.items():
        problem = _owned_dir(root, tighten=ours)
        if problem is None:
            problem = _owned_dir(root / __version__, tighten=True)
            if problem is not None:
                problem = f"holds {root / __version__}, which {problem}"
        if problem is None:
            refused = "; ".join(problems) or None
            if refused:
                _warn(f"not using the compile cache directory {refused}: whoever can write there "
                      f"could plant binaries that kernelkit loads. Using {root} instead; set "
                      "KERNELKIT_CACHE_DIR to a directory that only you can write (mode 0700).")
            return DiskCache(root, refused)
        problems.append(f"{root} ({problem})")
    why = f"no compile cache directory can be used ({'; '.join(problems)})"
    _warn(f"{why}: every process compiles its kernels again. Set KERNELKIT_CACHE_DIR to a "
          "directory that only you can write (mode 0700).")
    return why


@contextlib.contextmanager
def private_dir() -> Iterator[str]:
    """A new directory (mode 0700) for this caller alone, removed afterwards: in the disk cache's
    version directory where it can be written (its filesystem lets code run, which a noexec
    /tmp does not), else in the temporary directory."""
    store = disk()
    try:
        path = tempfile.mkdtemp(prefix=".load-", dir=store.directory) if store else None
    except OSError:  # a read-only cache
        path = None
    path = path or tempfile.mkdtemp(prefix="kernelkit-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_disks: dict[tuple[str, int], DiskCache | str] = {}
_disks_lock = threading.Lock()


def _resolved() -> DiskCache | str:
    """_open() of the configured directory, once per process."""
    memo = (str(cache_dir()), os.geteuid())
    found = _disks.get(memo)
    if found is None:
        with _disks_lock:
            found = _disks.get(memo)
            if found is None:
                found = _disks[memo] = _open(Path(memo[0]))
    return found


def disk() -> DiskCache | None:
    """This user's disk cache for the configured directory; None where there is none."""
    found = _resolved()
    return found if isinstance(found, DiskCache) else None


def no_disk_reason() -> str | None:
    """Why there is no disk cache (as warned), or None where there is one."""
    found = _resolved()
    return found if isinstance(found, str) else None


_holding = threading.local()  # .lock: this thread holds a build lock


@contextlib.contextmanager
def _build_lock(shard: Path | None) -> Iterator[None]:
    """Held while this process builds an entry of `shard`, so that processes sharing the cache
    compile each kernel once: an flock on the shard directory (no lock file to leave behind;
    the system releases it should the process die). Where none can be had, nothing is held: at
    worst a kernel is compiled twice. A build inside a build takes none (no self-deadlock)."""
    if shard is None or getattr(_holding, "lock", False):
        yield
        return
    fd = _locked(shard)
    _holding.lock = fd is not None
    try:
        yield
    finally:
        _holding.lock = False
        if fd is not None:
            os.close(fd)  # releases the flock


def _locked(directory: Path) -> int | None:
    """A descriptor of `directory` (made 0700 where missing: it is inside the version directory,
    which only this user can write) holding an exclusive flock; None where it cannot be had."""
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


class CompileCache:
    def __init__(self):
        self._memory: dict[str, bytes] = {}
        self._building: dict[str, threading.Lock] = {}  # key -> held while one thread builds it
        self._lock = threading.Lock()

    def get(self, key: str, suffix: str, source: str, build: Callable[[], bytes]) -> bytes:
        """The binary for `key`, building (and storing) it on a miss; threads that miss the same
        key meanwhile wait for that build. The bytes come from memory, from the compiler, or from
        a disk entry verified here, in this call: a caller that needs a file writes its own from
        them (backends/cpu.py)."""
        binary = self._memory.get(key)
        if binary is not None:
            return binary
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        with building:
            binary = self._memory.get(key)
            if binary is None:
                try:
                    binary = self._load_or_build(key, suffix, source, build)
                    with self._lock:
                        self._memory[key] = binary
                finally:
                    with self._lock:
                        self._building.pop(key, None)
        return binary

    def _load_or_build(self, key: str, suffix: str, source: str, build: Callable[[], bytes]) -> bytes:
        store = disk()
        binary = store.read(key, suffix) if store else None
        if binary is None:
            limit = max_bytes()  # a bad KERNELKIT_CACHE_MAX fails before the compiler runs
            # other processes missing the entry (the ranks of a distributed job) wait, then read it
            with _build_lock(store.path(key, suffix).parent if store else None):
                binary = store.read(key, suffix) if store else None
                if binary is None:
                    start = time.perf_counter()
                    binary = build()
                    _LOG.info("compiled %s%s in %.2f s", key[:16], suffix, time.perf_counter() - start)
                    if store:
                        store.write(key, suffix, binary, source, limit)
                    return binary
        _LOG.debug("compile cache hit on disk: %s%s", key[:16], suffix)
        return binary

    def clear(self, stale: bool = False) -> tuple[int, int]:
        """Remove kernelkit's entries from disk (`stale`: other versions' only) and, unless
        `stale`, from memory: (files, bytes) removed from disk."""
        store = disk()
        removed = clear(store.root, stale) if store else (0, 0)
        if not stale:
            with self._lock:
                self._memory.clear()
        return removed


CACHE = CompileCache()
