"""FP32 conv net: a ResNet-style network trained in full FP32 on a Tensor Core GPU.

Problem: the model, a small ResNet (3x3 convolutions, batch norm, residual
blocks) and a wide classifier head, trains in FP32 with no autocast. On a GPU
of compute capability 7.0 or later the convolutions and matmuls then run FP32
(or at best TF32) kernels, not the FP16 / BF16 Tensor Core kernels that run
several times faster and move half the bytes.
Expected: GD401
Needs: GPU
Fix: mixed precision with the ``torch.amp`` API: ``torch.autocast("cuda",
dtype=torch.bfloat16)`` around forward and loss on Ampere and later; on Volta
and Turing ``dtype=torch.float16`` with ``torch.amp.GradScaler("cuda")``. On a
CPU-only machine the fix is not applied (CPU autocast only pays on CPUs with
AMX / AVX-512 BF16), and both variants run alike.

    python sample_scripts/fp32_convnet.py            # planted
    python sample_scripts/fp32_convnet.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 100, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.images[i].float() - 127.5) / 64.0, self.labels[i]


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        Residual(width), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        Residual(2 * width), nn.MaxPool2d(2),
        Residual(2 * width),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(8 * width, 16 * width), nn.ReLU(inplace=True), nn.Linear(16 * width, 100),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a small ResNet in FP32.")
    p.add_argument("--fixed", action="store_true", help="autocast to bf16/fp16 on CUDA (the fix)")
    p.add_argument("--samples", type=int, default=None, help="dataset size (default 19200 on CUDA, 512 on CPU)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    size, width = (64, 64) if on_cuda else (32, 16)
    samples = args.samples or (19200 if on_cuda else 512)
    if args.quick:
        samples, args.batch_size = 64, 16
    loader = DataLoader(
        Images(samples, size), batch_size=args.batch_size, shuffle=True, num_workers=2,
        persistent_workers=True, pin_memory=on_cuda,
    )  # fmt: skip

    model = make_model(width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    use_amp = args.fixed and on_cuda
    amp_dtype = torch.bfloat16 if on_cuda and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        amp = torch.autocast("cuda", dtype=amp_dtype) if use_amp else contextlib.nullcontext()
        with amp:
            loss = criterion(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        running += loss.detach().float()
    print(f"{len(loader)} steps, mean loss {running.item() / len(loader):.3f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
