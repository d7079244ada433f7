"""A loop that swallows every exception of its steps (``--how``), as some training loops do:

- ``bare``: ``try: step() except: pass`` (a bare ``except:`` catches SystemExit too);
- ``suppress``: ``with contextlib.suppress(BaseException): step()``;
- ``finally``: ``try: step() finally: continue`` (a ``continue`` in ``finally`` drops the exception);
- ``once``: a loop that catches the first SystemExit of its steps (a retry), not the second;
- ``thread``: each step on a short-lived thread (an exception ends that thread only; the loop goes on).

``--iters`` steps; ``--report`` writes how many iterations began. ``--steps N`` raises a SystemExit at the boundary of step
N-1, which each of these loops swallows.
"""

import argparse
import contextlib
import json
import threading

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--how", required=True)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--report", required=True)
    a = ap.parse_args()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(8, 4)
    ran = {"iterations": 0}

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    try:
        loop(a, step, ran)
    finally:  # (also when the stop ends the loop)
        with open(a.report, "w") as f:
            json.dump(ran, f)


def loop(a, step, ran):
    retried = False
    for _ in range(a.iters):
        ran["iterations"] += 1
        if a.how == "bare":
            try:
                step()
            except:  # noqa: E722
                pass
        elif a.how == "suppress":
            with contextlib.suppress(BaseException):
                step()
        elif a.how == "once":
            try:
                step()
            except SystemExit:
                if retried:
                    raise
                retried = True
        elif a.how == "finally":
            try:
                step()
            finally:
                continue  # noqa: B012
        else:
            t = threading.Thread(target=step)
            t.start()
            t.join()


if __name__ == "__main__":
    main()
