"""Evaluation without no_grad: a validation pass that records autograd it never uses.

Problem: the evaluation loop of a deep, narrow residual MLP (96 blocks of width
64: LayerNorm, Linear, GELU, Linear) calls ``model.eval()``, which only switches
dropout and normalisation layers to inference behaviour, but not
``torch.no_grad()``. Every forward pass therefore records the autograd graph: a
backward node per op, and every activation a backward pass would need kept
alive until the batch's outputs are dropped. Nothing ever calls ``backward()``
or steps an optimizer: the bookkeeping costs time (about 30% of each batch for
this many small ops on a CPU) and memory (the saved activations), for nothing.
Expected: GD701
Fix: run the loop under ``torch.inference_mode()`` (or ``torch.no_grad()``),
together with ``model.eval()``.

    python sample_scripts/eval_without_no_grad.py            # planted
    python sample_scripts/eval_without_no_grad.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 64
WIDTH = 64
BLOCKS = 96


class ValidationRows(Dataset):
    """Feature rows in memory; ``__getitems__`` gathers a whole batch with one index op."""

    def __init__(self, n: int, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.features = torch.randn(n, FEATURES, generator=gen)
        self.labels = (self.features[:, :10].argmax(dim=1) + (self.features[:, 10] > 1).long()) % 10

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[i], self.labels[i]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.features[idx], self.labels[idx]


def already_batched(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, WIDTH), *[Block(WIDTH) for _ in range(BLOCKS)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Evaluate a deep MLP on a validation set.")
    p.add_argument("--fixed", action="store_true", help="evaluate under torch.inference_mode() (the fix)")
    p.add_argument("--samples", type=int, default=None, help="validation set size (default 524288 on CUDA, 65536 on CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="default 1024 on CUDA, 128 on CPU")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    samples = args.samples or (524288 if on_cuda else 65536)
    batch_size = args.batch_size or (1024 if on_cuda else 128)
    if args.quick:
        samples, batch_size = 256, 32
    loader = DataLoader(ValidationRows(samples), batch_size=batch_size, collate_fn=already_batched, pin_memory=on_cuda)
    model = make_model().to(device)  # stands for a trained checkpoint
    model.eval()

    start = time.perf_counter()
    confusion = torch.zeros(10, 10, dtype=torch.long, device=device)
    grad_mode = torch.inference_mode() if args.fixed else contextlib.nullcontext()
    with grad_mode:
        for features, labels in loader:
            features = features.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(features)
            confusion += torch.bincount(labels * 10 + logits.argmax(dim=1), minlength=100).view(10, 10)
    accuracy = confusion.diag().sum().item() / samples
    print(f"{len(loader)} batches, accuracy {accuracy:.3f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
