"""Many short epochs of a map-style DataLoader (4 batches each), then the script's own cProfile.

Under gpudoctor's cProfile window, an epoch's last ``__next__`` (the one that raises StopIteration) runs
between two of the window's steps; on 3.12 the DataLoader's cProfile (``collect.loaderprof``) used to
enable the window's profiler after it, left enabled for the rest of the run: the window gave way at its
next step, and the script's own ``cProfile.enable()`` raised "Another profiling tool is already active".
"""

import cProfile
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def work(batch):
    s = 0
    for i in range(20000):
        s += i
    return s + int(batch[0].sum())


def main():
    loader = DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4)
    for _ in range(15):
        for batch in loader:
            work(batch)
    p = cProfile.Profile()
    try:
        p.enable()
        p.disable()
        print("short_epochs: the script's cProfile ran")
    except Exception as err:
        print(f"short_epochs: the script's cProfile failed: {type(err).__name__}: {err}")
    held = sys.monitoring.get_tool(2) if sys.version_info >= (3, 12) else sys.getprofile()
    print(f"short_epochs: profiler slot at the end: {held!r}")


if __name__ == "__main__":
    main()
