"""A small CPU training script for the collect tests; behaviour chosen by flags.

--probe FILE        write what the script saw (__name__, sys.argv, sys.path[0], __file__)
--workers N         DataLoader workers (--context fork|spawn)
--epochs E          epochs over 64 samples in batches of 8 (8 steps per epoch)
--sleep S           seconds of sleep per step (slow steps for the signal tests)
--raise-at K        raise ValueError in a helper at step K
--exit N            sys.exit(N) at the end
--no-optimizer      iterate the DataLoader without training (DataLoader steps)
--marker FILE       touch FILE once the first step has run
"""

import argparse
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    """Defined in the script: spawn workers must unpickle it from __main__."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((4,), float(i) / 64)
        return x, x.sum(dim=0, keepdim=True)


def check_batch(step, raise_at):
    if step == raise_at:
        raise ValueError(f"planted failure at step {step}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--probe")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--context", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--no-optimizer", action="store_true")
    p.add_argument("--marker")
    args = p.parse_args()
    if args.probe:
        with open(args.probe, "w") as f:
            json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__, "cwd": os.getcwd()}, f)
    torch.manual_seed(0)
    loader = DataLoader(
        Squares(), batch_size=8, num_workers=args.workers,
        multiprocessing_context=args.context if args.workers else None,
        persistent_workers=False,
    )
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    step = 0
    for _ in range(args.epochs):
        for x, y in loader:
            check_batch(step, args.raise_at)
            if opt is None:
                with torch.no_grad():
                    model(x)
            else:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
            if args.sleep:
                time.sleep(args.sleep)
            step += 1
            if args.marker and step == 1:
                open(args.marker, "w").close()
    print(f"train_small: {step} iterations")
    if args.exit is not None:
        sys.exit(args.exit)


if __name__ == "__main__":
    main()
