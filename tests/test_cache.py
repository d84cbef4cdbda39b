"""The compile cache (SPEC §2): once per source/options/target, in memory and on disk."""

import hashlib
import os
import re
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import kernelkit as kk
from kernelkit import cache, fastcall
from kernelkit.cache import CACHE, CompileCache

SCRIPT = textwrap.dedent("""
    import sys, torch, kernelkit as kk
    from kernelkit.backends import cpu
    if sys.argv[1] == "forbid-compile":
        def refuse(*a, **k):
            raise SystemExit("compiled although the disk cache holds the kernel")
        cpu.compile_source = refuse
    k = kk.metal_kernel(name="cached", input_names=["a"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = a[i] * 3;")
    out = k(inputs=[torch.arange(8.0)], grid=(8, 1, 1), threadgroup=(8, 1, 1),
            output_shapes=[(8,)], output_dtypes=[torch.float32])[0]
    assert out.tolist() == [3.0 * i for i in range(8)], out
    print("ok")
""")


def _run(tmp_path, mode):
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(tmp_path))
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_fresh_process_finds_the_kernel_on_disk(tmp_path):
    first = _run(tmp_path, "compile")
    assert first.stdout.strip() == "ok", first.stderr
    second = _run(tmp_path, "forbid-compile")
    assert second.stdout.strip() == "ok", second.stderr
    sources = [p for p in tmp_path.rglob("*.src")]
    assert sources and any("custom_kernel_cached" in p.read_text() for p in sources)


@pytest.mark.slow
def test_corrupt_or_truncated_binary_is_a_miss(tmp_path):
    assert _run(tmp_path, "compile").stdout.strip() == "ok"
    binaries = [p for p in tmp_path.rglob("*.so") if "custom_kernel_cached" in
                p.with_name(p.name + ".src").read_text()]
    assert binaries
    for p in binaries:
        p.write_bytes(p.read_bytes()[:100])  # half-written
    again = _run(tmp_path, "compile")
    assert again.stdout.strip() == "ok", again.stderr


@pytest.mark.slow
def test_processes_sharing_the_cache_concurrently(tmp_path):
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, "compile"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert out.strip() == "ok", err


def test_same_name_different_source_never_share_a_binary(device):
    a = kk.metal_kernel(name="same", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] + 1;")
    b = kk.metal_kernel(name="same", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] * 10;")
    x = torch.arange(4.0, device=device)
    args = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[torch.float32])
    ra, rb = a(inputs=[x], **args)[0], b(inputs=[x], **args)[0]  # back to back, no sync between
    assert ra.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rb.tolist() == [0.0, 10.0, 20.0, 30.0]


def test_one_kernel_two_dtypes(device):
    k = kk.metal_kernel(name="twice", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] * 2;")
    for dtype in (torch.float16, torch.float32):
        x = torch.randn(16, device=device).to(dtype)
        out = k(inputs=[x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
                output_dtypes=[dtype])[0]
        assert out.dtype == dtype
        torch.testing.assert_close(out, x * 2)


def test_memory_cache_compiles_once(monkeypatch, device):
    k = kk.metal_kernel(name="once", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] - 1;")
    x = torch.arange(4.0, device=device)
    args = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[torch.float32])
    k(inputs=[x], **args)
    fastcall.module()  # its first build (a background thread) goes through the cache too
    calls = []
    original = CACHE.get
    monkeypatch.setattr(CACHE, "get", lambda *a, **kw: calls.append(a) or original(*a, **kw))
    for _ in range(3):
        k(inputs=[x], **args)
    assert calls == []


# --- the disk cache's trust (issue 15) ---------------------------------------------------------

def _key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


class _Builds:
    """A build function that counts its calls and returns fresh bytes each time."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return os.urandom(64) + b"binary %d" % self.calls


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty cache root of this test's own: (root, this version's directory)."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELKIT_CACHE_MAX", raising=False)
    return tmp_path / "cache", tmp_path / "cache" / kk.__version__


def _entry(root: Path, key: str, suffix: str = ".so") -> Path:
    return root / kk.__version__ / key[:2] / (key + suffix)


def test_an_entry_round_trips_and_new_directories_are_private(store):
    root, version_dir = store
    old = os.umask(0)  # kernelkit's directories are 0700 whatever the umask
    try:
        build = _Builds()
        first = CompileCache().get(_key("a"), ".so", "src", build)
    finally:
        os.umask(old)
    assert CompileCache().get(_key("a"), ".so", "src", build) == first and build.calls == 1
    for d in (root, version_dir, _entry(root, _key("a")).parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE((version_dir / cache.KEY_FILE).stat().st_mode) == 0o600
    assert (version_dir / cache.MARKER).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:50])


def _not_utf8(p: Path) -> None:  # finding 5: an unreadable checksum made every later call fail
    p.write_bytes(b"\xff\xfe\x80" * 30 + p.read_bytes()[90:])
    p.with_name(p.name + ".sha256").write_bytes(b"\xff\xfe\x80")


def _directory(p: Path) -> None:
    p.unlink()
    (p / "inside").mkdir(parents=True)


def _forged(p: Path) -> None:  # finding 4: whoever rewrites the binary rewrites its checksum too
    planted = b"planted code"
    p.write_bytes(b"KKCACHE1" + hashlib.sha256(planted).digest() + planted)


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _key_unreadable(p: Path) -> None:
    key = p.parents[1] / cache.KEY_FILE
    key.unlink()
    key.mkdir()


def _key_open_to_others(p: Path) -> None:
    (p.parents[1] / cache.KEY_FILE).chmod(0o644)


@pytest.mark.parametrize("damage", [_truncate, _not_utf8, _directory, _forged, _fifo, _key_unreadable,
                                    _key_open_to_others])
def test_a_damaged_entry_or_key_is_a_miss_never_an_error(store, damage, monkeypatch):
    root, _ = store
    build = _Builds()
    CompileCache().get(_key("a"), ".so", "src", build)
    damage(_entry(root, _key("a")))
    monkeypatch.setattr(cache, "_disks", {})  # as a new process finds it
    again = CompileCache().get(_key("a"), ".so", "src", build)
    assert build.calls == 2 and again.endswith(b"binary 2")


def test_an_entry_copied_to_another_key_is_a_miss(store):
    """Finding 1's stale code: another kernel's valid entry at this kernel's path never loads."""
    root, _ = store
    build = _Builds()
    theirs = CompileCache().get(_key("theirs"), ".so", "src", build)
    mine = CompileCache().get(_key("mine"), ".so", "src", build)
    _entry(root, _key("mine")).write_bytes(_entry(root, _key("theirs")).read_bytes())
    again = CompileCache().get(_key("mine"), ".so", "src", build)
    assert again not in (theirs, mine) and build.calls == 3


def test_a_root_others_can_write_is_refused_for_a_private_one(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    CompileCache().get(_key("a"), ".so", "src", _Builds())
    [record] = [r for r in caplog.records if r.name == "kernelkit"]
    assert record.levelname == "WARNING"
    assert re.search(r"not using the compile cache directory .*shared \(is writable by others than its "
                     r"owner \(mode 777\)\).*Using .*home-cache/kernelkit instead", record.getMessage())
    assert list(shared.iterdir()) == []
    assert _entry(tmp_path / "home-cache" / "kernelkit", _key("a")).exists()


def test_the_size_cap_evicts_the_least_recently_used_never_the_newest(store, monkeypatch):
    root, _ = store
    monkeypatch.setenv("KERNELKIT_CACHE_MAX", "4K")  # three entries of 1 KiB + 40 bytes fit
    payload = {name: os.urandom(1024) for name in "abcd"}
    for name in "abc":
        CompileCache().get(_key(name), ".so", "", lambda: payload[name])
        time.sleep(0.02)  # file times are coarse (a few ms)
    assert CompileCache().get(_key("a"), ".so", "", _Builds()) == payload["a"]  # a hit: a is used now
    time.sleep(0.02)
    CompileCache().get(_key("d"), ".so", "", lambda: payload["d"])
    assert sorted(e.path.name[:64] for e in cache.entries(root)) == sorted(_key(n) for n in "acd")
    big = os.urandom(8192)  # larger than the cap: everything else goes, it stays
    assert CompileCache().get(_key("big"), ".so", "", lambda: big) == big
    assert [e.path.name[:64] for e in cache.entries(root)] == [_key("big")]
    assert CompileCache().get(_key("big"), ".so", "", _Builds()) == big


@pytest.mark.parametrize("text, expected", [("", 1 << 30), ("4096", 4096), ("512M", 512 << 20),
                                            ("2g", 2 << 30), ("1.5KiB", 1536), ("0", None)])
def test_cache_max_sizes(monkeypatch, text, expected):
    monkeypatch.setenv("KERNELKIT_CACHE_MAX", text)
    assert cache.max_bytes() == expected


def test_a_bad_cache_max_is_an_error_before_compiling(store, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_MAX", "lots")
    build = _Builds()
    with pytest.raises(ValueError, match=r"KERNELKIT_CACHE_MAX='lots' is not a size: expected bytes "
                       r"with an optional K, M, G or T suffix"):
        CompileCache().get(_key("a"), ".so", "", build)
    assert build.calls == 0


@pytest.mark.slow
def test_a_planted_library_never_runs(tmp_path):
    """Finding 4: a library planted in the cache with a checksum beside it (the old layout's
    `.sha256`, or a digest in the entry) is a miss: its constructor never runs."""
    assert _run(tmp_path, "compile").stdout.strip() == "ok"
    ran = tmp_path / "planted-ran"
    planted_src = tmp_path / "planted.cpp"
    planted_src.write_text(f'#include <cstdio>\n__attribute__((constructor)) static void f() '
                           f'{{ fclose(fopen("{ran}", "w")); }}\n')
    planted = tmp_path / "planted.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(planted_src), "-o", str(planted)], check=True)
    code = planted.read_bytes()
    for p in (tmp_path / kk.__version__).rglob("*.so"):
        if "custom_kernel_cached" in p.with_name(p.name + ".src").read_text():
            p.write_bytes(b"KKCACHE1" + hashlib.sha256(code).digest() + code)
            p.with_name(p.name + ".sha256").write_text(hashlib.sha256(code).hexdigest())
    again = _run(tmp_path, "compile")
    assert again.stdout.strip() == "ok", again.stderr
    assert not ran.exists()


def test_a_marker_that_cannot_be_written_costs_no_caching(store):
    root, version_dir = store
    (version_dir / cache.MARKER).mkdir(parents=True)  # the marker's name taken by a directory
    build = _Builds()
    first = CompileCache().get(_key("a"), ".so", "src", build)
    assert CompileCache().get(_key("a"), ".so", "src", build) == first and build.calls == 1
    assert cache.version_dirs(root) == []  # not marked: `kernelkit cache clear` leaves it alone


def test_compiles_and_disk_hits_are_logged(caplog):
    import logging
    import uuid
    key, source = cache.key_of(str(uuid.uuid4())), "// a source"
    with caplog.at_level(logging.DEBUG, logger="kernelkit"):
        assert CACHE.get(key, ".bin", source, lambda: b"built") == b"built"
        assert any(r.levelno == logging.INFO and r.message.startswith("compiled ") for r in caplog.records)
        caplog.clear()
        CACHE._memory.clear()  # a fresh process's view: the disk entry
        assert CACHE.get(key, ".bin", source, lambda: b"rebuilt") == b"built"
        assert any(r.message.startswith("compile cache hit on disk") for r in caplog.records)
