"""The training loop ``benchmarks/verify_aa.py`` verifies: a little compute, a wait, and a planted tail.

Each step: a forward/backward/``SGD`` step of a small MLP on one intra-op thread (~1-2 ms
of CPU on the 2-core CI machine), then ``--wait-ms`` (default 5) of sleep, the time a batch
takes to arrive. Every fifth step (0, 5, 10 …) sleeps ``--tail-ms`` more (default 0; the
environment variable ``VERIFY_LOOP_TAIL_MS``, when set, wins): a batch read from slow storage. The tail moves the mean step (what an
epoch costs) and not the median, and removing it is a fix of known size: the planted
effect of the benchmark, applied by an ``env`` injection as ``--verify`` applies its
fixes. ``VERIFY_LOOP_MARK`` is read and ignored: the A/A arm sets it, a change that
changes nothing. Nothing in the loop knows about gpudoctor; it runs until stopped
(``gpudoctor profile --steps N``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wait-ms", type=float, default=5.0)
    p.add_argument("--tail-ms", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wait_s = args.wait_ms / 1000
    tail_s = float(os.environ.get("VERIFY_LOOP_TAIL_MS", args.tail_ms)) / 1000
    os.environ.get("VERIFY_LOOP_MARK")  # the A/A arm's change: read, and nothing depends on it
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    step = 0
    while True:
        time.sleep(wait_s + (tail_s if step % 5 == 0 else 0.0))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1


if __name__ == "__main__":
    main()
