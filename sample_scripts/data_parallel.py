"""DataParallel: the model is wrapped in ``nn.DataParallel``.

Problem: ``model = nn.DataParallel(model)``, as older tutorials do. DataParallel
is one process driving every GPU: each step it scatters the batch from GPU 0,
replicates the whole model to every GPU, gathers the outputs back on GPU 0 and
reduces the gradients there, all under one Python interpreter and its GIL. GPU 0
does more work and holds more memory than the others, and PyTorch recommends
DistributedDataParallel even on a single machine. On a CPU-only machine the
wrapper only calls the module (its ``DataParallel.forward`` still shows in the
trace), so the diagnosis is measurable here but the speed-up needs 2+ GPUs.
Expected: GD601
Speedup: needs 2+ GPUs
Fix: one process per GPU with ``DistributedDataParallel`` and a
``DistributedSampler``, launched by ``torchrun --nproc-per-node=NGPUS``
(``gpudoctor profile --nproc-per-node N`` does it for you). Run as a single
process, the fixed variant simply trains the unwrapped model.

    python sample_scripts/data_parallel.py                        # planted
    python sample_scripts/data_parallel.py --fixed                # the fix, one process
    torchrun --nproc-per-node 2 sample_scripts/data_parallel.py --fixed
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Images(Dataset):
    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 10, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.images[i].float() - 127.5) / 64.0, self.labels[i]


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a CNN wrapped in nn.DataParallel.")
    p.add_argument("--fixed", action="store_true", help="DistributedDataParallel under torchrun (the fix)")
    p.add_argument("--samples", type=int, default=None, help="dataset size (default 25600 on CUDA, 6144 on CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="per step (default 128)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    distributed = args.fixed and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    torch.manual_seed(0)
    size, width = (64, 32) if on_cuda else (32, 32)
    samples = args.samples or (25600 if on_cuda else 6144)
    batch_size = args.batch_size or 128
    if args.quick:
        samples, batch_size = 64, 16
    dataset = Images(samples, size)
    sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler, num_workers=2,
        persistent_workers=True, pin_memory=on_cuda,
    )  # fmt: skip

    model = make_model(width).to(device)
    if not args.fixed:
        model = nn.DataParallel(model)
    elif distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if on_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    print(f"{len(loader)} steps, mean loss {running.item() / len(loader):.3f}, {time.perf_counter() - start:.1f} s")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
