"""Compiled, and still launch-bound: torch.compile on a model trained a batch of 4 at a time.

Problem: a 12-block residual MLP (width 64: Linear, LayerNorm, GELU, Linear) is
compiled with ``torch.compile`` and trained with ``batch_size=4``. Compiling
fuses the small ops and removes the Python between them, but every step still
pays the fixed cost of the compiled call (guards, the autograd function around
the compiled forward and backward, the optimizer's many small ops) for only
four samples: the step is still spent issuing work rather than doing it. The
model is already compiled, so the advice must not be to compile it: on a GPU
it is CUDA graphs (``mode="reduce-overhead"``) or a larger batch, on a CPU a
larger batch. The backend is ``aot_eager`` (``--backend inductor`` for
Inductor's generated kernels): on the 2-core CPU machine the tests run on,
Inductor's first compilation takes 30 s with a cold cache (6 s warm), about the
whole run's time; ``aot_eager`` compiles the same graphs (Dynamo and
AOTAutograd: the compiled regions a trace shows) in under 3 s.
Expected: GD103
Fix: a larger batch: ``batch_size=256`` with the learning rate scaled linearly
(0.002 x 256/4 for Adam, with warm-up on real jobs). The benchmark compares
time per sample, since the batch changes.

    python sample_scripts/compiled_tiny_batch.py            # planted
    python sample_scripts/compiled_tiny_batch.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WIDTH = 64
BLOCKS = 12


class Tabular(Dataset):
    """Feature rows in memory; ``__getitems__`` gathers a whole batch with one index op."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

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
        nn.Linear(32, WIDTH), *[Block(WIDTH) for _ in range(BLOCKS)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a compiled deep, narrow MLP on tabular features.")
    p.add_argument("--fixed", action="store_true", help="batch 256 with a scaled learning rate (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="samples to train on (default 4096)")
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend (default aot_eager; inductor)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples = 256  # one batch of the fix (drop_last: every batch one shape, no recompilation)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    features = torch.randn(args.samples, 32)
    labels = (features[:, :10].argmax(dim=1) + (features[:, 10] > 1).long()) % 10
    batch_size = 256 if args.fixed else 4
    loader = DataLoader(
        Tabular(features, labels), batch_size=batch_size, shuffle=True, collate_fn=already_batched,
        pin_memory=device.type == "cuda", drop_last=True,
    )  # fmt: skip

    model = make_model().to(device)
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.002 * batch_size / 4 if args.fixed else 0.002)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(compiled(x), y)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    elapsed = time.perf_counter() - start
    print(f"{len(loader)} steps of {batch_size}: mean loss {running.item() / len(loader):.3f}, "
          f"{1e6 * elapsed / args.samples:.0f} us per sample")  # fmt: skip


if __name__ == "__main__":
    main()
