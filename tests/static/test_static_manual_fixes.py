"""Fixes that `gpudoctor check --fix` leaves to the author where the change would break the script: the
finding stays, its fix is not automatic, and its evidence says why (review of the rewrite)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.model.findings import Finding
from gpudoctor.static import check_paths

FIX_LEFT = "not changed by `gpudoctor check --fix`"


def _findings(tmp_path: Path, text: str, code: str) -> list[Finding]:
    path = tmp_path / "t.py"
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    report = check_paths([path], Config())
    assert report.errors == ()
    return [f for f in report.findings if f.code == code]


def _manual(f: Finding, why: str) -> None:
    assert not f.fix.automatic and f.fix.edits == ()
    assert any(n.startswith(FIX_LEFT) and why in n for n in f.evidence.notes), f.evidence.notes


# --------------------------------------------------------------------------- GD701: no_grad around an evaluation


EVAL = """
import torch
import torch.nn.functional as F


def test(model, device, test_loader):
    model.eval()
    total = 0
    for data, target in test_loader:
        data, target = data.to(device), target.to(device)
{inside}
        output = model(data)
        total += F.nll_loss(output, target, reduction="sum").item()
{after}
    return total
"""


def _eval(tmp_path: Path, inside: str = "", after: str = "") -> list[Finding]:
    return _findings(tmp_path, EVAL.format(inside=textwrap.indent(inside, " " * 8),
                                           after=textwrap.indent(after, " " * 4)), "GD701")


def test_a_plain_evaluation_loop_gets_no_grad_automatically(tmp_path):
    (f,) = _eval(tmp_path)
    assert f.fix.automatic and f.fix.edits


def test_an_evaluation_that_needs_gradients_is_not_wrapped_automatically(tmp_path):
    """A saliency map (`torch.autograd.grad` in the loop) raised under the no_grad --fix added."""
    for inside, why in [("data.requires_grad_(True)", ".requires_grad_(...)"),
                        ("g = torch.autograd.grad(model(data).sum(), data)[0]", "torch.autograd.grad"),
                        ("model(data).sum().backward()", ".backward(...)"),
                        ("data.requires_grad = True", ".requires_grad = ..."),
                        ("with torch.enable_grad():\n    g = model(data)", "torch.enable_grad"),
                        ("torch.set_grad_enabled(True)", "torch.set_grad_enabled")]:
        found = _eval(tmp_path, inside=inside)
        if "backward" in inside:  # a loop that calls backward trains: no evaluation loop at all
            assert all(not f.fix.automatic for f in found)
            continue
        (f,) = found
        _manual(f, why)


def test_an_output_of_the_loop_differentiated_after_it_keeps_the_fix_manual(tmp_path):
    (f,) = _eval(tmp_path, after="output.sum().backward()")
    _manual(f, "`output`, bound in it, is differentiated after it")
    (f,) = _eval(tmp_path, after="g = torch.autograd.grad(output.sum(), data)")
    _manual(f, "differentiated after it")
    (f,) = _eval(tmp_path, after="other.sum().backward()")  # not the loop's: the fix stays
    assert f.fix.automatic
