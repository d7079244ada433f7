"""``analyze --jobs N``: the same report whatever N, bounded memory per process.

The traces are mapped over a process pool (one per task) or, for a single large trace,
read in parts by several processes; the results are reduced in input order, so the
report is byte-identical to ``--jobs 1`` (the ``created_at`` stamp aside).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from pipeline_traces import rank_folder, rank_trace, run_gpudoctor, write_trace

import gpudoctor.parse.parallel as parallel
from gpudoctor.cli import cli
from gpudoctor.errors import TraceFormatError
from gpudoctor.pipeline import analyze_paths, available_cores


def report_json(args: list[str]) -> str:
    res = CliRunner().invoke(cli, ["analyze", "--format", "json", *args])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    data.pop("created_at")
    return json.dumps(data, sort_keys=True)


def test_jobs_give_the_same_report_as_one_job(tmp_path):
    folder = rank_folder(tmp_path / "ranks", world=5)
    one = analyze_paths([folder], jobs=1)
    for jobs in (2, 3, 8):
        many = analyze_paths([folder], jobs=jobs, pool_min_bytes=0)
        assert json.dumps(many.to_dict()) == json.dumps(one.to_dict()), jobs
    assert [m.rank for m in one.metrics] == [0, 1, 2, 3, 4]
    assert one.metrics[1].path.endswith("rank1.pt.trace.json")


def test_cli_jobs_report_is_byte_identical(tmp_path, monkeypatch):
    import gpudoctor.pipeline as pipeline

    monkeypatch.setattr(pipeline, "POOL_MIN_BYTES", 0)
    folder = rank_folder(tmp_path / "ranks", world=4)
    first = report_json(["-j", "1", str(folder)])
    assert report_json(["--jobs", "2", str(folder)]) == first
    assert report_json([str(folder)]) == first  # default: the cores available
    assert '"GD603"' in first  # the straggler is found across the ranks the workers analyzed


def test_one_large_trace_read_in_parts_gives_the_same_report(tmp_path, monkeypatch):
    import gpudoctor.pipeline as pipeline

    path = write_trace(tmp_path / "big.pt.trace.json", rank_trace(0, 1, steps=40, layers=30), "minified")
    one = analyze_paths([path], jobs=1)
    monkeypatch.setattr(parallel, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "PART_MIN_BYTES", 64 << 10)
    monkeypatch.setattr(pipeline, "BESIDE_MIN_EVENTS", 0)  # its host-side passes in a forked process too
    forked = []
    real = pipeline._fork_beside
    monkeypatch.setattr(pipeline, "_fork_beside", lambda passes: forked.append(len(passes)) or real(passes))
    assert parallel.split_count(path, 3) == 3
    for jobs in (2, 3):
        assert analyze_paths([path], jobs=jobs).to_dict() == one.to_dict()
    assert forked == [6, 6]  # CPU summary, dispatch, syncs, transfers, kernels, roofline
    gz = write_trace(tmp_path / "big.pt.trace.json.gz", rank_trace(0, 1, steps=40, layers=30), "lines")
    assert parallel.split_count(gz, 2) == 2
    # The same figures; only the file's name differs (the metrics and the ledger's key name it).
    expected = {**one.metrics[0].to_dict(), "path": str(gz)}
    expected["ledger"] = {**expected["ledger"], "key": f"trace:{gz}"}
    for jobs in (2, 3):
        assert analyze_paths([gz], jobs=jobs).metrics[0].to_dict() == expected


def test_an_unreadable_trace_fails_the_same_way(tmp_path):
    folder = rank_folder(tmp_path / "ranks", world=4)
    broken = folder / "rank2.pt.trace.json"
    broken.write_text(broken.read_text()[: broken.stat().st_size // 2])
    errors = []
    for jobs in (1, 3):
        with pytest.raises(TraceFormatError) as err:
            analyze_paths([folder], jobs=jobs, pool_min_bytes=0)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "rank2.pt.trace.json" in errors[0] and "truncated" in errors[0]
    proc = run_gpudoctor("analyze", "-j", "2", str(folder))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr == f"gpudoctor: error: {errors[0]}\n"


def test_a_run_directory_notes_what_it_could_not_read(tmp_path):
    """Traces of a run directory that do not read become notes, in order, with any --jobs."""
    src = rank_folder(tmp_path / "src", world=3)
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text("")
    for i, t in enumerate(sorted(src.iterdir())):
        shutil.copy(t, run / f"host_{i}.00000010.pt.trace.json")
    (run / "host_1.00000010.pt.trace.json").write_text('{"traceEvents": [')
    one = analyze_paths([run], jobs=1)
    two = analyze_paths([run], jobs=2, pool_min_bytes=0)
    assert one.to_dict() == two.to_dict()
    assert len(one.metrics) == 2
    assert any("trace skipped" in n and "host_1" in n for n in one.notes)


def test_jobs_must_be_positive(tmp_path):
    folder = rank_folder(tmp_path / "ranks", world=2)
    proc = run_gpudoctor("analyze", "--jobs", "0", str(folder))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--jobs" in proc.stderr


def test_available_cores_is_the_affinity_mask():
    import os

    assert available_cores() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="passes are forked on Linux only")
def test_passes_beside_run_in_another_process_and_their_errors_come_back():
    from gpudoctor.pipeline import _fork_beside

    here = os.getpid()
    pids = _fork_beside([os.getpid, lambda: sum(range(10))])()
    assert pids[0] != here and pids[1] == 45

    def broken() -> int:
        raise ValueError("a pass failed")

    results = _fork_beside([broken])
    with pytest.raises(ValueError, match="a pass failed"):  # run again here: the same error, raised here
        results()


def test_the_readers_need_none_of_the_analysis():
    # One large trace's parts are read by processes forked once the reader is imported: what
    # analysing it needs besides (the inputs, the analysis, the report's model) comes after.
    code = ("import sys, gpudoctor.cli, gpudoctor.pipeline, gpudoctor.parse.parallel\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('gpudoctor'))))")
    mods = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "gpudoctor.parse.kineto" in mods and "gpudoctor.model.trace" in mods
    for heavy in ("gpudoctor.analysis", "gpudoctor.parse.inputs", "gpudoctor.model.findings", "gpudoctor.engine"):
        assert heavy not in mods


def test_the_model_and_parse_packages_name_what_their_type_checking_imports_name():
    import ast
    import importlib

    import gpudoctor.model
    import gpudoctor.parse

    for pkg, names in ((gpudoctor.model, gpudoctor.model._WHERE), (gpudoctor.parse, gpudoctor.parse._INPUTS)):
        tree = ast.parse(open(pkg.__file__, encoding="utf-8").read())
        guarded = {(node.module.rsplit(".", 1)[1], a.name)
                   for block in tree.body if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
                   for node in block.body for a in node.names}
        lazy = {(names[n], n) for n in names} if isinstance(names, dict) else {("inputs", n) for n in names}
        assert guarded == lazy, pkg.__name__
        for mod, name in lazy:  # each resolves, to the object its module defines
            assert getattr(pkg, name) is getattr(importlib.import_module(f"{pkg.__name__}.{mod}"), name)
    with pytest.raises(AttributeError):
        gpudoctor.model.no_such_name  # noqa: B018
