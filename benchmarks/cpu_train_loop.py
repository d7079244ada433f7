"""A plain CPU training loop for ``benchmarks/overhead.py``: 1000 steps by default.

An MLP classifier on synthetic data fed by a ``DataLoader`` (in-process, so the
measurement is not at the mercy of worker scheduling), ``AdamW``, cross-entropy.
About 10–15 ms per step on a 2-core machine. Nothing in it knows about gpudoctor.

    python benchmarks/cpu_train_loop.py --steps 1000
    python benchmarks/cpu_train_loop.py --steps 1000 --step-times out.json

``--step-times FILE`` writes the loop's own per-step times, ``{"wall": [...], "cpu": [...]}``
in seconds (``time.perf_counter`` and ``time.process_time`` at the end of each
iteration), so the bare and the profiled runs are timed by the same code.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--step-times", default=None, help="write per-step wall times (s) here")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    n = args.batch_size * 64
    x = torch.randn(n, 256)
    y = torch.randint(0, 10, (n,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Sequential(
        nn.Linear(256, args.width), nn.ReLU(),
        nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    walls: list[float] = []
    cpus: list[float] = []
    step = 0
    t_prev = time.perf_counter()
    c_prev = time.process_time()
    while step < args.steps:
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            t = time.perf_counter()
            c = time.process_time()
            walls.append(t - t_prev)
            cpus.append(c - c_prev)
            t_prev, c_prev = t, c
            step += 1
            if step >= args.steps:
                break
    if args.step_times:
        with open(args.step_times, "w", encoding="utf-8") as f:
            json.dump({"wall": walls, "cpu": cpus}, f)
    print(f"trained {step} steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
