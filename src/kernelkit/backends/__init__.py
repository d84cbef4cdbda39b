"""Backends: where a generated kernel is compiled, loaded and launched.

Each backend is one small module behind the same four calls: `target` (the
entry the code generator renders), `check_dispatch`, `build(source) -> program`
(through the shared compile cache) and `launch`.
"""

from __future__ import annotations

import torch


_LOADED = {}


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
