"""What this machine offers kernelkit: `kernelkit doctor`.

Each probe looks at one piece (the GPUs, the NVIDIA driver, NVRTC, CUDA's headers, the
C++ compiler of the CPU backend, the compile cache, the optional packages) and returns
findings; a probe that raises becomes a finding saying so, never a crash. A missing piece
comes with the line that fixes it. `versions()` is the short form that benchmark results
record.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

# Status of a finding: "ok" (present and usable), "info" (absent, and nothing needs it here),
# "warn" (usable, with a caveat), "missing" (needed and absent: `fix` says what to do),
# "error" (the probe itself failed).
MARKS = {"ok": "ok", "info": "--", "warn": "!", "missing": "!!", "error": "??"}


@dataclass
class Finding:
    name: str
    status: str
    detail: str
    fix: str | None = None


def _probe(name: str):
    """Run the probe; an exception becomes an "error" finding, never a crash. `name` may hold
    `{}` fields for the probe's arguments ("run on {}")."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs) -> list[Finding]:
            try:
                found = fn(*args, **kwargs)
                return found if isinstance(found, list) else [found]
            except Exception as e:  # noqa: BLE001 - doctor reports, it does not crash
                return [Finding(name.format(*args), "error", f"probe failed: {type(e).__name__}: {e}")]
        return run
    return wrap


# --- the pieces, each queried once ------------------------------------------------------------

def has_nvidia_device_nodes() -> bool:
    return os.path.exists("/dev/nvidiactl")


def _dist_version(*names: str) -> tuple[str, str] | None:
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def driver_info() -> dict:
    """The NVIDIA driver through NVIDIA's bindings: {"version": "13.0", "gpus": [...]} or
    {"error": why}. Loads libcuda, so only where a driver may be installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return {"error": "cuda-bindings is not installed"}
    try:
        err, version = driver.cuDriverGetVersion()
    except Exception as e:  # libcuda not found: cuda-pathfinder raises
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return {"error": f"libcuda not loadable ({msg})"}
    if int(err) != 0:
        return {"error": f"cuDriverGetVersion: {err}"}
    info = {"version": f"{version // 1000}.{version % 1000 // 10}", "gpus": []}
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            info["init_error"] = str(err)
            return info
        err, count = driver.cuDeviceGetCount()
        attr = driver.CUdevice_attribute
        for i in range(count if int(err) == 0 else 0):
            _, dev = driver.cuDeviceGet(i)
            _, name = driver.cuDeviceGetName(64, dev)
            _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            _, mem = driver.cuDeviceTotalMem(dev)
            info["gpus"].append({"name": name.split(b"\0")[0].decode(errors="replace"),
                                 "arch": f"sm_{major}{minor}", "memory_gib": int(mem) / 2**30})
    except Exception as e:  # noqa: BLE001
        info["init_error"] = f"{type(e).__name__}: {e}"
    return info


@functools.lru_cache(maxsize=None)
def nvrtc_info() -> dict:
    """NVRTC: {"version", "path", "found_via", "wheel", "archs"} or {"error": why}."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return {"error": "cuda-bindings is not installed"}
    info: dict = {}
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        lib = load_nvidia_dynamic_lib("nvrtc")
        info["path"], info["found_via"] = lib.abs_path, getattr(lib, "found_via", None)
        if info["found_via"] is None and "site-packages" in str(lib.abs_path):
            info["found_via"] = "site-packages"
    except Exception as e:  # noqa: BLE001
        return {"error": f"libnvrtc not found ({str(e).splitlines()[0] if str(e) else type(e).__name__})"}
    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        return {"error": f"nvrtcVersion: {err}", **info}
    info["version"] = f"{major}.{minor}"
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        if int(err) == 0:
            info["archs"] = [int(a) for a in archs]
    except Exception:  # noqa: BLE001 - older NVRTC
        pass
    wheel = _dist_version(f"nvidia-cuda-nvrtc-cu{major}", "nvidia-cuda-nvrtc")
    if wheel and info.get("found_via") == "site-packages":
        info["wheel"] = f"{wheel[0]} {wheel[1]}"
    return info


@functools.lru_cache(maxsize=None)
def cxx_info() -> dict:
    """The CPU backend's C++ compiler: {"path", "version"} or {"error": why}."""
    from .backends import cpu
    try:
        path, identity = cpu.compiler()
    except cpu.CompilerNotFound as e:
        return {"error": str(e)}
    return {"path": path, "version": identity, "from_env": bool(os.environ.get("CXX"))}


def _short_nvrtc(info: dict) -> str | None:
    if "version" not in info:
        return None
    where = info.get("wheel") or info.get("found_via") or ""
    return f"{info['version']} ({where})" if where else info["version"]


def versions(device=None) -> dict:
    """kernelkit, Python, torch, NVRTC, driver and C++ compiler versions, for benchmark records.
    The driver is asked only for a CUDA device; NVRTC only where it is installed."""
    import torch

    from . import __version__
    out = {"kernelkit": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda}
    try:
        out["nvrtc"] = _short_nvrtc(nvrtc_info())
    except Exception:  # noqa: BLE001
        out["nvrtc"] = None
    on_gpu = device is not None and getattr(device, "type", str(device)).startswith("cuda")
    out["driver"] = driver_info().get("version") if on_gpu else None
    try:
        out["cxx"] = cxx_info().get("version")
    except Exception:  # noqa: BLE001
        out["cxx"] = None
    return out


# --- probes ------------------------------------------------------------------------------------

@_probe("kernelkit")
def probe_kernelkit():
    from . import __version__
    where = Path(__file__).resolve().parent
    return Finding("kernelkit", "ok", f"{__version__} at {where} (Python {platform.python_version()}, "
                   f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs)")


@_probe("torch")
def probe_torch():
    import torch
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return Finding("torch", "ok", f"{torch.__version__} ({build}, {torch.get_num_threads()} threads)")


@_probe("GPU")
def probe_gpus():
    import torch
    if torch.cuda.is_available():
        found = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            found.append(Finding("GPU", "ok", f"cuda:{i} {p.name}, sm_{p.major}{p.minor}, "
                                 f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs"))
        return found
    if not has_nvidia_device_nodes():
        return Finding("GPU", "info", "none (no NVIDIA device on this machine): kernels run on the "
                       "CPU backend")
    if not torch.version.cuda:
        return Finding("GPU", "missing", f"an NVIDIA device is present but torch {torch.__version__} "
                       "is a CPU-only build",
                       "install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    return Finding("GPU", "missing", "an NVIDIA device is present but torch.cuda.is_available() is "
                   "False (driver too old for this torch, or no device visible: CUDA_VISIBLE_DEVICES="
                   f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})",
                   "update the NVIDIA driver, or check CUDA_VISIBLE_DEVICES")


@_probe("driver")
def probe_driver():
    import torch
    if not has_nvidia_device_nodes() and not torch.cuda.is_available():
        return Finding("driver", "info", "no NVIDIA driver (no /dev/nvidiactl); not needed for the CPU backend")
    info = driver_info()
    if "error" in info:
        fix = ('pip install "kernelkit[cuda]"' if "cuda-bindings" in info["error"]
               else "install the NVIDIA driver (CUDA 12.8 or newer), e.g. apt-get install nvidia-driver")
        return Finding("driver", "missing", info["error"], fix)
    gpus = ", ".join(f"{g['name']} ({g['arch']})" for g in info["gpus"]) or "no devices"
    if "init_error" in info:
        return Finding("driver", "missing", f"CUDA {info['version']} driver, cuInit failed: {info['init_error']}",
                       "check the driver install (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    status, fix = "ok", None
    nv = nvrtc_info()
    if "version" in nv and int(nv["version"].split(".")[0]) > int(info["version"].split(".")[0]):
        status = "warn"
        fix = (f"NVRTC {nv['version']} is newer than the driver's CUDA {info['version']}: its binaries "
               f"may not load; update the driver, or pip install nvidia-cuda-nvrtc-cu{info['version'].split('.')[0]}")
    return Finding("driver", status, f"CUDA {info['version']} driver; {gpus}", fix)


@_probe("NVRTC")
def probe_nvrtc():
    info = nvrtc_info()
    if "error" in info:
        return Finding("NVRTC", "missing", info["error"],
                       'pip install "kernelkit[cuda]", or set CUDA_HOME to a CUDA toolkit; only the '
                       "GPU backend needs it")
    via = info.get("found_via") or "?"
    if via == "CUDA_HOME":
        via = f"CUDA_HOME ({os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')})"
    where = f"the {info['wheel']} wheel" if info.get("wheel") else via
    detail = f"{info['version']} from {where}: {info.get('path')}"
    archs = info.get("archs")
    if archs:
        detail += f"; targets sm_{archs[0]}..sm_{archs[-1]}"
    status, fix = "ok", None
    import torch
    if archs and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            if major * 10 + minor not in archs:
                status = "missing"
                fix = (f"this NVRTC cannot compile for cuda:{i} (sm_{major}{minor}): install an NVRTC "
                       "that supports it (pip install -U nvidia-cuda-nvrtc)")
    return Finding("NVRTC", status, detail, fix)


@_probe("CUDA headers")
def probe_headers():
    from .backends import cuda
    try:
        dirs = cuda.cuda_include_dirs()
    except cuda.CudaUnavailable as e:
        return Finding("CUDA headers", "missing", str(e).split(":")[0],
                       'pip install "kernelkit[cuda]", or set CUDA_HOME; only the GPU backend needs '
                       "them")
    fp16 = any(os.path.exists(os.path.join(d, "cuda_fp16.h")) for d in dirs)
    std = any(os.path.isdir(os.path.join(d, "cuda", "std")) for d in dirs)
    missing = [h for h, ok in (("cuda_fp16.h", fp16), ("cuda/std (CCCL)", std)) if not ok]
    if missing:
        return Finding("CUDA headers", "missing", f"{', '.join(dirs)}; without {', '.join(missing)}",
                       'pip install "kernelkit[cuda]", or set CUDA_HOME')
    return Finding("CUDA headers", "ok", ", ".join(dirs))


@_probe("C++ compiler")
def probe_cxx():
    info = cxx_info()
    if "error" in info:
        return Finding("C++ compiler", "missing", f"{info['error']} (CPU backend unavailable)",
                       "no C++ compiler: apt-get install g++, or set CXX")
    via = " (from $CXX)" if info.get("from_env") else ""
    return Finding("C++ compiler", "ok", f"{info['path']}{via}: {info['version']}")


@_probe("fast call path")
def probe_fastcall():
    from . import fastcall
    module = fastcall.module()
    if isinstance(module, str):
        return Finding("fast call path", "warn", f"not built ({module}); repeated calls take the "
                       "slower Python path", "install g++ and the Python headers (python3-dev)")
    helper = fastcall.torch_helper()
    if isinstance(helper, str):  # the Python-method path allocates and reads tensors instead
        return Finding("fast call path", "ok", f"compiled (fastcall.cpp); its libtorch helper is not ({helper})")
    return Finding("fast call path", "ok", "compiled (fastcall.cpp, and fastcall_torch.cpp with custom_function's "
                   "autograd node against this torch)")


def _writable(directory: Path) -> bool:
    """Whether kernelkit can write there: try it."""
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        os.close(fd)
        os.unlink(tmp)
        return True
    except OSError:
        return False


@_probe("cache")
def probe_cache():
    from . import __version__
    from . import cache as cc
    store = cc.disk()
    where = "$KERNELKIT_CACHE_DIR" if os.environ.get("KERNELKIT_CACHE_DIR") else "default"
    fix = "set KERNELKIT_CACHE_DIR to a directory that only you can write (mode 0700)"
    if store is None:
        return Finding("cache", "missing", f"{cc.no_disk_reason()}: every process compiles its "
                       "kernels again", fix)
    usage = cc.usage(store.root)
    files, size = sum(u[1] for u in usage), sum(u[2] for u in usage)
    limit = cc.max_bytes()
    detail = (f"{store.root} ({where if not store.refused else 'fallback'}): {files} files, "
              f"{size / 2**20:.1f} MiB of {f'{limit / 2**20:.0f} MiB' if limit else 'no limit'}"
              f"{' (KERNELKIT_CACHE_MAX)' if os.environ.get('KERNELKIT_CACHE_MAX') else ''}")
    stale = [u for u in usage if u[0] != __version__]
    if stale:
        detail += (f"; {sum(u[2] for u in stale) / 2**20:.1f} MiB from other kernelkit versions "
                   "(kernelkit cache clear --stale)")
    if store.refused:
        return Finding("cache", "warn", f"{detail}; in place of {store.refused}: whoever can "
                       "write there could plant binaries", fix)
    if not _writable(store.directory):
        return Finding("cache", "warn", detail + "; not writable: every process recompiles", fix)
    return Finding("cache", "ok", detail)


@_probe("optional")
def probe_optional():
    import importlib.util
    found = []
    for module, dist, use in (("matplotlib", "matplotlib", "charts of `kernelkit demo --plot` and "
                               "`kernelkit bench`: pip install 'kernelkit[plot]'"),
                              ("cupy", None, "the hand-written CUDA port in `kernelkit bench` on a GPU")):
        if importlib.util.find_spec(module) is None:
            found.append(Finding(module, "info", f"not installed (optional: {use})"))
        else:
            v = _dist_version(dist) if dist else None
            found.append(Finding(module, "ok", v[1] if v else "installed"))
    return found


@_probe("run on {}")
def probe_run(device: str):
    """Compile and run a small kernel on `device`: the whole road, end to end."""
    import time

    import torch

    from .ops.exp import exp
    t0 = time.perf_counter()
    a = torch.linspace(-4, 4, 4096, device=device)
    out = exp(a)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    err = float((out.double() - a.double().exp()).norm() / a.double().exp().norm())
    if err > 1e-5:
        return Finding(f"run on {device}", "missing", f"exp kernel is wrong: relative error {err:.1e}",
                       "please report this (kernelkit doctor --json output attached)")
    return Finding(f"run on {device}", "ok", f"exp kernel compiled and checked in {dt:.2f} s")


def findings(run: bool = False) -> list[Finding]:
    out: list[Finding] = []
    for probe in (probe_kernelkit, probe_torch, probe_gpus, probe_driver, probe_nvrtc, probe_headers,
                  probe_cxx, probe_fastcall, probe_cache, probe_optional):
        out += probe()
    if run:  # every device, the CPU even without a compiler: the check says what failed
        devices = ["cpu"]
        try:
            import torch
            devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        except Exception:  # noqa: BLE001
            pass
        for d in devices:
            out += probe_run(d)
    return out


def backends(found: list[Finding]) -> dict[str, bool]:
    """Which backends can run kernels, from the findings."""
    bad = {f.name for f in found if f.status in ("missing", "error")}
    gpu = any(f.name == "GPU" and f.status == "ok" for f in found)
    return {"cpu": "C++ compiler" not in bad,
            "cuda": gpu and not bad & {"driver", "NVRTC", "CUDA headers"}}


def report(found: list[Finding]) -> str:
    width = max(len(f.name) for f in found) + 2
    lines = ["kernelkit doctor"]
    for f in found:
        detail = f.detail.replace("\n", "\n" + " " * (width + 7))  # a compiler's log, indented
        lines.append(f"  [{MARKS.get(f.status, '?'):>2}] {f.name:<{width}}{detail}")
        if f.fix:
            lines.append(f"  {'':4} {'':<{width}}fix: {f.fix}")
    ok = backends(found)
    gpus = sum(1 for f in found if f.name == "GPU" and f.status == "ok")
    cuda = (f"ready ({gpus} GPU{'s' if gpus != 1 else ''})" if ok["cuda"]
            else "unavailable" + ("" if gpus else " (no GPU)"))
    lines.append(f"backends: CPU {'ready' if ok['cpu'] else 'unavailable'}; CUDA {cuda}")
    return "\n".join(lines)


def main(json_output: bool = False, run: bool = False) -> int:
    """Print what this machine offers; 0 when at least one backend can run kernels and, with
    `run`, every device ran its check."""
    try:
        found = findings(run)
    except Exception as e:  # noqa: BLE001 - the probes are wrapped; this is the last guard
        found = [Finding("doctor", "error", f"{type(e).__name__}: {e}")]
    if json_output:
        import json
        print(json.dumps({"findings": [asdict(f) for f in found], "backends": backends(found)}, indent=2))
    else:
        print(report(found))
    ok = backends(found)
    failed_run = any(f.name.startswith("run on") and f.status != "ok" for f in found)
    return 0 if (ok["cpu"] or ok["cuda"]) and not failed_run else 1
