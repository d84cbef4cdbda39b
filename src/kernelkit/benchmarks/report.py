"""Reports: results in the current layout (`upgrade`, also of the older files under
bench/results/), `load`, BENCHMARKS.md's Markdown tables (`markdown`), charts (matplotlib), and
`write_results`: a run's JSON, results.md and charts."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from .debug import DEBUG_MODES
from .suite import KINDS, SCRIPTS

# What a speed-up column means, under each table that has one.
SPEED_UP = "Speed-up: the reference's time over kernelkit's (above 1, kernelkit is faster)."
CPU_SPEED_UP = (SPEED_UP[:-1] + ". On the CPU, below 1 is expected: the CPU backend runs a kernel "
                "body thread by thread as C++, to develop and test GPU kernels without a GPU, "
                "against torch's vectorised CPU code.")


def kind_of(result: dict) -> str | None:
    if result.get("benchmark") in KINDS:
        return result["benchmark"]
    command = result.get("command", "")
    for kind, script in SCRIPTS.items():
        if script in command:
            return kind
    return None


def upgrade(result: dict) -> dict:
    """A result in the current layout; the files recorded before `kernelkit bench` used other keys."""
    r = dict(result)
    kind = r["benchmark"] = kind_of(r)
    if kind == "cpu" and "exp_64M_float32" in r:
        e = r.pop("exp_64M_float32")
        r["exp"] = {"n": 64 * 2**20, "dtype": "float32", "kernelkit_ms": e["kernelkit_ms"],
                    "torch_ms": e["torch_exp_ms"], "throughput_vs_torch": e["throughput_vs_torch"]}
    if kind == "cpu" and "grid_sample_1_16" in r:
        r["grid_sample"] = r.pop("grid_sample_1_16")
    if kind == "cpu" and "compile_s" in r:
        c = r.pop("compile_s")
        r["compile"] = {"cold_first_call_s": c["cold_first_call"],
                        "warm_disk_first_call_s": c["disk_cache_first_call"]}
    if kind == "ops" and "grid_sample_bilinear_zeros_float32" in r:
        r["grid_sample"] = r.pop("grid_sample_bilinear_zeros_float32")
        r["grid_sample"].setdefault("shape", {"x": [8, 1024, 1024, 64], "grid": [8, 256, 256, 2],
                                              "dtype": "float32"})
    for key in [k for k in r if k.startswith("matmul_add_relu_batch")]:
        batch, n = (int(v) for v in re.findall(r"\d+", key)[:2])
        r["matmul_add_relu"] = {"batch": batch, "m": n, "n": n, "k": n, **r.pop(key)}
    r.setdefault("versions", {"torch": r.get("torch")})
    return r


def load(paths) -> list[tuple[dict, str]]:
    """(result, file) for each JSON file given, or each *.json in a directory given."""
    out = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.json"), key=lambda f: (KINDS.index(f.stem) if f.stem in KINDS
                                                        else len(KINDS), f.name)) if p.is_dir() else [p]
        for f in files:
            data = json.loads(f.read_text())
            for r in data if isinstance(data, list) else [data]:
                if kind_of(r):
                    out.append((upgrade(r), str(f)))
    return out


def _num(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{_num(v)} ms"


def _s(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{_num(v * 1e3)} ms" if v < 0.1 else f"{_num(v)} s"


def _shape(dims) -> str:
    return "×".join(str(d) for d in dims)


def _on_cpu(r: dict) -> bool:
    return r["benchmark"] == "cpu" or str(r.get("device", "")).startswith("cpu")


def _meta(r: dict, path: str | None) -> str:
    v = r.get("versions") or {}
    parts = [r.get("device", "?"), f"torch {v.get('torch') or r.get('torch', '?')}"]
    if _on_cpu(r):
        if v.get("cxx"):
            parts.append(v["cxx"])
    else:
        if v.get("nvrtc"):
            parts.append(f"NVRTC {v['nvrtc']}")
        if v.get("driver"):
            parts.append(f"driver CUDA {v['driver']}")
    if v.get("kernelkit"):
        parts.append(f"kernelkit {v['kernelkit']}")
    parts.append(r.get("date", "?"))
    line = ", ".join(parts) + f", `{r.get('command', '?')}`"
    if path:
        line += f" (`{path}`)"
    return line + (". Quick (reduced) sizes." if r.get("quick") else ".")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def _ratio(a, b) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}×"


def _md_grid_sample(r: dict, path) -> list[str]:
    s, f, v, c = r["shape"], r["forward_ms"], r["vjp_ms"], r.get("compile", {})
    timing = "best host times" if str(r.get("device", "")).startswith("cpu") else "CUDA-event medians"
    lines = ["## grid_sample through `metal_kernel` against a hand-written CUDA port", "", _meta(r, path),
             f"x {_shape(s['x'])}, grid {_shape(s['grid'])}, {s.get('dtype', 'float32')}, grid uniform "
             f"in [-1, 1]; {timing}. \"Hand port\" is the same kernel written as CUDA C++ and launched "
             "through CuPy's `RawKernel`, outside kernelkit.", ""]
    lines += _table(["", "kernelkit `metal_kernel` (MLX's grid_sample example, unchanged)",
                     "hand-written CUDA port", "kernelkit / hand port"], [
        ["forward", _ms(f["kernelkit"]), _ms(f.get("hand_port")), _ratio(f["kernelkit"], f.get("hand_port"))],
        ["VJP (incl. zero fill of the outputs)", _ms(v["kernelkit"]), _ms(v.get("hand_port")),
         _ratio(v["kernelkit"], v.get("hand_port"))],
        ["`torch.nn.functional.grid_sample` (NHWC view), forward",
         _ms(f.get("torch_grid_sample_nhwc_view")), "", ""]])
    if r.get("hand_port_note"):
        lines += ["", f"No hand port: {r['hand_port_note']}."]
    if c and _on_cpu(r):
        lines += ["", _cpu_compile_line(c)]
    elif c:
        lines += ["", "Compile time, fresh processes: first call with an empty cache (NVRTC compile, "
                  f"load, launch) **{_s(c['cold_first_call_s'])}**; "
                  "first call in a fresh process with the kernel in the disk cache "
                  f"**{_s(c['warm_disk_first_call_s'])}**."]
    return lines


def _cpu_compile_line(c: dict) -> str:
    return ("Compile time of a kernel (fresh process, CPU runtime library already built): cold "
            f"**{_s(c['cold_first_call_s'])}**, disk-cache hit **{_s(c['warm_disk_first_call_s'])}**.")


def _md_ops(r: dict, path) -> list[str]:
    g, m = r.get("grid_sample"), r.get("matmul_add_relu")
    lines = ["## `kernelkit.ops` against torch", "", _meta(r, path), ""]
    rows = []
    if g:
        f, b, s = g["forward_ms"], g["forward_backward_ms"], g["shape"]
        shapes = f"x {_shape(s['x'])}, grid {_shape(s['grid'])}"
        rows += [["grid_sample forward (bilinear, zeros, float32)", shapes, _ms(f["kernelkit"]),
                  f"{_ms(f.get('torch_grid_sample_nchw'))} (`F.grid_sample`, NCHW data)",
                  _ratio(f.get("torch_grid_sample_nchw"), f["kernelkit"])],
                 ["", "", "", f"{_ms(f.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                  _ratio(f.get("torch_grid_sample_nhwc_view"), f["kernelkit"])],
                 ["", "", "", f"{_ms(f.get('composed_reference'))} (composed torch ops)",
                  _ratio(f.get("composed_reference"), f["kernelkit"])],
                 ["grid_sample forward + backward", "same", _ms(b["kernelkit"]),
                  f"{_ms(b.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                  _ratio(b.get("torch_grid_sample_nhwc_view"), b["kernelkit"])]]
        c = g.get("forward_backward_crowded_ms")
        if c:
            rows.append([f"grid_sample forward + backward, grid × {_num(c['grid_scale'])} (points crowded "
                         "in the centre of x)", "same", _ms(c["kernelkit"]),
                         f"{_ms(c.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                         _ratio(c.get("torch_grid_sample_nhwc_view"), c["kernelkit"])])
    if m:
        shapes = f"{m['batch']} × {m['m']}×{m['k']} @ {m['k']}×{m['n']}"
        for dtype in ("bfloat16", "float16", "float32", "float64"):
            if dtype in m:
                d = m[dtype]
                rows.append([f"matmul_add_relu {dtype}", shapes,
                             f"{_ms(d['kernelkit_ms'])} ({_num(d['kernelkit_tflops'])} TFLOP/s)",
                             f"{_ms(d['torch_ms'])} ({_num(d['torch_tflops'])} TFLOP/s, `relu(baddbmm)`)",
                             _ratio(d["torch_ms"], d["kernelkit_ms"])])
    x = r.get("mxfp8_matmul")
    if x:
        shapes = f"{x['m']}×{x['k']} @ ({x['n']}×{x['k']})ᵀ"
        rows.append(["mxfp8_matmul, bf16 out", shapes,
                     f"{_ms(x['kernelkit_ms'])} ({_num(x['kernelkit_tflops'])} TFLOP/s)",
                     f"{_ms(x['torch_bf16_ms'])} ({_num(x['torch_bf16_tflops'])} TFLOP/s, bf16 `matmul`)",
                     _ratio(x["torch_bf16_ms"], x["kernelkit_ms"])])
        if "torch_scaled_mm_ms" in x:
            rows.append(["", "", "", f"{_ms(x['torch_scaled_mm_ms'])} ({_num(x['torch_scaled_mm_tflops'])} "
                         "TFLOP/s, `_scaled_mm` fp8 per-tensor)", _ratio(x["torch_scaled_mm_ms"], x["kernelkit_ms"])])
    a = r.get("flash_attention")
    if a:
        shapes = f"{_shape(a['shape'])} {a['dtype']}"
        for name in ("full", "causal"):
            for part, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
                d, f = a[name][part + "_ms"], a[name][part + "_tflops"]
                rows.append([f"flash_attention {name}, {label}", shapes,
                             f"{_ms(d['kernelkit'])} ({_num(f['kernelkit'])} TFLOP/s)",
                             f"{_ms(d['torch_sdpa'])} ({_num(f['torch_sdpa'])} TFLOP/s, SDPA)",
                             _ratio(d["torch_sdpa"], d["kernelkit"])])
    for f in r.get("linalg", ()):
        rows.append([f"{f['op']} {f['dtype']}", f"{f['batch']} × {f['n']}×{f['n']}", _ms(f["kernelkit_ms"]),
                     f"{_ms(f['torch_ms'])} (`torch.linalg.{f['op']}`)", _ratio(f["torch_ms"], f["kernelkit_ms"])])
    return lines + _table(["op", "shapes", "kernelkit", "torch", "speed-up"], rows) + [
        "", CPU_SPEED_UP if _on_cpu(r) else SPEED_UP]


def _md_cpu(r: dict, path) -> list[str]:
    lines = ["## The CPU backend", "", _meta(r, path) + " Best of several runs.", ""]
    rows = []
    e = r.get("exp")
    if e:
        n = e["n"]
        size = f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)
        rows.append([f"exp, {size} {e.get('dtype', 'float32')} (plain loops)", _ms(e["kernelkit_ms"]),
                     f"{_ms(e['torch_ms'])} (`torch.exp`)", _ratio(e["torch_ms"], e["kernelkit_ms"])])
    g = r.get("grid_sample")
    if g:
        s = g["shape"]
        rows.append([f"grid_sample forward (MLX's example), x {_shape(s['x'])}, grid {_shape(s['grid'])}",
                     _ms(g["forward_ms"]), f"{_ms(g['torch_forward_ms'])} (`F.grid_sample`, NHWC view)",
                     _ratio(g["torch_forward_ms"], g["forward_ms"])])
        ref = g.get("torch_forward_backward_ms")
        rows.append(["grid_sample VJP (MLX's example), same shapes (fibers: `simd_sum`)", _ms(g["vjp_ms"]),
                     f"{_ms(ref)} (`F.grid_sample` forward + backward)" if ref else "",
                     _ratio(ref, g["vjp_ms"])])
        if g.get("op_forward_ms"):
            rows.append(["`kernelkit.ops.grid_sample` forward, same shapes", _ms(g["op_forward_ms"]),
                         f"{_ms(g['torch_forward_ms'])}", _ratio(g["torch_forward_ms"], g["op_forward_ms"])])
            rows.append(["`kernelkit.ops.grid_sample` forward + backward (plain loops, atomics)",
                         _ms(g["op_forward_backward_ms"]), f"{_ms(ref)}" if ref else "",
                         _ratio(ref, g["op_forward_backward_ms"])])
    m = r.get("matmul_add_relu")
    if m:
        rows.append([f"matmul_add_relu {m.get('dtype', 'float32')}, {m['batch']} × {m['m']}×{m['k']} @ "
                     f"{m['k']}×{m['n']} (fibers: barriers)", _ms(m["kernelkit_ms"]),
                     f"{_ms(m['torch_ms'])} (`relu(baddbmm)`)", _ratio(m["torch_ms"], m["kernelkit_ms"])])
    lines += _table(["", "kernelkit (CPU backend)", "torch", "speed-up"], rows) + ["", CPU_SPEED_UP]
    c = r.get("compile")
    if c:
        lines += ["", _cpu_compile_line(c)]
    return lines


def _md_overhead(r: dict, path) -> list[str]:
    lines = ["## Per-call host overhead", "", _meta(r, path), "",
             "A cached kernel with one input and one output of 32 float32, called in a loop; host "
             "time per call including the output's allocation, no sync inside the loop."
             + (f" Median of {r['rounds']} rounds (each call measured once per round: the host's "
                f"speed drifts); kernelkit / torch add_ within a round: "
                f"{_num(r['kernelkit_over_torch_add_'])}." if r.get("rounds") else ""), ""]
    return lines + _table(["", "µs per call"], [
        ["kernelkit `metal_kernel` call", _num(r["kernelkit_call_us"])],
        ["torch `y.add_(1.0)`", _num(r["torch_add__us"])],
        ["torch `torch.empty(32)`", _num(r["torch_empty_us"])]] + (
        [["CuPy `RawKernel` launch (no allocation)", _num(r["cupy_rawkernel_us"])]]
        if r.get("cupy_rawkernel_us") else []))


_DEBUG_ROWS = (("exp", lambda r: f"exp, {_count(r['n'])} float32 (no loop)"),
               ("row_sum", lambda r: f"row sum, {r['rows']}×{r['cols']} float32 (a loop)"),
               ("grid_sample_forward", lambda r: f"grid_sample forward (MLX's example), x {_shape(r['shape']['x'])}"))


def _count(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else str(n)


def _md_debug(r: dict, path) -> list[str]:
    lines = ["## Checked calls (`check_bounds`, `timeout`)", "", _meta(r, path), "",
             "Wall time per call, synchronised (a checked call waits for its kernel and reads its "
             "record back), and the ratio to the plain call.", ""]
    rows = []
    for key, label in _DEBUG_ROWS:
        f = r.get(key)
        if not f:
            continue
        plain = f["plain_ms"]
        rows.append([label(f), _ms(plain)] + [f"{_ms(f[f'{m}_ms'])} ({f[f'{m}_ms'] / plain:.2f}×)"
                                           for m in list(DEBUG_MODES)[1:]])
    return lines + _table(["", "plain", "check_bounds", "timeout", "both"], rows)


def _bars_debug(r: dict):
    groups = [key for key, _ in _DEBUG_ROWS if r.get(key)]
    names = {"plain": "plain", "check_bounds": "check_bounds", "timeout": "timeout",
             "check_bounds_timeout": "both"}
    series = {names[m]: [r[g][f"{m}_ms"] for g in groups] for m in DEBUG_MODES}
    return "checked calls", "ms", [g.replace("_", " ") for g in groups], series


_MARKDOWN = {"grid_sample": _md_grid_sample, "ops": _md_ops, "cpu": _md_cpu, "overhead": _md_overhead,
             "debug": _md_debug}


def markdown(results: list[tuple[dict, str | None]]) -> str:
    """BENCHMARKS.md's tables for these results ((result, file it came from))."""
    sections = []
    for r, path in results:
        r = upgrade(r)
        sections.append("\n".join(_MARKDOWN[r["benchmark"]](r, path)).replace("\n\n\n", "\n\n"))
    return "\n\n".join(sections) + "\n"


def bars(r: dict) -> tuple[str, str, list[str], dict[str, list]]:
    """(title, unit, groups, series) of a result's chart: kernelkit against its references."""
    r = upgrade(r)
    kind = r["benchmark"]
    if kind == "grid_sample":
        f, v = r["forward_ms"], r["vjp_ms"]
        return ("grid_sample (MLX's example kernels)", "ms", ["forward", "VJP"],
                {"kernelkit": [f["kernelkit"], v["kernelkit"]],
                 "hand-written CUDA": [f.get("hand_port"), v.get("hand_port")],
                 "torch (NHWC view)": [f.get("torch_grid_sample_nhwc_view"), None]})
    if kind == "ops":
        groups, ours, ref = [], [], []
        g, m = r.get("grid_sample"), r.get("matmul_add_relu") or {}
        if g:
            groups += ["grid_sample fwd", "grid_sample fwd+bwd"]
            ours += [g["forward_ms"]["kernelkit"], g["forward_backward_ms"]["kernelkit"]]
            ref += [g["forward_ms"].get("torch_grid_sample_nhwc_view"),
                    g["forward_backward_ms"].get("torch_grid_sample_nhwc_view")]
        for dtype in ("bfloat16", "float16", "float32", "float64"):
            if dtype in m:
                groups.append(f"matmul_add_relu {dtype}")
                ours.append(m[dtype]["kernelkit_ms"])
                ref.append(m[dtype]["torch_ms"])
        for f in r.get("linalg", ()):
            groups.append(f"{f['op']} {f['batch']}×{f['n']}²")
            ours.append(f["kernelkit_ms"])
            ref.append(f["torch_ms"])
        return "kernelkit.ops", "ms", groups, {"kernelkit": ours, "torch": ref}
    if kind == "cpu":
        groups, ours, ref = [], [], []
        if r.get("exp"):
            groups.append("exp")
            ours.append(r["exp"]["kernelkit_ms"])
            ref.append(r["exp"]["torch_ms"])
        if r.get("grid_sample"):
            g = r["grid_sample"]
            groups += ["grid_sample fwd", "grid_sample VJP"]
            ours += [g["forward_ms"], g["vjp_ms"]]
            ref += [g["torch_forward_ms"], g.get("torch_forward_backward_ms")]
        if r.get("matmul_add_relu"):
            groups.append("matmul_add_relu")
            ours.append(r["matmul_add_relu"]["kernelkit_ms"])
            ref.append(r["matmul_add_relu"]["torch_ms"])
        return "CPU backend", "ms", groups, {"kernelkit": ours, "torch": ref}
    if kind == "debug":
        return _bars_debug(r)
    return ("per-call host overhead", "µs", ["one call"],
            {"kernelkit": [r["kernelkit_call_us"]], "torch add_": [r["torch_add__us"]],
             "torch empty": [r["torch_empty_us"]]})


@functools.lru_cache(maxsize=None)
def have_matplotlib() -> bool:
    """matplotlib is importable and can draw (some installs import but fail inside their C++)."""
    try:
        import io

        from matplotlib.figure import Figure
        fig = Figure(figsize=(1, 1))
        fig.subplots().bar([0], [1])
        fig.savefig(io.BytesIO(), format="png")
    except Exception:  # noqa: BLE001 - any failure means: no charts, and say so
        return False
    return True


MATPLOTLIB_NOTE = ("matplotlib is not installed or cannot draw here: no PNG charts "
                   "(pip install matplotlib, or pip install 'kernelkit[plot]')")


def bar_chart(path, title: str, unit: str, groups: list[str], series: dict[str, list]) -> None:
    """Grouped bars on a log scale, each labelled with its value; no pyplot, no display needed."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    series = {name: values for name, values in series.items() if any(values)}
    fig = Figure(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v]
        ys = [v for v in values if v]
        if not ys:
            continue
        rects = ax.bar(xs, ys, width, label=name)
        ax.bar_label(rects, labels=[_num(v) for v in ys], fontsize=7, padding=1)
    ax.set_yscale("log")
    values = [v for vs in series.values() for v in vs if v]
    if values:
        ax.set_ylim(min(values) / 3, max(values) * 2)
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(f"time ({unit}, log scale; lower is better)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def write_chart(r: dict, path) -> None:
    title, unit, groups, series = bars(r)
    bar_chart(path, f"{title}\n{r.get('device', '')}, {r.get('date', '')}", unit, groups, series)


def write_results(results: dict[str, dict], out: Path, charts: bool = True) -> tuple[list[Path], list[str]]:
    """<kind>.json, results.md and <kind>.png under `out`; (files written, notes)."""
    out.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    for kind, r in results.items():
        p = out / f"{kind}.json"
        p.write_text(json.dumps(r, indent=2) + "\n")
        written.append(p)
    if results:
        md = out / "results.md"
        md.write_text(markdown([(r, f"{kind}.json") for kind, r in results.items()]))
        written.append(md)
    if charts and results:
        if have_matplotlib():
            for kind, r in results.items():
                try:
                    write_chart(r, out / f"{kind}.png")
                    written.append(out / f"{kind}.png")
                except Exception as e:  # noqa: BLE001 - a chart is never worth the figures
                    notes.append(f"no chart for {kind}: {type(e).__name__}: {e}")
        else:
            notes.append(MATPLOTLIB_NOTE)
    return written, notes
