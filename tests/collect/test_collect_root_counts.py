"""The root module's record (``manifest.root_module``: calls, calls in eval mode) that GD701 judges from,
kept by ``collect.markers.RootModuleWatch`` in-process with torch: its counts cover the same calls, a model
reloaded for a last evaluation included, and go on when step tracking has stopped."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpudoctor.collect import schedule as sched  # noqa: E402
from gpudoctor.collect.markers import RootModuleWatch  # noqa: E402
from gpudoctor.collect.steps import CprofileWindow, StepTracker  # noqa: E402


class LM(nn.Module):  # the script's own class: its forward is wrapped on the class
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 20)

    def forward(self, x):
        return self.out(self.emb(x))


def _sequential() -> nn.Module:  # a torch class: the root instance gets hooks
    return nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20))


class _Writer:
    def write_text(self, text: str) -> None:
        self.rows = [json.loads(line) for line in text.splitlines()]

    def flush(self) -> None:
        pass


def _calls(model: nn.Module, n: int, train: bool) -> None:
    x = torch.randint(0, 20, (4, 5))
    model.train(train)
    for _ in range(n):
        if train:
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)


def _reloaded(model: nn.Module, build) -> nn.Module:
    """A new object of the model's class with its weights, as word_language_model's torch.load of the best
    model (torch.save itself would need install()'s pickling guard, left out here)."""
    new = build()
    new.load_state_dict(model.state_dict())
    return new


@pytest.mark.parametrize("build", [LM, _sequential], ids=["own-class", "torch-class"])
def test_calls_and_eval_calls_cover_the_same_calls(build, tmp_path: Path) -> None:
    """word_language_model: train() under model.train(), evaluate() under model.eval() and no_grad, the
    best model saved and loaded back for the test set. The record said "10 calls, 19 in eval mode" (the
    calls were the reloaded object's alone), and nothing once step tracking had stopped (Python 3.12)."""
    errors: list[str] = []
    cprof = CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats")
    tracker = StepTracker(torch, _Writer(), 0, None, None, None, cprof)
    watch = RootModuleWatch(torch, tracker, lambda what, err: errors.append(f"{what}: {err}"))
    watch._arm()  # not install(): it would patch Module.__getstate__ and torch.jit.script in the test process
    try:
        model = build()
        _calls(model, 4, train=True)
        _calls(model, 2, train=False)  # an evaluation between epochs
        model = _reloaded(model, build)  # the first root is gone: the search starts again
        gc.collect()
        _calls(model, 2, train=False)  # the test set, on the reloaded model: found again at its 2nd call
        tracker.active = False  # step tracking stopped (--steps reached, or an error in its bookkeeping)
        _calls(model, 3, train=True)
        _calls(model, 2, train=False)
        model = _reloaded(model, build)  # and once more, found again with step tracking off
        gc.collect()
        _calls(model, 3, train=False)
    finally:
        watch._disarm()
        watch._unhook()
    assert not errors
    assert tracker.root_name == type(model).__qualname__
    assert (tracker.root_calls, tracker.eval_calls, tracker.eval_grad_calls) == (16, 9, 0)


def test_a_module_that_never_becomes_the_root_counts_nowhere(tmp_path: Path) -> None:
    """A frozen teacher called in eval mode while the root is searched for is not the root's evaluation."""
    cprof = CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats")
    tracker = StepTracker(torch, _Writer(), 0, None, None, None, cprof)
    watch = RootModuleWatch(torch, tracker, lambda what, err: None)
    watch._arm()
    try:
        teacher, student = LM().eval(), LM()
        x = torch.randint(0, 20, (4, 5))
        with torch.no_grad():
            teacher(x)
        _calls(student, 3, train=True)
    finally:
        watch._disarm()
        watch._unhook()
    assert (tracker.root_calls, tracker.eval_calls) == (3, 0)
