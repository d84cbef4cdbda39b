"""The compile cache as an unprivileged user sees it (issue 15, findings 1, 4 and 10): a
read-only cache whose entries are stale, truncated or not files; a cache directory of another
user. Run as root, each scenario switches to `nobody` in a subprocess (root passes every
permission check); run as another user, it runs as that user."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import kernelkit as kk

pytestmark = pytest.mark.slow

ROOT = os.geteuid() == 0
NOBODY = 65534

# Everything a kernel call imports is imported before the switch (root's Python is not
# readable by nobody): a call of a warm-up kernel, from a cache of root's, and the fast path.
PRELUDE = textwrap.dedent("""
    import os, sys, tempfile
    import torch, kernelkit as kk
    from kernelkit import fastcall

    def call(name, factor):
        k = kk.metal_kernel(name=name, input_names=["a"], output_names=["out"],
                            source=f"uint i = thread_position_in_grid.x; out[i] = a[i] * {factor};")
        a = torch.randn(64)
        out = k(inputs=[a], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                output_dtypes=[torch.float32])[0]
        assert torch.equal(out, a * factor), (name, factor, out[:4], a[:4])

    call("warm", 1.0)
    fastcall.module()
    cache_dir, home = sys.argv[1], sys.argv[2]
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(%(nobody)d)
        os.setuid(%(nobody)d)
    os.environ.update(KERNELKIT_CACHE_DIR=cache_dir, HOME=home, XDG_CACHE_HOME=home + "/.cache",
                      TMPDIR=home + "/tmp")
    tempfile.tempdir = None
""") % {"nobody": NOBODY}


@pytest.fixture(scope="module")
def warm_cache():
    with tempfile.TemporaryDirectory(prefix="kernelkit-test-warm-") as d:
        yield d


@pytest.fixture
def place():
    """A directory that nobody can reach (pytest's own are root's, mode 0700), and a home in it
    that belongs to the user the scenario runs as."""
    top = Path(tempfile.mkdtemp(prefix="kernelkit-test-"))
    top.chmod(0o755)
    home = top / "home"
    (home / "tmp").mkdir(parents=True)
    if ROOT:
        for p in (home, home / "tmp"):
            os.chown(p, NOBODY, NOBODY)
    try:
        yield top, home
    finally:
        for d in [top, *(p for p in top.rglob("*") if p.is_dir() and not p.is_symlink())]:
            d.chmod(0o700)  # the read-only cache's directories, for a user other than root
        shutil.rmtree(top)


def unprivileged(script: str, cache_dir: Path, home: Path, warm: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERNELKIT_CACHE_DIR=warm)
    command = [sys.executable, "-c", PRELUDE + textwrap.dedent(script), str(cache_dir), str(home)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _call(name: str, factor: float) -> None:
    k = kk.metal_kernel(name=name, input_names=["a"], output_names=["out"],
                        source=f"uint i = thread_position_in_grid.x; out[i] = a[i] * {factor};")
    a = torch.randn(64)
    out = k(inputs=[a], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
            output_dtypes=[torch.float32])[0]
    assert torch.equal(out, a * factor)


def _entry_of(root: Path, kernel: str) -> Path:
    found = [p for p in root.rglob("*.so")
             if f"custom_kernel_{kernel}(" in p.with_name(p.name + ".src").read_text()]
    assert len(found) == 1, (kernel, found)
    return found[0]


def test_a_read_only_cache_never_loads_a_bad_entry(place, warm_cache, monkeypatch):
    """Finding 1: an entry that fails its check in a cache that cannot be written is rebuilt and
    loaded from the fresh build, never from the file at the entry's path: another kernel's
    entry (stale code), a truncated file (SIGBUS), a directory. Finding 10: the private copies
    loaded meanwhile are gone afterwards."""
    top, home = place
    cache = top / "cache"
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(cache))
    tag = os.urandom(4).hex()  # kernels new to this process: their entries get written
    kernels = {f"ro_ok_{tag}": 2.0, f"ro_stale_{tag}": 3.0, f"ro_trunc_{tag}": 4.0, f"ro_dir_{tag}": 5.0}
    for name, factor in kernels.items():
        _call(name, factor)
    good = _entry_of(cache, f"ro_ok_{tag}")
    _entry_of(cache, f"ro_stale_{tag}").write_bytes(good.read_bytes())
    truncated = _entry_of(cache, f"ro_trunc_{tag}")
    truncated.write_bytes(truncated.read_bytes()[:1000])
    folder = _entry_of(cache, f"ro_dir_{tag}")
    folder.unlink()
    folder.mkdir()
    before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    for p in [cache, *cache.rglob("*")]:
        if ROOT:
            os.chown(p, NOBODY, NOBODY)
        p.chmod(0o500 if p.is_dir() else 0o400)

    r = unprivileged(f"""
        for name, factor in {kernels!r}.items():
            call(name, factor)
        left = os.listdir(os.environ["TMPDIR"])
        assert left == [], left
        print("ok")
    """, cache, home, warm_cache)
    assert r.stdout.strip() == "ok", r.stderr
    assert "not using the compile cache" not in r.stderr, r.stderr  # read-only is not untrusted
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == before
    assert folder.is_dir()


@pytest.mark.skipif(not ROOT, reason="needs root to make a directory of another user")
def test_a_cache_directory_of_another_user_is_refused(place, warm_cache):
    """Finding 4: whoever owns the cache directory can plant binaries in it: another user's
    directory is refused with a warning, and the user's own private cache (created 0700 whatever
    the umask) is used instead."""
    top, home = place
    theirs = top / "theirs"
    theirs.mkdir(mode=0o755)
    r = unprivileged("""
        import stat
        from pathlib import Path
        os.umask(0)
        call("refused", 6.0)  # kernelkit's warning goes to stderr (logging's last resort)
        own = Path(os.environ["XDG_CACHE_HOME"]) / "kernelkit"
        for d in (own, own / kk.__version__, *own.glob(kk.__version__ + "/??")):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        assert stat.S_IMODE((own / kk.__version__ / "hmac.key").stat().st_mode) == 0o600
        print("ok")
    """, theirs, home, warm_cache)
    assert r.stdout.strip() == "ok", r.stderr
    assert (f"not using the compile cache directory {theirs} (is owned by uid 0, not by this user "
            f"(uid {NOBODY}))") in r.stderr
    assert f"Using {home}/.cache/kernelkit instead" in r.stderr
    assert list(theirs.iterdir()) == []
