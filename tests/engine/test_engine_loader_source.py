"""A run's DataLoader fixes read the script's source as `check` does (issue 38's "a fix keeps every input
working", for `profile`): persistent workers keep their first copy of the dataset, so a loop that changes
the dataset in place (``ds.set_epoch(epoch)``) gets no ``persistent_workers=True``, neither in the fix
nor in ``--verify``'s trial runs; a change made at every step leaves the workers themselves to the author;
the script's own ``persistent_workers=`` is never overridden."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from rule_builders import CallSite, cpu_manifest, dataloader, manifest, run, settings, steps, trace

from gpudoctor.config import Config
from gpudoctor.engine import diagnose, loader_source_of
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.registry import get
from gpudoctor.static import loader_sources
from gpudoctor.verify.plan import plan

EPOCHS = '''import torch
from torch.utils.data import DataLoader, Dataset


class DS(Dataset):
    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((8,), float(self.epoch)), 0


def main():
    ds = DS()
    loader = DataLoader(ds, batch_size=4,
                        shuffle=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        {change}
        for x, y in loader:
            {step_change}
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
'''
LOADER_LINE = 21  # the DataLoader(...) call spans lines 21-22


def _script(tmp_path: Path, change: str = "ds.set_epoch(epoch)", step_change: str = "pass") -> Path:
    p = tmp_path / "train.py"
    p.write_text(EPOCHS.format(change=change, step_change=step_change))
    return p


def _run(script: Path, *, gpu: bool = False, line: int = LOADER_LINE, call_file: str = "train.py", **dl):
    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    mf = (manifest if gpu else cpu_manifest)(script=str(script), cwd=str(script.parent), script_sha256=sha)
    d = dataloader(call_site=CallSite(call_file, line, "main"), **dl)
    return run(source=str(script.parent / "run"), manifest=mf,
               settings=settings(device_type="cuda" if gpu else "cpu", dataloaders=(d,)),
               steps=steps(20, 100.0, 60.0))


def _gd201(report):
    (f,) = [f for f in report.findings if f.code == "GD201"]
    return f


def test_the_review_names_the_loop_that_changes_the_dataset_at_every_line_of_the_call(tmp_path):
    p = _script(tmp_path)
    found = loader_sources(p, {str(p): p.read_text()}, {str(p): "train.py"})
    assert set(found) == {21, 22}
    where, per_step = found[21]
    assert not per_step and "`ds` is changed in place in the loop at train.py:25" in where
    # the text given is what is read (the run's), not the file's
    assert loader_sources(p, {str(p): EPOCHS.format(change="pass", step_change="pass")}) == {}


def test_a_dataset_changed_per_epoch_gets_workers_without_persistent_workers(tmp_path):
    p = _script(tmp_path)
    report = diagnose(_run(p), Config(), kind="profile")
    f = _gd201(report)
    assert "num_workers=" in f.fix.instruction and "persistent_workers" not in f.fix.after
    assert "persistent_workers=True" not in f.fix.instruction  # the sentence says what the edit makes
    assert any(n.startswith("persistent_workers left out: `ds` is changed in place") for n in f.evidence.notes)
    assert f.fix.edits and f.fix.source is not None  # still the automatic edit, made from the script's line
    arms, _not_tried = plan(report)
    (arm,) = arms
    # the trial runs measure what the fix says: the workers, and (a CPU run whose loading was not measured, sized
    # as computing) the training's threads that leave them their cores
    assert {c.key for c in arm.changes} == {"num_workers", "torch.set_num_threads"}
    assert "torch.set_num_threads(" in f.fix.instruction


def test_without_the_change_the_fix_keeps_persistent_workers(tmp_path):
    p = _script(tmp_path, change="pass")
    f = _gd201(diagnose(_run(p), Config(), kind="profile"))
    assert "persistent_workers=True" in f.fix.after


def test_a_dataset_changed_at_every_step_leaves_the_workers_to_the_author(tmp_path):
    p = _script(tmp_path, change="pass", step_change="ds.epoch += 1")
    report = diagnose(_run(p), Config(), kind="profile")
    f = _gd201(report)
    assert not f.fix.edits and "not an automatic change" in f.fix.illustration
    assert "Left to you: `ds` is changed in place in the step loop at train.py:27" in f.fix.instruction
    arms, not_tried = plan(report)
    assert not arms and "the fix is left to the author" in not_tried[report.findings.index(f)]


def test_a_script_changed_since_the_run_is_not_read(tmp_path):
    p = _script(tmp_path)
    data = _run(p)
    p.write_text(p.read_text() + "\n# edited\n")
    f = _gd201(diagnose(data, Config(), kind="profile"))
    assert "persistent_workers=True" in f.fix.after  # nothing read against it: the run's own fix


def test_gd202_leaves_persistent_workers_to_the_author_where_the_dataset_changes(tmp_path):
    p = _script(tmp_path)
    data = dataclasses.replace(_run(p, num_workers=4, prefetch_factor=2, iterations_started=4),
                               steps=steps(40, 100.0, 1.0, epochs=4, first_wait_ms=400.0))
    rule = get("GD202")
    ctx = RuleContext(data, loader_source=loader_source_of(data)).for_rule(rule.code, rule.name)
    (f,) = rule.check(ctx).findings
    assert not f.fix.edits and "persistent workers would keep their first copy" in f.fix.instruction
    assert rule.inject(f, ctx).startswith("the fix is left to the author: `ds` is changed in place")


def test_the_scripts_own_persistent_workers_is_never_overridden():
    # no source at hand: the call's own arguments say the script chose
    data = run(manifest=manifest(), settings=settings(dataloaders=(dataloader(
        num_workers=4, prefetch_factor=2, iterations_started=4,
        passed_args=("dataset", "batch_size", "num_workers", "persistent_workers")),)),
        steps=steps(40, 100.0, 1.0, epochs=4, first_wait_ms=400.0))
    rule = get("GD202")
    ctx = RuleContext(data).for_rule(rule.code, rule.name)
    (f,) = rule.check(ctx).findings
    assert not f.fix.edits and "passes persistent_workers itself (False)" in f.fix.instruction
    assert "left to the author" in rule.inject(f, ctx)


def test_a_trace_without_step_records_follows_the_source_too(tmp_path):
    p = _script(tmp_path)
    data = dataclasses.replace(_run(p, gpu=True), steps=(),
                               metrics=(trace(breakdown_mean_pct={"data_loading": 35.0, "gpu_compute": 65.0}),))
    f = _gd201(diagnose(data, Config(), kind="profile"))
    assert "persistent_workers" not in f.fix.after and "persistent_workers" not in f.fix.instruction
    assert any(n.startswith("persistent_workers left out: `ds` is changed in place") for n in f.evidence.notes)


def test_a_review_that_fails_leaves_the_runs_own_fix(tmp_path, monkeypatch):
    import gpudoctor.static

    def broken(*_a, **_k):
        raise RuntimeError("a bug in the review")

    monkeypatch.setattr(gpudoctor.static, "loader_sources", broken)
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    f = _gd201(diagnose(_run(_script(tmp_path)), Config(), kind="profile"))
    assert "persistent_workers=True" in f.fix.after  # GD201 itself stands


DATA = '''from torch.utils.data import DataLoader


def make_loader(ds):
    return DataLoader(ds, batch_size=4, shuffle=True)
'''


def test_a_dataloader_built_in_a_module_is_judged_with_the_scripts_loop(tmp_path):
    """The DataLoader is built in data.py, the script's loop iterates it and changes its dataset: the run's
    call site names data.py, and the script is read with it."""
    (tmp_path / "data.py").write_text(DATA)
    main = EPOCHS.format(change="ds.set_epoch(epoch)", step_change="pass")
    main = main.replace("    loader = DataLoader(ds, batch_size=4,\n                        shuffle=True)",
                        "    loader = make_loader(ds)").replace("import torch\n", "import torch\nfrom data import make_loader\n", 1)
    p = tmp_path / "train.py"
    p.write_text(main)
    f = _gd201(diagnose(_run(p, line=5, call_file="data.py"), Config(), kind="profile"))
    assert "persistent_workers" not in f.fix.after and str(f.location) == "data.py:5"
    assert any("`ds` is changed in place in the loop at train.py:" in n for n in f.evidence.notes), f.evidence.notes
