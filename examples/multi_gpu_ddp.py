"""Data-parallel training through kernelkit ops: one DistributedDataParallel step of a model built on
kk.ops.grid_sample and kk.ops.matmul_add_relu (kk.custom_function ops: kernels with their own
backward), on two processes, checked against the same step run by one process on the same global
batch.

    torchrun --nproc-per-node=2 examples/multi_gpu_ddp.py   # one process per GPU
    python examples/multi_gpu_ddp.py                        # starts its two processes itself

With two NVIDIA GPUs or more, process r drives cuda:r and the processes talk through NCCL. With
fewer, they run on the CPU backend and talk through gloo: the same script, so it also runs in CI
without a GPU. Both processes share one compile cache (KERNELKIT_CACHE_DIR): a kernel compiled by
one is loaded by the other.
"""

import gc
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kernelkit as kk

WORLD = 2
BATCH, H, W, C, POINTS, HIDDEN = 8, 16, 16, 16, 8, 32  # BATCH: the global batch, split over ranks


class Model(torch.nn.Module):
    """Samples each image at learned points (grid_sample), then a fused layer (matmul_add_relu)."""

    def __init__(self):
        super().__init__()
        self.points = torch.nn.Parameter(torch.rand(POINTS, POINTS, 2) * 1.8 - 0.9)  # (x, y) in [-1, 1]
        self.gain = torch.nn.Parameter(torch.rand(C) + 0.5)
        self.weight = torch.nn.Parameter(torch.randn(C, HIDDEN) / C ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(HIDDEN) * 0.1)
        self.head = torch.nn.Linear(HIDDEN, 1)

    def forward(self, images):  # images: (B, H, W, C), NHWC as grid_sample takes them
        grid = self.points.expand(images.shape[0], -1, -1, -1).contiguous()
        sampled = kk.ops.grid_sample(images * self.gain, grid)  # (B, POINTS, POINTS, C)
        features = kk.ops.matmul_add_relu(sampled.reshape(images.shape[0], -1, C), self.weight,
                                          self.bias)  # (B, POINTS * POINTS, HIDDEN)
        return self.head(features.mean(dim=1)).squeeze(-1)


def batch(device):
    """The global batch, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, H, W, C, generator=g)
    targets = torch.randn(BATCH, generator=g)
    return images.to(device), targets.to(device)


def gradients(model, images, targets):
    """Each parameter's gradient of the mean squared error over `images`."""
    model.zero_grad()
    torch.nn.functional.mse_loss(model(images), targets).backward()
    return [p.grad.clone() for p in model.parameters()]


def worker(rank: int, world: int, init_method: str) -> None:
    use_gpus = torch.cuda.device_count() >= world
    device = torch.device("cuda", rank) if use_gpus else torch.device("cpu")
    if use_gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_gpus else "gloo", init_method=init_method,
                            rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same initial model on every rank
        model = Model().to(device)
        images, targets = batch(device)
        single = gradients(model, images, targets)  # one process, the whole batch

        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if use_gpus else None)
        shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        for _ in range(2):  # the second step takes kernelkit's fast path
            parallel = gradients(ddp, images[shard], targets[shard])  # DDP averages over the ranks
        for (name, _), a, b in zip(model.named_parameters(), parallel, single):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        print(f"rank {rank} on {device}: DDP gradients match the one-process step: ok", flush=True)
        # Release DDP (its reducer holds the group) and let every rank's gloo work finish before
        # the group goes: destroyed while its worker thread still releases a finished work (which
        # takes the GIL), the group's destructor waits for that thread with the GIL held, for ever.
        del ddp, model
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    if "RANK" in os.environ:  # started by torchrun: it set the rendezvous in the environment
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(WORLD, f"file://{tmp}/rendezvous"), nprocs=WORLD)


if __name__ == "__main__":
    main()
