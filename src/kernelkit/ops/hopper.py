"""What the ops' Hopper (sm_90) kernels share: the persistent, warp-specialised kernels of the
tensor-op layer (tensor_ops/sm90_persistent.h, sm90_attention.h) run one threadgroup an SM, a
producer warpgroup and consumers: 384 threads (two consumers), 512 for the D = 64 attention
forward (three)."""

from __future__ import annotations

import functools

import torch

# the threadgroup, and the header that bounds the entry to it (entry_bounds.h: setmaxnreg needs it)
THREADS = 384


def header(threads: int = THREADS) -> str:
    """The header of a kernel of `threads` a threadgroup."""
    return f"#define KK_MAX_THREADS_PER_THREADGROUP {threads}\n#include <kernelkit/tensor_ops.h>\n"


HEADER = header()


@functools.lru_cache(maxsize=None)
def sm90_sms(dev: torch.device) -> int | None:
    """The SMs of a Hopper (sm_90) GPU, None for another GPU."""
    p = torch.cuda.get_device_properties(dev)
    return p.multi_processor_count if (p.major, p.minor) == (9, 0) else None


def launch(dev: torch.device, tiles: int, threads: int = THREADS) -> dict | None:
    """grid and threadgroup of a persistent kernel over `tiles` tiles: a threadgroup an SM (or a
    tile, if fewer); None past what its 32-bit tile counter takes."""
    if tiles >= 2**31:
        return None
    return dict(grid=(min(tiles, sm90_sms(dev)) * threads, 1, 1), threadgroup=(threads, 1, 1))
