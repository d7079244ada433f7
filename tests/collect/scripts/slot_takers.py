"""A loop whose script takes Python's profiler slot itself in its iterations 17..19 (inside gpudoctor's cProfile
window with the default schedule), in one of the ways tools do (``--how``):

- ``collate``, ``getitem``: a ``cProfile.Profile()`` enabled in the ``collate_fn`` / ``Dataset.__getitem__``
  (num_workers=0: it runs inside the DataLoader's own profile, ``collect.loaderprof``);
- ``lsprof``: ``_lsprof.Profiler().enable()`` directly (not ``cProfile.Profile.enable``);
- ``use_tool_id``: ``sys.monitoring.use_tool_id(2, "x")`` and its callbacks, as line profilers do (3.12+);
- ``register_callback``: the callback registered first, then the tool id (3.12+);
- ``setprofile``: ``sys.setprofile`` (a profiler up to 3.11);
- ``thread-lsprof``, ``thread-use_tool_id``: the same, from a short-lived thread while the loop runs.

Each taking counts the calls its profiler saw; ``--report`` writes the counts. Alone, the script exits 0.
"""

import _lsprof
import argparse
import cProfile
import json
import sys
import threading

import torch
from torch.utils.data import DataLoader, Dataset

TAKE = range(17, 20)
seen = {"iterations": 0, "calls": []}


def work():
    return sum(i * i for i in range(200))


def take(how):
    """Take the slot, call work(), let it go; the calls the script's profiler saw."""
    if how in ("collate", "getitem", "lsprof"):
        p = cProfile.Profile() if how != "lsprof" else _lsprof.Profiler()
        p.enable()
        work()
        p.disable()
        return sum(int(e.callcount) for e in p.getstats())
    if how == "setprofile":
        calls = []
        sys.setprofile(lambda frame, event, arg: calls.append(event) if event == "call" else None)
        work()
        sys.setprofile(None)
        return len(calls)
    mon = sys.monitoring
    calls = []
    if how == "register_callback":
        mon.register_callback(2, mon.events.PY_START, lambda code, offset: calls.append(code))
        mon.use_tool_id(2, "x")
    else:
        mon.use_tool_id(2, "x")
        mon.register_callback(2, mon.events.PY_START, lambda code, offset: calls.append(code))
    mon.set_events(2, mon.events.PY_START)
    work()
    mon.set_events(2, 0)
    mon.register_callback(2, mon.events.PY_START, None)
    mon.free_tool_id(2)
    return len(calls)


class Data(Dataset):
    def __init__(self, how):
        self.how = how

    def __len__(self):
        return 4 * 1000

    def __getitem__(self, i):
        if self.how == "getitem" and seen["iterations"] in TAKE and i % 4 == 0:
            seen["calls"].append(take("getitem"))
        return torch.full((4,), float(i % 7))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--how", required=True)
    ap.add_argument("--report", required=True)
    a = ap.parse_args()

    def collate(batch):
        if a.how == "collate" and seen["iterations"] in TAKE:
            seen["calls"].append(take("collate"))
        return torch.stack(batch)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for x in DataLoader(Data(a.how), batch_size=4, collate_fn=collate, num_workers=0):
            if seen["iterations"] in TAKE:
                if a.how.startswith("thread-"):
                    t = threading.Thread(target=lambda: seen["calls"].append(take(a.how[len("thread-"):])))
                    t.start()
                    t.join()
                elif a.how not in ("collate", "getitem"):
                    seen["calls"].append(take(a.how))
            seen["iterations"] += 1
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    finally:
        with open(a.report, "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main()
