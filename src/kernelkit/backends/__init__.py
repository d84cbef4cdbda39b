"""Backends: where a generated kernel is compiled, loaded and launched.

Each backend is one small module behind the same calls: `target` (the entry
the code generator renders), `check_dispatch`, `build(source, ..., entry) ->
program` (through the shared compile cache; `entry` names the GPU's kernel
symbol, the CPU library's is fixed), `launcher(...) -> launch(block)` and
`compiled_plan(...)` (a repeated call's plan in C, or None: kernel.py's plans).
"""

from __future__ import annotations

import torch


_LOADED = {}


def groups_per_grid(grid, group) -> tuple[int, int, int]:
    """Threadgroups (CUDA blocks) that cover a grid of threads, per dimension."""
    return tuple(-(-n // g) for n, g in zip(grid, group))


class Fill:
    """A new output's fill with its init_value: a step of kernel.py's plans, which the CUDA
    backend's compiled plans take over (the driver's memset, where the value's bytes allow)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self, t: torch.Tensor) -> None:
        t.fill_(self.value)


def get_backend(device: torch.device):
    backend = _LOADED.get(device.type)
    if backend is None:
        if device.type == "cuda":
            from .cuda import BACKEND as backend
        elif device.type == "cpu":
            from .cpu import BACKEND as backend
        else:
            raise ValueError(f"kernelkit runs on CUDA GPUs and on the CPU, not on {device}")
        _LOADED[device.type] = backend
    return backend
