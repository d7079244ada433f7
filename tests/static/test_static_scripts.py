"""Realistic training scripts (tests/static/scripts/): exactly the expected findings, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.model.findings import Report, Severity
from gpudoctor.static import check_paths

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _found(report: Report) -> set[tuple[str, str, int]]:
    assert report.errors == ()
    return {(f.code, Path(f.location.file).name, f.location.line) for f in report.findings}


def _line(path: Path, needle: str) -> int:
    """The 1-based line of the only line of ``path`` containing ``needle``."""
    hits = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def test_project_split_across_files_is_followed_from_the_entry_script():
    project = SCRIPTS / "cifar_project"
    report = check_paths([project / "train.py"], Config())
    data, engine, models, train = (project / n for n in ("data.py", "engine.py", "models.py", "train.py"))
    expected = {
        # --workers defaults to 0, passed through build_loaders(…, args.workers) in another file
        ("GD201", "data.py", _line(data, "train_loader = DataLoader")),
        ("GD201", "data.py", _line(data, "val_loader = DataLoader")),
        ("GD301", "data.py", _line(data, "train_loader = DataLoader")),
        ("GD301", "data.py", _line(data, "val_loader = DataLoader")),
        # loss.item() every step in train_one_epoch, called from the epoch loop of train.py;
        # the one under `if step % args.log_every == 0:` is not reported
        ("GD102", "engine.py", _line(engine, "running_loss += loss.item()")),
        # evaluate(): model.eval(), no backward, no no_grad
        ("GD701", "engine.py", _line(engine, "for images, targets in loader:")),
        # autocast(enabled=args.amp) with --amp off by default
        ("GD401", "engine.py", _line(engine, "for step, (images, targets) in enumerate(loader):")),
        ("GD403", "models.py", _line(models, "self.conv1 = nn.Conv2d")),
        ("GD404", "train.py", _line(train, "optimizer = torch.optim.SGD")),
    }
    assert _found(report) == expected
    by_code = {f.code: f for f in report.findings}
    assert "num_workers comes from `--workers` (default 0)" in by_code["GD201"].message
    assert "`--amp` (default False)" in by_code["GD401"].message
    assert report.summary[1].key == "files_followed" and report.summary[1].value == 3


def test_checking_the_folder_gives_the_same_findings_once():
    project = SCRIPTS / "cifar_project"
    one = check_paths([project / "train.py"], Config())
    folder = check_paths([project], Config())
    assert _found(folder) == _found(one)
    assert len(folder.findings) == len(one.findings)


def test_hugging_face_style_loop():
    path = SCRIPTS / "messy" / "hf_finetune.py"
    report = check_paths([path], Config())
    assert _found(report) == {
        ("GD102", path.name, _line(path, "progress.set_postfix(loss=loss.item())")),
        ("GD202", path.name, _line(path, "train_dl = DataLoader(")),
        ("GD404", path.name, _line(path, "optimizer = torch.optim.AdamW")),
    }


def test_legacy_data_parallel_script():
    path = SCRIPTS / "messy" / "legacy_dp.py"
    report = check_paths([path], Config())
    assert _found(report) == {
        ("GD601", path.name, _line(path, "nn.DataParallel(model)")),
        ("GD302", path.name, _line(path, "images = images.cuda()")),
        ("GD302", path.name, _line(path, "target = target.cuda()")),
        ("GD303", path.name, _line(path, "pred = output.data.cpu().numpy()")),
        ("GD303", path.name, _line(path, "accs.append(")),
        ("GD102", path.name, _line(path, 'print("loss", loss)')),
        ("GD502", path.name, _line(path, "torch.cuda.empty_cache()")),
        ("GD202", path.name, _line(path, "loader = DataLoader(")),
        ("GD401", path.name, _line(path, "scaler = GradScaler()")),  # deprecated torch.cuda.amp
        ("GD401", path.name, _line(path, "with autocast():")),
        ("GD404", path.name, _line(path, "optimizer = torch.optim.SGD")),
    }
    dp = next(f for f in report.findings if f.code == "GD601")
    assert "DistributedDataParallel(model, device_ids=[local_rank])" in dp.fix.after
    copy = next(f for f in report.findings if f.code == "GD302")
    assert copy.fix.after.endswith(".cuda(non_blocking=True)")


def test_pytorch_tutorial_shape_module_level_loop():
    path = SCRIPTS / "messy" / "cifar_tutorial.py"
    report = check_paths([path], Config())
    assert _found(report) == {
        ("GD102", path.name, _line(path, "running_loss += loss.item()")),
        # pageable batches: at the copies in the loops over each loader (the fix is on the DataLoader)
        ("GD301", path.name, _line(path, "inputs, labels = data[0].to(device)")),
        ("GD301", path.name, _line(path, "images, labels = data[0].to(device)")),
        # trainloader is iterated every epoch; testloader once, after training
        ("GD202", path.name, _line(path, "trainloader = torch.utils.data.DataLoader")),
        ("GD401", path.name, _line(path, "for i, data in enumerate(trainloader, 0):")),
        ("GD403", path.name, _line(path, "self.conv1 = nn.Conv2d")),
        ("GD404", path.name, _line(path, "optimizer = optim.SGD")),
    }
    # `.item()` under `with torch.no_grad()` after training, and the evaluation loop itself: fine
    assert not [f for f in report.findings if f.code == "GD701"]


def test_tuned_script_has_no_findings_and_a_checklist_of_applied_techniques():
    report = check_paths([SCRIPTS / "messy" / "clean_train.py"], Config())
    assert report.findings == ()
    status = {c.key: c.status.value for c in report.checklist}
    for key in ("pinned-memory", "dataloader-workers", "cudnn-benchmark", "no-grad-eval", "prefetch", "amp",
                "host-sync", "d2h-every-step", "unfused-optimizer", "allocator-churn"):
        assert status[key] == "applied", (key, status[key])


@pytest.mark.parametrize("fmt", ["terminal", "md", "json", "html", "sarif"])
def test_findings_render_in_every_format(fmt: str):
    from gpudoctor.report import render

    report = check_paths([SCRIPTS / "messy" / "legacy_dp.py"], Config())
    text = render(report, fmt)
    assert "GD601" in text and "legacy_dp.py" in text


def test_severities_follow_the_documented_policy():
    report = check_paths([SCRIPTS / "messy" / "legacy_dp.py", SCRIPTS / "cifar_project"], Config())
    for f in report.findings:
        if f.code in ("GD401", "GD403", "GD202"):
            assert f.severity is Severity.INFO, f
        elif f.code in ("GD102", "GD201", "GD301", "GD302", "GD303", "GD601", "GD701"):
            assert f.severity is Severity.WARNING, f
        assert f.severity is not Severity.ERROR


def test_json_report_validates_against_the_report_schema():
    import json

    import jsonschema

    from gpudoctor.report import render
    from gpudoctor.report.schema import report_schema

    report = check_paths([SCRIPTS / "messy" / "legacy_dp.py", SCRIPTS / "cifar_project"], Config())
    data = json.loads(render(report, "json"))
    jsonschema.validate(data, report_schema())
    assert data["kind"] == "check" and data["run"] is None
    assert {f["confidence"] for f in data["findings"]} == {"static"}


def test_fix_snippets_parse_when_the_loader_is_built_in_the_loop_header(tmp_path):
    """`for (x, y) in DataLoader(...)`: the keyword goes into the DataLoader call, not the tuple,
    and every "after" snippet is Python."""
    import ast
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(8, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        for epoch in range(2):
            for (x, y) in DataLoader(ds, batch_size=8):
                x, y = x.cuda(), y.cuda()
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        """))
    report = check_paths([script], Config())
    codes = {f.code for f in report.findings}
    assert "GD301" in codes, codes
    for f in report.findings:
        if f.fix is None or not f.fix.after:
            continue
        after = f.fix.after
        snippet = after + ("\n    pass" if after.rstrip().endswith(":") else "")
        ast.parse(textwrap.dedent(snippet))  # raises on a broken snippet
        if f.code == "GD301":
            assert "DataLoader(ds, batch_size=8, pin_memory=True)" in after and "(x, y)" in after


def test_a_data_parallel_guarded_off_by_the_defaults_is_named_not_denied(tmp_path):
    # DCGAN's shape: nn.DataParallel under `if args.ngpu > 1`, default 1. The checklist item is not
    # applicable with the defaults, and says the wrapper is there and what switches it on.
    script = tmp_path / "dcgan_like.py"
    script.write_text(
        "import argparse\nimport torch\nfrom torch import nn\n"
        "p = argparse.ArgumentParser()\np.add_argument('--ngpu', type=int, default=1)\nargs = p.parse_args()\n"
        "model = nn.Linear(10, 10).cuda()\n"
        "if args.ngpu > 1:\n    model = nn.DataParallel(model, list(range(args.ngpu)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2)\n"
        "for x in loader:\n    loss = model(x.cuda()).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    report = check_paths([script], Config())
    assert not [f for f in report.findings if f.code == "GD601"]
    item = next(c for c in report.checklist if c.key == "data-parallel")
    assert item.status.value == "not_applicable"
    assert f"nn.DataParallel at {script}:{_line(script, 'nn.DataParallel(')}" in item.reason
    assert "--ngpu" in item.reason and "no nn.DataParallel" not in item.reason


def test_a_loop_without_per_step_copies_applies_the_two_sync_items_at_the_loop():
    path = SCRIPTS / "messy" / "clean_train.py"
    report = check_paths([path], Config())
    items = {c.key: c for c in report.checklist}
    assert items["host-sync"].reason.startswith("no per-step .item() / print(tensor) / float(tensor) in the training loop at ")
    assert items["d2h-every-step"].reason.startswith("no per-step .cpu() / .numpy() / .tolist() in the training loop at ")
    assert str(path.name) in items["host-sync"].reason
