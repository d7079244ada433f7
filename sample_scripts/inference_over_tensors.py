"""Batch inference over a list of tensors, without no_grad: every batch's autograd graph is kept.

Problem: a scoring script runs a trained MLP (LayerNorm, Linear, GELU blocks) over
feature batches it already holds in memory, a plain list of tensors (no DataLoader,
no optimizer, nothing calls ``backward()``), and keeps every batch's output to
concatenate them at the end, the usual way of collecting predictions. It calls
``model.eval()`` but not ``torch.no_grad()``: autograd records each forward, and
since every output is kept, every batch's activations stay alive with its graph
until the script ends. Memory grows with the number of batches (hundreds of MB
here) and the forward passes pay for the recording and for ever more fresh memory.
Expected: GD701
Fix: run the loop under ``torch.inference_mode()`` (the outputs then carry no graph
and each batch's activations are freed as soon as the next layer has used them).

    python sample_scripts/inference_over_tensors.py            # planted
    python sample_scripts/inference_over_tensors.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn

FEATURES = 64
CLASSES = 10


def make_model(depth: int, width: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(FEATURES, width)]
    for _ in range(depth):
        layers += [nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.LayerNorm(width), nn.Linear(width, CLASSES))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Score feature batches with a trained MLP.")
    p.add_argument("--fixed", action="store_true", help="score under torch.inference_mode() (the fix)")
    p.add_argument("--batches", type=int, default=240, help="feature batches (default 240)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.depth = 8, 4

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(args.batch_size, FEATURES, generator=gen) for _ in range(args.batches)]
    model = make_model(args.depth, args.width).to(device)  # stands for a trained checkpoint
    model.eval()

    start = time.perf_counter()
    grad_mode = torch.inference_mode() if args.fixed else contextlib.nullcontext()
    with grad_mode:
        scores = []
        for features in batches:
            scores.append(model(features.to(device, non_blocking=True)))  # planted: each output keeps its graph
        predictions = torch.cat(scores).softmax(dim=1)
    confident = (predictions.max(dim=1).values > 0.2).float().mean().item()
    print(f"{len(batches)} batches scored, {confident:.1%} confident, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
