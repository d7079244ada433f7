"""Host sync every step: the loop reads the loss back and prints a tensor after every step.

Problem: after each optimizer step the loop calls ``loss.item()`` to log the
loss and prints the running accuracy, a CUDA tensor, in an f-string. Both wait
for the GPU to finish all queued work (``cudaStreamSynchronize`` /
``aten::_local_scalar_dense`` in the trace), so the host cannot queue the next
step while the GPU computes, and the GPU then idles while the host fetches and
copies the next batch and launches its kernels.
Expected: GD102
Needs: GPU
Fix: keep the metrics on the device (``running_loss += loss.detach()``) and
read them back every N steps (here once every 50) instead of every step.
On a CPU-only machine ``.item()`` is cheap and both variants run alike.

    python sample_scripts/host_sync_every_step.py            # planted
    python sample_scripts/host_sync_every_step.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

LOG_EVERY = 50


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
    p = argparse.ArgumentParser(description="Train a CNN and log its metrics.")
    p.add_argument("--fixed", action="store_true", help=f"keep metrics on the device, log every {LOG_EVERY} steps (the fix)")
    p.add_argument("--samples", type=int, default=None, help="dataset size (default 25600 on CUDA, 1024 on CPU)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    size, width = (64, 32) if on_cuda else (32, 16)
    samples = args.samples or (25600 if on_cuda else 1024)
    if args.quick:
        samples, args.batch_size = 64, 16
    loader = DataLoader(
        Images(samples, size), batch_size=args.batch_size, shuffle=True, num_workers=2,
        persistent_workers=True, pin_memory=on_cuda,
    )  # fmt: skip

    model = make_model(width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    losses: list[float] = []
    running_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device)
    seen = 0
    for step, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = criterion(logits, labels)
        loss.backward()
        optimizer.step()
        correct += (logits.detach().argmax(dim=1) == labels).sum()
        seen += len(labels)
        if args.fixed:
            running_loss += loss.detach()
            if (step + 1) % LOG_EVERY == 0:
                print(f"step {step + 1}: loss {running_loss.item() / LOG_EVERY:.4f} acc {correct.item() / seen:.3f}")
                running_loss.zero_()
        else:
            losses.append(loss.item())  # waits for the GPU
            print(f"step {step + 1}: loss {losses[-1]:.4f} acc {correct / seen}")  # formats a device tensor
    print(f"{len(loader)} steps, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
