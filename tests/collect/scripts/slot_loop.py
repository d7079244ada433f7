"""A plain SGD loop (400 steps unless told) for Python's profiler slot and --steps; behaviour chosen by flags.

--steps N               iterations of the loop
--own-cprofile A:B      the script runs its own cProfile from step A to step B (enable / disable)
--whole-cprofile        the script runs the whole loop under its own cProfile (cProfile.Profile as a context)
--own-torch-stacks A:B  the script runs its own torch.profiler with stacks from step A to step B
--break-tracking K      break gpudoctor's step tracking on purpose at step K (its boundary raises)
--report FILE           write what the script's own profilers saw (JSON)

Each of the script's own profilers must see the loop's work: its report says how many calls its
cProfile counted of the loop's ``one_step`` and how many Python events its torch.profiler recorded,
so a test can tell that gpudoctor's instruments did not take it down.
"""

import argparse
import cProfile
import json
import pstats

import torch


def one_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()


def span(text):
    if not text:
        return None
    a, b = text.split(":")
    return int(a), int(b)


def break_tracking(at):
    """Make gpudoctor's step boundaries raise from step ``at`` on (its step tracking then stops)."""
    from gpudoctor.collect.steps import tracker  # noqa: PLC0415 - only under gpudoctor profile

    orig = tracker.StepTracker._open

    def broken(self, now_ns, ru=None):
        if self.index >= at:
            raise RuntimeError("broken on purpose by the test script")
        return orig(self, now_ns, ru)

    tracker.StepTracker._open = broken


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--own-cprofile", default="")
    ap.add_argument("--whole-cprofile", action="store_true")
    ap.add_argument("--own-torch-stacks", default="")
    ap.add_argument("--break-tracking", type=int, default=None)
    ap.add_argument("--report", default="")
    args = ap.parse_args()
    if args.break_tracking is not None:
        break_tracking(args.break_tracking)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    own, torch_span = span(args.own_cprofile), span(args.own_torch_stacks)
    mine = cProfile.Profile()
    prof = None
    seen = {}
    whole = cProfile.Profile() if args.whole_cprofile else None
    if whole is not None:
        whole.enable()
    done = 0  # iterations begun (a step stopped by --steps N stops the script inside its N-th)
    try:
        for i in range(args.steps):
            done += 1
            if own and i == own[0]:
                mine.enable()
            if torch_span and i == torch_span[0]:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True)
                prof.start()
            one_step(model, opt, x, y)
            if own and i == own[1]:
                mine.disable()
            if prof is not None and i == torch_span[1]:
                prof.stop()
                prof.export_chrome_trace("own_trace.json")  # its Python events: in the trace on every torch
                with open("own_trace.json", encoding="utf-8") as f:
                    events = json.load(f)["traceEvents"]
                seen["torch_python_events"] = sum(1 for e in events if e.get("cat") == "python_function")
                prof = None
    finally:
        if whole is not None:
            whole.disable()
        for name, p in (("own", mine if own else None), ("whole", whole)):
            if p is not None:
                stats = pstats.Stats(p).stats if p.getstats() else {}
                seen[f"{name}_cprofile_one_step_calls"] = sum(v[1] for k, v in stats.items() if k[2] == "one_step")
        if args.report:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump({**seen, "iterations": done}, f)
        print(f"slot_loop: {done} iterations")


if __name__ == "__main__":
    main()
