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


# --------------------------------------------------------------------------- GD202 / GD201: persistent workers


LOADER = """
import torch
from torch.utils.data import DataLoader, Dataset


class Curriculum(Dataset):
    def __init__(self):
        self.epoch = 0

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(self.epoch)), torch.tensor(i % 2)

    def set_epoch(self, epoch):
        self.epoch = epoch


def main():
    ds = Curriculum()
    loader = DataLoader(ds, batch_size=4{args})
    model = torch.nn.Linear(4, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
{epoch}
        for x, y in loader:
{step}
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
"""


def _loader(tmp_path: Path, code: str, args: str = "", epoch: str = "pass", step: str = "pass") -> Finding:
    (f,) = _findings(tmp_path, LOADER.format(args=args, epoch=" " * 8 + epoch, step=" " * 12 + step), code)
    return f


def test_gd202_keeps_its_fix_where_the_dataset_does_not_change(tmp_path):
    f = _loader(tmp_path, "GD202", args=", num_workers=2")
    assert f.fix.automatic and dict(f.fix.edits[0].args) == {"persistent_workers": "True"}


def test_gd202_leaves_persistent_workers_to_the_author_where_the_dataset_changes_per_epoch(tmp_path):
    """Persistent workers keep their first copy of the dataset: `ds.epoch = epoch` was never seen again."""
    for epoch in ("ds.epoch = epoch", "ds.set_epoch(epoch)", "loader.dataset.set_epoch(epoch)"):
        f = _loader(tmp_path, "GD202", args=", num_workers=2", epoch=epoch)
        _manual(f, "is changed in place in the loop at")


def test_gd202_never_overrides_an_explicit_persistent_workers(tmp_path):
    f = _loader(tmp_path, "GD202", args=", num_workers=2, persistent_workers=False")
    _manual(f, "passes persistent_workers itself (persistent_workers=False)")


def test_gd201_adds_workers_without_persistence_where_the_dataset_changes_per_epoch(tmp_path):
    f = _loader(tmp_path, "GD201", epoch="ds.set_epoch(epoch)")
    assert f.fix.automatic
    (edit,) = f.fix.edits
    assert "persistent_workers" not in dict(edit.args) and "num_workers" in dict(edit.args)
    f = _loader(tmp_path, "GD201", args=", persistent_workers=False")
    assert f.fix.automatic and "persistent_workers" not in dict(f.fix.edits[0].args)
    f = _loader(tmp_path, "GD201")  # nothing changes it: workers and persistent ones
    assert dict(f.fix.edits[0].args)["persistent_workers"] == "True"


def test_gd201_leaves_workers_to_the_author_where_the_dataset_changes_at_every_step(tmp_path):
    f = _loader(tmp_path, "GD201", step="ds.epoch += 1")
    _manual(f, "would not see the change")


# --------------------------------------------------------------------------- GD201: what workers cannot unpickle


def test_gd201_leaves_workers_to_the_author_where_spawned_workers_cannot_unpickle(tmp_path):
    """lam.py: a dataset class defined in main() and a lambda collate_fn broke under spawn / forkserver."""
    cases = [
        (LOADER.replace("loader = DataLoader(ds, batch_size=4{args})",
                        "loader = DataLoader(ds, batch_size=4, collate_fn=lambda b: b)"), "its collate_fn"),
        (LOADER.replace("loader = DataLoader(ds, batch_size=4{args})",
                        "pad = lambda b: b\n    loader = DataLoader(ds, batch_size=4, collate_fn=pad)"), "a lambda"),
        (LOADER.replace("    ds = Curriculum()", "    class Local(Curriculum):\n        pass\n\n    ds = Local()"),
         "a class defined inside main()"),
        (LOADER.replace("loader = DataLoader(ds, batch_size=4{args})",
                        "def seed(i):\n        pass\n\n    loader = DataLoader(ds, batch_size=4, worker_init_fn=seed)"),
         "a function defined inside main()"),
        (LOADER.replace("loader = DataLoader(ds, batch_size=4{args})", "loader = DataLoader(Local(), 4)").replace(
            "    ds = Curriculum()", "    class Local(Curriculum):\n        pass\n"), "an instance of Local"),
    ]
    for text, why in cases:
        assert text != LOADER
        (f,) = _findings(tmp_path, text.format(args="", epoch="        pass", step="            pass"), "GD201")
        _manual(f, why)
        assert "spawn or forkserver" in " ".join(f.evidence.notes)

